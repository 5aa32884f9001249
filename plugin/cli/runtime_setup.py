"""``nri-gpu install`` / ``uninstall``: turn NRI on in containerd or CRI-O, and back.

Two layers. The text layer (``containerd_enable``, ``containerd_revert``,
``crio_dropin``, ``crio_dropin_is_ours``) takes and returns text, edits with tomlkit
so every comment and the layout of the rest of the file survive, and does no I/O.
The file layer (``install``, ``uninstall``) reads and writes files, keeps a backup
of the original bytes next to the config (``<config>.nri-gpu-orig``) and a record
of what it changed (``<config>.nri-gpu.json``) so that uninstall can restore the
file byte for byte, or, when someone edited it since, revert only our own keys.
A second install (another ``--socket``) keeps the first backup and the first
original values. Every file is read and written by descriptor, and a link where a
regular file belongs is refused (``nri_gpu.plugin.cli.config_files``); a record that is not
what we write is refused by name. Nothing here restarts a runtime; the CLI does
that when asked.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import Table

from nri_gpu.plugin.cli.config_files import Folder
from nri_gpu.plugin.config import DEFAULT_NAME, DEFAULT_SOCKET
from nri_gpu.plugin.events import parse_version

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CRIO_DROPIN_DIR = "/etc/crio/crio.conf.d"
CRIO_DROPIN_NAME = "10-nri-gpu.conf"
NRI_TABLE = "io.containerd.nri.v1.nri"
NRI_HEADER = f'[plugins."{NRI_TABLE}"]'
BACKUP_SUFFIX = ".nri-gpu-orig"
RECORD_SUFFIX = ".nri-gpu.json"
RUNTIMES = ("containerd", "crio")
VALIDATOR = "default_validator"
VALIDATOR_HEADER = f'[plugins."{NRI_TABLE}".{VALIDATOR}]'
# The annotation that lets a pod start while a required plugin is missing: our own
# DaemonSet pod must carry it (it starts before nri-gpu is there to be required).
TOLERATE_ANNOTATION = "tolerate-missing-nri-plugins.noderesource.dev"
# The first release whose NRI (v0.10) has the default validator and validating plugins.
FAIL_CLOSED_SINCE = {"containerd": (2, 2, 0), "crio": (1, 34, 0)}
_RUNTIME_LABEL = {"containerd": "containerd", "crio": "CRI-O"}


class SetupError(Exception):
    """We refuse to touch the file; the message names the file and key, and why."""


@dataclasses.dataclass(frozen=True)
class Change:
    """One key of ``[plugins."io.containerd.nri.v1.nri"]``: ``old`` is None when absent."""

    key: str
    old: Any
    new: Any


@dataclasses.dataclass
class Result:
    """What a command did (or, dry run, would do): messages, a diff, the file."""

    path: Path
    changed: bool
    messages: list[str] = dataclasses.field(default_factory=list)
    diff: str = ""
    warnings: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class FailClosed:
    """The runtime's default validator, set to refuse a container while ``plugin``
    is not registered; a pod annotated ``<tolerate_annotation>: "true"`` is exempt."""

    plugin: str = DEFAULT_NAME
    tolerate_annotation: str = TOLERATE_ANNOTATION


# ---------------------------------------------------------------- text layer (pure)


_CRIO_VERSION_RE = re.compile(r"^(?:crio version|Version:)\s+(\S+)", re.IGNORECASE | re.MULTILINE)


def parse_runtime_version(runtime: str, output: str) -> tuple[int, int, int] | None:
    """The release in the output of ``containerd --version`` or ``crio --version``.

    ``containerd github.com/containerd/containerd/v2 v2.2.0 1c4457e0``,
    ``containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+b1``,
    ``crio version 1.34.0`` (or a ``Version:  1.34.0`` line) -> (2, 2, 0) ...;
    None when the output is not one of those.
    """
    if runtime == "containerd":
        words = output.split()
        return parse_version(words[2]) if len(words) >= 3 and words[0] == "containerd" else None
    found = _CRIO_VERSION_RE.search(output)
    return parse_version(found.group(1)) if found else None


def fail_closed_for(
    runtime: str, version: tuple[int, int, int] | None, why_unknown: str, plugin: str = DEFAULT_NAME
) -> tuple[FailClosed | None, str]:
    """Whether to write the default validator config for ``runtime`` at ``version``,
    and the sentence that says so (or why not: an older release has no such keys,
    and an unknown one is not guessed, ``why_unknown`` says why it is unknown)."""
    label, since = _RUNTIME_LABEL[runtime], FAIL_CLOSED_SINCE[runtime]
    first = ".".join(map(str, since))
    if version is None:
        return None, (
            f"fail-closed: not set up: could not tell the {label} version ({why_unknown}); it needs {label} >= "
            f"{first}: pass --runtime-version to set it up"
        )
    shown = ".".join(map(str, version))
    if version < since:
        return None, (
            f"fail-closed: not set up: {label} {shown} has no NRI default validator (new in {label} {first}); "
            "a GPU container created while nri-gpu is not connected starts without its GPUs"
        )
    return FailClosed(plugin), (
        f"fail-closed: {label} {shown} refuses to create a container while {plugin} is not registered "
        f'(required_plugins); pods annotated {TOLERATE_ANNOTATION}: "true" are exempt'
    )


def _parse(text: str, source: str) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise SetupError(f"{source}: not valid TOML: {exc}") from exc


def containerd_version(text: str, source: str = "config") -> int:
    """The config's schema ``version`` (2: containerd 1.7, 3: 2.x); refuses the rest."""
    doc = _parse(text, source)
    version = doc.get("version")
    if version is None:
        raise SetupError(
            f"{source}: no 'version' key: a legacy (version 1) containerd config, where NRI "
            f"would be [plugins.nri]. Refusing to edit it; migrate it first "
            f"(containerd config migrate, or start from containerd config default) and add version = 2 or 3"
        )
    if isinstance(version, bool) or not isinstance(version, int) or version not in (2, 3):
        raise SetupError(f"{source}: version = {version!r} is not supported (2 for containerd 1.7, 3 for 2.x)")
    return int(version)


