"""The container's ld.so.cache as the image built it, plus the driver libraries.  (pure)

Why not run ldconfig at container start: it costs a process (fork, confine,
exec, scan every library folder of the image, ~12 ms and more on a large
image) on the path of every GPU container, and its output depends only on
the image's libraries, which the image's own cache already lists, plus ours,
which the plan knows exactly (the node's cache gave their names, flags and
ABI notes). So ``merge`` takes the image's entries as they are and inserts
ours where glibc's ldconfig would have put them, and ``encode`` writes the
result in the format ldconfig writes since glibc 2.32 (every glibc from 2.3
on reads it).

Where ldconfig puts an entry (``elf/cache.c``, ``add_to_cache`` and
``compare``): the list is sorted by library name *descending* in
``_dl_cache_libcmp`` order (runs of digits compare as numbers), then flags
descending, ``glibc-hwcaps`` entries before plain ones, more hwcap bits first,
higher osversion first; a new entry goes after the entries it ties with. The
dynamic loader binary-searches this order, so it must be reproduced exactly,
down to C's signed ``char`` and ``int`` arithmetic. Ours go *before* their
ties instead: ldconfig scans our folders first (``00-nri-gpu.conf``), so in a
full rebuild ours would have been added first.

What the merge does not do that a rebuild would: list libraries the image put
in its folders without running ldconfig. The container sees the loader
configuration its image shipped, plus the driver; the ``rebuild`` mode
(``engine.ld_cache``) runs the trusted ldconfig for images that need it.
"""

from __future__ import annotations

import bisect
import functools
import struct
from collections.abc import Iterable, Sequence

from nri_gpu.engine.ldcache import (
    EXTENSION_MAGIC,
    EXTENSION_TAG_GENERATOR,
    EXTENSION_TAG_HWCAPS,
    NEW_MAGIC,
    NEW_VERSION,
    LdCache,
    check_deadline,
    is_hwcaps_entry,
)
from nri_gpu.engine.model import LdCacheEntry

__all__ = ["GENERATOR", "encode", "libcmp", "merge"]

GENERATOR = "nri-gpu: the image's cache with the NVIDIA driver libraries added"

_HEADER = struct.Struct("<17s3sIIB3xI12x")  # as ldcache._NEW_HEADER: 48 bytes
_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap: 24 bytes
_EXTENSION = struct.Struct("<II")
_SECTION = struct.Struct("<IIII")
_LITTLE_ENDIAN = 2
_INT_MIN, _INT_RANGE = -(1 << 31), 1 << 32
_CHUNK = 4096  # entries written between two looks at the deadline


def _int(value: int) -> int:
    """``value`` as a C ``int`` (two's complement, 32 bits) after overflow."""
    return (value - _INT_MIN) % _INT_RANGE + _INT_MIN


def _char(byte: int) -> int:
    """A byte as x86's signed ``char``."""
    return byte - 256 if byte > 127 else byte


def _digit(byte: int) -> bool:
    return 48 <= byte <= 57


def libcmp(left: str, right: str) -> int:
    """glibc's ``_dl_cache_libcmp``: <0, 0, >0 as ``left`` sorts before, with or
    after ``right`` (digit runs as numbers; names with bytes >= 0x80 or digit runs
    past ``int`` compare as glibc's C does on x86-64, overflow included).

    >>> libcmp("libc.so.10", "libc.so.9") > 0, libcmp("libz.so.1", "libz.so.1"), libcmp("a", "ab") < 0
    (True, 0, True)
    """
    p1 = left.encode("utf-8", "surrogateescape") + b"\0"
    p2 = right.encode("utf-8", "surrogateescape") + b"\0"
    i = j = 0
    while p1[i] != 0:
        c1, c2 = p1[i], p2[j]
        if _digit(c1):
            if not _digit(c2):
                return 1
            val1, val2 = c1 - 48, c2 - 48
            i, j = i + 1, j + 1
            while _digit(p1[i]):
                val1 = _int(val1 * 10 + p1[i] - 48)
                i += 1
            while _digit(p2[j]):
                val2 = _int(val2 * 10 + p2[j] - 48)
                j += 1
            if val1 != val2:
                return _int(val1 - val2)
        elif _digit(c2):
            return -1
        elif c1 != c2:
            return _char(c1) - _char(c2)
        else:
            i, j = i + 1, j + 1
    return _char(p1[i]) - _char(p2[j])


def _bits(hwcap: int) -> int:
    return bin(hwcap).count("1")


