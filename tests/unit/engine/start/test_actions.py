"""The start work's host-side parts that need no container."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.start import actions, ldconfig
from engine.start.rootdir import RootDir
from engine.start.work import WorkError


def test_a_hooks_mountinfo_is_read_within_a_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook reads its own mountinfo (the host's mounts, then the container's):
    bounded as the plugin's read of a container's is, and refused when over
    (cut short, a procfs mount could be left uncovered for ldconfig)."""
    monkeypatch.setattr(ldconfig, "open_trusted", lambda path: os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
    root = RootDir(os.open(tmp_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    try:
        trusted = actions._trusted_here(root, str(tmp_path), "/sbin/ldconfig")
        for fd in (trusted.binary, trusted.devnull, trusted.own_pid_namespace):
            if fd is not None:
                os.close(fd)
        monkeypatch.setattr(actions, "_MOUNTINFO_LIMIT", 64)
        with pytest.raises(WorkError, match=r"^/proc/self/mountinfo: over 64 bytes"):
            actions._trusted_here(root, str(tmp_path), "/sbin/ldconfig")
    finally:
        root.close()