_CRI_NAMES = ("cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images")


def check_cri_enabled(text: str, source: str = "config") -> None:
    """Refuse a config whose ``disabled_plugins`` turns CRI off (Docker's containerd.io
    package ships such a file): NRI only ever sees CRI containers, so enabling it
    there would look done and give no GPU to anything."""
    disabled = _parse(text, source).get("disabled_plugins") or []
    if not isinstance(disabled, list):
        raise SetupError(f"{source}: disabled_plugins is not a list")
    off = [str(name) for name in disabled if str(name) in _CRI_NAMES]
    if off:
        raise SetupError(
            f"{source}: disabled_plugins contains {', '.join(repr(n) for n in off)}: the CRI plugin is off, and NRI "
            "only sees containers created through CRI (kubelet). Remove it from disabled_plugins first"
        )


def _nri_table(doc: tomlkit.TOMLDocument, source: str) -> Any:
    plugins = doc.get("plugins")
    if plugins is None:
        return None
    if not isinstance(plugins, Mapping):
        raise SetupError(f"{source}: 'plugins' is not a table")
    table = plugins.get(NRI_TABLE)
    if table is not None and not isinstance(table, Mapping):
        raise SetupError(f"{source}: {NRI_HEADER} is not a table")
    return table


def _defaults(version: int) -> dict[str, Any]:
    # containerd's built-in values: NRI is off by default in 1.7, on in 2.x.
    return {"disable": version == 2, "disable_connections": False, "socket_path": DEFAULT_SOCKET}


def containerd_changes(
    text: str, socket: str | None = None, source: str = "config", fail_closed: FailClosed | None = None
) -> list[Change]:
    """The keys that must change for NRI to be on (and listening on ``socket``), and,
    with ``fail_closed``, for the default validator to require the plugin. Keys of
    the validator table are named ``default_validator.<key>``."""
    version = containerd_version(text, source)
    table = _nri_table(_parse(text, source), source)
    want: dict[str, Any] = {"disable": False, "disable_connections": False}
    if socket is not None:
        want["socket_path"] = socket
    changes = []
    for key, value in want.items():
        old = _get(table, key)
        effective = _defaults(version)[key] if old is None else old
        if effective != value:
            changes.append(Change(key, old, value))
    if fail_closed is not None:
        changes += _validator_changes(table, fail_closed, source)
    return changes


