"""The procfs view of a MIG container on real containers (runc-created, acted on, started).

A MIG device's container must see the access files of its GPU instance and
compute instance under ``/proc/driver/nvidia/capabilities`` (libcuda and NVML read
them) and nothing else there; a monitor or config grant adds ``mig/monitor`` or
``mig/config``, and config the whole folder, live. The node is simulated
(``testbed.gpunode`` with ``mig=``): GPU 2 has GPU instances 2 (compute
instances 0 and 1) and 3 (compute instance 0). The start work is made by hand
from a ``Plan`` holding what the planner gives a MIG device.

Needs root (namespaces, mounts, runc); skipped with the reason otherwise.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_gpu.engine.errors import StartError
from nri_gpu.engine.model import Plan
from nri_gpu.engine.start import StartWork, start_work
from testbed import debs
from testbed.bundle import Container, RuncHost
from testbed.gpunode import MigSpec, SimNode, build_node, reconfigure_mig
from tests.integration.startcall import run_start
from tests.integration.test_start import WHO, _attach, _cannot_run, mounts, start

MIG: MigSpec = {2: [(2, [0, 1]), (3, [0])]}
CAPS = "/proc/driver/nvidia/capabilities"
# Every entry under capabilities/ with its mode, then the two access files' contents.
SHOW = f"find {CAPS} | sort | while read p; do stat -c '%a %n' \"$p\"; done; echo --; ls /proc/driver/nvidia/gpus"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    if os.geteuid() != 0:
        _cannot_run("needs root: namespaces, mounts and runc")
    return build_node(tmp_path_factory.mktemp("node"), gpus=4, mig=MIG)


@pytest.fixture(scope="module")
def runc(tmp_path_factory: pytest.TempPathFactory, node: SimNode) -> Iterator[RuncHost]:
    try:
        host = RuncHost(tmp_path_factory.mktemp("runc"))
    except debs.DebUnavailable as exc:
        _cannot_run(f"runc cannot be fetched: {exc}")
    try:
        yield host
    finally:
        host.close()


def _m(node: SimNode) -> int:
    return node.gpus[2].minor


def mig_work(node: SimNode, *caps: str, all_caps: bool = False, proc_root: Path | None = None) -> StartWork:
    """What a plan for GPU 2's MIG devices leaves for start: its parent's bus id and the caps."""
    plan = Plan(visible_bus_ids=(node.gpus[2].bus_id,), proc_caps=tuple(sorted(caps)), proc_caps_all=all_caps)
    return start_work(plan, WHO, str(proc_root or node.proc_root))


def device_caps(node: SimNode, gi: int = 2, ci: int = 0) -> tuple[str, str]:
    m = _m(node)
    return f"gpu{m}/mig/gi{gi}/access", f"gpu{m}/mig/gi{gi}/ci{ci}/access"


def container(runc: RuncHost, args: str = SHOW) -> Container:
    return runc.create("mig", ["sh", "-c", args])


def listing(out: str) -> list[str]:
    """``find``'s part of SHOW: "mode path" lines under capabilities/."""
    return out.split("--\n")[0].splitlines()


def expected(*caps: str) -> list[str]:
    """The listing of a view showing ``caps``: each folder on the way 0555, each file 0444."""
    entries = {CAPS: "555"}
    for cap in caps:
        parts = cap.split("/")
        for depth in range(1, len(parts)):
            entries[f"{CAPS}/{'/'.join(parts[:depth])}"] = "555"
        entries[f"{CAPS}/{cap}"] = "444"
    return [f"{mode} {path}" for path, mode in sorted(entries.items())]


def test_a_mig_device_sees_exactly_its_two_access_files(runc: RuncHost, node: SimNode) -> None:
    caps = device_caps(node)
    c = container(runc, SHOW + f"; cat {CAPS}/{caps[1]}")
    assert start(c.pid, mig_work(node, *caps)).procfs == "created"
    out = c.run()
    assert listing(out) == expected(*caps), out
    tail = out.split("--\n")[1].splitlines()
    assert tail[0] == node.gpus[2].bus_id
    assert "\n".join(tail[1:]) + "\n" == (node.proc_root / f"driver/nvidia/capabilities/{caps[1]}").read_text()


def test_the_cap_files_are_locked_binds(runc: RuncHost, node: SimNode) -> None:
    caps = device_caps(node)
    c = container(runc, f"(echo x > {CAPS}/{caps[0]}) 2>&1 | sed 's/.*: //'; touch {CAPS}/x 2>&1 | sed 's/.*: //'")
    start(c.pid, mig_work(node, *caps))
    binds = {m[4]: m for m in mounts(c.pid) if m[4].startswith(CAPS)}
    assert sorted(binds) == [f"{CAPS}/{cap}" for cap in caps]
    for m in binds.values():
        assert {"ro", "nosuid", "nodev", "noexec"} <= set(m[5].split(",")), m
    assert c.run().splitlines() == ["Read-only file system"] * 2


def test_monitor_and_config_are_shown_when_granted(runc: RuncHost, node: SimNode) -> None:
    caps = (*device_caps(node, 3), "mig/monitor")
    c = container(runc)
    start(c.pid, mig_work(node, *caps))
    assert listing(c.run()) == expected(*caps)
    c = container(runc)
    start(c.pid, mig_work(node, "mig/config", "mig/monitor"))
    assert listing(c.run()) == expected("mig/config", "mig/monitor")


def test_no_caps_no_capabilities_folder(runc: RuncHost, node: SimNode) -> None:
    c = container(runc, f"ls -d {CAPS} 2>&1 | sed 's/.*: //'; echo --")
    start(c.pid, mig_work(node))
    assert c.run().splitlines()[0] == "No such file or directory"


