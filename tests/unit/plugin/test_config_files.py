"""``nri_gpu.plugin.cli.config_files``: what install and uninstall read beside a runtime's config."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nri_gpu.plugin.cli.config_files import FileRefused, Folder
from testbed.openwatch import OpenWatch


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
    with OpenWatch(planted) as watch:
        with Folder(tmp_path) as folder, pytest.raises(FileRefused, match="is not a regular file"):
            folder.read("config.toml", if_link="")
        assert watch.opens() == 0


def test_a_regular_file_is_read_and_a_link_refused(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_bytes(b"version = 2\n")
    os.symlink("config.toml", tmp_path / "link.toml")
    with Folder(tmp_path) as folder:
        found = folder.read("config.toml", if_link="")
        assert found is not None and found[0] == b"version = 2\n" and stat.S_ISREG(found[1].st_mode)
        assert folder.read("missing.toml", if_link="") is None
        with pytest.raises(FileRefused, match="is a symbolic link"):
            folder.read("link.toml", if_link="replace it")


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """Whoever can write the folder may plant a huge (here sparse) file: it is refused
    by its size, never read into memory."""
    with open(tmp_path / "config.toml", "wb") as planted:
        planted.truncate((16 << 20) + 1)
    with Folder(tmp_path) as folder, pytest.raises(FileRefused, match=r"config.toml is over 16777216 bytes"):
        folder.read("config.toml", if_link="")