def _get(table: Any, key: str) -> Any:
    """``key`` (dotted: ``default_validator.enable``) of the NRI table, unwrapped; None when absent."""
    for part in key.split("."):
        if not isinstance(table, Mapping):
            return None
        table = table.get(part)
    return table.unwrap() if table is not None and hasattr(table, "unwrap") else table


def _validator_changes(table: Any, want: FailClosed, source: str) -> list[Change]:
    """Enable the validator, add our name to ``required_plugins`` (a name already
    there, bare or as ``<idx>-<name>``, is enough: the runtime matches both), and
    name the toleration annotation unless the admin named one."""
    sub = None if table is None else table.get(VALIDATOR)
    if sub is not None and not isinstance(sub, Mapping):
        raise SetupError(f"{source}: {VALIDATOR_HEADER} is not a table")
    changes = []
    enable = _get(table, f"{VALIDATOR}.enable")
    if enable is not True:
        changes.append(Change(f"{VALIDATOR}.enable", enable, True))
    required = _get(table, f"{VALIDATOR}.required_plugins")
    if required is not None and not (isinstance(required, list) and all(isinstance(n, str) for n in required)):
        raise SetupError(f"{source}: {VALIDATOR_HEADER} required_plugins is not a list of names")
    names = list(required or [])
    ours = re.compile(rf"(?:[0-9]{{2}}-)?{re.escape(want.plugin)}")
    if not any(ours.fullmatch(n) for n in names):
        changes.append(Change(f"{VALIDATOR}.required_plugins", required, [*names, want.plugin]))
    tolerate = _get(table, f"{VALIDATOR}.tolerate_missing_plugins_annotation")
    if not tolerate:
        changes.append(Change(f"{VALIDATOR}.tolerate_missing_plugins_annotation", tolerate, want.tolerate_annotation))
    return changes


def containerd_enable(text: str, changes: list[Change], source: str = "config") -> str:
    """Apply ``changes`` (from ``containerd_changes``); the rest of the text is kept as is."""
    if not changes:
        return text
    out = text
    for header, path, group in (
        (NRI_HEADER, (), [c for c in changes if "." not in c.key]),
        (VALIDATOR_HEADER, (VALIDATOR,), [c for c in changes if c.key.startswith(f"{VALIDATOR}.")]),
    ):
        if group:
            out = _set_keys(out, header, path, group, source)
    _check_applied(out, changes, source)
    return out


def _set_keys(text: str, header: str, path: tuple[str, ...], changes: list[Change], source: str) -> str:
    doc = _parse(text, source)
    table = _nri_table(doc, source)
    for part in path:
        table = None if table is None else table.get(part)
    if table is None:
        # Appended as text: the whole file before it stays byte for byte.
        block = "".join(f"  {c.key.rpartition('.')[2]} = {tomlkit.item(c.new).as_string()}\n" for c in changes)
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return f"{text}{sep}{header}\n{block}"
    for change in changes:
        table[change.key.rpartition(".")[2]] = change.new
    return doc.as_string()


def _check_applied(text: str, changes: list[Change], source: str) -> None:
    table = _nri_table(_parse(text, source), source)
    for change in changes:
        if _get(table, change.key) != change.new:
            raise SetupError(f"{source}: could not set {NRI_HEADER} {change.key} (internal error)")


