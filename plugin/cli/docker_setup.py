"""``nri-gpu install`` / ``uninstall`` for Docker and podman: the CDI spec, and Docker's ``features.cdi``.

Neither runtime reaches NRI; both read CDI specs from ``/etc/cdi`` (and
``/var/run/cdi``). So install writes the spec (``nri-gpu cdi generate``'s text,
made by the CLI) and, for Docker 25.0 to 28.1, which read specs only with the
``cdi`` feature on, sets ``"features": {"cdi": true}`` in ``/etc/docker/daemon.json``.

The text layer (``daemon_cdi_change``, ``daemon_enable``, ``daemon_revert``) edits
the JSON as text, at the byte offsets of the members it finds, so every other key,
its order and the file's layout stay as they were; the result is parsed back and
checked. The file layer keeps, as the containerd edit does, the original bytes
(``daemon.json.nri-gpu-orig``) and a record (``daemon.json.nri-gpu.json``): uninstall
restores the file byte for byte (or removes it, when install created it), or, when
someone edited it since, reverts only ``features.cdi``. Files are read and written
through ``nri_gpu.plugin.cli.config_files`` (by descriptor, links refused). Install also writes
the systemd units that rewrite the spec at boot and when the driver changes
(``nri_gpu.plugin.cli.systemd_unit``), checked before anything is written; uninstall removes them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from nri_gpu.plugin.cli.cdi_conflicts import KIND
from nri_gpu.plugin.cli.config_files import Folder
from nri_gpu.plugin.cli.runtime_setup import (
    CONFIG_LINK,
    OURS_LINK,
    Result,
    SetupError,
    backup_path,
    decode_utf8,
    record_path,
    sha256_hex,
    unified_diff,
)
from nri_gpu.plugin.cli.systemd_unit import install_units, refuse_if_enabled, uninstall_units
from nri_gpu.plugin.events import parse_version

__all__ = [
    "CDI_DEFAULT_SINCE",
    "CDI_SINCE",
    "DAEMON_JSON",
    "DEFAULT_SPEC",
    "DaemonChange",
    "SpecResult",
    "Units",
    "daemon_cdi_change",
    "daemon_enable",
    "daemon_revert",
    "install_spec_runtime",
    "is_our_spec",
    "needs_cdi_feature",
    "parse_docker_version",
    "spec_dir_warning",
    "uninstall_spec_runtime",
]

DAEMON_JSON = "/etc/docker/daemon.json"
DEFAULT_SPEC = "/etc/cdi/nri-gpu.json"
CDI_SINCE = (25, 0, 0)  # the first Docker that reads CDI specs (with features.cdi)
CDI_DEFAULT_SINCE = (28, 2, 0)  # CDI on by default
_NEW_DAEMON = '{\n  "features": {\n    "cdi": true\n  }\n}\n'
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclasses.dataclass
class SpecResult(Result):
    """A ``Result`` that also says whether dockerd must restart (daemon.json changed)
    and whether the systemd units were written or changed (to enable them)."""

    restart: bool = False
    units_changed: bool = False


@dataclasses.dataclass(frozen=True)
class Units:
    """The systemd unit files (``nri_gpu.plugin.cli.systemd_unit``) install writes into ``folder``."""

    folder: Path
    texts: dict[str, str]


# ---------------------------------------------------------------- text layer (pure)


_DOCKER_VERSION_RE = re.compile(r"^(?:Docker version\s+)?v?([0-9][^\s,]*)", re.IGNORECASE)


def parse_docker_version(output: str) -> tuple[int, int, int] | None:
    """The release in ``docker version --format '{{.Server.Version}}'`` (``28.5.2``)
    or ``dockerd --version`` (``Docker version 26.1.5+dfsg1, build a72d7cd``) output."""
    found = _DOCKER_VERSION_RE.match(output.strip())
    return parse_version(found.group(1)) if found else None


def needs_cdi_feature(version: tuple[int, int, int] | None) -> bool:
    """Whether ``features.cdi`` must be set: before 28.2, and when unknown (the key
    is harmless where CDI is on by default). Refuses a Docker without CDI."""
    if version is not None and version < CDI_SINCE:
        shown = ".".join(map(str, version))
        raise SetupError(f"Docker {shown} has no CDI support (new in Docker 25.0); upgrade Docker first")
    return version is None or version < CDI_DEFAULT_SINCE


@dataclasses.dataclass(frozen=True)
class DaemonChange:
    """``features.cdi`` set to true: ``old`` its value before (None: absent), and
    whether the ``features`` object itself was added."""

    old: bool | None
    features_added: bool


@dataclasses.dataclass(frozen=True)
class _Member:
    key: str
    key_start: int
    value_start: int
    value_end: int


def _members(text: str, start: int, source: str, where: str) -> tuple[list[_Member], int]:
    """The members of the JSON object whose ``{`` is at ``start``, and the offset of its ``}``."""
    members: list[_Member] = []
    i = _WS.match(text, start + 1).end()  # type: ignore[union-attr]
    if text.startswith("}", i):
        return members, i
    while True:
        if not text.startswith('"', i):
            raise SetupError(f"{source}: not valid JSON in {where} at offset {i}")
        key, after_key = _decode_at(text, i, source)
        colon = _WS.match(text, after_key).end()  # type: ignore[union-attr]
        if not text.startswith(":", colon):
            raise SetupError(f"{source}: not valid JSON in {where} at offset {colon}")
        value_start = _WS.match(text, colon + 1).end()  # type: ignore[union-attr]
        _, value_end = _decode_at(text, value_start, source)
        if any(m.key == key for m in members):
            raise SetupError(f"{source}: {where} has the key {key!r} twice; dockerd would read only one")
        members.append(_Member(str(key), i, value_start, value_end))
        i = _WS.match(text, value_end).end()  # type: ignore[union-attr]
        if text.startswith("}", i):
            return members, i
        if not text.startswith(",", i):
            raise SetupError(f"{source}: not valid JSON in {where} at offset {i}")
        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]


def _decode_at(text: str, i: int, source: str) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, i)
    except (ValueError, RecursionError) as exc:
        raise SetupError(f"{source}: not valid JSON: {exc}") from exc


def _load(text: str, source: str) -> tuple[dict[str, Any], list[_Member], int, list[_Member] | None, int]:
    """The parsed file, its top-level members and ``}``, and those of ``features`` (None: absent)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SetupError(f"{source}: not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise SetupError(f"{source}: not a JSON object")
    top, close = _members(text, _WS.match(text).end(), source, "the file")  # type: ignore[union-attr]
    features = next((m for m in top if m.key == "features"), None)
    if features is None:
        return value, top, close, None, -1
    if not isinstance(value["features"], dict):
        raise SetupError(f'{source}: "features" is not an object')
    inner, inner_close = _members(text, features.value_start, source, '"features"')
    return value, top, close, inner, inner_close


def daemon_cdi_change(text: str | None, needed: bool, source: str = "daemon.json") -> DaemonChange | None:
    """What install changes in ``text`` (None: no file): nothing when ``features.cdi``
    is already true, or when not ``needed`` and not turned off by hand."""
    if text is None:
        return DaemonChange(None, True) if needed else None
    value, _, _, inner, _ = _load(text, source)
    if inner is None:
        return DaemonChange(None, True) if needed else None
    cdi = value["features"].get("cdi")
    if cdi is not None and not isinstance(cdi, bool):
        raise SetupError(f'{source}: "features": {{"cdi": ...}} is {cdi!r}, not true or false')
    if cdi is True or (cdi is None and not needed):
        return None
    return DaemonChange(cdi, False)


def _indent_of(text: str, offset: int) -> str:
    line = text.rfind("\n", 0, offset) + 1
    return text[line:offset] if text[line:offset].strip() == "" else ""


def _insert(text: str, members: list[_Member], close: int, open_at: int, member: str, nested: bool) -> str:
    """``member`` (``"key": value``) added last to the object at ``open_at``..``close``."""
    if members:
        last = members[-1]
        indent = _indent_of(text, last.key_start)
        sep = f",\n{indent}" if indent or text[open_at : last.key_start].count("\n") else ", "
        return text[: last.value_end] + sep + member + text[last.value_end :]
    if nested:
        return text[: open_at + 1] + member + text[close:]  # a nested "{}": kept on its line
    closing = _indent_of(text, close)
    inner = closing + "  "
    return text[: open_at + 1] + f"\n{inner}{member}\n{closing}" + text[close:]


def daemon_enable(text: str | None, change: DaemonChange, source: str = "daemon.json") -> str:
    """``text`` with ``features.cdi`` true; every other byte kept where it can be."""
    if text is None:
        return _NEW_DAEMON
    value, top, close, inner, inner_close = _load(text, source)
    if inner is None:
        start = _WS.match(text).end()  # type: ignore[union-attr]
        outer = _indent_of(text, top[-1].key_start) if top else "  "
        one_line = bool(top) and "\n" not in text[start : top[-1].key_start]
        member = '"features": {"cdi": true}' if one_line else f'"features": {{\n{outer}  "cdi": true\n{outer}}}'
        after = _insert(text, top, close, start, member, False)
    else:
        features = next(m for m in top if m.key == "features")
        cdi = next((m for m in inner if m.key == "cdi"), None)
        if cdi is None:
            after = _insert(text, inner, inner_close, features.value_start, '"cdi": true', True)
        else:
            after = text[: cdi.value_start] + "true" + text[cdi.value_end :]
    expected = dict(value)
    expected["features"] = {**value.get("features", {}), "cdi": True}
    if json.loads(after) != expected:
        raise SetupError(f'{source}: could not set "features": {{"cdi": true}} (internal error)')
    return after


def _remove(text: str, members: list[_Member], close: int, index: int) -> str:
    member = members[index]
    if index > 0:
        return text[: members[index - 1].value_end] + text[member.value_end :]
    if len(members) > 1:
        return text[: member.key_start] + text[members[1].key_start :]
    open_at = text.rfind("{", 0, member.key_start)
    return text[: open_at + 1] + text[close:]


def daemon_revert(text: str, change: DaemonChange, source: str = "daemon.json") -> tuple[str, list[str]]:
    """Undo ``change`` where ``features.cdi`` is still true; returns (text, warnings)."""
    value, top, close, inner, inner_close = _load(text, source)
    cdi = None if inner is None else value["features"].get("cdi")
    if inner is None or cdi is not True:
        return text, [f'{source}: "features": {{"cdi": ...}} is now {cdi!r}, not the true we set; left as is']
    at = next(i for i, m in enumerate(inner) if m.key == "cdi")
    if change.old is not None:
        member = inner[at]
        return text[: member.value_start] + json.dumps(change.old) + text[member.value_end :], []
    after = _remove(text, inner, inner_close, at)
    if change.features_added and len(inner) == 1:
        _, top, close, _, _ = _load(after, source)
        after = _remove(after, top, close, next(i for i, m in enumerate(top) if m.key == "features"))
    return after, []


def is_our_spec(data: bytes) -> bool:
    """Whether ``data`` is a CDI spec of our kind as JSON (what ``cdi generate`` writes)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and value.get("kind") == KIND and isinstance(value.get("devices"), list)


# ---------------------------------------------------------------- file layer


def _record_bytes(created: bool, change: DaemonChange, written: bytes) -> bytes:
    record = {
        "tool": "nri-gpu",
        "runtime": "docker",
        "created": created,
        "cdi_old": change.old,
        "features_added": change.features_added,
        "written_sha256": sha256_hex(written),
    }
    return (json.dumps(record, indent=2) + "\n").encode()


def _parse_record(data: bytes, source: str) -> tuple[bool, DaemonChange, str]:
    try:
        value = json.loads(data)
        if not isinstance(value, dict) or value.get("runtime") != "docker":
            raise ValueError("not a Docker install record")
        created, old, added, sha = (value.get(k) for k in ("created", "cdi_old", "features_added", "written_sha256"))
        if not (isinstance(created, bool) and isinstance(added, bool) and isinstance(sha, str)):
            raise ValueError("'created', 'features_added' or 'written_sha256' has the wrong type")
        if old is not None and not isinstance(old, bool):
            raise ValueError("'cdi_old' has the wrong type")
        return created, DaemonChange(old, added), sha
    except (ValueError, RecursionError) as exc:
        raise SetupError(f"{source}: unreadable install record ({str(exc)[:200]}); remove it by hand") from exc


def _install_spec(spec: Path, text: str, dry_run: bool, result: SpecResult) -> None:
    with Folder(spec.parent, create=not dry_run) as folder:
        found = folder.read(spec.name, if_link=OURS_LINK)
        if found is not None and found[0] == text.encode():
            result.messages.append(f"{spec}: the CDI spec is current; nothing to change")
            return
        if found is not None and not is_our_spec(found[0]):
            raise SetupError(f"{spec}: exists and is not a CDI spec of kind {KIND}; not overwriting it (--cdi-spec)")
        before = None if found is None else found[0].decode(errors="replace")
        result.messages.append(f"{spec}: CDI spec {'written' if before is None else 'rewritten'} (kind {KIND})")
        result.diff += unified_diff(before, text, spec)
        result.changed = True
        if not dry_run:
            folder.write(spec.name, text.encode(), None if found is None else found[1])


def spec_dir_warning(text: str | None, spec: Path, source: str) -> str | None:
    """The warning when daemon.json's ``cdi-spec-dirs`` leaves out the spec's folder."""
    dirs = None if text is None else json.loads(text).get("cdi-spec-dirs")
    if not isinstance(dirs, list) or str(spec.parent) in [str(d).rstrip("/") or "/" for d in dirs]:
        return None
    return f'{source}: "cdi-spec-dirs" does not name {spec.parent}: dockerd will not read {spec}'


def _install_daemon(path: Path, spec: Path, needed: bool, dry_run: bool, result: SpecResult) -> None:
    with Folder(path.parent, create=not dry_run) as folder:
        found = folder.read(path.name, if_link=CONFIG_LINK)
        before = None if found is None else decode_utf8(found[0], path)
        change = daemon_cdi_change(before, needed, str(path))
        warning = spec_dir_warning(before, spec, str(path))
        if warning is not None:
            result.warnings.append(warning)
        if change is None:
            why = "already true" if needed else "not needed: CDI is on by default since Docker 28.2"
            result.messages.append(f'{path}: "features": {{"cdi": true}} {why}; nothing to change')
            return
        after = daemon_enable(before, change, str(path))
        was = "absent" if change.old is None else json.dumps(change.old)
        verb = "created with" if before is None else "set"
        result.messages.append(f'{path}: {verb} "features": {{"cdi": true}} (was {was})')
        result.diff += unified_diff(before, after, path)
        result.changed = result.restart = True
        if dry_run:
            return
        record = folder.read(record_path(path).name, if_link=OURS_LINK)
        if record is not None:
            # Reverted by hand since the last install: that record's backup is stale.
            result.warnings.append(
                f"{path}: changed since the last install; its backup is replaced by the current file"
            )
        if found is not None:
            folder.write(backup_path(path).name, found[0], found[1])
        else:
            folder.remove(backup_path(path).name)
        folder.write(record_path(path).name, _record_bytes(found is None, change, after.encode()))
        folder.write(path.name, after.encode(), None if found is None else found[1])


def install_spec_runtime(
    runtime: str,
    spec: Path,
    spec_text: str,
    daemon: Path | None,
    needed: bool,
    dry_run: bool = False,
    units: Units | None = None,
) -> SpecResult:
    """Write the CDI spec ``spec_text`` to ``spec``; for Docker (``daemon`` set), turn
    on ``features.cdi`` there when ``needed`` (or when it was turned off by hand); and
    write the systemd ``units`` that keep the spec true."""
    result = SpecResult(spec, False)
    if not dry_run:
        # Refused before anything is written (a malformed daemon.json, a link, a unit not ours).
        if daemon is not None:
            _install_daemon(daemon, spec, needed, True, SpecResult(daemon, False))
        if units is not None:
            install_units(units.folder, units.texts, True, SpecResult(units.folder, False))
    _install_spec(spec, spec_text, dry_run, result)
    if daemon is not None:
        _install_daemon(daemon, spec, needed, dry_run, result)
    if units is not None:
        result.units_changed = install_units(units.folder, units.texts, dry_run, result)
    result.messages.append(f"use: {runtime} run --rm --device {KIND}=0 IMAGE nvidia-smi (or {KIND}=all)")
    return result


def _uninstall_daemon(path: Path, dry_run: bool, result: SpecResult) -> None:
    with Folder(path.parent) as folder:
        record = folder.read(record_path(path).name, if_link=OURS_LINK)
        if record is None:
            result.messages.append(f"{path}: no install record ({record_path(path)}); nothing to undo")
            return
        created, change, sha = _parse_record(record[0], str(record_path(path)))
        backup = backup_path(path)
        kept = None if created else folder.read(backup.name, if_link=OURS_LINK)
        if not created and kept is None:
            raise SetupError(f"{backup}: the backup of the original file is missing; not touching {path}")
        found = folder.read(path.name, if_link=CONFIG_LINK)
        if found is None:
            result.warnings.append(f"{path}: gone since install; only removing our record")
        elif sha256_hex(found[0]) == sha:
            original = None if kept is None else kept[0]
            how = "removed (nri-gpu created it)" if original is None else f"restored byte for byte from {backup}"
            result.messages.append(f"{path}: {how}")
            after_text = None if original is None else decode_utf8(original, backup)
            result.diff += unified_diff(decode_utf8(found[0], path), after_text, path)
            result.changed = result.restart = True
            if not dry_run:
                if original is None:
                    folder.remove(path.name)
                else:
                    folder.write(path.name, original, found[1])
        else:
            before = decode_utf8(found[0], path)
            after, warnings = daemon_revert(before, change, str(path))
            result.warnings.append(f'{path}: changed since install; reverting only "features": {{"cdi"}}')
            result.warnings += warnings
            if after != before:
                result.messages.append(f'{path}: reverted "features": {{"cdi"}}')
                result.diff += unified_diff(before, after, path)
                result.changed = result.restart = True
                if not dry_run:
                    folder.write(path.name, after.encode(), found[1])
        if not dry_run:
            folder.remove(backup.name)
            folder.remove(record_path(path).name)


def uninstall_spec_runtime(
    spec: Path, daemon: Path | None, dry_run: bool = False, unit_dir: Path | None = None
) -> SpecResult:
    """Remove the CDI spec at ``spec`` (only one of our kind); for Docker, undo the
    ``daemon.json`` edit; remove our systemd units from ``unit_dir``."""
    result = SpecResult(spec, False)
    if unit_dir is not None and not dry_run:
        refuse_if_enabled(unit_dir)  # before anything is removed
    with Folder(spec.parent) as folder:
        found = folder.read(spec.name, if_link=OURS_LINK)
        if found is None:
            result.messages.append(f"{spec}: not there; nothing to remove")
        elif not is_our_spec(found[0]):
            raise SetupError(
                f"{spec}: not a CDI spec of kind {KIND}; left in place (remove it by hand if it should go)"
            )
        else:
            result.messages.append(f"{spec}: CDI spec removed")
            result.diff += unified_diff(found[0].decode(errors="replace"), None, spec)
            result.changed = True
            if not dry_run:
                folder.remove(spec.name)
    if daemon is not None:
        _uninstall_daemon(daemon, dry_run, result)
    if unit_dir is not None:
        uninstall_units(unit_dir, dry_run, result)
    return result
