"""glibc's ``/etc/ld.so.cache``, read without glibc.  (pure)

Theory of operation. ldconfig writes one of three layouts (glibc's
``sysdeps/generic/dl-cache.h`` and ``elf/cache.c``; all fields native-endian,
and we read little-endian only):

* **new** (the default since glibc 2.32): a 48-byte header, ``nlibs`` entries
  of 24 bytes, then ``len_strings`` bytes of NUL-terminated strings and
  optionally an extension directory (which we do not need)::

      0   "glibc-ld.so.cache" "1.1"           magic + version, 20 bytes
      20  uint32 nlibs, uint32 len_strings
      28  uint8 flags (low two bits: 0 unknown, 1 invalid, 2 little, 3 big endian)
      29  3 bytes padding, uint32 extension_offset, 3 x uint32 unused
      48  entries: int32 flags, uint32 key, uint32 value, uint32 osversion, uint64 hwcap

  ``key`` (the library name) and ``value`` (its path) are offsets from the
  start of this header. The extension directory (glibc >= 2.33; at a file
  offset, a multiple of 4): uint32 magic 0xeaa42174, uint32 count, then
  ``count`` sections of uint32 tag, flags, offset (from the file's start),
  size. Tag 1 lists the ``glibc-hwcaps`` subdirectory names as uint32 string
  offsets; an entry whose ``hwcap`` has bit 62 set (alone among the high bits
  above the ISA level) is in the subdirectory its low 32 bits index.
* **old** (``ld.so-1.7.0``, libc5 and glibc 2.0/2.1): a 16-byte header (11
  magic bytes, a NUL, uint32 ``nlibs``), entries of 12 bytes (int32 flags,
  uint32 key, uint32 value), then the strings; offsets count from the end of
  the entries.
* **compat** (the default before glibc 2.32): an old cache whose string table
  starts with a complete new cache, placed at the end of the old entries
  rounded up to 8 bytes. Like glibc, we read the new part when it is there
  and carries the new magic and version, else the old part.

Every way the bytes can be wrong is a ``DiscoveryError`` naming the field or
offset; counts are checked against the size before anything is unpacked, a
string is at most ``MAX_STRING`` bytes and all strings together at most
``_DECODE_FACTOR`` times the file, so a hostile file can neither make us
allocate much nor loop long. On top of that, limits no real cache comes near
(``LdCacheLimit``, a ``DiscoveryError``): at most ``MAX_CACHE_SIZE`` bytes
(checked first), at most ``MAX_ENTRIES`` entries (checked before any entry is
unpacked), and an optional deadline checked as the entries are built, so a
cache made to be big (64 MiB holds 2.8 million entries: half a gigabyte of
objects, seconds of work) costs a container start nothing but a clear error.

Speed: the entries are unpacked into columns with ``array`` slices, and the
strings of a table shaped as ldconfig writes it are found in bulk (a split at
the NULs, dictionary lookups, suffix slices); only what that does not resolve
is looked up one offset at a time, and anything odd makes the careful
one-by-one pass decide (and name the fault). About 2 us an entry, most of it
building the ``LdCacheEntry`` objects.
"""

from __future__ import annotations

import struct
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import getitem, le, sub
from typing import cast

from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.model import LdCacheEntry

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache"
NEW_VERSION = b"1.1"

_OLD_HEADER = struct.Struct("<11sxI")  # magic, NUL, nlibs: 16 bytes
_OLD_ENTRY_WORDS = 3  # int32 flags, uint32 key, uint32 value: 12 bytes
_NEW_HEADER = struct.Struct("<17s3sIIB3xI12x")  # magic, version, nlibs, len_strings, flags, extension_offset: 48
_NEW_ENTRY_WORDS = 6  # int32 flags, uint32 key, uint32 value, uint32 osversion, uint64 hwcap: 24 bytes
_NEW_ALIGN = 8  # alignof(struct cache_file_new): where the new part starts in a compat cache
EXTENSION_MAGIC = 0xEAA42174
EXTENSION_TAG_GENERATOR = 0
EXTENSION_TAG_HWCAPS = 1
HWCAP_EXTENSION = 1 << 62
_ISA_LEVEL_BITS = 10
_EXTENSION = struct.Struct("<II")  # magic, count
_SECTION = struct.Struct("<IIII")  # tag, flags, offset, size
_MAX_HWCAPS = 64  # glibc knows four x86-64 levels and a handful elsewhere