def containerd_revert(text: str, changes: list[Change], source: str = "config") -> tuple[str, list[str]]:
    """Undo our ``changes`` where the file still has our value; returns (text, warnings).

    A key someone set to another value since is left as it is, with a warning. A table
    we created and that is now empty is removed.
    """
    doc = _parse(text, source)
    table = _nri_table(doc, source)
    warnings = []
    if table is None:
        return text, [f"{source}: {NRI_HEADER} is gone; nothing of ours to revert"]
    for change in changes:
        current = _get(table, change.key)
        owner, _, key = change.key.rpartition(".")
        holder = table.get(owner) if owner else table
        if current != change.new or not isinstance(holder, Mapping):
            warnings.append(
                f"{source}: {NRI_HEADER} {change.key} is now {current!r}, not the {change.new!r} we set; left as is"
            )
        elif change.old is None:
            del holder[key]  # type: ignore[attr-defined]
        else:
            holder[key] = change.old  # type: ignore[index]
    sub = table.get(VALIDATOR)
    if isinstance(sub, Mapping) and len(sub) == 0 and any(c.key.startswith(f"{VALIDATOR}.") for c in changes):
        del table[VALIDATOR]
    if len(table) == 0:
        plugins = doc["plugins"]
        assert isinstance(plugins, Mapping)
        del plugins[NRI_TABLE]  # type: ignore[attr-defined]
        if isinstance(plugins, Table) and len(plugins) == 0 and plugins.is_super_table():
            del doc["plugins"]
    return doc.as_string(), warnings


def containerd_new_file(socket: str | None, fail_closed: FailClosed | None = None) -> str:
    """A minimal config for a node that has none (version 2 is read by 1.7 and 2.x)."""
    lines = ["# Written by nri-gpu install; removed by nri-gpu uninstall.", "version = 2", "", NRI_HEADER]
    lines += ["  disable = false", "  disable_connections = false"]
    if socket is not None:
        lines.append(f"  socket_path = {tomlkit.item(socket).as_string()}")
    if fail_closed is not None:
        lines += ["", VALIDATOR_HEADER]
        lines += [
            f"  {c.key.partition('.')[2]} = {tomlkit.item(c.new).as_string()}"
            for c in _validator_changes(None, fail_closed, "new file")
        ]
    return "\n".join(lines) + "\n"


_DROPIN_HEAD = (
    "# Written by nri-gpu install: turns on NRI in CRI-O (on by default since 1.30).\n"
    "# nri-gpu uninstall removes this file unless it was changed.\n"
)


def crio_dropin(socket: str | None, fail_closed: FailClosed | None = None) -> str:
    """The CRI-O drop-in that turns NRI on (and sets its socket when given), and
    with ``fail_closed`` its default validator (``[crio.nri.default_validator]``,
    CRI-O >= 1.34: internal/config/nri/nri.go)."""
    text = _DROPIN_HEAD + "[crio.nri]\nenable_nri = true\n"
    if socket is not None:
        text += f"nri_listen = {tomlkit.item(socket).as_string()}\n"
    if fail_closed is not None:
        text += (
            "\n# Fail closed: refuse a container while nri-gpu is not registered (CRI-O >= 1.34).\n"
            "# This list replaces the one of any file CRI-O reads before this one.\n"
            f"[crio.nri.{VALIDATOR}]\n"
            "nri_enable_default_validator = true\n"
            f"nri_validator_required_plugins = {tomlkit.item([fail_closed.plugin]).as_string()}\n"
            "nri_validator_tolerate_missing_plugins_annotation = "
            f"{tomlkit.item(fail_closed.tolerate_annotation).as_string()}\n"
        )
    return text


def crio_dropin_is_ours(text: str) -> bool:
    """Whether ``text`` is exactly a drop-in we write (for some socket and validator)."""
    try:
        nri = tomlkit.parse(text).unwrap().get("crio", {}).get("nri", {})
    except (tomlkit.exceptions.ParseError, AttributeError):
        return False
    if not isinstance(nri, dict):
        return False
    socket = nri.get("nri_listen")
    if socket is not None and not isinstance(socket, str):
        return False
    validator = nri.get(VALIDATOR)
    if validator is None:
        return text == crio_dropin(socket)
    plugins = validator.get("nri_validator_required_plugins") if isinstance(validator, dict) else None
    tolerate = validator.get("nri_validator_tolerate_missing_plugins_annotation") if plugins else None
    if not (isinstance(plugins, list) and len(plugins) == 1 and isinstance(plugins[0], str)):
        return False
    if not isinstance(tolerate, str):
        return False
    return text == crio_dropin(socket, FailClosed(plugins[0], tolerate))


