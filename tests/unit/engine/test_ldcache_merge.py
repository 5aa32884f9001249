"""The ld.so.cache merge, held against glibc's own ldconfig and loader order.

The order is the whole point: glibc's loader binary-searches the entries, so a
merged cache must be sorted exactly as ldconfig sorts. The references are real
caches (the host's, and those ``testbed.ldcaches`` has the real ldconfig
write for the driver's libraries, one with a ``glibc-hwcaps`` entry): shuffled
and sorted again they must come back in file order, and what ``encode`` writes
must read back the same through ``ldconfig -p``. That a merge equals a real
rebuild of a container is tested on runc containers
(``tests/integration/test_start.py``).
"""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpu.engine.ldcache import (
    HWCAP_EXTENSION,
    LdCache,
    LdCacheLimit,
    is_64bit_flags,
    is_hwcaps_entry,
    read_ld_so_cache,
)
from nri_gpu.engine.ldcache_merge import GENERATOR, encode, libcmp, merge, sorted_like_ldconfig
from nri_gpu.engine.model import LdCacheEntry

HOST_CACHE = Path("/etc/ld.so.cache")
X86_64 = 0x0303
I386 = 0x0003


def entry(name: str, path: str = "", flags: int = X86_64, hwcap: int = 0, osversion: int = 0) -> LdCacheEntry:
    return LdCacheEntry(name, path or f"/lib/{name}", flags, is_64bit_flags(flags), hwcap, osversion)


def real_caches() -> dict[str, bytes]:
    """Caches the real ldconfig writes, in each format, of the committed driver fixture's
    libraries; and this host's own cache."""
    from testbed import ldcaches
    from testbed.gpunode import FIXTURE_DRIVER

    found = {kind: ldcaches.real_cache(kind, FIXTURE_DRIVER) for kind in ldcaches.KINDS}
    if HOST_CACHE.is_file():
        found["host"] = HOST_CACHE.read_bytes()
    return found


# --------------------------------------------------------------------------- _dl_cache_libcmp


@pytest.mark.parametrize(
    ("left", "right", "sign"),
    [
        ("libz.so.1", "libz.so.1", 0),
        ("libc.so.10", "libc.so.9", 1),  # digit runs are numbers
        ("libc.so.010", "libc.so.10", 0),  # leading zeros do not count
        ("libfoo2.so", "libfooa.so", 1),  # a digit sorts after any other character
        ("liba.so", "liba.so.1", -1),  # a prefix first
        ("libé.so", "libz.so", -1),  # bytes >= 0x80 are negative (x86's signed char)
        ("lib3000000000.so", "lib1.so", -1),  # C's int wraps: 3000000000 becomes negative
    ],
)
def test_libcmp_is_glibcs(left: str, right: str, sign: int) -> None:
    result = libcmp(left, right)
    assert (result > 0) - (result < 0) == sign
    back = libcmp(right, left)
    assert (back > 0) - (back < 0) == -sign


def test_ldconfigs_own_caches_come_back_in_file_order() -> None:
    caches = real_caches()
    assert "new-hwcaps" in caches
    for kind, data in caches.items():
        entries = list(read_ld_so_cache(data).entries)
        shuffled = entries[:]
        random.Random(kind).shuffle(shuffled)
        assert sorted_like_ldconfig(shuffled) == entries, kind


# --------------------------------------------------------------------------- encode


def test_encoded_caches_read_back_the_same_through_glibcs_reader() -> None:
    ldcaches = pytest.importorskip("testbed.ldcaches")
    for kind, data in real_caches().items():
        cache = read_ld_so_cache(data)
        ours = encode(cache)
        assert read_ld_so_cache(ours) == cache, kind
        assert ldcaches.print_cache(ours) == ldcaches.print_cache(data), kind


def test_the_hwcaps_names_and_the_generator_are_written() -> None:
    cache = read_ld_so_cache(real_caches()["new-hwcaps"])
    assert cache.hwcaps == ("x86-64-v3",)
    assert [e.name for e in cache.entries if is_hwcaps_entry(e)] == ["libz.so.1"]
    data = encode(cache)
    assert data.endswith(GENERATOR.encode())
    assert encode(LdCache(())).startswith(b"glibc-ld.so.cache1.1\0\0\0\0")


