"""Fuzzing the ld.so.cache reader (``engine.ldcache``) and the merge (``engine.ldcache_merge``).

The cache is read from inside a container image, so it is hostile. Any bytes,
and caches in all three layouts with counts, offsets and lengths overwritten,
cut short or bit-flipped, give entries or a ``DiscoveryError`` that mentions
the ld.so.cache; the strings decoded stay within the documented budget.
"""

from __future__ import annotations

import struct

from hypothesis import example, given
from hypothesis import strategies as st

from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.ldcache import NEW_MAGIC, NEW_VERSION, OLD_MAGIC, parse_ld_so_cache, read_ld_so_cache
from nri_gpu.engine.ldcache_merge import encode, merge
from nri_gpu.engine.model import LdCacheEntry
from tests.fuzz.support import fuzz, mutated, typed

Spec = tuple[int, bytes, bytes]  # flags, name, path

SPECS = st.lists(
    st.tuples(
        st.sampled_from([0x0303, 0x0003, 0x0A03, 0x0001, -1]),
        st.sampled_from([b"libcuda.so.1", b"libz.so.1", b"", "libé.so".encode()]),
        st.sampled_from([b"/lib/x86_64-linux-gnu/", b"/usr/lib/", b""]),
    ),
    max_size=5,
)


def _strings(specs: list[Spec], first: int) -> tuple[bytes, list[tuple[int, int, int]]]:
    """String table (each name the tail of its path, as ldconfig >= 2.32 writes it) and (flags, key, value)."""
    table, rows = b"", []
    for flags, name, directory in specs:
        value = first + len(table)
        table += directory + name + b"\0"
        rows.append((flags, value + len(directory), value))
    return table, rows


def new_cache(specs: list[Spec]) -> bytes:
    table, rows = _strings(specs, 48 + 24 * len(specs))
    header = struct.pack("<17s3sIIB3xI12x", NEW_MAGIC, NEW_VERSION, len(rows), len(table), 2, 0)
    return header + b"".join(struct.pack("<iIIIQ", f, k, v, 0, 0) for f, k, v in rows) + table


def old_cache(specs: list[Spec], compat: bool) -> bytes:
    entries_end = 16 + 12 * len(specs)
    prefix = b""
    if compat:  # the new cache at the start of the old string table, 8-aligned
        prefix = b"\0" * (-entries_end % 8) + new_cache(specs)
    table, rows = _strings(specs, len(prefix))
    header = struct.pack("<11sxI", OLD_MAGIC, len(rows))
    return header + b"".join(struct.pack("<iII", f, k, v) for f, k, v in rows) + prefix + table


CACHES = st.one_of(
    SPECS.map(new_cache), SPECS.map(lambda s: old_cache(s, False)), SPECS.map(lambda s: old_cache(s, True))
)


def check(data: bytes) -> None:
    got = typed(DiscoveryError, parse_ld_so_cache, data)
    if isinstance(got, DiscoveryError):
        assert "ld.so.cache" in str(got)
        return
    decoded = sum(len(e.name) + len(e.path) for e in got)
    assert decoded <= 16 * len(data) + 65536, f"{decoded} characters decoded from {len(data)} bytes"


@fuzz(500)
@given(data=st.one_of(mutated(CACHES, words=[48, 49, 24, 16, 12]), CACHES))
@example(data=struct.pack("<17s3sIIB3xI12x", NEW_MAGIC, NEW_VERSION, 0xFFFFFFFF, 0xFFFFFFFF, 2, 0))
@example(data=struct.pack("<11sxI", OLD_MAGIC, 0xFFFFFFFF))
@example(data=new_cache([(0x0303, b"libz.so.1", b"/lib/")])[:-1])  # the last NUL cut off
def test_mutated_caches(data: bytes) -> None:
    check(data)


@fuzz(500)
@given(
    data=st.one_of(
        st.binary(max_size=256),
        st.builds(
            bytes.__add__, st.sampled_from([OLD_MAGIC + b"\0", NEW_MAGIC + NEW_VERSION]), st.binary(max_size=256)
        ),
    )
)
def test_arbitrary_bytes(data: bytes) -> None:
    check(data)


@fuzz(200)
@given(specs=SPECS, layout=st.sampled_from(["new", "old", "compat"]))
def test_valid_caches_read_back(specs: list[Spec], layout: str) -> None:
    data = new_cache(specs) if layout == "new" else old_cache(specs, layout == "compat")
    got = parse_ld_so_cache(data)
    wanted = [(n.decode(errors="surrogateescape"), (d + n).decode(errors="surrogateescape"), f) for f, n, d in specs]
    assert [(e.name, e.path, e.flags) for e in got] == wanted


OURS = [
    LdCacheEntry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0x0303, True),
    LdCacheEntry("libcuda.so", "/usr/lib/x86_64-linux-gnu/libcuda.so", 0x0303, True),
    LdCacheEntry("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", 0x0003, False),
]


@fuzz(300)
@given(data=st.one_of(mutated(CACHES, words=[48, 49, 24, 16, 12, 32]), CACHES, st.binary(max_size=256)))
def test_merging_into_a_hostile_cache(data: bytes) -> None:
    """What StartContainer does with the image's cache (engine.start.ldconfig.merge):
    anything readable merges, encodes and reads back to the same; the rest is a
    DiscoveryError (and is then treated as no cache)."""
    got = typed(DiscoveryError, read_ld_so_cache, data)
    if isinstance(got, DiscoveryError):
        return
    merged = merge(got, OURS)
    assert set(OURS) <= set(merged.entries)
    assert read_ld_so_cache(encode(merged)) == merged
