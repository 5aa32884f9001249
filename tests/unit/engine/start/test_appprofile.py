"""The application profile written in a container's root (``engine.start.appprofile``):
in the root, atomically, never through a link the image planted."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_gpu.engine.graphics import APP_PROFILE_PATH, app_profile_text
from nri_gpu.engine.start import appprofile
from nri_gpu.engine.start.rootdir import RootDir
from nri_gpu.engine.start.work import WorkError

TEXT = app_profile_text((1, 3))


@pytest.fixture
def root(tmp_path: Path) -> Iterator[tuple[RootDir, Path]]:
    tree = tmp_path / "root"
    tree.mkdir()
    r = RootDir(os.open(tree, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    try:
        yield r, tree
    finally:
        r.close()


def test_written_once_then_left_as_it_is(root: tuple[RootDir, Path]) -> None:
    r, tree = root
    assert appprofile.write(r, TEXT) is True
    path = tree / APP_PROFILE_PATH.lstrip("/")
    assert path.read_text() == TEXT and (path.stat().st_mode & 0o777) == 0o644
    assert appprofile.write(r, TEXT) is False
    assert appprofile.write(r, app_profile_text((0,))) is True
    assert "0x1]" in path.read_text()


def test_a_planted_link_is_replaced_not_followed(root: tuple[RootDir, Path], tmp_path: Path) -> None:
    r, tree = root
    outside = tmp_path / "outside.conf"
    outside.write_text("host file\n")
    folder = tree / APP_PROFILE_PATH.lstrip("/").rsplit("/", 1)[0]
    folder.mkdir(parents=True)
    os.symlink(str(outside), folder / "10-container.conf")
    assert appprofile.write(r, TEXT) is True
    assert outside.read_text() == "host file\n"
    assert not (folder / "10-container.conf").is_symlink()
    assert (folder / "10-container.conf").read_text() == TEXT


def test_an_absolute_folder_link_never_leads_out_of_the_root(root: tuple[RootDir, Path], tmp_path: Path) -> None:
    r, tree = root
    escape = tmp_path / "escape"
    escape.mkdir()
    (tree / "etc").mkdir()
    # /etc/nvidia -> <escape> on the host; in the root it means <root><escape>, which is not there.
    os.symlink(str(escape), tree / "etc/nvidia")
    with pytest.raises(WorkError, match="/etc/nvidia: a symlink to nowhere"):
        appprofile.write(r, TEXT)
    assert list(escape.iterdir()) == []
    (tree / str(escape).lstrip("/")).mkdir(parents=True)  # now it leads somewhere in the root
    assert appprofile.write(r, TEXT) is True
    assert list(escape.iterdir()) == []
    inside = tree / str(escape).lstrip("/") / "nvidia-application-profiles-rc.d/10-container.conf"
    assert inside.read_text() == TEXT