def unified_diff(before: str | None, after: str | None, path: Path) -> str:
    a = [] if before is None else before.splitlines(keepends=True)
    b = [] if after is None else after.splitlines(keepends=True)
    return "".join(
        difflib.unified_diff(
            a, b, "/dev/null" if before is None else str(path), "/dev/null" if after is None else str(path)
        )
    )


# ---------------------------------------------------------------- file layer


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


CONFIG_LINK = "nri-gpu edits only a regular file: point --config at the real file"
OURS_LINK = "nri-gpu wrote a regular file there and follows no link; remove it by hand"
_KEYS = {
    "disable": bool,
    "disable_connections": bool,
    "socket_path": str,
    f"{VALIDATOR}.enable": bool,
    f"{VALIDATOR}.required_plugins": list,
    f"{VALIDATOR}.tolerate_missing_plugins_annotation": str,
}


def decode_utf8(data: bytes, path: Path) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise SetupError(f"{path}: not UTF-8 text") from exc


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def record_path(path: Path) -> Path:
    return path.with_name(path.name + RECORD_SUFFIX)


@dataclasses.dataclass(frozen=True)
class Record:
    """What install changed: whether it created the file, the keys (with the
    first original's values), and the hash of what it wrote last."""

    created: bool
    changes: list[Change]
    written_sha256: str

    def to_bytes(self) -> bytes:
        record = {
            "tool": "nri-gpu",
            "runtime": "containerd",
            "created": self.created,
            "changes": [dataclasses.asdict(c) for c in self.changes],
            "written_sha256": self.written_sha256,
        }
        return (json.dumps(record, indent=2) + "\n").encode()


def parse_record(data: bytes, source: str) -> Record:
    """The install record ``data``; SetupError naming ``source`` for anything else
    (the file is ours, so anything else was written by someone or something else)."""
    try:
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        created, changes, sha = value.get("created", False), value.get("changes"), value.get("written_sha256", "")
        if not isinstance(created, bool) or not isinstance(sha, str) or not isinstance(changes, list):
            raise ValueError("'created', 'changes' or 'written_sha256' has the wrong type")
        return Record(created, [_parse_change(c) for c in changes], sha)
    except (ValueError, RecursionError) as exc:
        why = str(exc)[:200]
        raise SetupError(f"{source}: unreadable install record ({why}); remove it by hand") from exc


def _parse_change(value: object) -> Change:
    if not isinstance(value, dict) or set(value) != {"key", "old", "new"}:
        raise ValueError("a change is not an object with exactly key, old and new")
    key, old, new = value["key"], value["old"], value["new"]
    kind = _KEYS.get(key) if isinstance(key, str) else None
    if kind is None:
        raise ValueError(f"{str(key)[:50]!r} is not a key nri-gpu sets")
    if not isinstance(new, kind) or not (old is None or isinstance(old, (bool, int, float, str, list))):
        raise ValueError(f"the values of {key!r} have the wrong type")
    for value in (old, new):
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise ValueError(f"the values of {key!r} have the wrong type")
    return Change(key, old, new)


def _load_record(folder: Folder, path: Path) -> Record | None:
    found = folder.read(record_path(path).name, if_link=OURS_LINK)
    return None if found is None else parse_record(found[0], str(record_path(path)))


def _merged(first: Record, changes: list[Change]) -> list[Change]:
    """``changes`` on top of an earlier install's: a key both set keeps the value it
    had before the first install, so that uninstall restores that one."""
    before = {c.key: c.old for c in first.changes}
    now = {c.key: c for c in changes}
    kept = [Change(c.key, c.old, now.pop(c.key).new) if c.key in now else c for c in first.changes]
    return kept + [Change(c.key, before.get(c.key, c.old), c.new) for c in now.values()]


