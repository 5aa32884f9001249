"""The image's CUDA compat folder read in a root (``engine.start.compat``): the
hostile layouts an image can ship, and the cache entries of a real-looking one.

The root is a plain directory opened as a ``RootDir`` (the worker's copy of a
container's root in the real start work); the libraries are built with gcc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_gpu.engine.ldcache import LdCache
from nri_gpu.engine.ldcache_merge import encode, merge
from nri_gpu.engine.model import LdCacheEntry
from nri_gpu.engine.start import compat
from nri_gpu.engine.start.rootdir import RootDir

HOST = "550.163.01"
COMPAT = "usr/local/cuda/compat"
X86_64 = 0x0303


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """libcuda (soname libcuda.so.1) and libnvidia-nvvm (soname libnvidia-nvvm.so.4)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc to build the test libraries")
    d = tmp_path_factory.mktemp("libs")
    (d / "x.c").write_text("int nri_gpu_compat_test;\n")
    built = {}
    for soname in ("libcuda.so.1", "libnvidia-nvvm.so.4"):
        out = d / soname
        subprocess.run([gcc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(d / "x.c")], check=True)
        built[soname] = out
    return built


@pytest.fixture
def root(tmp_path: Path) -> Iterator[tuple[RootDir, Path]]:
    tree = tmp_path / "root"
    (tree / COMPAT).mkdir(parents=True)
    r = RootDir(os.open(tree, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    try:
        yield r, tree
    finally:
        r.close()


def cuda_compat_layout(folder: Path, libs: dict[str, Path], version: str = "555.58.02") -> None:
    """What NVIDIA's cuda-compat package installs: the real files and their links."""
    shutil.copy(libs["libcuda.so.1"], folder / f"libcuda.so.{version}")
    os.symlink(f"libcuda.so.{version}", folder / "libcuda.so.1")
    os.symlink("libcuda.so.1", folder / "libcuda.so")
    shutil.copy(libs["libnvidia-nvvm.so.4"], folder / f"libnvidia-nvvm.so.{version}")
    os.symlink(f"libnvidia-nvvm.so.{version}", folder / "libnvidia-nvvm.so.4")
    (folder / "README").write_text("not a library\n")


def entry(name: str) -> LdCacheEntry:
    return LdCacheEntry(name, f"/{COMPAT}/{name}", X86_64, True, 0, 0)


def test_a_newer_compat_folder_is_used_with_the_entries_ldconfig_would_list(
    root: tuple[RootDir, Path], libs: dict[str, Path]
) -> None:
    r, tree = root
    cuda_compat_layout(tree / COMPAT, libs)
    found = compat.check(r, HOST)
    assert found.decision is not None and found.decision.use, found
    assert found.folder == "/usr/local/cuda/compat"
    assert found.entries == (entry("libcuda.so"), entry("libcuda.so.1"), entry("libnvidia-nvvm.so.4"))


def test_an_older_compat_folder_is_not_used(root: tuple[RootDir, Path], libs: dict[str, Path]) -> None:
    r, tree = root
    cuda_compat_layout(tree / COMPAT, libs, version="535.183.06")
    found = compat.check(r, HOST)
    assert found.decision is not None and not found.decision.use
    assert "not newer than the driver 550.163.01" in found.note
    assert found.entries == () and found.folder is None


def test_no_compat_folder_says_nothing(tmp_path: Path) -> None:
    r = RootDir(os.open(tmp_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    try:
        assert compat.check(r, HOST) == compat.Compat()
    finally:
        r.close()


# --------------------------------------------------------------------------- hostile images


def test_a_compat_folder_linked_to_a_host_path_is_read_in_the_root(tmp_path: Path, libs: dict[str, Path]) -> None:
    """``/usr/local/cuda/compat -> <a host folder holding a newer libcuda>``: the
    link is followed as the container would (in its root), where there is no
    such folder; the host's files are never looked at."""
    host = tmp_path / "host-compat"
    host.mkdir()
    cuda_compat_layout(host, libs)
    tree = tmp_path / "root"
    (tree / "usr/local/cuda").mkdir(parents=True)
    os.symlink(host, tree / COMPAT)
    r = RootDir(os.open(tree, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    try:
        assert compat.check(r, HOST) == compat.Compat()  # as if there were none: the host's is not the image's
    finally:
        r.close()


def test_a_compat_folder_linked_to_etc_is_the_containers_etc(root: tuple[RootDir, Path]) -> None:
    r, tree = root
    os.rmdir(tree / COMPAT)
    (tree / "etc").mkdir()
    (tree / "etc/libcuda.so.999.0").write_bytes(b"not an ELF file")
    os.symlink("/etc", tree / COMPAT)
    found = compat.check(r, HOST)
    assert found.decision is not None and not found.decision.use
    assert found.note == ("/usr/local/cuda/compat/libcuda.so.999.0: not an ELF file: the driver's libraries are used")


def test_a_libcuda_linked_to_a_host_file_is_not_followed_out(
    root: tuple[RootDir, Path], libs: dict[str, Path], tmp_path: Path
) -> None:
    """``libcuda.so.999.0 -> /<host path of a real newer libcuda>``: resolved in
    the root, where that path does not exist."""
    r, tree = root
    host = tmp_path / "host-lib"
    shutil.copy(libs["libcuda.so.1"], host)
    os.symlink(str(host), tree / COMPAT / "libcuda.so.999.0")
    found = compat.check(r, HOST)
    assert found.decision is not None and not found.decision.use
    assert found.note.startswith("/usr/local/cuda/compat/libcuda.so.999.0: No such file or directory"), found.note


def test_a_libcuda_through_a_proc_magic_link_is_refused(root: tuple[RootDir, Path]) -> None:
    r, tree = root
    (tree / "proc").mkdir()
    os.symlink(f"/proc/{os.getpid()}/root/etc/hostname", tree / COMPAT / "libcuda.so.999.0")
    # A real procfs under the root, as a container has: the magic link is refused.
    subprocess.run(["mount", "-t", "proc", "proc", str(tree / "proc")], check=True)
    try:
        found = compat.check(r, HOST)
    finally:
        subprocess.run(["umount", "-l", str(tree / "proc")], check=True)
    assert found.decision is not None and not found.decision.use
    assert found.note.startswith("/usr/local/cuda/compat/libcuda.so.999.0: refused: "), found.note  # never read


def test_a_fifo_named_libcuda_is_never_opened(root: tuple[RootDir, Path]) -> None:
    """A reader would block on it forever; it is refused from the listing."""
    r, tree = root
    os.mkfifo(tree / COMPAT / "libcuda.so.999.0")
    began = time.monotonic()
    found = compat.check(r, HOST)
    assert time.monotonic() - began < 1
    assert (
        found.note
        == "/usr/local/cuda/compat/libcuda.so.999.0 is neither a file nor a link: the driver's libraries are used"
    )


def test_a_link_to_a_fifo_named_libcuda_does_not_block(root: tuple[RootDir, Path]) -> None:
    r, tree = root
    os.mkfifo(tree / "fifo")
    os.symlink("/fifo", tree / COMPAT / "libcuda.so.999.0")
    began = time.monotonic()
    found = compat.check(r, HOST)
    assert time.monotonic() - began < 1
    assert found.note == "/usr/local/cuda/compat/libcuda.so.999.0: not a regular file: the driver's libraries are used"


def test_a_device_node_named_libcuda_is_never_opened(root: tuple[RootDir, Path]) -> None:
    r, tree = root
    os.mknod(tree / COMPAT / "libcuda.so.999.0", 0o600 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers
    found = compat.check(r, HOST)
    assert found.decision is not None and not found.decision.use
    assert "is neither a file nor a link" in found.note


def test_a_huge_libcuda_costs_a_few_bounded_reads(root: tuple[RootDir, Path], libs: dict[str, Path]) -> None:
    """A 64 GiB (sparse) file whose section table claims to lie at its end: read
    in a few pieces of at most 256 KiB, never whole."""
    r, tree = root
    big = tree / COMPAT / "libcuda.so.999.0"
    shutil.copy(libs["libcuda.so.1"], big)
    with open(big, "r+b") as f:
        f.truncate(64 << 30)
        f.seek(0x28)
        f.write(((64 << 30) - 4096).to_bytes(8, "little"))
        f.seek(0x3C)
        f.write((4000).to_bytes(2, "little"))  # 4000 sections of 64 bytes: past the end
    began = time.monotonic()
    found = compat.check(r, HOST)
    assert time.monotonic() - began < 0.5
    assert found.decision is not None and not found.decision.use
    assert found.note == (
        "/usr/local/cuda/compat/libcuda.so.999.0: a table beyond the end of the file: the driver's libraries are used"
    )


def test_thousands_of_entries_are_refused_without_listing_them_all(root: tuple[RootDir, Path]) -> None:
    r, tree = root
    for i in range(5000):
        (tree / COMPAT / f"f{i}").touch()
    began = time.monotonic()
    found = compat.check(r, HOST)
    assert time.monotonic() - began < 0.5
    assert found.note == "/usr/local/cuda/compat: over 256 entries: the driver's libraries are used"


def test_two_candidates_leave_the_driver_in_place(root: tuple[RootDir, Path], libs: dict[str, Path]) -> None:
    r, tree = root
    cuda_compat_layout(tree / COMPAT, libs)
    shutil.copy(libs["libcuda.so.1"], tree / COMPAT / "libcuda.so.560.35.03")
    found = compat.check(r, HOST)
    assert found.decision is not None and not found.decision.use and found.entries == ()
    assert found.note == (
        "2 candidates in /usr/local/cuda/compat (libcuda.so.555.58.02, libcuda.so.560.35.03): "
        "the driver's libraries are used"
    )


def test_a_library_linked_out_of_the_root_is_left_out_of_the_entries(
    root: tuple[RootDir, Path], libs: dict[str, Path], tmp_path: Path
) -> None:
    """A used folder whose libnvidia-ptxjitcompiler.so.1 points at a host path:
    not listed (in the root it leads nowhere), the rest are."""
    r, tree = root
    cuda_compat_layout(tree / COMPAT, libs)
    host = tmp_path / "host-ptx"
    shutil.copy(libs["libcuda.so.1"], host)
    os.symlink(str(host), tree / COMPAT / "libnvidia-ptxjitcompiler.so.1")
    found = compat.check(r, HOST)
    assert found.decision is not None and found.decision.use
    assert [e.name for e in found.entries] == ["libcuda.so", "libcuda.so.1", "libnvidia-nvvm.so.4"]


def test_a_candidate_that_is_no_libcuda_is_not_used(root: tuple[RootDir, Path], libs: dict[str, Path]) -> None:
    """An ELF library of another soname named libcuda.so.999.1 (the hostile image of
    tests/e2e/test_hostile_images.py::test_cuda_compat_folder_linked_to_the_host,
    whose compat link resolves to such a folder inside the image)."""
    r, tree = root
    shutil.copy(libs["libnvidia-nvvm.so.4"], tree / COMPAT / "libcuda.so.999.1")
    os.symlink("libcuda.so.999.1", tree / COMPAT / "libcuda.so.1")
    found = compat.check(r, HOST)
    assert found.note == (
        "/usr/local/cuda/compat/libcuda.so.999.1 is not a libcuda.so.1 (its soname is 'libnvidia-nvvm.so.4'): "
        "the driver's libraries are used"
    )


# Hostile libraries whose headers made the Python reader raise past its own
# error handling (found by the compiled hook's port, which reads the same files:
# hook/tests/fixtures/compat/build.py makes them). None may fail the start.
HOSTILE = Path(__file__).resolve().parents[4] / "hook" / "tests" / "fixtures" / "compat"


@pytest.mark.parametrize(
    ("fixture", "said"),
    [
        # e_phoff 2**64-1: os.pread took it as an OverflowError; read as past the end, as any offset there.
        ("phoff-max.so", "a table beyond the end of the file"),
        # An ABI note whose descriptor is cut short (it was a struct.error).
        ("abi-note-truncated.so", "an ABI tag note cut short"),
    ],
)
def test_a_libcuda_whose_headers_cannot_be_read_is_a_reason_not_a_failure(
    root: tuple[RootDir, Path], fixture: str, said: str
) -> None:
    r, tree = root
    shutil.copy(HOSTILE / fixture, tree / COMPAT / "libcuda.so.999.1")
    found = compat.check(r, HOST)
    assert found.decision is not None and not found.decision.use, found
    assert said in found.decision.reason and "the driver's libraries are used" in found.decision.reason, found


def test_an_abi_note_past_32_bits_gives_glibcs_low_32_bits(root: tuple[RootDir, Path], libs: dict[str, Path]) -> None:
    """ldconfig computes the osversion in a uint32: an OS field of 0x1234 keeps 0x34 (the
    cache's field is 32 bits; a wider value made the merge fail with a struct.error)."""
    r, tree = root
    cuda_compat_layout(tree / COMPAT, libs)
    for name in ("libcuda.so.555.58.02",):
        shutil.copy(HOSTILE / "abi-note-os-big.so", tree / COMPAT / name)
    found = compat.check(r, "550.1")
    assert found.decision is not None and found.decision.use, found
    wide = [e for e in found.entries if e.name.startswith("libcuda")]
    assert wide and all(e.osversion >> 24 == 0x34 for e in wide), wide
    encode(merge(LdCache(()), found.entries))
