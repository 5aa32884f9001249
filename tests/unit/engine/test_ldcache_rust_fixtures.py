"""The golden cases the compiled hook's ld.so.cache code is held to (``hook/src/ldcache.rs``, ``ldconf.rs``).

The Rust port must read, merge and write a cache exactly as ``engine.ldcache``,
``engine.ldcache_merge`` and ``engine.start.ldconfig.merge`` do: byte for byte,
and a refusal with the same kind (a limit or a garbled cache) and message. This
file is the Python half of that check. For every case in
``hook/tests/fixtures/ldcache/cases.txt`` it computes with the Python code what
the case gives, and fails when a committed file says otherwise;
``NRI_GPU_UPDATE_GOLDEN=1`` rewrites the files (then review the diff). The Rust
unit tests read the same files and must give the same answers, so neither side
can change alone.

Inputs: caches written by glibc's ldconfig (the node fixture's own, its old,
compat and ``glibc-hwcaps`` variants, and a Debian 12 host's) are kept as they
were committed; only the node fixture's are compared with their source. The
others are built here, most of them odd or hostile: they are written to the
directory too, so that the Rust side reads the very bytes. A case's input may
be padded with zeros to a size (the limits need megabytes no one should commit).

``cases.txt``: blocks of lines, ``ours NAME`` ... ``end`` (entries to merge) and
``case NAME`` ... ``end``; strings %-escaped (every byte outside ``!``..``~``,
and ``%``, as ``%XX``; the empty string as ``%``). A case's ``parse`` line is
``read_ld_so_cache``'s answer (``ok COUNT HWCAPS FNV``: the count of entries and
of hwcaps names, and the FNV-1a 64 of their dump, which follows when short),
its ``merge`` line that of ``ldconfig.merge`` on a root holding the input as
``/etc/ld.so.cache``: the file it leaves (stored, or its length and FNV-1a 64
when big), or the ``WorkError`` message.
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.ldcache import (
    EXTENSION_MAGIC,
    EXTENSION_TAG_GENERATOR,
    EXTENSION_TAG_HWCAPS,
    HWCAP_EXTENSION,
    MAX_CACHE_SIZE,
    MAX_ENTRIES,
    NEW_MAGIC,
    NEW_VERSION,
    OLD_MAGIC,
    LdCache,
    LdCacheLimit,
    is_64bit_flags,
    read_ld_so_cache,
)
from nri_gpu.engine.ldcache_merge import sorted_like_ldconfig
from nri_gpu.engine.model import LdCacheEntry
from nri_gpu.engine.start import ldconfig
from nri_gpu.engine.start.rootdir import RootDir
from nri_gpu.engine.start.work import WorkError
from tests.unit.engine import golden

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "hook" / "tests" / "fixtures" / "ldcache"
MANIFEST = "cases.txt"
_BIG = 16 << 10  # a merged cache longer than this is given by its length and digest, not stored
_DUMP_BYTES = 4096  # an entry dump longer than this is given by its digest only

X86_64, I386, AARCH64 = 0x0303, 0x0003, 0x0A03
Spec = tuple[int, bytes, bytes, int, int]  # flags, name, path, hwcap, osversion

# --------------------------------------------------------------------------- the entries merged


def _ours(flags: int, name: str, path: str, hwcap: int = 0, osversion: int = 0) -> LdCacheEntry:
    return LdCacheEntry(name, path, flags, is_64bit_flags(flags), hwcap, osversion)


_LIB = "/usr/lib/x86_64-linux-gnu"
OURS: dict[str, tuple[LdCacheEntry, ...]] = {
    "driver": (
        _ours(X86_64, "libcuda.so.1", f"{_LIB}/libcuda.so.1"),  # the same as the real caches': replaces it
        _ours(X86_64, "libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1"),  # ties with the one above
        _ours(I386, "libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
        _ours(AARCH64, "libcuda.so.1", "/usr/lib/aarch64-linux-gnu/libcuda.so.1"),
        _ours(X86_64, "libnvidia-ml.so.1", f"{_LIB}/libnvidia-ml.so.1", osversion=0x030200),
        _ours(X86_64, "libEGL_nvidia.so.0", f"{_LIB}/libEGL_nvidia.so.0", osversion=0x020616),
        _ours(X86_64, "libnvidia-encode.so.550.163.01", f"{_LIB}/libnvidia-encode.so.550.163.01"),
        _ours(X86_64, "libz.so.1", "/opt/nri-gpu/libz.so.1", hwcap=0x1),  # ties with the image's libz
        _ours(X86_64, "libé.so.1", f"{_LIB}/libé.so.1"),  # bytes >= 0x80: C's signed char
        _ours(X86_64, "lib3000000000.so", f"{_LIB}/lib3000000000.so"),  # a digit run past C's int
    ),
    "one": (_ours(X86_64, "libcuda.so.1", f"{_LIB}/libcuda.so.1"),),
    "none": (),
}

# --------------------------------------------------------------------------- hand-made caches


def _strings(entries: Sequence[Spec], extra: Sequence[bytes] = ()) -> tuple[bytes, list[tuple[int, int]], list[int]]:
    """A string table as ldconfig >= 2.32 lays it out (a name that is the tail of a
    string already there is not stored again); (table, (key, value) per entry,
    offset per ``extra`` string), offsets from the table's start."""
    table = bytearray()
    offsets = []
    for _, name, path, _, _ in entries:
        value = len(table)
        table += path + b"\0"
        found = bytes(table).find(name + b"\0")
        key = found if found >= 0 else len(table)
        if found < 0:
            table += name + b"\0"
        offsets.append((key, value))
    more = []
    for text in extra:
        more.append(len(table))
        table += text + b"\0"
    return bytes(table), offsets, more


