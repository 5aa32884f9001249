"""Which Debian mirror the host uses, read from its apt sources at run time.

The test bed downloads from the same mirror the machine already trusts (a CI cache
proxy, a snapshot, or the public one), so no host name is written into the project.
The main Debian entry is the one whose suites include the host's own codename (from
/etc/os-release): that tells it apart from debian-security and third-party repos.
Both the deb822 ``*.sources`` and the one-line ``sources.list`` formats are read;
``$NRI_GPU_DEBIAN_MIRROR`` overrides everything.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_KEYRING", "SourcesError", "debian_mirror"]

DEFAULT_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


class SourcesError(RuntimeError):
    """The host's apt sources name no usable Debian mirror."""


@dataclass(frozen=True)
class SourceEntry:
    """One apt source (the first URI of a deb822 stanza)."""

    types: tuple[str, ...]
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str  # a keyring path, or "" (inline keys and no Signed-By alike)


def debian_mirror() -> tuple[str, Path]:
    """Return (URI, keyring) of the system's main Debian entry.

    The main entry is the one whose suites include the host's own codename (from
    /etc/os-release), which tells it apart from debian-security and third-party repos.
    Raises SourcesError if the system has no such entry and ``$NRI_GPU_DEBIAN_MIRROR`` is unset.
    """
    override = os.environ.get("NRI_GPU_DEBIAN_MIRROR")
    if override:
        return override.rstrip("/"), DEFAULT_KEYRING
    codename = _os_codename()
    for entry in _system_source_entries():
        if "deb" in entry.types and codename in entry.suites and "main" in entry.components:
            keyring = Path(entry.signed_by) if entry.signed_by else DEFAULT_KEYRING
            return entry.uri.rstrip("/"), keyring
    raise SourcesError(
        f"no Debian entry for suite {codename!r} with component main in the apt sources "
        "(/etc/apt/sources.list, /etc/apt/sources.list.d/); set NRI_GPU_DEBIAN_MIRROR"
    )


def _os_codename() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "bookworm"


def _system_source_entries() -> list[SourceEntry]:
    """Parse the deb822 ``*.sources`` and one-line ``*.list`` files of the host."""
    etc = Path("/etc/apt")
    entries: list[SourceEntry] = []
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        entries += _parse_deb822(path.read_text())
    one_line = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    for path in one_line:
        if path.is_file():
            entries += _parse_one_line(path.read_text())
    return entries


def _parse_deb822(text: str) -> list[SourceEntry]:
    entries = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0] in " \t" and key:  # continuation line
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if not fields.get("uris") or fields.get("enabled", "yes").lower() == "no":
            continue
        signed_by = fields.get("signed-by", "")
        entries.append(
            SourceEntry(
                types=tuple(fields.get("types", "").split()),
                uri=fields["uris"].split()[0],
                suites=tuple(fields.get("suites", "").split()),
                components=tuple(fields.get("components", "").split()),
                signed_by=signed_by if signed_by.startswith("/") else "",
            )
        )
    return entries


def _parse_one_line(text: str) -> list[SourceEntry]:
    entries = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        opts = ""
        match = re.match(r"^(\S+)\s+\[([^\]]*)\]\s+(.*)$", line)
        if match:
            typ, opts, rest = match.groups()
        else:
            typ, _, rest = line.partition(" ")
        parts = rest.split()
        if len(parts) < 2:
            continue
        signed = re.search(r"signed-by=(\S+)", opts)
        entries.append(
            SourceEntry(
                types=(typ,),
                uri=parts[0],
                suites=(parts[1],),
                components=tuple(parts[2:]),
                signed_by=signed.group(1) if signed else "",
            )
        )
    return entries
