"""The start work's host-side parts that need no container."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nri_gpu.engine.start import actions
from nri_gpu.engine.start.work import WorkError


def test_a_containers_mountinfo_is_read_within_a_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The procfs mount points ldconfig's view must cover come from the container's
    mountinfo: bounded, and refused when over (cut short, a procfs mount could be
    left uncovered for ldconfig)."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("22 1 0:21 / /proc rw,nosuid - proc proc rw\n")
    found = actions._proc_mounts(os.open(mountinfo, os.O_RDONLY | os.O_CLOEXEC), "the container's mountinfo")
    assert found == ("/proc",)
    monkeypatch.setattr(actions, "_MOUNTINFO_LIMIT", 16)
    with pytest.raises(WorkError, match=r"^the container's mountinfo: over 16 bytes"):
        actions._proc_mounts(os.open(mountinfo, os.O_RDONLY | os.O_CLOEXEC), "the container's mountinfo")
