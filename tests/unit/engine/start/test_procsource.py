"""The procfs view's source strategies (procsource): which one a config chooses, and what
each does without a driver tree (the views themselves: tests/integration)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nri_gpu.engine.start import procsource, procview
from nri_gpu.engine.start.work import WorkError

BUS = ("0000:07:00.0",)


def test_a_real_node_takes_the_containers_own_tree_and_a_simulated_one_a_host_directory() -> None:
    real = procsource.source_for(None)
    simulated = procsource.source_for("/sim/proc/driver/nvidia")
    assert isinstance(real, procsource.DriverProcfs)
    assert (real.name, real.takes_outside) == ("container", False)
    assert isinstance(simulated, procsource.HostDirectory)
    assert (simulated.name, simulated.takes_outside, simulated.path) == ("host", True, "/sim/proc/driver/nvidia")


def test_the_marker_names_the_source() -> None:
    """A view made from another source is replaced, not kept."""
    assert procview.marker_text(BUS, "container") != procview.marker_text(BUS, "host")
    assert procview.marker_text(BUS, "host").splitlines()[1] == b"source: host"


def test_without_a_driver_tree_a_real_node_skips_the_view_or_refuses_gpus() -> None:
    real = procsource.DriverProcfs()
    assert real.take_inside(None, (), (), False) is None
    with pytest.raises(WorkError, match="is the NVIDIA driver loaded"):
        real.take_inside(None, BUS, (), False)
    with pytest.raises(WorkError, match="is the NVIDIA driver loaded"):
        real.take_inside(None, (), ("mig/monitor",), False)


def test_a_host_directory_is_taken_on_the_host_or_not_at_all() -> None:
    missing = procsource.HostDirectory("/nonexistent/driver/nvidia")
    with pytest.raises(WorkError, match=r"^/nonexistent/driver/nvidia: No such file or directory$"):
        missing.take_outside(BUS, (), False)
    with pytest.raises(WorkError, match="not taken before entering the container"):
        missing.take_inside(None, BUS, (), False)


def test_a_host_directorys_links_and_fifos_are_refused_not_followed(tmp_path: Path) -> None:
    """Each file and GPU folder is opened without following a link (a FIFO would
    block a plain read); a simulated node's tree is a real directory, with real links."""
    if os.geteuid() != 0:
        pytest.skip("cloning a mount (open_tree) needs root")
    tree = tmp_path / "nvidia"
    (tree / "gpus").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tree / "gpus" / BUS[0]).symlink_to("../../elsewhere")
    with pytest.raises(WorkError, match=rf"^driver/nvidia/gpus/{BUS[0]}: "):
        procsource.HostDirectory(str(tree)).take_outside(BUS, (), False)
    (tree / "params").symlink_to("/etc/shadow")
    with pytest.raises(WorkError, match=r"^driver/nvidia/params: "):
        procsource.HostDirectory(str(tree)).take_outside((), (), False)
    os.mkfifo(tree / "version")
    with pytest.raises(WorkError, match=r"^driver/nvidia/version: not a regular file$"):
        procsource.HostDirectory(str(tree)).take_outside((), (), False)