_ENDIAN_MASK = 0x03
_ENDIAN_UNSET, _ENDIAN_INVALID, _ENDIAN_LITTLE, _ENDIAN_BIG = 0, 1, 2, 3

FLAG_REQUIRED_MASK = 0xFF00
# The required-ABI values (ldconfig.h) whose libraries are 64-bit (LP64):
# sparc64, ia64, x86-64, s390x, ppc64, mips64 n64 (and its nan2008 variant),
# aarch64, loongarch64 (soft and double float). Left out: 0 (i386, arm, ...),
# mips n32 and x32 (64-bit ISA, 32-bit pointers), arm hf/sf, and RISC-V, whose
# flags name only the float ABI and are the same for rv32 and rv64.
_LIB64_ABIS = frozenset({0x0100, 0x0200, 0x0300, 0x0400, 0x0500, 0x0700, 0x0A00, 0x0E00, 0x1100, 0x1200})

MAX_STRING = 4096  # PATH_MAX: no library name or path in a real cache is longer
_DECODE_FACTOR = 16  # decoded text allowed per byte of cache (real caches: about 1)
# Real caches: a CUDA image's ~30 KB and a few hundred entries, a desktop's
# ~200 KB and a few thousand. Far above both, far below what hurts.
MAX_CACHE_SIZE = 8 << 20
MAX_ENTRIES = 1 << 16
_CHUNK = 4096  # entries built between two looks at the deadline


class LdCacheLimit(DiscoveryError):
    """A cache over a size, count or time limit: not garbled, but refused."""


def check_deadline(deadline: float | None, what: str) -> None:
    """Raise ``LdCacheLimit`` when ``deadline`` (``time.monotonic``) has passed."""
    if deadline is not None and time.monotonic() > deadline:
        raise LdCacheLimit(f"ld.so.cache: {what} did not finish before the deadline")


def is_64bit_flags(flags: int) -> bool:
    """Whether a cache entry's ``flags`` word names a 64-bit ABI.

    >>> is_64bit_flags(0x0303), is_64bit_flags(0x0A03), is_64bit_flags(0x0003)
    (True, True, False)
    """
    return (flags & FLAG_REQUIRED_MASK) in _LIB64_ABIS


@dataclass(frozen=True)
class LdCache:
    """A whole cache: its entries in file order and the ``glibc-hwcaps``
    subdirectory names its extension entries index (empty when it has none)."""

    entries: tuple[LdCacheEntry, ...]
    hwcaps: tuple[str, ...] = ()


def is_hwcaps_entry(entry: LdCacheEntry) -> bool:
    """Whether ``entry`` lives in a ``glibc-hwcaps`` subdirectory (glibc's
    ``dl_cache_hwcap_extension``): bit 62 alone above the ISA level bits."""
    return (entry.hwcap >> 32) & ~((1 << _ISA_LEVEL_BITS) - 1) == HWCAP_EXTENSION >> 32


def parse_ld_so_cache(data: bytes, *, deadline: float | None = None) -> tuple[LdCacheEntry, ...]:
    """Every entry of an ld.so.cache, in file order: ``read_ld_so_cache(data).entries``."""
    return read_ld_so_cache(data, deadline=deadline).entries


def read_ld_so_cache(data: bytes, *, deadline: float | None = None) -> LdCache:
    """Every entry of an ld.so.cache, in file order (ldconfig sorts them), and the
    ``glibc-hwcaps`` names of its extension section.

    Sample input, the start of a new-format cache (``xxd /etc/ld.so.cache``)::

        00000000: 676c 6962 632d 6c64 2e73 6f2e 6361 6368  glibc-ld.so.cach
        00000010: 6531 2e31 1802 0000 2654 0000 0200 0000  e1.1....&T......
        00000020: 9886 0000 0000 0000 0000 0000 0000 0000  ................
        00000030: 0303 0000 aa4e 0000 944e 0000 0000 0000  .....N...N......

    that is: version "1.1", 0x218 entries, 0x5426 bytes of strings,
    little-endian (flags byte 2), extension directory at 0x8698; the first
    entry has flags 0x0303 (libc6, x86-64), its name at 0x4eaa (the tail of its
    path, ldconfig shares suffixes) and its path at 0x4e94. It becomes
    ``LdCacheEntry("libz3.so.4", "/lib/x86_64-linux-gnu/libz3.so.4", 0x303,
    True, 0)``, what ``ldconfig -p`` prints as
    ``libz3.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz3.so.4``.
    Strings are decoded as UTF-8 with ``surrogateescape`` (what ``os.fsdecode``
    does), so any byte path survives.

    Raises ``DiscoveryError`` for a file that is not a cache (bad magic or
    version), is byte-swapped, or is truncated or inconsistent anywhere;
    ``LdCacheLimit`` for one over ``MAX_CACHE_SIZE`` bytes or ``MAX_ENTRIES``
    entries, or not read by ``deadline`` (a ``time.monotonic`` value).
    """
    if len(data) > MAX_CACHE_SIZE:
        raise LdCacheLimit(f"ld.so.cache of {len(data)} bytes: over the limit of {MAX_CACHE_SIZE} bytes")
    data = bytes(data)
    if data.startswith(OLD_MAGIC):
        return _parse_old_or_compat(data, deadline)
    if data.startswith(NEW_MAGIC):
        return _parse_new(data, 0, deadline)
    raise DiscoveryError(f"not an ld.so.cache: starts with {data[:20]!r}, expected {NEW_MAGIC!r} or {OLD_MAGIC!r}")