def _compare(e1: LdCacheEntry, e2: LdCacheEntry) -> int:
    """ldconfig's ``compare(e1, e2)``: >0 when ``e1`` goes after ``e2``. Two
    ``glibc-hwcaps`` entries (only ever both the image's) keep their order."""
    res = libcmp(e2.name, e1.name)
    if res != 0:
        return res
    if e1.flags != e2.flags:
        return 1 if e1.flags < e2.flags else -1
    ext1, ext2 = is_hwcaps_entry(e1), is_hwcaps_entry(e2)
    if ext1 or ext2:
        return 0 if ext1 and ext2 else -1 if ext1 else 1
    for a, b in ((_bits(e1.hwcap), _bits(e2.hwcap)), (e1.hwcap, e2.hwcap), (e1.osversion, e2.osversion)):
        if a != b:
            return 1 if b > a else -1
    return 0


_KEY = functools.cmp_to_key(_compare)


def merge(image: LdCache, ours: Iterable[LdCacheEntry], *, deadline: float | None = None) -> LdCache:
    """``image``'s entries with ``ours`` inserted as ldconfig would (see the module
    doc). An image entry for the same name at the same path as one of ours is the
    same library: ours replaces it. The image's order is kept as it is, sorted or
    not (an unsorted cache only misleads its own container's loader). A
    ``glibc-hwcaps`` entry whose subdirectory name is missing (a malformed
    extension) is dropped: no loader can use it. Raises ``LdCacheLimit`` past
    ``deadline`` (``time.monotonic``)."""
    ours = tuple(ours)
    replaced = {(e.name, e.path) for e in ours}
    merged = [e for e in image.entries if (e.name, e.path) not in replaced and _named(e, image.hwcaps)]
    for entry in ours:
        check_deadline(deadline, "the merge")
        merged.insert(bisect.bisect_left(merged, _KEY(entry), key=_KEY), entry)
    return LdCache(tuple(merged), image.hwcaps)


def _named(entry: LdCacheEntry, hwcaps: tuple[str, ...]) -> bool:
    return not is_hwcaps_entry(entry) or (entry.hwcap & 0xFFFFFFFF) < len(hwcaps)


def encode(cache: LdCache, generator: str = GENERATOR, *, deadline: float | None = None) -> bytes:
    """The bytes of ``cache`` in glibc's new format (little-endian), with an
    extension directory naming ``generator`` (``ldconfig -p`` prints it) and, if
    ``cache.hwcaps`` is not empty, the ``glibc-hwcaps`` names its entries index.
    Raises ``LdCacheLimit`` past ``deadline`` (``time.monotonic``)."""
    strings = _StringTable(_HEADER.size + _ENTRY.size * len(cache.entries))
    rows: list[bytes] = []
    for i in range(0, len(cache.entries), _CHUNK):
        check_deadline(deadline, "writing the merged cache")
        rows += [
            _ENTRY.pack(e.flags, strings.add(e.name), strings.add(e.path), e.osversion, e.hwcap)
            for e in cache.entries[i : i + _CHUNK]
        ]
    hwcap_offsets = [strings.add(name) for name in cache.hwcaps]
    table = strings.data()
    extension_offset = -(-(strings.end) // 4) * 4
    header = _HEADER.pack(NEW_MAGIC, NEW_VERSION, len(cache.entries), len(table), _LITTLE_ENDIAN, extension_offset)
    text = generator.encode("utf-8", "surrogateescape")
    sections = 2 if hwcap_offsets else 1
    data_start = extension_offset + _EXTENSION.size + sections * _SECTION.size
    hwcaps = struct.pack(f"<{len(hwcap_offsets)}I", *hwcap_offsets)
    directory = _EXTENSION.pack(EXTENSION_MAGIC, sections) + _SECTION.pack(
        EXTENSION_TAG_GENERATOR, 0, data_start + len(hwcaps), len(text)
    )
    if hwcap_offsets:
        directory += _SECTION.pack(EXTENSION_TAG_HWCAPS, 0, data_start, len(hwcaps))
    padding = b"\0" * (extension_offset - strings.end)
    return b"".join((header, *rows, table, padding, directory, hwcaps, text))


class _StringTable:
    """NUL-terminated strings, each stored once; offsets count from the file's start."""

    def __init__(self, start: int) -> None:
        self._offsets: dict[str, int] = {}
        self._parts: list[bytes] = []
        self.end = start

    def add(self, text: str) -> int:
        found = self._offsets.get(text)
        if found is None:
            raw = text.encode("utf-8", "surrogateescape") + b"\0"
            found = self._offsets[text] = self.end
            self._parts.append(raw)
            self.end += len(raw)
        return found

    def data(self) -> bytes:
        return b"".join(self._parts)


def sorted_like_ldconfig(entries: Sequence[LdCacheEntry]) -> list[LdCacheEntry]:
    """``entries`` in ldconfig's order (stable: ties keep their order). For tests
    and tools; ``merge`` never re-sorts the image's entries."""
    return sorted(entries, key=_KEY)
