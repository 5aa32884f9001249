"""procfs mount points from a mountinfo file."""

from __future__ import annotations

import pytest

from engine.start.mountinfo import proc_mount_points

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