def _parse_old_or_compat(data: bytes, deadline: float | None) -> LdCache:
    if len(data) < _OLD_HEADER.size:
        raise DiscoveryError(
            f"truncated ld.so.cache: the old-format header needs {_OLD_HEADER.size} bytes, the file has {len(data)}"
        )
    _, nlibs = _OLD_HEADER.unpack_from(data, 0)
    entries_end = _entries_end(data, "old-format", 12, _OLD_HEADER.size, nlibs, 4 * _OLD_ENTRY_WORDS)
    new_start = -(-entries_end // _NEW_ALIGN) * _NEW_ALIGN
    header = data[new_start : new_start + len(NEW_MAGIC) + len(NEW_VERSION)]
    if len(data) - new_start >= _NEW_HEADER.size and header == NEW_MAGIC + NEW_VERSION:
        return _parse_new(data, new_start, deadline)  # compat: glibc reads the new part
    _check_count(nlibs, "old-format", 12)  # before anything is unpacked
    check_deadline(deadline, "reading the strings")  # before the columns are unpacked
    block = data[_OLD_HEADER.size : entries_end]
    flags = _column(block, "i", 0, _OLD_ENTRY_WORDS)
    keys = _column(block, "I", 1, _OLD_ENTRY_WORDS)
    values = _column(block, "I", 2, _OLD_ENTRY_WORDS)
    zeros = [0] * nlibs
    return LdCache(_entries(data, entries_end, entries_end, len(data), flags, keys, values, zeros, zeros, deadline))


def _check_count(nlibs: int, kind: str, field: int) -> None:
    if nlibs > MAX_ENTRIES:
        raise LdCacheLimit(
            f"{kind} ld.so.cache nlibs={nlibs} (offset {field}): over the limit of {MAX_ENTRIES} entries"
        )


def _parse_new(data: bytes, base: int, deadline: float | None) -> LdCache:
    if len(data) - base < _NEW_HEADER.size:
        raise DiscoveryError(
            f"truncated ld.so.cache: the new-format header at offset {base} needs {_NEW_HEADER.size} bytes, "
            f"{len(data) - base} are left"
        )
    _, version, nlibs, len_strings, flags, extension = _NEW_HEADER.unpack_from(data, base)
    if version != NEW_VERSION:
        raise DiscoveryError(
            f"unsupported ld.so.cache version {version!r} at offset {base + 17}, expected {NEW_VERSION!r}"
        )
    endian = flags & _ENDIAN_MASK
    if endian == _ENDIAN_BIG:
        raise DiscoveryError(
            f"ld.so.cache is big-endian (flags byte {flags:#04x} at offset {base + 28}); only little-endian caches are read"
        )
    if endian == _ENDIAN_INVALID:
        raise DiscoveryError(f"ld.so.cache marks itself invalid (flags byte {flags:#04x} at offset {base + 28})")
    entries_start = base + _NEW_HEADER.size
    entries_end = _entries_end(data, "new-format", base + 20, entries_start, nlibs, 4 * _NEW_ENTRY_WORDS)
    _check_count(nlibs, "new-format", base + 20)  # before anything is unpacked
    strings_end = entries_end + len_strings
    if strings_end > len(data):
        raise DiscoveryError(
            f"ld.so.cache len_strings={len_strings} (offset {base + 24}): the string table would end at "
            f"{strings_end}, past the end of the file ({len(data)} bytes)"
        )
    # Before the columns are unpacked: a deadline gone already costs no work at all.
    check_deadline(deadline, "reading the strings")
    block = data[entries_start:entries_end]
    flags = _column(block, "i", 0, _NEW_ENTRY_WORDS)
    keys = _column(block, "I", 1, _NEW_ENTRY_WORDS)
    values = _column(block, "I", 2, _NEW_ENTRY_WORDS)
    osversions = _column(block, "I", 3, _NEW_ENTRY_WORDS)
    hwcaps = _column(block, "Q", 2, _NEW_ENTRY_WORDS // 2)
    entries = _entries(data, base, entries_end, strings_end, flags, keys, values, hwcaps, osversions, deadline)
    return LdCache(entries, _hwcaps_names(data, base, extension, deadline) if extension else ())


def _hwcaps_names(data: bytes, base: int, offset: int, deadline: float | None = None) -> tuple[str, ...]:
    """The ``glibc-hwcaps`` subdirectory names of the extension directory at file
    offset ``offset``; string offsets count from ``base``. Checked as glibc's
    ``cache_extension_load`` checks it; anything malformed gives no names, as the
    loader then goes on without them (the entries are still read).

    The directory can hold one section per 16 bytes of the file, each of them
    decoded: ``deadline`` is looked at as they are, like the entries'."""
    if offset % 4 or offset + _EXTENSION.size > len(data):
        return ()
    magic, count = _EXTENSION.unpack_from(data, offset)
    if magic != EXTENSION_MAGIC or offset + _EXTENSION.size + count * _SECTION.size > len(data):
        return ()
    names: tuple[str, ...] = ()
    strings = data[base:]  # once: a copy per section made a compat file's extension quadratic
    for i in range(count):
        if i % _CHUNK == 0:
            check_deadline(deadline, "reading the extension")
        tag, _flags, start, size = _SECTION.unpack_from(data, offset + _EXTENSION.size + i * _SECTION.size)
        if start + size > len(data):
            return ()
        if tag != EXTENSION_TAG_HWCAPS or size == 0 or start % 4 or size % 4 or size // 4 > _MAX_HWCAPS:
            continue  # glibc ignores an unknown tag and drops a malformed hwcaps section
        table = _column(data[start : start + size], "I", 0, 1)
        try:
            found = _strings_one_by_one(strings, 0, base, table, (), _DECODE_FACTOR * len(data) + 65536)
        except DiscoveryError:
            return ()
        names = tuple(found[o] for o in table)
    return names


def _entries_end(data: bytes, kind: str, field: int, start: int, nlibs: int, size: int) -> int:
    end = start + nlibs * size
    if end <= len(data):
        return end
    why = f"{kind} ld.so.cache nlibs={nlibs} (offset {field}): "
    why += f"{nlibs} entries of {size} bytes from offset {start} end at {end}, past the end of the file ({len(data)} bytes)"
    swapped = int.from_bytes(nlibs.to_bytes(4, "little"), "big")
    if start + swapped * size <= len(data):
        why += (
            f"; byte-swapped it would be {swapped}, so the cache looks big-endian (only little-endian caches are read)"
        )
    raise DiscoveryError(why)


def _column(block: bytes, code: str, index: int, stride: int) -> array[int]:
    """Field ``index`` of every record: ``block`` read as little-endian items of ``code``, every ``stride``-th."""
    items = array(code, block)
    if sys.byteorder == "big":
        items.byteswap()
    return items[index::stride]


def _entries(
    data: bytes,
    base: int,
    start: int,
    end: int,
    flags: Sequence[int],
    keys: Sequence[int],
    values: Sequence[int],
    hwcaps: Sequence[int],
    osversions: Sequence[int],
    deadline: float | None = None,
) -> tuple[LdCacheEntry, ...]:
    """Entries from the unpacked columns; string offsets count from ``base``, strings lie in [start, end)."""
    table = data[start:end]
    budget = _DECODE_FACTOR * len(data) + 65536
    strings = _strings_in_bulk(table, start - base, keys, values, budget)
    check_deadline(deadline, "reading the strings")
    if strings is None:
        seen = _strings_one_by_one(table, start - base, base, keys, values, budget, deadline)
        strings = list(map(seen.__getitem__, keys)), list(map(seen.__getitem__, values))
    lib64 = [(f & FLAG_REQUIRED_MASK) in _LIB64_ABIS for f in flags]
    columns = (*strings, flags, lib64, hwcaps, osversions)
    out: list[LdCacheEntry] = []
    for i in range(0, len(flags), _CHUNK):
        check_deadline(deadline, "building the entries")
        out.extend(map(LdCacheEntry, *(column[i : i + _CHUNK] for column in columns)))
    return tuple(out)


def _strings_in_bulk(
    table: bytes, first: int, keys: Sequence[int], values: Sequence[int], budget: int
) -> tuple[list[str], list[str]] | None:
    """(names, paths) for a string table shaped as ldconfig writes it, mostly in passes that run in C.

    That shape: ASCII, every value the start of a string, and every key the
    start of one or a tail of one (ldconfig >= 2.32 stores a shared suffix
    once: ``libz.so.1`` is the tail of ``/lib/x86_64-linux-gnu/libz.so.1``).
    Anything else, malformed input included, gives None, and the caller
    leaves the decision (and the error message) to ``_strings_one_by_one``.
    ``first`` is the table's offset counted the way the entries' offsets are.
    """
    if not table.isascii() or table.count(0) > 2 * len(keys) + 16:
        return None
    parts = table.decode("ascii").split("\0")
    starts = accumulate(map((1).__add__, map(len, parts)), initial=first)
    natural = dict(zip(starts, parts[:-1], strict=False))  # the last part has no NUL after it
    found = list(map(natural.get, values))
    if None in found:
        return None
    paths = cast(list[str], found)
    if sum(map(len, paths)) > budget or max(map(len, paths), default=0) > MAX_STRING:
        return None  # (the sum and the maximum also bound the tails cut below)
    shift = list(map(sub, keys, values))
    if min(shift, default=0) >= 0 and all(map(le, shift, map(len, paths))):  # each name the tail of its own path
        return list(map(getitem, paths, map(slice, shift, repeat(None)))), paths
    names = list(map(natural.get, keys))
    if None in names:  # some names the tail of their own path, some of another string or stored alone
        names = [
            name if name is not None else path[key - value :] if value < key <= value + len(path) else None
            for name, path, key, value in zip(names, paths, keys, values, strict=True)
        ]
    if None in names:  # a tail of another string: a 32-bit entry's name inside the 64-bit path
        missing = [key for key, name in zip(keys, names, strict=True) if name is None]
        try:
            more = _strings_one_by_one(table, first, 0, missing, (), budget - sum(map(len, paths)))
        except DiscoveryError:
            return None
        names = [more[key] if name is None else name for key, name in zip(keys, names, strict=True)]
    complete = cast(list[str], names)
    if max(map(len, complete), default=0) > MAX_STRING:
        return None
    return complete, paths


def _strings_one_by_one(
    table: bytes,
    first: int,
    base: int,
    keys: Sequence[int],
    values: Sequence[int],
    budget: int,
    deadline: float | None = None,
) -> dict[int, str]:
    """offset -> string for every offset the entries use, each checked; raises naming the first fault."""
    find = table.find
    seen: dict[int, str] = {}
    for field, offsets in (("key", keys), ("value", values)):
        for count, offset in enumerate(offsets):
            if count % _CHUNK == 0:
                check_deadline(deadline, "reading the strings")
            if offset in seen:
                continue
            pos = offset - first  # its position in ``table``
            nul = find(b"\0", pos, pos + MAX_STRING + 1) if pos >= 0 else -1
            if nul < 0:
                raise _string_error(table, base, base + first, count, field, offset)
            budget -= nul - pos
            if budget < 0:
                raise DiscoveryError(
                    f"ld.so.cache entry {count}: its strings bring the total past "
                    f"{_DECODE_FACTOR}x the file's size; the offsets overlap in a way ldconfig never writes"
                )
            seen[offset] = table[pos:nul].decode("utf-8", "surrogateescape")
    return seen


def _string_error(table: bytes, base: int, start: int, index: int, field: str, offset: int) -> DiscoveryError:
    pos = base + offset
    end = start + len(table)
    if not start <= pos < end:
        return DiscoveryError(
            f"ld.so.cache entry {index}: {field} offset {offset} (file offset {pos}) is outside the "
            f"string table [{start}, {end})"
        )
    return DiscoveryError(
        f"ld.so.cache entry {index}: the {field} string at file offset {pos} has no NUL "
        f"within {min(end - pos, MAX_STRING + 1)} bytes"
    )