def install_containerd(
    path: Path,
    socket: str | None,
    dry_run: bool = False,
    fail_closed: FailClosed | None = None,
    at: int | None = None,
) -> Result:
    with Folder(path.parent, create=not dry_run, at=at) as folder:
        return _install_containerd(folder, path, socket, dry_run, fail_closed)


def _install_containerd(
    folder: Folder, path: Path, socket: str | None, dry_run: bool, fail_closed: FailClosed | None
) -> Result:
    found = folder.read(path.name, if_link=CONFIG_LINK)
    record = _load_record(folder, path)
    if found is None:
        text = containerd_new_file(socket, fail_closed)
        result = Result(path, True, [f"{path}: created with NRI enabled ({NRI_HEADER} disable = false)"])
        result.diff = unified_diff(None, text, path)
        if not dry_run:
            written = [Change("disable", None, False), Change("disable_connections", None, False)]
            if socket is not None:
                written.append(Change("socket_path", None, socket))
            if fail_closed is not None:
                written += _validator_changes(None, fail_closed, str(path))
            folder.write(record_path(path).name, Record(True, written, sha256_hex(text.encode())).to_bytes())
            folder.write(path.name, text.encode())
        return result
    data, info = found
    before = decode_utf8(data, path)
    version = containerd_version(before, str(path))
    check_cri_enabled(before, str(path))
    changes = containerd_changes(before, socket, str(path), fail_closed)
    if not changes:
        if record is not None:
            return Result(
                path, False, [f"{path}: already set up ({NRI_HEADER} is as nri-gpu set it); nothing to change"]
            )
        if version == 3:
            return Result(path, False, [f"NRI is on by default in containerd 2.x; nothing to change ({path})"])
        return Result(
            path, False, [f"{path}: NRI is already enabled ({NRI_HEADER} disable = false); nothing to change"]
        )
    after = containerd_enable(before, changes, str(path))
    result = Result(
        path, True, [f"{path}: {NRI_HEADER} {c.key} = {_show(c.new)} (was {_show(c.old)})" for c in changes]
    )
    result.diff = unified_diff(before, after, path)
    # Installed before and untouched since: the backup and the values to restore
    # are the first install's, whatever this one changes.
    again = record is not None and record.written_sha256 == sha256_hex(data)
    if record is not None and not again:
        result.warnings.append(
            f"{path}: changed since the last install (our keys were undone); the earlier backup "
            f"{backup_path(path)} is replaced by the current file"
        )
    if not dry_run:
        if record is not None and again:
            new_record = Record(record.created, _merged(record, changes), sha256_hex(after.encode()))
        else:
            folder.write(backup_path(path).name, data, info)
            new_record = Record(False, changes, sha256_hex(after.encode()))
        folder.write(record_path(path).name, new_record.to_bytes())
        folder.write(path.name, after.encode(), info)
    return result


def _show(value: Any) -> str:
    return "unset" if value is None else tomlkit.item(value).as_string()


def uninstall_containerd(path: Path, dry_run: bool = False, at: int | None = None) -> Result:
    with Folder(path.parent, at=at) as folder:
        return _uninstall_containerd(folder, path, dry_run)


def _uninstall_containerd(folder: Folder, path: Path, dry_run: bool) -> Result:
    record = _load_record(folder, path)
    if record is None:
        return Result(path, False, [f"{path}: no install record ({record_path(path)}); nothing to undo"])
    found = folder.read(path.name, if_link=CONFIG_LINK)
    backup = backup_path(path)
    kept = None if record.created else folder.read(backup.name, if_link=OURS_LINK)
    if not record.created and kept is None:
        raise SetupError(f"{backup}: the backup of the original file is missing; not touching {path}")
    original = None if kept is None else kept[0]
    result = Result(path, True)
    if found is None:
        result.warnings.append(f"{path}: gone since install; only removing our record")
        result.changed = False
    elif sha256_hex(found[0]) == record.written_sha256:
        data, info = found
        if original is None:
            result.messages.append(f"{path}: removed (nri-gpu created it)")
            result.diff = unified_diff(decode_utf8(data, path), None, path)
        else:
            result.messages.append(f"{path}: restored byte for byte from {backup}")
            result.diff = unified_diff(decode_utf8(data, path), decode_utf8(original, backup), path)
        if not dry_run:
            if original is None:
                folder.remove(path.name)
            else:
                folder.write(path.name, original, info)
    else:
        data, info = found
        before = decode_utf8(data, path)
        after, warnings = containerd_revert(before, record.changes, str(path))
        result.warnings.append(f"{path}: changed since install; reverting only nri-gpu's keys in {NRI_HEADER}")
        result.warnings += warnings
        result.messages.append(f"{path}: reverted {NRI_HEADER} keys " + ", ".join(c.key for c in record.changes))
        result.diff = unified_diff(before, after, path)
        result.changed = after != before
        if not dry_run and result.changed:
            folder.write(path.name, after.encode(), info)
    if not dry_run:
        folder.remove(backup.name)
        folder.remove(record_path(path).name)
    return result


