"""Root: node paths read under a directory, links resolved as if it were /."""

from __future__ import annotations

import os
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest

from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.model import EntryType
from nri_gpu.engine.root import Root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.550.163.01").write_bytes(b"ELF")
    os.symlink("libcuda.so.550.163.01", lib / "libcuda.so.1")
    os.symlink("/usr/lib/x86_64-linux-gnu/libcuda.so.1", lib / "abs-link")
    os.symlink("../../../../../../etc/shadow", lib / "climbing")
    os.symlink("loop-b", lib / "loop-a")
    os.symlink("loop-a", lib / "loop-b")
    os.symlink("usr/lib", tmp_path / "lib")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/shadow").write_text("inside")
    return tmp_path


def test_relative_and_absolute_links_resolve_inside_the_root(tree: Path) -> None:
    root = Root(str(tree))
    real = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.163.01"
    assert root.resolve("/usr/lib/x86_64-linux-gnu/libcuda.so.1") == real
    assert root.resolve("/usr/lib/x86_64-linux-gnu/abs-link") == real  # "/" means the root, not the host
    assert root.resolve("/lib/x86_64-linux-gnu/libcuda.so.1") == real  # a linked folder
    assert root.read_bytes("/lib/x86_64-linux-gnu/abs-link") == b"ELF"


def test_dotdot_never_climbs_above_the_root(tree: Path) -> None:
    root = Root(str(tree))
    assert root.resolve("/usr/lib/x86_64-linux-gnu/climbing") == "/etc/shadow"
    assert root.read_text("/usr/lib/x86_64-linux-gnu/climbing") == "inside"  # the tree's file, not the host's


def test_link_loops_are_an_error_not_a_hang(tree: Path) -> None:
    with pytest.raises(DiscoveryError, match="too many levels of symbolic links"):
        Root(str(tree)).resolve("/usr/lib/x86_64-linux-gnu/loop-a")


def test_missing_files(tree: Path) -> None:
    root = Root(str(tree))
    assert not root.exists("/nope") and root.stat("/nope") is None and root.listdir("/nope") == []
    with pytest.raises(DiscoveryError, match="cannot read /nope"):
        root.read_text("/nope")


def test_host_path_joins_on_whole_components(tree: Path) -> None:
    assert Root("/").host_path("/usr/bin/x") == "/usr/bin/x"
    assert Root("/run/nvidia/driver").host_path("/usr/bin/x") == "/run/nvidia/driver/usr/bin/x"
    assert Root("/run/nvidia/driver").host_path("../../etc") == "/run/nvidia/driver/etc"


def test_read_limit(tree: Path) -> None:
    (tree / "big").write_bytes(b"x" * 100)
    with pytest.raises(DiscoveryError, match="larger than 10 bytes"):
        Root(str(tree)).read_bytes("/big", limit=10)


def test_relative_root_is_refused() -> None:
    with pytest.raises(DiscoveryError, match="must be an absolute path"):
        Root("relative/dir")


@pytest.mark.parametrize(
    "path",
    [
        "/run/nvidia/driver/missing/../../../../etc/shadow",  # the rest after a missing folder
        "/etc/shadow/../../../../etc/passwd",  # a file where a folder should be (ENOTDIR)
        "/missing/./../../..//etc/./shadow",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1/../../../../..",
    ],
)
def test_resolve_always_gives_a_clean_path_inside_the_root(tree: Path, path: str) -> None:
    """A missing component ends link resolution, but never lets ``..`` or ``.`` through:
    the answer becomes a mount source, and runc would walk a raw ``..`` out of the root."""
    resolved = Root(str(tree)).resolve(path)
    assert resolved.startswith("/") and posixpath.normpath(resolved) == resolved, resolved
    assert ".." not in resolved.split("/") and "//" not in resolved, resolved


_MOUNTED_ENTRY = """
import subprocess, sys
from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.model import EntryType
from nri_gpu.engine.root import Root
root, where = sys.argv[1:]
# What a FUSE file system a local user mounts on a folder of theirs (user_allow_other)
# reports for its root: whatever its owner likes, here root's 0755.
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,uid=0,gid=0", "bait", where], check=True)
try:
    print("taken" if Root(root).root_only_stat("/tmp/nvidia-mps", EntryType.DIRECTORY) is not None else "absent")
except DiscoveryError as exc:
    print("refused:", exc)
"""


def test_a_mount_on_an_entry_of_a_sticky_folder_is_refused(tmp_path: Path) -> None:
    """In ``/tmp`` anyone may make a folder and mount a FUSE file system of their own
    on it (``fusermount``), whose root then says it is root's and mode 0755: every
    inode we check below it is the user's word. A mount on an entry of a sticky
    folder is refused; the mount point's own owner is not what ``fstat`` shows."""
    root = tmp_path / "node"
    (root / "tmp/nvidia-mps").mkdir(parents=True)
    os.chmod(root, 0o755)
    os.chmod(root / "tmp", 0o1777)
    os.chown(root / "tmp/nvidia-mps", 1000, 1000)
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _MOUNTED_ENTRY,
         str(root), str(root / "tmp/nvidia-mps")],
        capture_output=True, text=True, timeout=30, cwd=Path(__file__).parents[3],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:") and "mount" in done.stdout, done.stdout


@pytest.mark.parametrize("path", ["run/x", "/", "/run/../x", "/run//x", "/run/./x", "/run/x/"])
def test_root_only_stat_refuses_a_path_that_is_not_clean(tmp_path: Path, path: str) -> None:
    """The walk takes each component as written: a '..' or empty one would not be the path runc binds."""
    with pytest.raises(DiscoveryError, match="is not a clean absolute path"):
        Root(str(tmp_path)).root_only_stat(path, EntryType.SOCKET)
