"""procfs mount points from a mountinfo file; the host-side check for nri-gpu's /proc/driver view."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nri_gpu.engine.start.mountinfo import proc_mount_points
from nri_gpu.engine.start.procview import MARKER, marker_text
from nri_gpu.engine.start.runner import shows_driver_view

# A runc container's mountinfo (runc 1.1.5, containerd's masked and read-only paths).
RUNC = """\
69 46 0:39 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
70 69 0:48 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
71 69 0:49 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
75 70 0:49 /null /proc/kcore rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
80 70 0:48 /bus /proc/bus ro,nosuid,nodev,noexec,relatime - proc proc rw
81 70 0:48 /sys /proc/sys ro,nosuid,nodev,noexec,relatime - proc proc rw
"""


def test_nested_proc_mounts_are_covered_by_their_parent() -> None:
    assert proc_mount_points(RUNC) == ("/proc",)


def test_every_separate_procfs_counts_and_names_are_unescaped() -> None:
    text = RUNC + "90 69 0:50 / /host/my\\040proc rw - proc proc rw\n91 69 0:51 / /procfoo rw - proc proc rw\n"
    assert proc_mount_points(text) == ("/host/my proc", "/proc", "/procfoo")


def test_no_procfs_at_all() -> None:
    assert proc_mount_points("1 0 0:1 / / rw - ext4 /dev/vda rw\n") == ()


def test_a_malformed_line_is_named() -> None:
    with pytest.raises(ValueError, match="malformed line 'garbage'"):
        proc_mount_points("garbage\n")


def _fake_pid(proc: Path, pid: int, marker: bytes | None, where: str = "proc/driver/nvidia") -> Path:
    """``<proc>/<pid>/root`` as a plain directory, the view's marker at ``where``."""
    root = proc / str(pid) / "root"
    (root / where).mkdir(parents=True)
    if marker is not None:
        (root / where / MARKER).write_bytes(marker)
    return root


def test_the_host_side_check_looks_up_the_views_marker_in_the_pids_root(tmp_path: Path) -> None:
    finished = marker_text(("0000:07:00.0",), "container")
    _fake_pid(tmp_path, 7, finished)
    _fake_pid(tmp_path, 8, None)
    _fake_pid(tmp_path, 9, finished, where="proc/driver")  # a simulated node: the view covers /proc/driver
    _fake_pid(tmp_path, 11, b"nri-gpu procfs view 1\nunfinished\n")  # a worker killed mid-build
    assert shows_driver_view(7, proc=str(tmp_path)) is True
    assert shows_driver_view(8, proc=str(tmp_path)) is False
    assert shows_driver_view(9, proc=str(tmp_path)) is True
    assert shows_driver_view(10, proc=str(tmp_path)) is None  # gone
    assert shows_driver_view(11, proc=str(tmp_path)) is False


def test_the_host_side_check_follows_no_link_and_opens_no_fifo(tmp_path: Path) -> None:
    """Whatever the container put there: links out of its root (to a host
    directory holding a finished marker) do not count, and a FIFO in the
    marker's place is never opened for reading (that would block)."""
    host = tmp_path / "host"
    host.mkdir()
    (host / MARKER).write_bytes(marker_text(("0000:07:00.0",), "container"))
    root = _fake_pid(tmp_path / "proc", 7, None, where="proc/driver")
    (root / "proc/driver/nvidia").symlink_to(host)
    assert shows_driver_view(7, proc=str(tmp_path / "proc")) is None
    root = _fake_pid(tmp_path / "proc", 8, None)
    os.mkfifo(root / "proc/driver/nvidia" / MARKER)
    assert shows_driver_view(8, proc=str(tmp_path / "proc")) is False