def install_crio(
    dropin_dir: Path,
    socket: str | None,
    dry_run: bool = False,
    fail_closed: FailClosed | None = None,
    at: int | None = None,
) -> Result:
    path = dropin_dir / CRIO_DROPIN_NAME
    text = crio_dropin(socket, fail_closed)
    what = "[crio.nri] enable_nri = true" + (
        f", [crio.nri.{VALIDATOR}] nri_enable_default_validator = true" if fail_closed else ""
    )
    with Folder(dropin_dir, create=not dry_run, at=at) as folder:
        found = folder.read(CRIO_DROPIN_NAME, if_link=OURS_LINK)
        before = None
        if found is not None:
            if found[0] == text.encode():
                return Result(path, False, [f"{path}: already set up ({what}); nothing to change"])
            before = found[0].decode(errors="replace")
            # Ours from an earlier install (another socket, with or without the
            # validator): the file is ours to rewrite; anything else is not.
            if not crio_dropin_is_ours(before):
                raise SetupError(
                    f"{path}: exists with other content; not overwriting it "
                    f"(run nri-gpu uninstall --runtime crio, or remove it, then install again)"
                )
        result = Result(path, True, [f"{path}: {'created' if before is None else 'rewritten'} ({what})"])
        result.diff = unified_diff(before, text, path)
        if not dry_run:
            folder.write(CRIO_DROPIN_NAME, text.encode())
        return result


def uninstall_crio(dropin_dir: Path, dry_run: bool = False, at: int | None = None) -> Result:
    path = dropin_dir / CRIO_DROPIN_NAME
    with Folder(dropin_dir, at=at) as folder:
        found = folder.read(CRIO_DROPIN_NAME, if_link=OURS_LINK)
        if found is None:
            return Result(path, False, [f"{path}: not there; nothing to undo"])
        text = found[0].decode(errors="replace")
        if not crio_dropin_is_ours(text):
            raise SetupError(
                f"{path}: changed since nri-gpu wrote it; left in place (remove it by hand if it should go)"
            )
        result = Result(path, True, [f"{path}: removed"], unified_diff(text, None, path))
        if not dry_run:
            folder.remove(CRIO_DROPIN_NAME)
        return result


def install(
    runtime: str,
    config: Path | None,
    socket: str | None,
    dry_run: bool = False,
    fail_closed: FailClosed | None = None,
    at: int | None = None,
) -> Result:
    """``at``: a descriptor of the config's folder (containerd) or of the drop-in
    folder (CRI-O), already looked up; ``config`` then only names it."""
    if runtime == "containerd":
        return install_containerd(config or Path(CONTAINERD_CONFIG), socket, dry_run, fail_closed, at)
    return install_crio(config or Path(CRIO_DROPIN_DIR), socket, dry_run, fail_closed, at)


def uninstall(runtime: str, config: Path | None, dry_run: bool = False, at: int | None = None) -> Result:
    if runtime == "containerd":
        return uninstall_containerd(config or Path(CONTAINERD_CONFIG), dry_run, at)
    return uninstall_crio(config or Path(CRIO_DROPIN_DIR), dry_run, at)
