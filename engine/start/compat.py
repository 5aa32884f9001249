"""The image's CUDA compat folder, read in the container's root for the decision
of ``engine.cudacompat``.

The folder is image data (the NVIDIAScape CVE, 2025-23266, lived in the
toolkit's handling of it), so it is read like every other file of the start
work: resolved in the container's root by descriptor (``RootDir``: links
followed as the container follows them, never out of its root, no ``/proc``
magic link, never across a mount), through the ``nodev`` copy of the root (a
device node cannot be opened), each file opened once with ``O_NONBLOCK`` and
checked with ``fstat`` (a FIFO is never waited on, only regular files are
read), and bounded: at most ``MAX_ENTRIES`` folder entries, and of each
library a few ``pread``s of at most 64 KiB (its ELF headers, its dynamic
section, the soname, its notes), never the whole file.

Nothing here fails the start: whatever the folder holds, a reason why the
driver's libraries are used instead is the worst outcome.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from nri_gpu.engine.cudacompat import (
    COMPAT_DIR,
    MAX_ENTRIES,
    NOTE_SECTION,
    Decision,
    Note,
    candidate,
    decide,
    library_key,
    looks_like_library,
    parse_note,
)
from nri_gpu.engine.model import LdCacheEntry
from nri_gpu.engine.start import elf
from nri_gpu.engine.start.rootdir import READ, RootDir, describe

__all__ = ["Compat", "check"]

_FILE, _LINK, _OTHER = "file", "link", "other"
_MAX_OFFSET = (1 << 63) - 1
_USED = ": the driver's libraries are used"
LIBCUDA = "libcuda.so.1"


@dataclass(frozen=True)
class Compat:
    """The decision (None: no compat folder, or no ``libcuda.so.*.*`` in it: nothing
    to say) and, when the folder is used, the cache entries of its libraries as
    ``ldconfig`` would list them with the folder first."""

    decision: Decision | None = None
    entries: tuple[LdCacheEntry, ...] = ()

    @property
    def folder(self) -> str | None:
        return COMPAT_DIR if self.decision is not None and self.decision.use else None

    @property
    def note(self) -> str:
        return "" if self.decision is None else self.decision.reason


def check(root: RootDir, host_version: str) -> Compat:
    """Look at ``/usr/local/cuda/compat`` in ``root`` (the ``nodev`` copy of the
    container's root) for a driver ``host_version``. Never raises for what the
    image holds."""
    try:
        listing = _listing(root)
    except _Skip as exc:
        return Compat(Decision(False, str(exc)))
    if listing is None:
        return Compat()
    name, why = candidate(sorted(listing))
    if name is None:
        return Compat(Decision(False, why) if why else None)
    try:
        if listing[name] == _OTHER:
            raise _Skip(f"{COMPAT_DIR}/{name} is neither a file nor a link{_USED}")
        note = _note(root, name)
    except _Skip as exc:
        return Compat(Decision(False, str(exc), name))
    decision = decide(name, note, host_version)
    if not decision.use:
        return Compat(decision)
    return Compat(decision, _entries(root, listing))


class _Skip(Exception):
    """Why the compat folder is not used (one line)."""


def _listing(root: RootDir) -> dict[str, str] | None:
    """The folder's entries and their kinds (not following links); None without one."""
    try:
        fd = root.open(COMPAT_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC, resolve=READ)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _Skip(describe(exc, COMPAT_DIR) + _USED) from exc
    found: dict[str, str] = {}
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if len(found) >= MAX_ENTRIES:
                    raise _Skip(f"{COMPAT_DIR}: over {MAX_ENTRIES} entries{_USED}")
                if entry.is_symlink():
                    found[entry.name] = _LINK
                elif entry.is_file(follow_symlinks=False):
                    found[entry.name] = _FILE
                else:
                    found[entry.name] = _OTHER
    except OSError as exc:
        raise _Skip(describe(exc, COMPAT_DIR) + _USED) from exc
    finally:
        os.close(fd)
    return found


def _with_file(root: RootDir, name: str, use: Callable[[elf.Read], object]) -> object:
    """``use(read)`` on the regular file ``name`` of the folder (links followed in
    the root, not across a mount). Raises ``_Skip``."""
    path = f"{COMPAT_DIR}/{name}"
    try:
        fd = root.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, resolve=READ)
    except OSError as exc:
        raise _Skip(describe(exc, path) + _USED) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Skip(f"{path}: not a regular file{_USED}")
        return use(lambda offset, size: _pread(fd, size, offset))
    except (ValueError, OSError) as exc:
        raise _Skip(f"{path}: {exc}{_USED}") from exc
    finally:
        os.close(fd)


def _pread(fd: int, size: int, offset: int) -> bytes:
    """``os.pread``, with an offset no file can reach read as the end of the file:
    pread takes a signed 64-bit offset, and a header can name any 64-bit one."""
    return os.pread(fd, size, offset) if offset <= _MAX_OFFSET else b""


def _note(root: RootDir, name: str) -> Note | None:
    """The candidate's note, once it is known to be a 64-bit ``libcuda.so.1`` (the
    toolkit takes any file of that name: one that is no CUDA driver library, an
    image's mislabelled file, has nothing to be compatible with)."""

    def read_note(read: elf.Read) -> Note | None:
        lib = elf.shared_library(read)
        if lib is None or lib.soname != LIBCUDA:
            what = "no 64-bit shared library" if lib is None else f"its soname is {str(lib.soname)[:100]!r}"
            raise _Skip(f"{COMPAT_DIR}/{name} is not a {LIBCUDA} ({what}){_USED}")
        found = elf.note_section(read, NOTE_SECTION)
        if found is None:
            return None
        section, little, align = found
        return parse_note(section, little_endian=little, align=align)

    note = _with_file(root, name, read_note)
    assert note is None or isinstance(note, Note)
    return note


def _entries(root: RootDir, listing: dict[str, str]) -> tuple[LdCacheEntry, ...]:
    """The folder's libraries under the names ``ldconfig`` lists them by, at
    ``<folder>/<name>``: one per name, files before links (as ``ldconfig``
    prefers them). One that is no ELF library is left out, as ``ldconfig`` does."""
    by_key: dict[str, LdCacheEntry] = {}
    for kind in (_FILE, _LINK):
        for name in sorted(n for n, k in listing.items() if k == kind and looks_like_library(n)):
            try:
                lib = _with_file(root, name, elf.shared_library)
            except _Skip:
                continue
            if not isinstance(lib, elf.SharedLibrary):
                continue
            key = library_key(name, lib.soname, is_link=kind == _LINK)
            if key not in by_key and "/" not in key and key not in (".", ".."):
                by_key[key] = LdCacheEntry(key, f"{COMPAT_DIR}/{key}", lib.flags, True, 0, lib.osversion)
    return tuple(by_key[key] for key in sorted(by_key))
