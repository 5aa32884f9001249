"""StartWork's MIG fields: the capability files the procfs view shows, refused
unless they are names the driver makes (each becomes a path opened in the source
tree and a mount point made in the view)."""

from __future__ import annotations

import pytest

from nri_gpu.engine.model import Plan
from nri_gpu.engine.start.work import StartWork, is_cap_path, start_work

GOOD = (
    "mig/config",
    "mig/monitor",
    "gpu0/mig/gi0/access",
    "gpu2/mig/gi2/access",
    "gpu2/mig/gi2/ci0/access",
    "gpu31/mig/gi14/ci7/access",
    "gpu10/mig/gi10/access",
)


@pytest.mark.parametrize("path", GOOD)
def test_the_drivers_names_are_taken(path: str) -> None:
    assert is_cap_path(path)
    assert StartWork("c", (), (), (), proc_caps=(path,)).proc_caps == (path,)


@pytest.mark.parametrize(
    "path",
    [
        "gpu2/mig/../../x",
        "mig/monitor/../config",
        "gpu2/mig/gi2/../gi3/access",
        "gpu32/mig/gi0/access",
        "gpu2/mig/gi15/access",
        "gpu2/mig/gi2/ci8/access",
        "gpu02/mig/gi2/access",
        "gpu2/mig/gi02/access",
        "gpu2/mig/gi2/ci00/access",
        "gpu-1/mig/gi2/access",
        "/gpu2/mig/gi2/access",
        "gpu2/mig/gi2/access/",
        "gpu2//mig/gi2/access",
        "./gpu2/mig/gi2/access",
        "gpu2/mig/gi2",
        "gpu2/mig",
        "gpu2/mig/access",
        "gpu2/mig/gi2/ci0",
        "gpu2/mig/gi2/ci0/ci1/access",
        "gpu2/xig/gi2/access",
        "gpu2/mig/ci0/access",
        "mig",
        "mig/",
        "mig/other",
        "MIG/monitor",
        "fabric-imex-mgmt",
        "",
        ".",
        "..",
        "gpu2/mig/gi2/access\0",
        "gpu2/mig/gi2/access\n",
        "gpu\uff12/mig/gi2/access",  # a fullwidth digit two
        "gpu 2/mig/gi2/access",
    ],
)
def test_anything_else_is_refused(path: str) -> None:
    assert not is_cap_path(path)
    with pytest.raises(ValueError, match="not a capability file the driver makes"):
        StartWork("c", (), (), (), proc_caps=(path,))


def test_a_cap_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        StartWork("c", (), (), (), proc_caps=("mig/monitor", "mig/monitor"))


def test_start_work_copies_the_plans_caps() -> None:
    caps = ("gpu2/mig/gi2/access", "gpu2/mig/gi2/ci0/access", "mig/config")
    work = start_work(Plan(visible_bus_ids=("0000:07:00.0",), proc_caps=caps, proc_caps_all=True), "c", "/proc")
    assert (work.proc_caps, work.proc_caps_all) == (caps, True)
    assert (start_work(Plan(), "c", "/proc").proc_caps, start_work(Plan(), "c", "/proc").proc_caps_all) == ((), False)
