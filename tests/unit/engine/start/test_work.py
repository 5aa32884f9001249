"""StartWork: what a plan leaves for container start, validated."""

from __future__ import annotations

import pytest

from nri_gpu.engine.model import Plan, Symlink
from nri_gpu.engine.start.work import StartWork, is_clean_absolute, start_work

LINKS = (Symlink("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so.550.163.01"),)


def test_a_real_procfs_means_the_containers_own_driver_tree() -> None:
    plan = Plan(visible_bus_ids=("0000:07:00.0",), symlinks=LINKS, ldconfig_folders=("/usr/lib/x86_64-linux-gnu",))
    work = start_work(plan, 'container "c" in pod "ns/p"', "/proc")
    assert work == StartWork(
        'container "c" in pod "ns/p"', ("0000:07:00.0",), LINKS, ("/usr/lib/x86_64-linux-gnu",), None
    )


@pytest.mark.parametrize("proc_root", ["/sim/proc", "/sim/proc/"])
def test_a_simulated_procfs_is_the_source_of_the_view(proc_root: str) -> None:
    assert start_work(Plan(), "c", proc_root).proc_source == "/sim/proc/driver/nvidia"


@pytest.mark.parametrize("bus", ["", "..", ".", "0000:07:00.0/..", "a\0b"])
def test_a_bus_id_must_be_one_path_component(bus: str) -> None:
    with pytest.raises(ValueError, match="bad bus id"):
        StartWork("c", (bus,), (), ())


@pytest.mark.parametrize(
    ("path", "clean"),
    [
        ("/usr/lib", True),
        ("/", True),
        ("usr/lib", False),
        ("/usr//lib", False),
        ("/usr/lib/", False),
        ("/usr/../etc", False),
        ("/usr/./lib", False),
        ("/a\nb", False),
    ],
)
def test_clean_absolute_paths(path: str, clean: bool) -> None:
    assert is_clean_absolute(path) is clean


def test_link_and_folder_paths_are_checked() -> None:
    with pytest.raises(ValueError, match="clean absolute"):
        StartWork("c", (), (Symlink("/usr/lib/../../etc/x", "y"),), ())
    with pytest.raises(ValueError, match="clean absolute"):
        StartWork("c", (), (), ("lib",))


@pytest.mark.parametrize("path", ["/k8s/a\nb", "/k8s/a\0b", "/k8s/" + "a" * 5000], ids=["newline", "nul", "long"])
def test_a_bad_cgroups_path_is_refused_bounded(path: str) -> None:
    with pytest.raises(ValueError, match=r"^bad cgroups path ") as caught:
        StartWork(container="c", visible_bus_ids=(), symlinks=(), ldconfig_folders=(), cgroups_path=path)
    assert len(str(caught.value)) < 300


def test_start_work_carries_the_cgroups_path() -> None:
    work = start_work(Plan(), 'container "c"', "/proc", cgroups_path="kubepods.slice:cri-containerd:abc")
    assert work.cgroups_path == "kubepods.slice:cri-containerd:abc"


def test_the_ipc_endpoints_of_the_plan_go_to_the_start_with_the_driver_root() -> None:
    plan = Plan(ipc=("/run/nvidia-persistenced/socket", "/tmp/nvidia-mps"))
    work = start_work(plan, "c", "/proc", driver_root="/run/nvidia/driver/")
    assert (work.ipc, work.ipc_root) == (plan.ipc, "/run/nvidia/driver")
    assert start_work(plan, "c", "/proc", ipc=()).ipc == ()  # the CDI hook's: those its spec mounted


@pytest.mark.parametrize(
    ("ipc", "root"),
    [
        (("/etc/shadow",), "/"),  # not an endpoint of the catalogue: nothing else is checked this way
        (("/tmp/nvidia-mps", "/tmp/nvidia-mps"), "/"),
        (("/tmp/nvidia-mps",), "/run/../x"),
        (("/tmp/nvidia-mps",), "relative"),
    ],
    ids=["not-an-endpoint", "twice", "unclean-root", "relative-root"],
)
def test_ipc_endpoints_are_the_catalogues_and_their_root_clean(ipc: tuple[str, ...], root: str) -> None:
    with pytest.raises(ValueError, match="ipc"):
        StartWork("c", (), (), (), ipc=ipc, ipc_root=root)


def test_identity_blind_spots_name_what_cannot_be_looked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where pid 1 is out of sight, the start work cannot refuse the host's own mount
    namespace by it: the plugin says so at start-up instead of failing open silently."""
    from nri_gpu.engine.start import actions

    monkeypatch.setattr(actions, "_NOT_CONTAINERS", (("/proc/self", "the plugin's"), ("/proc/0", "pid 0's")))
    blind = actions.identity_blind_spots()
    assert blind == [
        "/proc/0/root, pid 0's: No such file or directory",
        "/proc/0/ns/mnt, pid 0's: No such file or directory",
    ]