def test_a_malformed_extension_keeps_the_entries_and_drops_what_needs_it() -> None:
    cache = read_ld_so_cache(real_caches()["new-hwcaps"])
    data = bytearray(encode(cache))
    (offset,) = struct.unpack_from("<I", data, 32)
    data[offset : offset + 4] = b"\0\0\0\0"  # the extension magic
    broken = read_ld_so_cache(bytes(data))
    assert broken.entries == cache.entries and broken.hwcaps == ()
    kept = merge(broken, ()).entries
    assert [e for e in kept if is_hwcaps_entry(e)] == []
    assert len(kept) == len(cache.entries) - 1


# --------------------------------------------------------------------------- merge


def test_ours_go_where_ldconfig_puts_them_before_their_ties() -> None:
    image = LdCache(
        tuple(
            sorted_like_ldconfig(
                [
                    entry("libz.so.1"),
                    entry("libnvidia-ml.so.1", "/opt/stub/libnvidia-ml.so.1"),
                    entry("libm.so.6", osversion=0x03020000),
                    entry("libcuda.so.1", "/opt/old/libcuda.so.1", hwcap=HWCAP_EXTENSION),
                ]
            )
        ),
        ("x86-64-v3",),
    )
    ours = [
        entry("libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        entry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        entry("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", flags=I386),
        entry("libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6"),
    ]
    merged = [(e.name, e.path) for e in merge(image, ours).entries]
    assert merged == [
        ("libz.so.1", "/lib/libz.so.1"),
        ("libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),  # before the image's tie
        ("libnvidia-ml.so.1", "/opt/stub/libnvidia-ml.so.1"),
        ("libm.so.6", "/lib/libm.so.6"),  # a higher osversion first
        ("libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6"),
        ("libcuda.so.1", "/opt/old/libcuda.so.1"),  # glibc-hwcaps entries before plain ones
        ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        ("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),  # lower flags last
    ]


def test_the_same_library_is_listed_once_and_a_second_merge_changes_nothing() -> None:
    mine = entry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    stale = entry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", osversion=7)
    once = merge(LdCache((entry("libz.so.1"), stale)), [mine])
    assert once.entries == (entry("libz.so.1"), mine)
    assert merge(read_ld_so_cache(encode(once)), [mine]) == once


def test_an_unsorted_image_keeps_its_order() -> None:
    image = (entry("liba.so.1"), entry("libz.so.1"), entry("libm.so.6"))  # not ldconfig's order
    merged = merge(LdCache(image), [entry("libq.so.1")]).entries
    assert [e for e in merged if e.name != "libq.so.1"] == list(image)


_NAMES = st.text(alphabet="lib.so-_09xé", min_size=1, max_size=12)
_ENTRIES = st.builds(
    entry,
    _NAMES,
    _NAMES.map(lambda n: f"/lib/{n}"),
    st.sampled_from([X86_64, I386, 0x0A03]),
    st.sampled_from([0, 1, 3, HWCAP_EXTENSION]),
    st.sampled_from([0, 0x03020000]),
)


@settings(max_examples=300, deadline=None)
@given(image=st.lists(_ENTRIES, max_size=30), ours=st.lists(_ENTRIES, max_size=10))
def test_merged_caches_stay_sorted_and_round_trip(image: list[LdCacheEntry], ours: list[LdCacheEntry]) -> None:
    plain = [e for e in ours if not is_hwcaps_entry(e)]
    base = LdCache(tuple(sorted_like_ldconfig(image)), ("x86-64-v2",))
    merged = merge(base, plain)
    assert sorted_like_ldconfig(merged.entries) == list(merged.entries)
    keys = {(e.name, e.path) for e in plain}
    assert [e for e in merged.entries if (e.name, e.path) not in keys] == [
        e for e in base.entries if (e.name, e.path) not in keys
    ]
    assert read_ld_so_cache(encode(merged)) == merged


def test_a_merge_past_its_deadline_stops_with_a_clear_error() -> None:
    image = LdCache(tuple(LdCacheEntry(f"libx{i}.so.1", f"/lib/libx{i}.so.1", 0x0303, True, 0) for i in range(9000)))
    ours = [LdCacheEntry("libcuda.so.1", "/usr/lib/libcuda.so.1", 0x0303, True, 0)]
    assert len(merge(image, ours, deadline=time.monotonic() + 60).entries) == 9001
    with pytest.raises(LdCacheLimit, match="the merge did not finish before the deadline"):
        merge(image, ours, deadline=time.monotonic() - 1)
    with pytest.raises(LdCacheLimit, match="writing the merged cache did not finish before the deadline"):
        encode(image, deadline=time.monotonic() - 1)
