"""``plugin.config_files``: what install and uninstall read beside a runtime's config."""

from __future__ import annotations

import ctypes
import os
import stat
import struct
from pathlib import Path

import pytest

from plugin.config_files import FileRefused, Folder

_IN_OPEN = 0x20


def _opens(fd: int) -> int:
    count = 0
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return count
        at = 0
        while at < len(data):
            _, mask, _, size = struct.unpack_from("iIII", data, at)
            count += bool(mask & _IN_OPEN)
            at += 16 + size


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_where_a_file_is_read_is_never_opened(tmp_path: Path, kind: str) -> None:
    """Whoever can write the folder may hard-link a device node there (on the same file
    system, one they may read and write): opening it at all is its side effect (a
    watchdog starts counting down, a tape rewinds). Only the ``O_PATH`` handle's type
    is looked at; an inotify ``IN_OPEN`` watch on the inode shows any real open."""
    planted = tmp_path / "config.toml"
    if kind == "fifo":
        os.mkfifo(planted, 0o666)
    else:  # /dev/null's numbers: harmless, and an open shows as an inotify event
        os.mknod(planted, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    libc = ctypes.CDLL(None, use_errno=True)
    watch = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert watch >= 0 and libc.inotify_add_watch(watch, str(planted).encode(), _IN_OPEN) >= 0
    try:
        with Folder(tmp_path) as folder, pytest.raises(FileRefused, match="is not a regular file"):
            folder.read("config.toml", if_link="")
        assert _opens(watch) == 0
    finally:
        os.close(watch)


def test_a_regular_file_is_read_and_a_link_refused(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_bytes(b"version = 2\n")
    os.symlink("config.toml", tmp_path / "link.toml")
    with Folder(tmp_path) as folder:
        found = folder.read("config.toml", if_link="")
        assert found is not None and found[0] == b"version = 2\n" and stat.S_ISREG(found[1].st_mode)
        assert folder.read("missing.toml", if_link="") is None
        with pytest.raises(FileRefused, match="is a symbolic link"):
            folder.read("link.toml", if_link="replace it")
