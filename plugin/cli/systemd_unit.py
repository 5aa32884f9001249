"""The systemd units that keep the CDI spec true on a host with no resident plugin.

``nri-gpu install --runtime docker|podman`` writes the spec once; it names the
driver's files by version, so a driver upgrade would leave every GPU container of
Docker or podman failing on files that are gone. Where ``nri-gpu run`` serves the
node, its ``[cdi] spec`` keeps the spec true; elsewhere these two units do:

* ``nri-gpu-cdi.service``, a oneshot that runs ``nri-gpu cdi generate --output
  SPEC`` (with the flags install was given) at boot, once the modules are loaded;
* ``nri-gpu-cdi.path``, which starts it again when the driver changes: when
  ``depmod`` rewrites ``/lib/modules/<release>/modules.dep`` (a kernel module
  installed or removed, as NVIDIA's ``nvidia-cdi-refresh.path`` watches) and when
  ``ldconfig`` rewrites the driver root's ``/etc/ld.so.cache`` (new driver
  libraries: the spec is made from that cache, and a user-space upgrade need not
  touch the kernel module).

Unlike ``nvidia-cdi-refresh.service`` the service has no ``RemainAfterExit``: an
active (exited) oneshot is not started again, so the path unit's later triggers
would do nothing.

The text layer is pure; the file layer writes through ``nri_gpu.plugin.cli.config_files`` (by
descriptor, links refused). A unit file carries a first line of ours: install
rewrites and uninstall removes only such files, and uninstall refuses while a unit
is enabled (its ``.wants`` link would dangle): ``systemctl disable`` first, which
``--restart`` does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from nri_gpu.plugin.cli.config_files import Folder
from nri_gpu.plugin.cli.hook_install import check_folder, check_hook, check_install
from nri_gpu.plugin.cli.runtime_setup import OURS_LINK, Result, SetupError, unified_diff

__all__ = [
    "PATH_UNIT",
    "SERVICE",
    "UNITS",
    "UNIT_DIR",
    "disable_command",
    "enable_command",
    "enabled_links",
    "exec_start",
    "install_units",
    "planned_units",
    "refuse_if_enabled",
    "uninstall_units",
    "unit_texts",
]

UNIT_DIR = "/etc/systemd/system"
SERVICE = "nri-gpu-cdi.service"
PATH_UNIT = "nri-gpu-cdi.path"
UNITS = (SERVICE, PATH_UNIT)
_WANTED_BY = "multi-user.target"
_MARK = "# Written by nri-gpu install --runtime docker|podman; nri-gpu uninstall removes it."

# What a word of a unit may hold: systemd gives meaning to %, $, \, quotes, ; and
# white space in ExecStart= and paths, so a value with any of them is refused, not escaped.
_SAFE = re.compile(r"[A-Za-z0-9_./,:=+@-]+")


def _safe(value: str, what: str) -> str:
    if not _SAFE.fullmatch(value):
        raise SetupError(f"{what} {value!r}: a systemd unit names only values of letters, digits and _ . / , : = + @ -")
    return value


def exec_start(nri_gpu: str, spec: Path, flags: Sequence[str]) -> list[str]:
    """The command the service runs: this install's ``nri-gpu cdi generate`` with
    ``flags`` (the hook's path, the roots and capabilities install was given), each
    word checked."""
    if not nri_gpu.startswith("/"):
        raise SetupError(f"the nri-gpu path {nri_gpu!r} is not absolute")
    if not spec.is_absolute():
        raise SetupError(f"the spec path {str(spec)!r} is not absolute")
    argv = [nri_gpu, "cdi", "generate", "--output", str(spec), *flags]
    return [_safe(word, "unit command word") for word in argv]


def unit_texts(argv: Sequence[str], driver_root: str = "/") -> dict[str, str]:
    """The two unit files (name -> text) for the service command ``argv``; the path
    unit watches ``driver_root``'s ld.so cache."""
    words = [_safe(word, "unit command word") for word in argv]
    cache = str(Path(_safe(driver_root, "driver root")) / "etc/ld.so.cache")
    service = f"""{_MARK}
[Unit]
Description=Write the CDI spec of this node's GPUs for Docker and podman (nri-gpu)
After=systemd-modules-load.service nvidia-persistenced.service

[Service]
Type=oneshot
ExecStart={" ".join(words)}

[Install]
WantedBy={_WANTED_BY}
"""
    path = f"""{_MARK}
[Unit]
Description=Rewrite nri-gpu's CDI spec when the NVIDIA driver changes

[Path]
PathChanged=/lib/modules/%v/modules.dep
PathChanged=/lib/modules/%v/modules.dep.bin
PathChanged={cache}
Unit={SERVICE}

[Install]
WantedBy={_WANTED_BY}
"""
    return {SERVICE: service, PATH_UNIT: path}


def planned_units(
    nri_gpu: str, hook: str, spec: Path, flags: Sequence[str], driver_root: str | None, unit_dir: Path
) -> dict[str, str]:
    """The unit files for this install, refused (SetupError, every problem named) when
    a user other than root could change what they run or where they write: ``nri-gpu``
    itself (a Python console script, and everything it imports) and ``hook``, the hook
    its spec names (as ``cdi generate`` checks it, and no ``--allow-untrusted-hook``
    here: a unit runs unattended at every boot), the spec's folder, the roots in
    ``flags`` and the unit folder."""
    argv = exec_start(nri_gpu, spec, ["--hook-path", hook, *flags])
    problems = check_install(nri_gpu) + check_hook(hook)
    folders = [str(spec.parent), str(unit_dir), *(flags[i + 1] for i, f in enumerate(flags) if f.endswith("-root"))]
    for folder in dict.fromkeys(folders):
        problems += check_folder(folder)
    if problems:
        raise SetupError(
            "the systemd unit would run, as root at every boot, what users other than root can change: "
            + "; ".join(problems)
            + " (--no-unit writes none)"
        )
    return unit_texts(argv, driver_root or "/")


def enable_command() -> list[list[str]]:
    """What ``--restart`` runs after install wrote or changed the units."""
    return [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", PATH_UNIT, SERVICE]]


def disable_command() -> list[str]:
    """What ``--restart`` runs before uninstall removes the units."""
    return ["systemctl", "disable", "--now", PATH_UNIT, SERVICE]


def enabled_links(unit_dir: Path) -> list[Path]:
    """The ``.wants`` links ``systemctl enable`` made for our units in ``unit_dir``."""
    wants = unit_dir / f"{_WANTED_BY}.wants"
    return [wants / name for name in UNITS if (wants / name).is_symlink() or (wants / name).exists()]


def _is_ours(data: bytes) -> bool:
    return data.split(b"\n", 1)[0] == _MARK.encode()


def install_units(unit_dir: Path, texts: Mapping[str, str], dry_run: bool, result: Result) -> bool:
    """Write ``texts`` into ``unit_dir`` (a unit not written by nri-gpu is refused before
    anything is written); whether any file changed."""
    changed = False
    with Folder(unit_dir, create=not dry_run) as folder:
        found = {name: folder.read(name, if_link=OURS_LINK) for name in texts}
        for name, now in found.items():
            if now is not None and not _is_ours(now[0]):
                raise SetupError(f"{unit_dir / name}: exists and was not written by nri-gpu; not overwriting it")
        for name, text in texts.items():
            now = found[name]
            if now is not None and now[0] == text.encode():
                result.messages.append(f"{unit_dir / name}: current; nothing to change")
                continue
            before = None if now is None else now[0].decode(errors="replace")
            result.messages.append(f"{unit_dir / name}: {'written' if now is None else 'rewritten'}")
            result.diff += unified_diff(before, text, unit_dir / name)
            result.changed = changed = True
            if not dry_run:
                folder.write(name, text.encode(), None if now is None else now[1])
    return changed


def refuse_if_enabled(unit_dir: Path) -> None:
    """SetupError while a unit of ours is enabled: removing it would leave systemd a
    ``.wants`` link to a file that is gone."""
    links = enabled_links(unit_dir)
    if links:
        raise SetupError(
            f"{', '.join(map(str, links))}: the units are enabled; run {' '.join(disable_command())} first "
            "(or pass --restart)"
        )


def uninstall_units(unit_dir: Path, dry_run: bool, result: Result) -> bool:
    """Remove our unit files from ``unit_dir`` (refused while a unit is enabled, unless
    ``dry_run``); whether any was there."""
    if not dry_run:
        refuse_if_enabled(unit_dir)
    removed = False
    with Folder(unit_dir) as folder:
        for name in UNITS:
            now = folder.read(name, if_link=OURS_LINK)
            if now is None:
                continue
            if not _is_ours(now[0]):
                result.warnings.append(f"{unit_dir / name}: not written by nri-gpu; left in place")
                continue
            result.messages.append(f"{unit_dir / name}: removed")
            result.diff += unified_diff(now[0].decode(errors="replace"), None, unit_dir / name)
            result.changed = removed = True
            if not dry_run:
                folder.remove(name)
    return removed
