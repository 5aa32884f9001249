"""The ld.so.cache parser (engine.ldcache) on caches the real ldconfig wrote of
NVIDIA's own 550.163.01 libraries, 64-bit and i386 (hack/testbed/ldcaches.py),
checked against glibc's own reader. Integration, not unit: it needs NVIDIA's files
(downloaded once); the unit tests (tests/unit/engine/test_ldcache.py) use caches of
this host's libraries and of the committed fixture.
"""

from __future__ import annotations

import pytest

from nri_gpu.engine.ldcache import parse_ld_so_cache
from testbed import ldcaches
from testbed.debs import DebUnavailable
from tests.unit.engine.test_ldcache import _PRINTED_TYPE, rows

NVIDIA_KINDS = ("new", "old", "compat", "new-hwcaps")


@pytest.mark.parametrize("kind", NVIDIA_KINDS)
def test_caches_of_the_real_nvidia_driver_libraries(kind: str) -> None:
    """The 550.163.01 driver's libraries, 64-bit and i386, in a cache the real ldconfig wrote (hack/testbed)."""
    try:
        data = ldcaches.real_cache(kind)
    except DebUnavailable as exc:
        pytest.skip(f"the driver packages cannot be fetched: {exc}")
    entries = parse_ld_so_cache(data)
    reference = [
        (e.soname, _PRINTED_TYPE[e.flags.split(",")[0]], e.flags.split(",")[1:2] == ["x86-64"], e.path)
        for e in ldcaches.print_cache(data)
    ]
    assert rows(entries) == reference
    libcuda = {(e.is_64bit, e.flags, e.path) for e in entries if e.name == "libcuda.so.1"}
    assert libcuda == {
        (True, 0x0303, "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        (False, 0x0003, "/usr/lib/i386-linux-gnu/libcuda.so.1"),
    }
    hwcaps = [e for e in entries if e.hwcap]
    if kind == "new-hwcaps":
        assert [(e.name, e.hwcap >> 62) for e in hwcaps] == [("libz.so.1", 1)]
    else:
        assert hwcaps == []