def new_cache(
    entries: Sequence[Spec],
    *,
    hwcaps: Sequence[bytes] = (),
    sections: Sequence[tuple[int, bytes]] | None = None,
    order: str = "<",
    endian: int | None = None,
) -> bytes:
    """A new-format cache; with ``hwcaps`` an extension directory naming them (or
    the ``sections`` given: (tag, payload); a payload of ``b"HWCAPS"`` stands for
    the hwcaps names' offsets)."""
    start = 48 + 24 * len(entries)
    table, offsets, names = _strings(entries, hwcaps)
    rows = b"".join(
        struct.pack(f"{order}iIIIQ", flags, start + key, start + value, osversion, hwcap)
        for (flags, _, _, hwcap, osversion), (key, value) in zip(entries, offsets, strict=True)
    )
    end = start + len(table)
    extension = b""
    offset = 0
    if hwcaps or sections:
        offset = -(-end // 4) * 4
        given = sections if sections is not None else [(EXTENSION_TAG_HWCAPS, b"HWCAPS")]
        payloads = [
            struct.pack(f"{order}{len(names)}I", *(start + n for n in names)) if data == b"HWCAPS" else data
            for _, data in given
        ]
        at = offset + 8 + 16 * len(given)
        directory = struct.pack(f"{order}II", EXTENSION_MAGIC, len(given))
        for (tag, _), payload in zip(given, payloads, strict=True):
            directory += struct.pack(f"{order}IIII", tag, 0, at, len(payload))
            at += len(payload) + (-len(payload) % 4)
        extension = b"\0" * (offset - end) + directory + b"".join(p + b"\0" * (-len(p) % 4) for p in payloads)
    flag = (3 if order == ">" else 2) if endian is None else endian
    header = struct.pack(f"{order}17s3sIIB3xI12x", NEW_MAGIC, NEW_VERSION, len(entries), len(table), flag, offset)
    return header + rows + table + extension


def old_cache(entries: Sequence[Spec], *, compat: bool = False) -> bytes:
    """An old-format cache (entries with a hwcap left out, as ldconfig does), or a
    compat one: the old part followed by a whole new cache holding the strings."""
    olds = [spec for spec in entries if spec[3] == 0]
    old_size = 16 + 12 * len(olds)
    pad = -old_size % 8
    table, offsets, _ = _strings(entries)
    new = new_cache(entries)
    shift = pad + 48 + 24 * len(entries) if compat else 0  # old offsets count from the end of the old entries
    rows = b"".join(
        struct.pack("<iII", spec[0], shift + key, shift + value)
        for spec, (key, value) in zip(entries, offsets, strict=True)
        if spec[3] == 0
    )
    old = struct.pack("<11sxI", OLD_MAGIC, len(olds)) + rows
    return old + b"\0" * pad + new if compat else old + table


def patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _spec(flags: int, name: bytes, path: bytes, hwcap: int = 0, osversion: int = 0) -> Spec:
    return (flags, name, path, hwcap, osversion)


def _sorted(specs: Sequence[Spec]) -> list[Spec]:
    entries = [
        LdCacheEntry(n.decode("utf-8", "surrogateescape"), p.decode("utf-8", "surrogateescape"), f, True, h, o)
        for f, n, p, h, o in specs
    ]
    order = sorted_like_ldconfig(entries)
    return [specs[entries.index(e)] for e in order]


HAND = _sorted(
    [
        _spec(X86_64, b"libz.so.1", b"/lib/x86_64-linux-gnu/libz.so.1"),
        _spec(X86_64, b"libodd.so.1", b"/lib/\xff\xfe/libodd.so.1"),  # not UTF-8: the bytes survive
        _spec(X86_64, b"libm.so.6", b"/lib/x86_64-linux-gnu/libm.so.6", osversion=0x03020000),
        _spec(X86_64, b"libfoo.so", b"/opt/foo/libfoo-1.2.so"),  # a name stored on its own
        _spec(X86_64, b"libcuda.so.1", b"/opt/old/libcuda.so.1", hwcap=0x2),  # plain hwcap bits
        _spec(I386, b"libz.so.1", b"/lib/i386-linux-gnu/libz.so.1"),
        _spec(I386, b"libm.so.6", b"/lib/i386-linux-gnu/libm.so.6"),
        _spec(X86_64, b"libnvidia-ml.so.1", b"/opt/stub/libnvidia-ml.so.1"),
        _spec(X86_64, b"libc.so.10", b"/lib/x86_64-linux-gnu/libc.so.10"),
        _spec(X86_64, b"libc.so.9", b"/lib/x86_64-linux-gnu/libc.so.9"),
    ]
)
# Names that are the tail of another entry's path: ``m.so.6`` inside libm's, a 32-bit
# entry's name inside the 64-bit path (the lookups the bulk pass leaves to the careful one).
SHARED = [
    _spec(X86_64, b"libm.so.6", b"/lib/x86_64-linux-gnu/libm.so.6"),
    _spec(I386, b"m.so.6", b"/lib/i386-linux-gnu/libmx.so.6"),
    _spec(I386, b"libm.so.6", b"/lib/i386-linux-gnu/libm-2.36.so"),
]
HWCAPS = _sorted(
    [
        _spec(X86_64, b"libz.so.1", b"/lib/x86_64-linux-gnu/libz.so.1"),
        _spec(X86_64, b"libz.so.1", b"/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libz.so.1", HWCAP_EXTENSION | 0),
        _spec(X86_64, b"libz.so.1", b"/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v4/libz.so.1", HWCAP_EXTENSION | 1),
        _spec(X86_64, b"libm.so.6", b"/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v9/libm.so.6", HWCAP_EXTENSION | 5),
        _spec(X86_64, b"libm.so.6", b"/lib/x86_64-linux-gnu/libm.so.6"),
        _spec(X86_64, b"libcuda.so.1", b"/opt/x/glibc-hwcaps/x86-64-v3/libcuda.so.1", HWCAP_EXTENSION | (2 << 32)),
    ]
)
_V3V4 = (b"x86-64-v3", b"x86-64-v4")
_NEW = new_cache(HAND)
_N = len(HAND)
_STRINGS = 48 + 24 * _N  # where _NEW's string table starts


def _tails_of_one_path(count: int) -> bytes:
    """``count`` entries of one 4096-byte path, their names distinct tails of it.

    Within the budget as Python's bulk pass counts (each path as often as it is
    used), past it as the careful pass counts (each distinct string once, the
    tails too): a cache, since the bulk pass reads it."""
    path = b"/" + b"a" * 4095
    start = 48 + 24 * count
    rows = b"".join(struct.pack("<iIIIQ", X86_64, start + 1 + i, start, 0, 0) for i in range(count))
    header = struct.pack("<17s3sIIB3xI12x", NEW_MAGIC, NEW_VERSION, count, len(path) + 1, 2, 0)
    return header + rows + path + b"\0"


def _overlapping(count: int) -> bytes:
    """Paths that are not where strings start (distinct tails of one long string),
    past the budget: garbled."""
    path = b"/" + b"b" * 4095
    start = 48 + 24 * count
    rows = b"".join(struct.pack("<iIIIQ", X86_64, start + 1 + i, start + 1 + i, 0, 0) for i in range(count))
    header = struct.pack("<17s3sIIB3xI12x", NEW_MAGIC, NEW_VERSION, count, len(path) + 1, 2, 0)
    return header + rows + path + b"\0"


def _ext(data: bytes) -> int:
    (offset,) = struct.unpack_from("<I", data, 32)
    return int(offset)


_HWCAPS_NEW = new_cache(HWCAPS, hwcaps=_V3V4)


def _patched_extension(at: int, fmt: str, value: int, *, second: bool = False) -> bytes:
    """The hwcaps cache (with a second, unknown section if ``second``) with ``value``
    written ``at`` bytes into its extension directory."""
    sections = [(EXTENSION_TAG_HWCAPS, b"HWCAPS"), (7, b"abcd")] if second else None
    data = new_cache(HWCAPS, hwcaps=_V3V4, sections=sections)
    return patch(data, _ext(data) + at, fmt, value)


# name -> the bytes of NAME.cache
HANDMADE: dict[str, Callable[[], bytes]] = {
    "hand-new": lambda: _NEW,
    "hand-old": lambda: old_cache(HAND),
    "hand-compat": lambda: old_cache(HAND, compat=True),
    "hand-shared-tails": lambda: new_cache(SHARED),
    "hand-unsorted": lambda: new_cache(list(reversed(HAND))),
    "hand-duplicates": lambda: new_cache([HAND[0]] * 3 + HAND + [HAND[-1]] * 2),
    "hand-aligned-compat": lambda: old_cache(HAND[:3], compat=True),
    "hwcaps": lambda: new_cache(HWCAPS, hwcaps=_V3V4),
    "hwcaps-two-sections": lambda: new_cache(
        HWCAPS,
        hwcaps=(b"x86-64-v2", *_V3V4),
        sections=[(EXTENSION_TAG_HWCAPS, struct.pack("<I", 0)), (7, b"what"), (EXTENSION_TAG_HWCAPS, b"HWCAPS")],
    ),
    "hwcaps-generator-only": lambda: new_cache(HWCAPS, sections=[(EXTENSION_TAG_GENERATOR, b"ldconfig (GNU libc)")]),
    "hwcaps-bad-magic": lambda: _patched_extension(0, "<I", 0),
    "hwcaps-name-outside": lambda: new_cache(
        HWCAPS, hwcaps=_V3V4, sections=[(EXTENSION_TAG_HWCAPS, struct.pack("<II", 48, 0xFFFF0))]
    ),
    "hwcaps-section-past-end": lambda: _patched_extension(8 + 16 + 12, "<I", 1 << 20, second=True),
    "hwcaps-misaligned": lambda: patch(_HWCAPS_NEW, 32, "<I", _ext(_HWCAPS_NEW) + 2),
    "hwcaps-count-past-end": lambda: _patched_extension(4, "<I", 1 << 20),
    "budget-bulk-reads-it": lambda: _tails_of_one_path(35),
    "budget-overlap": lambda: _overlapping(80),
    "empty-file": lambda: b"",
    "not-a-cache": lambda: b'it\'s "x"\\\n\t\r\x00\x7f\xff and more bytes',
    "old-header-truncated": lambda: OLD_MAGIC + b"\0\1",
    "new-header-truncated": lambda: _NEW[:47],
    "compat-new-part-truncated": lambda: old_cache(HAND, compat=True)[: 16 + 12 * _N + 4 + 40],
    "bad-version": lambda: _NEW[:17] + b"1.0" + _NEW[20:],
    "big-endian-flag": lambda: patch(_NEW, 28, "B", 3),
    "big-endian": lambda: new_cache(HAND, order=">", endian=0),
    "marked-invalid": lambda: patch(_NEW, 28, "B", 0x81),
    "zero-entries": lambda: new_cache([]),
    "nlibs-past-end": lambda: patch(_NEW, 20, "<I", 1000),
    "old-nlibs-past-end": lambda: patch(old_cache(HAND), 12, "<I", 1000),
    "len-strings-past-end": lambda: patch(_NEW, 24, "<I", len(_NEW)),
    "key-outside": lambda: patch(_NEW, 48 + 4, "<I", 12),
    "value-past-table": lambda: patch(_NEW, 48 + 24 * 2 + 8, "<I", len(_NEW) + 5),
    "no-nul": lambda: patch(_NEW, 24, "<I", len(_NEW) - _STRINGS - 1),
    "string-too-long": lambda: new_cache([_spec(X86_64, b"libx.so", b"/" + b"x" * 4096)]),
    "string-at-max": lambda: new_cache([_spec(X86_64, b"libx.so", b"/" + b"x" * 4095)]),
    "old-key-outside": lambda: patch(old_cache(HAND), 16 + 12 + 4, "<I", 1 << 30),
    "over-entries": lambda: patch(new_cache([]), 20, "<I", MAX_ENTRIES + 1),
    "old-over-entries": lambda: patch(old_cache([]), 12, "<I", MAX_ENTRIES + 1),
    "zero-offsets": lambda: patch(new_cache([]), 20, "<I", 70) + b"\0" * (24 * 70),
    "at-entries-limit": lambda: patch(new_cache([]), 20, "<I", MAX_ENTRIES),
}


# The caches of glibc's ldconfig: kept as committed. The node fixture's are compared with it.
REAL = {
    "real-new.cache": REPO / "tests/fixtures/node/driver/etc/ld.so.cache",
    "real-nodriver.cache": REPO / "tests/fixtures/node/nodriver/etc/ld.so.cache",
    "real-old.cache": None,  # ldcaches.real_cache("old", FIXTURE_DRIVER), glibc 2.36
    "real-compat.cache": None,
    "real-new-hwcaps.cache": None,
    "host-debian12.cache": None,  # a Debian 12 container's /etc/ld.so.cache: 536 entries
}


@dataclass(frozen=True)
class Case:
    name: str
    input: str | None  # a file in the directory, None: no cache in the image
    ours: str
    pad: int = 0  # the input padded with zeros to this size
    deadline_passed: bool = False


CASES = [
    Case("real-new", "real-new.cache", "driver"),
    Case("real-new-reencoded", "real-new.cache", "none"),
    Case("real-old", "real-old.cache", "driver"),
    Case("real-compat", "real-compat.cache", "driver"),
    Case("real-new-hwcaps", "real-new-hwcaps.cache", "driver"),
    Case("real-nodriver", "real-nodriver.cache", "one"),
    Case("host-debian12", "host-debian12.cache", "driver"),
    Case("merged-again", "real-new.merged", "driver"),  # idempotent: nothing is written
    Case("hwcaps-merged-again", "real-new-hwcaps.merged", "driver"),
    Case("missing", None, "driver"),
    Case("missing-nothing-to-add", None, "none"),
    *(Case(name, f"{name}.cache", "driver") for name in HANDMADE if name != "at-entries-limit"),
    Case("at-entries-limit", "at-entries-limit.cache", "driver", pad=48 + 24 * MAX_ENTRIES),
    Case("over-size", "hand-new.cache", "driver", pad=MAX_CACHE_SIZE + 1),
    Case("at-size-limit", "hand-new.cache", "driver", pad=MAX_CACHE_SIZE),
    Case("over-entries", "over-entries.cache", "driver", pad=48 + 24 * (MAX_ENTRIES + 1)),
    Case("old-over-entries-padded", "old-over-entries.cache", "driver", pad=16 + 12 * (MAX_ENTRIES + 1)),
    Case("deadline-real-new", "real-new.cache", "driver", deadline_passed=True),
    Case("deadline-zero-entries", "zero-entries.cache", "driver", deadline_passed=True),
    Case("deadline-missing", None, "driver", deadline_passed=True),
    Case("deadline-missing-nothing-to-add", None, "none", deadline_passed=True),
    Case("deadline-garbled", "not-a-cache.cache", "driver", deadline_passed=True),
    Case(
        "deadline-over-entries", "over-entries.cache", "driver", pad=48 + 24 * (MAX_ENTRIES + 1), deadline_passed=True
    ),
]

# --------------------------------------------------------------------------- the manifest


def escape(raw: bytes) -> str:
    """Bytes as one word: those outside ``!``..``~``, and ``%``, as ``%XX``; empty as ``%``."""
    return "".join(chr(b) if 0x21 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in raw) or "%"


def fnv(data: bytes) -> str:
    """FNV-1a, 64 bits, in hex: a digest both sides compute in a few lines."""
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def entry_line(e: LdCacheEntry) -> str:
    return f"entry {e.flags} {int(e.is_64bit)} {e.hwcap} {e.osversion} {escape(_raw(e.name))} {escape(_raw(e.path))}"


def dump(cache: LdCache) -> list[str]:
    return [f"hwcaps {escape(_raw(name))}" for name in cache.hwcaps] + [entry_line(e) for e in cache.entries]


def _one_line(message: str) -> str:
    assert "\n" not in message and message.isascii(), message
    return message


def parse_line(data: bytes | None, deadline: float | None) -> list[str]:
    if data is None:
        return ["parse absent"]
    try:
        cache = read_ld_so_cache(data, deadline=deadline)
    except LdCacheLimit as exc:
        return [f"parse limit {_one_line(str(exc))}"]
    except DiscoveryError as exc:
        return [f"parse garbled {_one_line(str(exc))}"]
    lines = dump(cache)
    text = "".join(line + "\n" for line in lines).encode()
    head = f"parse ok {len(cache.entries)} {len(cache.hwcaps)} {fnv(text)}"
    return [head, *lines] if len(text) <= _DUMP_BYTES else [head]


def run_merge(data: bytes | None, ours: tuple[LdCacheEntry, ...], deadline: float | None) -> tuple[bool, bytes] | str:
    """``ldconfig.merge`` on a root whose ``/etc/ld.so.cache`` is ``data``: (written, the file after) or the error."""
    with tempfile.TemporaryDirectory(prefix="ldcache-golden-") as tmp:
        if data is not None:
            (Path(tmp) / "etc").mkdir()
            (Path(tmp) / "etc/ld.so.cache").write_bytes(data)
        root = RootDir(os.open(tmp, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        try:
            written = ldconfig.merge(root, ours, deadline)
        except WorkError as exc:
            return _one_line(str(exc))
        finally:
            root.close()
        return written, (Path(tmp) / "etc/ld.so.cache").read_bytes()


def build(inputs: dict[str, bytes]) -> dict[str, bytes]:
    """Every file the directory must hold, from ``inputs`` (the real caches)."""
    files = dict(inputs)
    for name, make in HANDMADE.items():
        files[f"{name}.cache"] = make()
    lines = [f"# Written by tests/unit/engine/{Path(__file__).name} (NRI_GPU_UPDATE_GOLDEN=1); do not edit.", ""]
    for name, entries in OURS.items():
        lines += [f"ours {name}", *(entry_line(e) for e in entries), "end", ""]
    stored: dict[bytes, str] = {}
    for case in CASES:
        data = None if case.input is None else files[case.input]
        if data is not None and case.pad:
            data = data + b"\0" * (case.pad - len(data))
        deadline = time.monotonic() - 1 if case.deadline_passed else None
        lines += [f"case {case.name}", f"input {case.input or '-'}"]
        lines += [f"pad {case.pad}"] if case.pad else []
        lines += ["deadline passed"] if case.deadline_passed else []
        lines += [f"ours {case.ours}", *parse_line(data, deadline)]
        result = run_merge(data, OURS[case.ours], deadline)
        if isinstance(result, str):
            lines.append(f"merge error {result}")
        else:
            written, out = result
            how = "written" if written else "unchanged"
            if len(out) > _BIG:
                lines.append(f"merge {how} digest {len(out)} {fnv(out)}")
            else:
                file = stored.setdefault(out, f"{case.name}.merged")
                files[file] = out
                lines.append(f"merge {how} file {file}")
        lines += ["end", ""]
    files[MANIFEST] = "\n".join(lines).encode()
    return files


def _real_inputs() -> dict[str, bytes]:
    found = {}
    for name, source in REAL.items():
        path = FIXTURES / name
        if source is not None and (golden.UPDATE or not path.exists()):
            found[name] = source.read_bytes()
        elif not path.exists() and golden.UPDATE and name.startswith("real-"):
            from testbed import ldcaches
            from testbed.gpunode import FIXTURE_DRIVER

            found[name] = ldcaches.real_cache(name.removeprefix("real-").removesuffix(".cache"), FIXTURE_DRIVER)
        else:
            assert path.exists(), f"{path} is missing: it is a cache glibc's ldconfig wrote, kept as committed"
            found[name] = path.read_bytes()
        if source is not None:
            assert found[name] == source.read_bytes(), f"{name} differs from {source}: run with NRI_GPU_UPDATE_GOLDEN=1"
    return found


def test_the_rust_fixtures_are_what_python_gives() -> None:
    files = build(_real_inputs())
    if golden.UPDATE:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        for old in FIXTURES.iterdir():
            if old.name not in files and old.suffix in (".cache", ".merged", ".txt"):
                old.unlink()
        for name, data in files.items():
            (FIXTURES / name).write_bytes(data)
    stale = sorted(
        name
        for name, data in files.items()
        if not (FIXTURES / name).is_file() or (FIXTURES / name).read_bytes() != data
    )
    extra = sorted(p.name for p in FIXTURES.iterdir() if p.name not in files)
    assert not stale and not extra, (
        f"stale: {stale}, not made by this test: {extra}; run with NRI_GPU_UPDATE_GOLDEN=1, then review the diff"
    )


def test_the_fixtures_stay_small() -> None:
    total = sum(p.stat().st_size for p in FIXTURES.iterdir())
    assert total < 150 << 10, f"{FIXTURES}: {total} bytes"


def test_the_hand_made_caches_are_what_they_claim() -> None:
    """The builders write what the parser reads back (else the hostile cases test nothing)."""
    assert [e.path.encode("utf-8", "surrogateescape") for e in read_ld_so_cache(_NEW).entries] == [s[2] for s in HAND]
    assert read_ld_so_cache(old_cache(HAND, compat=True)).entries == read_ld_so_cache(_NEW).entries
    assert read_ld_so_cache(new_cache(HWCAPS, hwcaps=_V3V4)).hwcaps == ("x86-64-v3", "x86-64-v4")
    assert [e.name for e in read_ld_so_cache(new_cache(SHARED)).entries] == ["libm.so.6", "m.so.6", "libm.so.6"]