def test_all_caps_show_the_whole_folder_live(runc: RuncHost, tmp_path: Path) -> None:
    own = build_node(tmp_path / "node", gpus=4, mig=MIG)
    host = own.proc_root / "driver/nvidia/capabilities"
    c = container(runc, f"sleep 0.3; find {CAPS} | sort")
    assert start(c.pid, mig_work(own, *device_caps(own), "mig/config", all_caps=True)).procfs == "created"
    binds = [m for m in mounts(c.pid) if m[4].startswith(CAPS)]
    assert [m[4] for m in binds] == [CAPS] and {"ro", "nosuid", "nodev", "noexec"} <= set(binds[0][5].split(","))
    c.start()
    # Created after the start (an operator's nvidia-smi mig -cgi): the container sees it too.
    later = reconfigure_mig(own, {2: [(2, [0, 1]), (3, [0]), (9, [0])]})
    out = c.wait()
    want = sorted([CAPS, *(f"{CAPS}/{p.relative_to(host)}" for p in host.rglob("*"))])
    assert out.splitlines() == want
    assert f"{CAPS}/gpu{_m(later)}/mig/gi9/ci0/access" in want
    assert f"{CAPS}/fabric-imex-mgmt" in want  # the whole folder, as libnvidia-container binds it


def test_the_same_caps_keep_the_view_others_replace_it(runc: RuncHost, node: SimNode) -> None:
    caps = device_caps(node)
    c = container(runc)
    work = mig_work(node, *caps)
    assert start(c.pid, work).procfs == "created"
    assert start(c.pid, work).procfs == "kept"
    assert start(c.pid, dataclasses.replace(work, proc_caps=caps[::-1])).procfs == "kept"  # the same set
    other = device_caps(node, 3)
    assert start(c.pid, mig_work(node, *other)).procfs == "created"
    assert start(c.pid, mig_work(node, *other, all_caps=True)).procfs == "created"
    assert start(c.pid, mig_work(node, *other, all_caps=True)).procfs == "kept"
    assert start(c.pid, mig_work(node)).procfs == "created"
    assert start(c.pid, mig_work(node, *caps)).procfs == "created"
    assert [m[4] for m in mounts(c.pid)].count("/proc/driver") == 1
    assert listing(c.run()) == expected(*caps)


def test_a_cap_missing_at_start_is_named(runc: RuncHost, node: SimNode) -> None:
    gone = f"gpu{_m(node)}/mig/gi9/access"  # no such instance: destroyed since planning
    for work in (mig_work(node, gone), mig_work(node, gone, all_caps=True)):
        c = container(runc, "true")
        with pytest.raises(StartError) as caught:
            run_start(c.pid, work)
        assert caught.value.step == "procfs isolation"
        assert f"driver/nvidia/capabilities/{gone} is not on this node" in str(caught.value)
        assert not [m for m in mounts(c.pid) if m[4].startswith("/proc/driver")]


def test_an_instance_destroyed_after_planning_fails_the_start(runc: RuncHost, tmp_path: Path) -> None:
    own = build_node(tmp_path / "node", gpus=4, mig=MIG)
    work = mig_work(own, *device_caps(own, 2, 1))
    reconfigure_mig(own, {2: [(2, [0]), (3, [0])]})
    c = container(runc, "true")
    with pytest.raises(StartError, match=r"capabilities/gpu\d+/mig/gi2/ci1/access is not on this node"):
        run_start(c.pid, work)


def test_a_symlink_in_the_source_is_refused(runc: RuncHost, tmp_path: Path) -> None:
    own = build_node(tmp_path / "node", gpus=4, mig=MIG)
    caps = device_caps(own)
    folder = own.proc_root / f"driver/nvidia/capabilities/{caps[1]}".rsplit("/", 1)[0]
    os.chmod(folder, 0o755)
    (folder / "access").unlink()
    (folder / "access").symlink_to("/etc/shadow")
    c = container(runc, "true")
    with pytest.raises(StartError, match=r"ci0/access: refused: its resolution meets a link not followed here"):
        run_start(c.pid, mig_work(own, *caps))
    gi = own.proc_root / f"driver/nvidia/capabilities/gpu{_m(own)}/mig"
    os.chmod(gi, 0o755)
    os.rename(gi / "gi3", gi / "gi3-real")
    (gi / "gi3").symlink_to("gi3-real")
    c = container(runc, "true")
    with pytest.raises(StartError, match=r"gi3/access: refused"):
        run_start(c.pid, mig_work(own, *device_caps(own, 3)))


def test_a_cap_that_is_not_a_file_is_refused(runc: RuncHost, tmp_path: Path) -> None:
    own = build_node(tmp_path / "node", gpus=4, mig=MIG)
    caps = device_caps(own)
    access = own.proc_root / f"driver/nvidia/capabilities/{caps[0]}"
    os.chmod(access.parent, 0o755)
    access.unlink()
    access.mkdir()
    c = container(runc, "true")
    with pytest.raises(StartError, match=r"gi2/access: not a regular file"):
        run_start(c.pid, mig_work(own, *caps))


def test_the_containers_own_driver_tree_is_the_source_on_a_real_node(runc: RuncHost, node: SimNode) -> None:
    caps = (*device_caps(node), "mig/monitor")
    c = container(runc)
    _attach(c.pid, node.proc_root / "driver", "/proc/driver")  # now it looks like a node with a driver
    real = dataclasses.replace(mig_work(node, *caps), proc_source=None)
    assert start(c.pid, real).procfs == "created"
    assert start(c.pid, real).procfs == "kept"
    assert [m[4] for m in mounts(c.pid)].count("/proc/driver/nvidia") == 1
    assert listing(c.run()) == expected(*caps)
