"""The committed driver fixture (tests/fixtures/node, written by its make-driver) is
what it says: its ld.so.cache lists what this machine's glibc ldconfig writes of its
libraries, and every entry leads to a library of the fixture whose SONAME is the
entry's name. Checked with the system's tools, never with the engine's parsers.
Unit tests trust it as they trust the real tree (tests/integration/test_gpunode.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import ldcaches
from testbed.gpunode import FIXTURE_DRIVER, FIXTURE_NO_DRIVER, LIB64, elf_soname


@pytest.mark.parametrize("tree", [FIXTURE_DRIVER, FIXTURE_NO_DRIVER], ids=["driver", "nodriver"])
def test_the_cache_is_the_real_ldconfigs_and_leads_to_the_fixtures_libraries(tree: Path) -> None:
    committed = (tree / "etc/ld.so.cache").read_bytes()
    entries = ldcaches.print_cache(committed)
    # Compared as glibc reads them: the bytes name the ldconfig that wrote them.
    assert ldcaches.print_cache(ldcaches.real_cache("new", tree)) == entries, "stale: run make-driver"
    assert entries and all(e.flags == "libc6,x86-64" for e in entries)
    for entry in entries:
        path = tree / entry.path.lstrip("/")
        assert path.resolve().is_file() and path.resolve().is_relative_to(tree.resolve()), entry
        if not entry.soname.endswith(".so"):  # the development link is named for the linker, not the SONAME
            assert elf_soname(path.resolve()) == entry.soname, entry
    links = {p.name for p in (tree / LIB64).iterdir() if p.is_symlink()}
    assert {e.soname for e in entries} == links


def test_the_driver_has_each_capabilitys_library_and_libcuda_answers_the_cuda_probe() -> None:
    from nri_gpu.engine.discover import _read_cuda_version

    names = {p.name for p in (FIXTURE_DRIVER / LIB64).iterdir()}
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-encode.so.1", "libGLX_nvidia.so.0"):
        assert soname in names
    assert _read_cuda_version(str(FIXTURE_DRIVER / LIB64 / "libcuda.so.1")) == ("12.4", None)
