"""The container-start engine on real containers: runc-created, acted on, then started.

Each test makes a container with ``runc create`` (the state containerd leaves a
container in when it sends NRI StartContainer), runs ``engine.start`` on its init
pid, then starts it: the container's own process prints what it sees. Host-side
reads through the container's overlay (``Container.rootfs``) are for assertions
only. The GPU node is simulated (``testbed.gpunode``): real NVIDIA 550.163.01
libraries, a fake procfs, so the procfs view's source is a host directory; one
test mounts that directory over the container's ``/proc/driver`` first to take the
real-node path (the container's own ``/proc/driver/nvidia`` as the source).

Needs root (namespaces, mounts, runc); skipped with the reason otherwise.
``NRI_GPU_E2E_REQUIRE=1`` turns the skips into failures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import mmap
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import discover
from nri_gpu.engine.errors import StartError
from nri_gpu.engine.ldcache import LdCache, parse_ld_so_cache
from nri_gpu.engine.ldcache_merge import encode
from nri_gpu.engine.model import LdCacheEntry, Plan, Symlink
from nri_gpu.engine.plan import plan as make_plan
from nri_gpu.engine.request import ContainerInfo, parse_request
from nri_gpu.engine.start import (
    StartReport,
    StartWork,
    actions,
    find_init_pid,
    run_start_async,
    runner,
    start_work,
    syscalls,
)
from nri_gpu.engine.start.rootdir import RootDir
from testbed import debs
from testbed.bundle import Container, RuncHost, busybox_rootfs
from testbed.gpunode import SimNode, build_node, run_ldconfig
from testbed.openwatch import OpenWatch
from tests.integration.startcall import killing_at, run_start

WHO = 'container "main" in pod "ns/p"'
LIB = "/usr/lib/x86_64-linux-gnu"
SHOW = (
    "echo gpus: $(ls /proc/driver/nvidia/gpus); grep ModifyDeviceFiles /proc/driver/nvidia/params; "
    f"cat /proc/driver/nvidia/version | head -1; readlink {LIB}/libcuda.so.1; readlink {LIB}/libnvidia-ml.so; "
    "touch /proc/driver/nvidia/x 2>&1 | sed 's/.*: //'"
)


def _cannot_run(reason: str) -> None:
    if os.environ.get("NRI_GPU_E2E_REQUIRE") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    if os.geteuid() != 0:
        _cannot_run("needs root: namespaces, mounts and runc")
    return build_node(tmp_path_factory.mktemp("node"), gpus=4)


@pytest.fixture(scope="module")
def plan(node: SimNode) -> Plan:
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    inventory = discover(config, cuda_version=lambda path: ("12.4", None))
    outcome = parse_request(
        ContainerInfo(name="main", pod_annotations={"nvidia.com/gpus": "0,2"}, env={}), config.policy
    )
    assert outcome.request is not None
    return make_plan(outcome.request, inventory, config)


@pytest.fixture(scope="module")
def work(plan: Plan, node: SimNode) -> StartWork:
    """The default: the driver's entries merged into the image's ld.so.cache."""
    return start_work(plan, WHO, str(node.proc_root))


@pytest.fixture(scope="module")
def rebuild(work: StartWork) -> StartWork:
    """``ld_cache = "rebuild"``: the trusted ldconfig rebuilds the cache."""
    return dataclasses.replace(work, ld_cache="rebuild")


@pytest.fixture(scope="module", params=["merge", "rebuild"])
def each(request: pytest.FixtureRequest, work: StartWork) -> StartWork:
    """Both ways of making the cache, for what must hold either way."""
    return dataclasses.replace(work, ld_cache=request.param)


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


@pytest.fixture(scope="module")
def gcc() -> str:
    found = shutil.which("gcc")
    if found is None:
        _cannot_run("needs gcc to build the test's preload library and static sleeper")
    assert found is not None
    return found


def gpu_container(runc: RuncHost, plan: Plan, args: str = SHOW, **kw: object) -> Container:
    binds = [(m.source, m.destination) for m in plan.mounts]
    return runc.create("gpu", ["sh", "-c", args], binds=binds, **kw)  # type: ignore[arg-type]


def start(pid: int, work: StartWork, **kw: object) -> StartReport:
    reports: list[StartReport] = []
    run_start(pid, work, on_report=reports.append, **kw)  # type: ignore[arg-type]
    assert len(reports) == 1
    return reports[0]


def cache_paths(c: Container) -> dict[str, str]:
    entries = parse_ld_so_cache((c.rootfs / "etc/ld.so.cache").read_bytes())
    return {e.name: e.path for e in entries if e.is_64bit}


def mounts(pid: int) -> list[list[str]]:
    return [line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]


def root_options(pid: int) -> set[str]:
    return {opt for m in mounts(pid) if m[4] == "/" for opt in m[5].split(",")}


def tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_symlink():
            h.update(os.readlink(p).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def bait(tmp_path: Path) -> Path:
    """A host directory an escape would write into; hashed before and after."""
    d = tmp_path / "bait"
    (d / "ld.so.conf.d").mkdir(parents=True)
    (d / "ld.so.conf.d/host.conf").write_text("/host/only\n")
    (d / "ld.so.cache").write_bytes(b"host cache\n")
    return d


# --------------------------------------------------------------------------- the work itself


def test_the_container_sees_its_gpus_libraries_and_cache(
    runc: RuncHost, plan: Plan, each: StartWork, node: SimNode
) -> None:
    c = gpu_container(runc, plan)
    report = start(c.pid, each)
    assert report.procfs == "created" and report.ld_cache_written
    out = c.run().splitlines()
    kept = sorted(g.bus_id for g in node.gpus if g.index in (0, 2))
    assert out[0] == "gpus: " + " ".join(kept)
    assert out[1] == "ModifyDeviceFiles: 0"
    assert out[2] == (node.proc_root / "driver/nvidia/version").read_text().splitlines()[0]
    assert out[3:5] == ["libcuda.so.550.163.01", "libnvidia-ml.so.1"]
    assert out[5] == "Read-only file system"
    assert cache_paths(c)["libcuda.so.1"] == f"{LIB}/libcuda.so.1"
    assert cache_paths(c)["libnvidia-ml.so.1"] == f"{LIB}/libnvidia-ml.so.1"
    conf = (c.rootfs / "etc/ld.so.conf.d/00-nri-gpu.conf").read_text()
    assert conf.splitlines()[1:] == [LIB]
    assert (c.rootfs / "etc/ld.so.conf").read_text() == "include /etc/ld.so.conf.d/*.conf\n"


def _shared_library(gcc: str, tmp_path: Path, soname: str, file_name: str) -> Path:
    """A tiny shared library with the given SONAME, built with gcc."""
    source = tmp_path / f"{file_name}.c"
    source.write_text("int nri_gpu_test_symbol;\n")
    lib = tmp_path / file_name
    subprocess.run([gcc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(lib), str(source)], check=True)
    return lib


def test_merge_equals_a_rebuild_and_the_loader_takes_ours(
    runc: RuncHost, plan: Plan, work: StartWork, rebuild: StartWork, gcc: str, tmp_path: Path
) -> None:
    """An image with a cache of its own, which names a stub libnvidia-ml.so.1 in a
    folder of its own (as images that bake in a driver stub do): the merge gives
    exactly the entries, in exactly the order, of the trusted ldconfig's rebuild,
    and glibc's loader in the container takes our library over the image's stub."""
    stub = _shared_library(gcc, tmp_path, "libnvidia-ml.so.1", "libnvidia-ml.so.1")

    def prepare(rootfs: Path) -> None:
        (rootfs / "opt/stub").mkdir(parents=True)
        shutil.copy(stub, rootfs / "opt/stub/libnvidia-ml.so.1")
        conf = rootfs / "etc/ld.so.conf.d"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "stub.conf").write_text("/opt/stub\n")
        (conf / "x86_64-linux-gnu.conf").write_text("/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
        run_ldconfig(rootfs)  # the image's own cache, as its build would have left it

    image_cache = None
    caches = {}
    for mode, how in (("merge", work), ("rebuild", rebuild)):
        c = runc.create("gpu", ["nvidia-smi"], binds=[(m.source, m.destination) for m in plan.mounts], glibc=True,
                        prepare=prepare)  # fmt: skip
        image_cache = parse_ld_so_cache((c.rootfs / "etc/ld.so.cache").read_bytes())
        assert start(c.pid, how).ld_cache_written
        caches[mode] = parse_ld_so_cache((c.rootfs / "etc/ld.so.cache").read_bytes())
        c.start()
        out = c.wait()
        assert "couldn't communicate with the NVIDIA driver" in out, (mode, out)  # not the stub: no symbols there
    assert image_cache is not None and "/opt/stub/libnvidia-ml.so.1" in {e.path for e in image_cache}
    assert {e.name for e in image_cache} & {"libc.so.6", "libm.so.6"}  # the image's own libraries are kept
    assert caches["merge"] == caches["rebuild"]
    names = [(e.name, e.path) for e in caches["merge"] if e.name == "libnvidia-ml.so.1"]
    assert names == [
        ("libnvidia-ml.so.1", f"{LIB}/libnvidia-ml.so.1"),
        ("libnvidia-ml.so.1", "/opt/stub/libnvidia-ml.so.1"),
    ]


def test_the_view_is_a_locked_tmpfs(runc: RuncHost, plan: Plan, work: StartWork) -> None:
    c = gpu_container(runc, plan, "true")
    start(c.pid, work)
    view = [m for m in mounts(c.pid) if m[4] == "/proc/driver"]
    assert len(view) == 1 and view[0][-3:-1] == ["tmpfs", "nri-gpu"], view
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(view[0][5].split(","))
    binds = [m for m in mounts(c.pid) if m[4].startswith("/proc/driver/nvidia/gpus/")]
    assert sorted(m[4].rsplit("/", 1)[1] for m in binds) == sorted(work.visible_bus_ids)
    for m in binds:
        assert {"ro", "nosuid", "nodev", "noexec"} <= set(m[5].split(",")), m
    # Host files are never touched: the view holds copies.
    assert "ModifyDeviceFiles: 1" in Path(str(work.proc_source), "params").read_text()
    # Nothing propagates: the view stays in the container's namespace, and the
    # tmpfs that hid /proc from ldconfig stayed in ldconfig's private copy of it.
    assert not [m for m in mounts(os.getpid()) if "nri-gpu" in m]
    assert [m[-3] for m in mounts(c.pid) if m[4] == "/proc"] == ["proc"]


def test_a_second_run_changes_nothing(runc: RuncHost, plan: Plan, each: StartWork) -> None:
    c = gpu_container(runc, plan)
    start(c.pid, each)
    cache = (c.rootfs / "etc/ld.so.cache").stat()
    again = start(c.pid, each)
    assert (again.procfs, again.ld_cache_written) == ("kept", False)
    after = (c.rootfs / "etc/ld.so.cache").stat()
    assert (after.st_ino, after.st_mtime_ns) == (cache.st_ino, cache.st_mtime_ns)
    assert [m[4] for m in mounts(c.pid)].count("/proc/driver") == 1
    assert c.run().splitlines()[1] == "ModifyDeviceFiles: 0"


def test_other_gpus_replace_the_view(runc: RuncHost, plan: Plan, work: StartWork, node: SimNode) -> None:
    c = gpu_container(runc, plan)
    start(c.pid, work)
    other = dataclasses.replace(work, visible_bus_ids=(node.gpus[3].bus_id,))
    assert start(c.pid, other).procfs == "created"
    assert [m[4] for m in mounts(c.pid)].count("/proc/driver") == 1
    assert c.run().splitlines()[0] == f"gpus: {node.gpus[3].bus_id}"


def test_no_gpu_hides_them_all(runc: RuncHost, plan: Plan, work: StartWork) -> None:
    c = gpu_container(runc, plan)
    start(c.pid, dataclasses.replace(work, visible_bus_ids=()))
    assert c.run().splitlines()[:2] == ["gpus:", "ModifyDeviceFiles: 0"]


def _attach(pid: int, host_dir: Path, container_dir: str) -> None:
    """Bind a host directory over a container directory from inside its namespace."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            tree = syscalls.open_tree(
                syscalls.AT_FDCWD, str(host_dir), syscalls.OPEN_TREE_CLONE | syscalls.AT_RECURSIVE
            )
            syscalls.setns(os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY), syscalls.CLONE_NEWNS)
            target = RootDir.current().opendir(container_dir)
            syscalls.move_mount(
                tree, "", target, "", syscalls.MOVE_MOUNT_F_EMPTY_PATH | syscalls.MOVE_MOUNT_T_EMPTY_PATH
            )
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0


def test_the_containers_own_driver_tree_is_the_source_on_a_real_node(
    runc: RuncHost, plan: Plan, work: StartWork, node: SimNode
) -> None:
    c = gpu_container(runc, plan, SHOW + "; echo $(ls /proc/driver)")
    _attach(c.pid, node.proc_root / "driver", "/proc/driver")  # now it looks like a node with a driver
    real = dataclasses.replace(work, proc_source=None)
    assert start(c.pid, real).procfs == "created"
    assert start(c.pid, real).procfs == "kept"
    assert [m[4] for m in mounts(c.pid)].count("/proc/driver/nvidia") == 1
    out = c.run().splitlines()
    assert out[0] == "gpus: " + " ".join(work.visible_bus_ids)
    assert out[1] == "ModifyDeviceFiles: 0"
    assert out[-1].split() == ["nvidia", "nvidia-caps"]  # the view covers driver/nvidia only


def test_a_read_only_root_stays_read_only(runc: RuncHost, plan: Plan, each: StartWork) -> None:
    c = gpu_container(runc, plan, SHOW + "; touch /x 2>&1 | sed 's/.*: //'", readonly=True)
    assert "ro" in root_options(c.pid)
    start(c.pid, each)
    assert "ro" in root_options(c.pid)
    out = c.run().splitlines()
    assert out[3] == "libcuda.so.550.163.01" and out[-1] == "Read-only file system"
    assert "libcuda.so.1" in cache_paths(c)


def test_an_unknown_bus_id_is_named(runc: RuncHost, plan: Plan, work: StartWork) -> None:
    c = gpu_container(runc, plan, "true")
    bad = dataclasses.replace(work, visible_bus_ids=("0000:99:00.0",))
    with pytest.raises(StartError) as caught:
        run_start(c.pid, bad)
    assert str(caught.value) == f"{WHO}: procfs isolation: bus id 0000:99:00.0 is not on this node"
    assert (caught.value.container, caught.value.step) == (WHO, "procfs isolation")


# --------------------------------------------------------------------------- hostile images


def _link(rootfs: Path, path: str, target: str) -> None:
    where = rootfs / path.lstrip("/")
    if where.is_dir() and not where.is_symlink():
        shutil.rmtree(where)
    else:
        where.unlink(missing_ok=True)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(target)


def test_conf_dir_linked_to_a_host_path_that_the_image_lacks(
    runc: RuncHost, plan: Plan, work: StartWork, bait: Path
) -> None:
    before = tree_hash(bait)
    c = gpu_container(runc, plan, "true", prepare=lambda r: _link(r, "/etc/ld.so.conf.d", str(bait / "ld.so.conf.d")))
    with pytest.raises(StartError, match=r"ld\.so\.conf: /etc/ld\.so\.conf\.d: a symlink to nowhere in the container"):
        run_start(c.pid, work)
    assert tree_hash(bait) == before


def test_conf_dir_linked_to_a_host_path_writes_inside(runc: RuncHost, plan: Plan, each: StartWork, bait: Path) -> None:
    def prepare(rootfs: Path) -> None:
        _link(rootfs, "/etc/ld.so.conf.d", str(bait / "ld.so.conf.d"))
        (rootfs / str(bait).lstrip("/") / "ld.so.conf.d").mkdir(parents=True)

    before = tree_hash(bait)
    c = gpu_container(runc, plan, "cat /etc/ld.so.conf.d/00-nri-gpu.conf", prepare=prepare)
    start(c.pid, each)
    assert tree_hash(bait) == before
    inside = c.rootfs / str(bait).lstrip("/") / "ld.so.conf.d/00-nri-gpu.conf"
    assert inside.read_text().splitlines()[1:] == [LIB]
    assert "libcuda.so.1" in cache_paths(c)  # ldconfig read it there too


def test_cache_linked_to_a_host_file(runc: RuncHost, plan: Plan, each: StartWork, bait: Path) -> None:
    def prepare(rootfs: Path) -> None:
        _link(rootfs, "/etc/ld.so.cache", str(bait / "ld.so.cache"))
        _link(rootfs, "/etc/ld.so.cache~", str(bait / "ld.so.cache"))  # ldconfig's own temporary name

    before = tree_hash(bait)
    c = gpu_container(runc, plan, "true", prepare=prepare)
    start(c.pid, each)
    assert tree_hash(bait) == before
    assert not (c.rootfs / "etc/ld.so.cache").is_symlink()  # the new cache was renamed over the link
    assert "libcuda.so.1" in cache_paths(c)


def test_cache_linked_through_a_magic_link_to_a_host_file(runc: RuncHost, plan: Plan, each: StartWork) -> None:
    # runc 1.1.5's init holds the container's stdout as fd 1, a HOST file: /proc/1/fd/1
    # in the container is a real way out (the class of CVE-2024-21626).
    c = gpu_container(runc, plan, "true", prepare=lambda r: _link(r, "/etc/ld.so.cache", "/proc/1/fd/1"))
    assert Path(f"/proc/{c.pid}/fd/1").resolve() == c.bundle / "stdout"
    start(c.pid, each)
    assert (c.bundle / "stdout").read_bytes() == b""
    assert "libcuda.so.1" in cache_paths(c)


@pytest.mark.parametrize(
    ("path", "target", "step"),
    [
        ("/etc/ld.so.conf.d", "/proc/1/root/tmp", "ld.so.conf"),
        ("/etc", "/proc/1/cwd/etc", "ld.so.conf"),
        ("/opt/nvidia", "/proc/1/fd/1/..", "symlinks"),
    ],
    ids=["conf-dir", "etc", "link-folder"],
)
def test_magic_links_are_refused(
    runc: RuncHost, plan: Plan, work: StartWork, bait: Path, path: str, target: str, step: str
) -> None:
    before = tree_hash(bait)
    c = gpu_container(runc, plan, "true", prepare=lambda r: _link(r, path, target))
    hostile = dataclasses.replace(
        work, visible_bus_ids=(), symlinks=(*work.symlinks, Symlink("/opt/nvidia/libx.so.1", "libx.so.1.0"))
    )
    with pytest.raises(StartError) as caught:
        run_start(c.pid, hostile)
    assert caught.value.step == step
    # Refused either for crossing into the /proc mount or for the magic link itself.
    message = str(caught.value)
    assert "refused: " in message and f": {path}" in message, message
    assert tree_hash(bait) == before
    assert (c.bundle / "stdout").read_bytes() == b""


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """A root-owned host folder (a hostPath) mounted read-write at /data."""
    d = tmp_path / "volume"
    d.mkdir(mode=0o755)
    (d / "data.txt").write_text("the volume's own\n")
    return d


def test_conf_dir_linked_into_a_volume_is_refused(runc: RuncHost, plan: Plan, work: StartWork, volume: Path) -> None:
    before = tree_hash(volume)
    c = gpu_container(
        runc, plan, "true", volumes=[(str(volume), "/data")], prepare=lambda r: _link(r, "/etc/ld.so.conf.d", "/data")
    )
    with pytest.raises(
        StartError,
        match=r"ld\.so\.conf: /etc/ld\.so\.conf\.d: refused: it leads out of the container's root file system",
    ):
        run_start(c.pid, work)
    assert tree_hash(volume) == before


def test_ldconfig_plants_no_link_and_no_aux_cache_in_a_volume(
    runc: RuncHost, plan: Plan, rebuild: StartWork, volume: Path, gcc: str, tmp_path: Path
) -> None:
    # glibc's ldconfig takes a SONAME with "/" as it is: run as root without -X it
    # would make /opt/evil/../../data/planted, in the volume; and it saves its aux
    # cache under /var/cache/ldconfig whatever -C says.
    lib = _shared_library(gcc, tmp_path, "../../data/planted", "libevil.so.1.0")

    def prepare(rootfs: Path) -> None:
        (rootfs / "opt/evil").mkdir(parents=True)
        shutil.copy(lib, rootfs / "opt/evil/libevil.so.1.0")
        (rootfs / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
        (rootfs / "etc/ld.so.conf.d/zz-evil.conf").write_text("/opt/evil\n")
        (rootfs / "var/cache").mkdir(parents=True, exist_ok=True)
        (rootfs / "var/cache/ldconfig").symlink_to("/data")

    before = tree_hash(volume)
    c = gpu_container(runc, plan, "true", volumes=[(str(volume), "/data")], prepare=prepare)
    start(c.pid, rebuild)
    assert tree_hash(volume) == before
    assert not (c.rootfs / "opt/evil/planted").is_symlink()
    entries = cache_paths(c)
    assert entries["libcuda.so.1"] == f"{LIB}/libcuda.so.1"
    assert entries["../../data/planted"] == "/opt/evil/../../data/planted"  # listed, as glibc would; not made


_MARK_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    int fd = open("/tmp/preload-mark", O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "loaded\n", 7); close(fd); }
}
"""


def test_the_image_env_and_its_own_ldconfig_never_run(
    runc: RuncHost, plan: Plan, each: StartWork, gcc: str, tmp_path: Path
) -> None:
    (tmp_path / "mark.c").write_text(_MARK_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(tmp_path / "libmark.so"), str(tmp_path / "mark.c")], check=True)

    def prepare(rootfs: Path) -> None:
        shutil.copy(tmp_path / "libmark.so", rootfs / "lib/libmark.so")
        (rootfs / "etc/ld.so.preload").write_text("/lib/libmark.so\n")
        (rootfs / "sbin/ldconfig").unlink()
        (rootfs / "sbin/ldconfig").write_text("#!/bin/sh\necho image-ldconfig >> /tmp/preload-mark\n")
        os.chmod(rootfs / "sbin/ldconfig", 0o755)

    env = ["LD_PRELOAD=/lib/libmark.so:/proc/self/cwd/lib/libmark.so", "LD_LIBRARY_PATH=/evil"]
    c = gpu_container(
        runc, plan, "getconf PAGESIZE >/dev/null; cat /tmp/preload-mark", glibc=True, env=env, prepare=prepare
    )
    start(c.pid, each)
    assert not (c.rootfs / "tmp/preload-mark").exists()
    assert not Path("/tmp/preload-mark").exists()
    assert "libcuda.so.1" in cache_paths(c)
    # Control: the trap is live for a dynamic program the container runs itself.
    assert c.run().splitlines() == ["loaded"]


# The probe the hook's confined ldconfig runs too (hook/tests/ldrebuild.rs).
_PROBE_C = Path(__file__).resolve().parents[2] / "hook" / "tests" / "fixtures" / "ldconfig-probe.c"


def test_ldconfig_runs_confined(runc: RuncHost, plan: Plan, rebuild: StartWork, gcc: str, tmp_path: Path) -> None:
    """A probe in ldconfig's place reports its situation (and fails, so the report is its output)."""
    subprocess.run([gcc, "-static", "-O", "-o", str(tmp_path / "probe"), str(_PROBE_C)], check=True)
    c = gpu_container(runc, plan, "true", env=["LD_PRELOAD=/x.so"])
    with pytest.raises(StartError) as caught:
        run_start(c.pid, rebuild, ldconfig=str(tmp_path / "probe"))
    report = dict(item.split("=", 1) for item in str(caught.value).rsplit(": ", 1)[1].split())
    assert report["argv"] == "ldconfig,-X,-i,-f,/etc/ld.so.conf,-C,/proc/ld.so.cache"
    assert (report["uid"], report["gid"], report["groups"]) == ("65534", "65534", "0")  # nobody
    assert report["env"] == "0"  # no environment at all: no LD_PRELOAD of the image's
    assert report["pid"] == "1" and report["ppid"] == "0"  # pid 1 of a pid namespace of its own
    # Not dumpable, even after the exec (which makes a process dumpable again when
    # its uid may read the binary): no process of its uid can ptrace it.
    assert report["dumpable"] == "0"
    assert report["caps"] == "0:0" and report["nnp"] == "1"
    assert (report["cpu"], report["fsize"]) == ("10", str(64 << 20))
    assert report["proc"] == "0"  # /proc is our empty output tmpfs: no magic link to climb out through
    assert report["cwd"] == "/" and report["open"] == "0"  # nothing of the plugin's open
    assert report["srvproc"] == "0"  # no second procfs mount here: the hook's test plants one
    assert report["writable"] == "0"  # a read-only view, even of the image's 1777 /tmp
    assert (c.rootfs / "tmp").stat().st_mode & 0o1777 == 0o1777  # control: it is one


def test_a_dynamic_ldconfig_is_refused(runc: RuncHost, plan: Plan, rebuild: StartWork) -> None:
    dynamic = shutil.which("true")
    assert dynamic is not None
    c = gpu_container(runc, plan, "true")
    with pytest.raises(StartError, match=r"ldconfig: .* is dynamically linked \(interpreter /lib64/ld-linux"):
        run_start(c.pid, rebuild, ldconfig=os.path.realpath(dynamic))


def test_a_failing_ldconfig_is_reported_with_its_output(
    runc: RuncHost, plan: Plan, rebuild: StartWork, tmp_path: Path
) -> None:
    busybox = tmp_path / "busybox"  # static; run as "ldconfig" it has no such applet
    shutil.copy(busybox_rootfs() / "bin/busybox", busybox)
    c = gpu_container(runc, plan, "true", readonly=True)
    with pytest.raises(StartError, match=r"ldconfig: .*busybox exited with status 127: ldconfig: applet not found"):
        run_start(c.pid, rebuild, ldconfig=str(busybox))
    assert "ro" in root_options(c.pid)  # made read-only again on failure


@pytest.fixture(scope="module")
def sleeper(gcc: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A static binary that sleeps whatever its arguments: an ldconfig that hangs."""
    d = tmp_path_factory.mktemp("sleeper")
    (d / "s.c").write_text("#include <unistd.h>\nint main(void) { for (;;) pause(); }\n")
    subprocess.run([gcc, "-static", "-o", str(d / "sleeper"), str(d / "s.c")], check=True)
    return d / "sleeper"


def _running(exe: Path) -> list[int]:
    """Processes running ``exe``: by its path, or as the sealed copy the start work
    executes (``/memfd:nri-gpu-ldconfig``), recognised by its content."""
    content = exe.read_bytes()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                link = os.readlink(entry / "exe")
                if link == str(exe) or (
                    link.startswith("/memfd:nri-gpu-ldconfig") and (entry / "exe").read_bytes() == content
                ):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _gone(exe: Path, timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while _running(exe) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _running(exe)


def test_a_hanging_ldconfig_is_killed_by_the_worker(
    runc: RuncHost, plan: Plan, rebuild: StartWork, sleeper: Path
) -> None:
    c = gpu_container(runc, plan, "true", readonly=True)
    began = time.monotonic()
    with pytest.raises(StartError, match=r"ldconfig: .*sleeper did not finish before the deadline and was killed"):
        run_start(c.pid, rebuild, ldconfig=str(sleeper), timeout=0.6)
    assert time.monotonic() - began < 1.0
    assert _gone(sleeper)
    assert "ro" in root_options(c.pid)


def test_a_worker_past_the_timeout_is_killed(
    runc: RuncHost, plan: Plan, rebuild: StartWork, sleeper: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "_REPORT_MARGIN", -10.0)  # the worker would wait on ldconfig for 10 s more
    c = gpu_container(runc, plan, "true")
    began = time.monotonic()
    with pytest.raises(StartError, match=rf"^{WHO}: ldconfig: not finished after 0.5 s; the worker was killed$"):
        run_start(c.pid, rebuild, ldconfig=str(sleeper), timeout=0.5)
    assert time.monotonic() - began < 1.0
    assert _gone(sleeper)  # PR_SET_PDEATHSIG took ldconfig along


def test_ldconfig_whose_worker_dies_as_it_changes_uid_does_not_run_orphaned(
    runc: RuncHost, plan: Plan, rebuild: StartWork, sleeper: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel clears the parent-death signal when the uid changes, and ldconfig
    sets it again after: a worker killed in between (at its timeout) must not leave
    ldconfig running on its own, as pid 1 of its namespace, where an image's FIFO
    among its conf files would keep it for good."""
    c = gpu_container(runc, plan, "true")
    # Shared memory, not a pipe: the worker holds none of its caller's descriptors,
    # and ldconfig sees no file of ours; a shared mapping survives both forks.
    told = mmap.mmap(-1, 1)
    workers: list[int] = []
    real_spawn, real_setresuid = runner._spawn, os.setresuid

    def spawn(*args: object) -> tuple[int, int]:
        child, fd = real_spawn(*args)  # type: ignore[arg-type]
        workers.append(child)
        return child, fd

    def setresuid(ruid: int, euid: int, suid: int) -> None:  # in the ldconfig process
        real_setresuid(ruid, euid, suid)
        told[0] = 1
        deadline = time.monotonic() + 5
        while told[0] != 2 and time.monotonic() < deadline:
            time.sleep(0.005)  # until the test has killed the worker and it is gone

    def kill_the_worker() -> None:
        deadline = time.monotonic() + 5
        while not told[0] and time.monotonic() < deadline:
            time.sleep(0.005)
        if told[0]:
            pidfd = os.pidfd_open(workers[0])
            os.kill(workers[0], signal.SIGKILL)
            select.select([pidfd], [], [], 5)  # it has exited (not necessarily reaped)
            os.close(pidfd)
            told[0] = 2

    monkeypatch.setattr(runner, "_spawn", spawn)
    monkeypatch.setattr(os, "setresuid", setresuid)
    killer = threading.Thread(target=kill_the_worker)
    killer.start()
    try:
        with pytest.raises(StartError, match="killed by SIGKILL"):
            run_start(c.pid, rebuild, ldconfig=str(sleeper), timeout=3.0)
        killer.join()
        assert _gone(sleeper, timeout=1.0), "ldconfig runs on without its worker"
    finally:
        killer.join()
        for pid in _running(sleeper):
            os.kill(pid, signal.SIGKILL)
        told.close()


def test_cancelling_the_async_call_kills_the_worker(
    runc: RuncHost, plan: Plan, rebuild: StartWork, sleeper: Path
) -> None:
    c = gpu_container(runc, plan, "true")

    async def cancel() -> None:
        task = asyncio.ensure_future(run_start_async(c.pid, rebuild, ldconfig=str(sleeper), timeout=5))
        while not _running(sleeper):  # the worker waits on the hanging ldconfig
            assert not task.done(), task
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel())
    assert _gone(sleeper)


# --------------------------------------------------------------------------- the runner


def test_async_keeps_the_loop_running(runc: RuncHost, plan: Plan, rebuild: StartWork) -> None:
    c = gpu_container(runc, plan, "true")
    reports: list[StartReport] = []

    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        tick = asyncio.ensure_future(ticker())
        await run_start_async(c.pid, rebuild, on_report=reports.append)
        tick.cancel()
        return ticks

    assert asyncio.run(main()) >= 3  # ldconfig runs ~10 ms; a blocked loop would tick at most once
    assert reports[0].procfs == "created" and reports[0].ld_cache_written


def children(zombies: bool) -> list[int]:
    """This process's live (or, with ``zombies``, zombie) children."""
    me, found = str(os.getpid()), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and (fields[0] == "Z") == zombies:
                found.append(int(entry.name))
    return found


def _wait_exited(pid: int, timeout: float = 10.0) -> bool:
    """Wait until ``pid`` (our child) has exited, without reaping it: its pidfd
    turns readable then, and it stays a zombie until someone waits for it. False
    when it is gone already: reaped by someone else meanwhile."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    assert ready, f"worker {pid} still running after {timeout} s"
    return True


def test_the_worker_is_reaped_after_an_early_return(
    runc: RuncHost, plan: Plan, work: StartWork, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call returns on the result line; the exiting worker is reaped by the
    loop (pidfd), or by the next call when the loop is gone before that. Not one
    zombie is left either way."""
    first, second = gpu_container(runc, plan, "true"), gpu_container(runc, plan, "true")
    # In a whole test run the session's daemons are children too: only new ones count.
    before = set(children(zombies=True))
    workers: list[int] = []
    reaping: list[asyncio.Future[int | None]] = []
    real_spawn, real_reap_later = runner._spawn, runner._reap_later

    def spawn(*args: object) -> tuple[int, int]:
        child, fd = real_spawn(*args)  # type: ignore[arg-type]
        workers.append(child)
        return child, fd

    def reap_later(loop: asyncio.AbstractEventLoop, child: int) -> asyncio.Future[int | None]:
        reaped = real_reap_later(loop, child)
        reaping.append(reaped)
        return reaped

    monkeypatch.setattr(runner, "_spawn", spawn)
    monkeypatch.setattr(runner, "_reap_later", reap_later)

    def zombies() -> list[int]:
        return sorted(set(children(zombies=True)) - before)

    async def with_the_loop_open(pid: int) -> None:
        await run_start_async(pid, work)
        await reaping[-1]  # the loop saw the worker's pidfd turn readable and reaped it

    asyncio.run(with_the_loop_open(first.pid))
    assert zombies() == []
    assert not Path(f"/proc/{workers[-1]}").exists()

    # Its loop closes at once: the worker is left to the next call. Unless, on a busy
    # machine, it exited before the loop closed and the loop reaped it: then again.
    for rounds in range(1, 11):  # noqa: B007 (counted after the loop)
        asyncio.run(run_start_async(second.pid, work))
        left = workers[-1]
        if _wait_exited(left):
            break
    assert zombies() == [left]  # the check sees a zombie when there is one
    asyncio.run(run_start_async(first.pid, work))  # reaps it first thing; leaves its own worker
    assert left not in zombies()
    _wait_exited(workers[-1])
    asyncio.run(with_the_loop_open(second.pid))  # reaps the last one's (if left), the loop its own
    assert len(workers) == 4 + (rounds - 1)  # one worker a call: the four, and each round tried again
    assert zombies() == []


def test_find_init_pid_from_the_cgroup(runc: RuncHost, plan: Plan) -> None:
    c = gpu_container(runc, plan, "true")
    assert find_init_pid(c.cgroups_path) == c.pid
    with pytest.raises(StartError, match=r"^find init pid: no cgroup.procs for '/nri-gpu-none/x'"):
        find_init_pid("/nri-gpu-none/x")


def test_the_plugins_own_namespace_is_refused(work: StartWork) -> None:
    with pytest.raises(StartError, match=r"enter: process \d+ shares the plugin's mount namespace: not a container"):
        run_start(os.getpid(), work)
    with pytest.raises(StartError, match=r"enter: no container process \(pid 0\)"):
        run_start(0, work)


def test_timings(runc: RuncHost, plan: Plan, each: StartWork) -> None:
    """Print the cost of a start (``-s`` to see it); generous bounds only."""
    walls, reports = [], []
    for _ in range(3):
        c = gpu_container(runc, plan, "true")
        began = time.perf_counter()
        reports.append(start(c.pid, each))
        walls.append((time.perf_counter() - began) * 1000)
    cache = sorted(r.timings_ms["ld.so.cache" if each.ld_cache == "merge" else "ldconfig"] for r in reports)
    print(f"\nstart work ({each.ld_cache}): wall {sorted(walls)} ms; cache step {cache} ms; {reports[-1].timings_ms}")
    assert min(walls) < 500


def test_stale_links_and_files_are_replaced_a_directory_is_not(runc: RuncHost, plan: Plan, work: StartWork) -> None:
    def prepare(rootfs: Path) -> None:
        lib = rootfs / LIB.lstrip("/")
        lib.mkdir(parents=True)
        (lib / "libcuda.so.1").symlink_to("libcuda.so.470.0")  # an older driver's link
        (lib / "libnvidia-ml.so.1").write_bytes(b"a stub the image shipped")
        (lib / "libcuda.so").mkdir()

    c = gpu_container(runc, plan, "true", prepare=prepare)
    with pytest.raises(
        StartError, match=rf"symlinks: {LIB}/libcuda.so: a directory is in the way of the link to libcuda.so.1"
    ):
        run_start(c.pid, work)
    (c.rootfs / LIB.lstrip("/") / "libcuda.so").rmdir()
    start(c.pid, work)
    lib = c.rootfs / LIB.lstrip("/")
    assert os.readlink(lib / "libcuda.so.1") == "libcuda.so.550.163.01"
    assert os.readlink(lib / "libnvidia-ml.so.1") == "libnvidia-ml.so.550.163.01"
    assert not [p.name for p in lib.iterdir() if "nri-gpu-tmp" in p.name]


def test_an_unfinished_view_is_replaced(runc: RuncHost, plan: Plan, work: StartWork, tmp_path: Path) -> None:
    # What a worker killed halfway leaves: a view whose marker matches no work.
    leftover = tmp_path / "leftover"
    (leftover / "nvidia/gpus").mkdir(parents=True)
    (leftover / ".nri-gpu-view").write_text("nri-gpu procfs view 1\nunfinished\n")
    c = gpu_container(runc, plan)
    _attach(c.pid, leftover, "/proc/driver")
    assert start(c.pid, work).procfs == "created"
    assert [m[4] for m in mounts(c.pid)].count("/proc/driver") == 1
    assert c.run().splitlines()[0] == "gpus: " + " ".join(work.visible_bus_ids)


def test_a_worker_with_a_second_thread_is_refused_before_entering(
    runc: RuncHost, plan: Plan, work: StartWork, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker joins the container's mount namespace only as the one thread of
    its process: a thread started after the fork (as gRPC's at-fork handlers do)
    would share its root and cwd, and the kernel refuses the setns then. The
    start fails at "enter", and the container is not touched."""
    real = runner._detach_from_caller

    def detach_and_start_a_thread(out: int) -> None:  # in the worker
        real(out)
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()

    monkeypatch.setattr(runner, "_detach_from_caller", detach_and_start_a_thread)
    c = gpu_container(runc, plan, "true")
    before = mounts(c.pid)
    with pytest.raises(StartError, match=rf"^{WHO}: enter: setns\(nstype=0x20000\): Invalid argument$"):
        run_start(c.pid, work)
    assert mounts(c.pid) == before


# --------------------------------------------------------------------------- security, part 2


def test_a_read_only_root_stays_read_only_whichever_step_the_worker_is_killed_at(
    runc: RuncHost, plan: Plan, each: StartWork, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed on timeout: containerd may then start the container anyway.
    Whatever step it died in, the container's ``/`` is as read-only as runc made it."""
    killed: list[str] = []
    finished = False
    for n in range(1, 20):
        c = gpu_container(runc, plan, "touch /x 2>&1 | sed 's/.*: //'", readonly=True)
        monkeypatch.setattr(runner, "_emit", killing_at(n))
        try:
            run_start(c.pid, each)
            finished = True
        except StartError as exc:
            assert "killed by SIGKILL" in str(exc), str(exc)
            killed.append(exc.step)
            finished = False
        assert "ro" in root_options(c.pid), f"writable after a kill at step {killed[-1]!r}"
        assert c.run() == "Read-only file system\n", f"killed at {killed}"
        if finished:
            break
    assert finished and len(killed) >= 5, killed


def _plant(kind: str, where: Path) -> None:
    where.parent.mkdir(parents=True, exist_ok=True)
    where.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(where, 0o666)
    else:  # /dev/null's numbers: harmless to open, and an open shows as an inotify event
        os.mknod(where, stat.S_IFCHR | 0o666, os.makedev(1, 3))


@pytest.mark.parametrize("kind", ["device", "fifo"])
@pytest.mark.parametrize("path", ["/etc/ld.so.conf.d/00-nri-gpu.conf", "/etc/ld.so.cache"], ids=["conf", "cache"])
def test_a_device_or_fifo_where_our_files_go_is_never_opened(
    runc: RuncHost, plan: Plan, each: StartWork, kind: str, path: str
) -> None:
    """The worker runs in the plugin's cgroup, with no device restriction: an open
    of an image's ``c 10 130`` (a watchdog) would be done with root's rights. Opens
    go through a ``nodev`` copy of the root; a FIFO is opened ``O_NONBLOCK`` (no
    side effect, never a wait) and refused by its type. Both are replaced."""
    c = gpu_container(runc, plan, f"ls -l {path}", prepare=lambda r: _plant(kind, r / path.lstrip("/")))
    watch = OpenWatch(c.rootfs / path.lstrip("/"))
    try:
        began = time.monotonic()
        start(c.pid, each)
        assert time.monotonic() - began < 1.0
        if kind == "device":
            assert watch.opens() == 0, f"the device node at {path} was opened"
    finally:
        watch.close()
    assert c.run().startswith("-rw-r--r--")  # replaced by a regular file of ours
    assert "libcuda.so.1" in cache_paths(c)


def test_ldconfig_opens_no_device_an_image_conf_file_is(runc: RuncHost, plan: Plan, rebuild: StartWork) -> None:
    """``rebuild``: the image's own conf files are read by ldconfig, in its view of
    the container: ``nodev`` too."""
    conf = "etc/ld.so.conf.d/zz-device.conf"

    def prepare(rootfs: Path) -> None:
        (rootfs / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
        _plant("device", rootfs / conf)

    c = gpu_container(runc, plan, "true", prepare=prepare)
    watch = OpenWatch(c.rootfs / conf)
    try:
        start(c.pid, rebuild)
        assert watch.opens() == 0, "ldconfig opened the device node"
    finally:
        watch.close()
    assert "libcuda.so.1" in cache_paths(c)


def _nspid(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError("no NSpid")


def test_ldconfig_runs_in_namespaces_of_its_own(runc: RuncHost, plan: Plan, rebuild: StartWork, sleeper: Path) -> None:
    """Not in the container's pid, net or IPC namespace: a sidecar of the same uid
    in a shared process namespace could otherwise ptrace it."""
    c = gpu_container(runc, plan, "true")
    errors: list[BaseException] = []

    def call() -> None:
        try:
            run_start(c.pid, rebuild, ldconfig=str(sleeper), timeout=1.5)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    try:
        deadline = time.monotonic() + 1.0
        while not _running(sleeper) and time.monotonic() < deadline:
            time.sleep(0.01)
        (pid,) = _running(sleeper)
        assert _nspid(pid)[1:] == [1]  # pid 1 of a namespace right below ours
        assert os.stat(f"/proc/{pid}/status").st_uid == 0  # not dumpable: its /proc files are root's, not nobody's
        for ns in ("pid", "net", "ipc", "uts", "mnt"):
            theirs = os.readlink(f"/proc/{pid}/ns/{ns}")
            assert theirs != os.readlink(f"/proc/{c.pid}/ns/{ns}"), ns
            assert theirs != os.readlink(f"/proc/self/ns/{ns}"), ns
    finally:
        thread.join()
    assert errors and "did not finish before the deadline" in str(errors[0])


def test_the_hosts_mount_namespace_is_refused_seen_from_a_plugin_container(
    runc: RuncHost, plan: Plan, work: StartWork, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a DaemonSet the plugin's own namespace and root are its container's; pid 1's
    (the host pid namespace) are the node's. Here container ``host`` plays pid 1."""
    host = gpu_container(runc, plan, "true")
    monkeypatch.setattr(
        actions,
        "_NOT_CONTAINERS",
        (("/proc/self", "the plugin's"), (f"/proc/{host.pid}", "the host's (pid 1's)")),
        raising=False,
    )
    with pytest.raises(StartError, match=r"enter: process \d+ shares the host's \(pid 1's\) mount namespace"):
        run_start(host.pid, work)


def test_a_host_process_with_a_mount_namespace_of_its_own_is_refused(
    runc: RuncHost, plan: Plan, work: StartWork, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host service with a private mount namespace (``PrivateTmp``) has the host's
    root: refused by comparing with pid 1's root, as the plugin (here: container
    ``plugin`` plays its container) has another root. Nothing is asked of the
    work, so a miss could not write into the host."""
    plugin = gpu_container(runc, plan, "true")
    # This process stands in for pid 1, which a sandboxed test machine may not let
    # even root look at: like pid 1, it has the host's root.
    init = f"/proc/{os.getpid()}"
    monkeypatch.setattr(
        actions,
        "_NOT_CONTAINERS",
        ((f"/proc/{plugin.pid}", "the plugin's"), (init, "the host's (pid 1's)")),
        raising=False,
    )
    service = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
    try:
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{service.pid}/exe").endswith("unshare") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.readlink(f"/proc/{service.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        nothing = dataclasses.replace(work, visible_bus_ids=(), symlinks=(), ldconfig_folders=(), proc_source=None)
        with pytest.raises(StartError, match=r"enter: process \d+ has the host's \(pid 1's\) root: not a container"):
            run_start(service.pid, nothing)
    finally:
        service.kill()
        service.wait()


def test_a_pid_outside_the_containers_cgroup_is_refused(runc: RuncHost, plan: Plan, work: StartWork) -> None:
    c, other = gpu_container(runc, plan, "true"), gpu_container(runc, plan, "true")
    with pytest.raises(
        StartError, match=rf"enter: process {c.pid} is not in the container's cgroup '{other.cgroups_path}'"
    ):
        run_start(c.pid, dataclasses.replace(work, cgroups_path=other.cgroups_path))
    assert start(c.pid, dataclasses.replace(work, cgroups_path=c.cgroups_path)).procfs == "created"


MAX_CACHE_SIZE, MAX_ENTRIES = 8 << 20, 1 << 16  # engine.ldcache's, spelled out as the contract


def _big_cache(rootfs: Path, what: str) -> None:
    entry = LdCacheEntry("libz.so.1", "/lib/libz.so.1", 0x0303, True, 0)
    count = 1000 if what == "size" else MAX_ENTRIES + 1
    data = encode(LdCache((entry,) * count))
    if what == "size":
        data += b"\0" * (MAX_CACHE_SIZE + 1 - len(data))
    (rootfs / "etc/ld.so.cache").write_bytes(data)


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("size", rf"{(8 << 20) + 1} bytes, over the limit of {8 << 20} bytes for an image's ld.so.cache"),
        ("entries", rf"/etc/ld.so.cache: new-format ld.so.cache nlibs={(1 << 16) + 1} .*over the limit of 65536"),
    ],
)
def test_an_image_cache_over_a_limit_fails_the_start_quickly(
    runc: RuncHost, plan: Plan, work: StartWork, what: str, message: str
) -> None:
    c = gpu_container(runc, plan, "true", prepare=lambda r: _big_cache(r, what))
    began = time.monotonic()
    with pytest.raises(StartError, match=rf"ld\.so\.cache: .*{message}"):
        run_start(c.pid, work)
    assert time.monotonic() - began < 0.5


def test_a_fifo_among_the_images_conf_files_costs_the_rebuild_its_deadline_only(
    runc: RuncHost, plan: Plan, rebuild: StartWork
) -> None:
    """ldconfig opens the image's conf files as they are, and an open of a FIFO
    waits for a writer; no mount flag forbids that. What bounds it is the deadline:
    the image's own container fails to start, clearly, in time; the plugin does not
    wait longer."""

    def prepare(rootfs: Path) -> None:
        (rootfs / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
        _plant("fifo", rootfs / "etc/ld.so.conf.d/zz-fifo.conf")

    c = gpu_container(runc, plan, "true", prepare=prepare)
    began = time.monotonic()
    with pytest.raises(StartError, match=r"ldconfig: .* did not finish before the deadline and was killed"):
        run_start(c.pid, rebuild, timeout=0.6)
    assert time.monotonic() - began < 0.8


# --------------------------------------------------------------------------- the host's IPC endpoints
#
# CreateContainer planned an endpoint that was root's alone then; runc binds the host path
# later, following links. Whatever happened in between (root's folder gone and a local
# user's `ln -s / /tmp/nvidia-mps` there at runc's bind, then put back), the start work
# must find in the container exactly the inode the host path holds now, still root's alone.
# (The CDI hook's same check, on the compiled hook: tests/integration/test_hook.py.)

MPS, PERSISTENCED = "/tmp/nvidia-mps", "/run/nvidia-persistenced/socket"


@pytest.fixture
def ipc_host(tmp_path: Path) -> Iterator[Path]:
    """A host tree (the endpoints' root) with a sticky /tmp, root's MPS folder, a
    listening persistenced socket, and a root-owned decoy folder a link may lead to."""
    root = tmp_path / "ipc"
    (root / "tmp").mkdir(parents=True)
    os.chmod(root / "tmp", 0o1777)
    (root / "tmp/nvidia-mps").mkdir(mode=0o755)
    (root / "run/nvidia-persistenced").mkdir(mode=0o755, parents=True)
    (root / "decoy").mkdir(mode=0o755)
    (root / "decoy/host-secret").write_text("the host's\n")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as daemon:
        daemon.bind(str(root / PERSISTENCED.lstrip("/")))
        daemon.listen(1)
        yield root


def ipc_container(runc: RuncHost, plan: Plan, root: Path, args: str = "true") -> Container:
    binds = [(m.source, m.destination) for m in plan.mounts]
    binds += [(str(root / path.lstrip("/")), path) for path in (MPS, PERSISTENCED)]
    return runc.create("gpu", ["sh", "-c", args], binds=binds)


def with_ipc(work: StartWork, root: Path) -> StartWork:
    return dataclasses.replace(work, ipc=(PERSISTENCED, MPS), ipc_root=str(root))


def test_ipc_mounts_of_the_checked_inodes_pass_and_still_serve(
    runc: RuncHost, plan: Plan, work: StartWork, ipc_host: Path
) -> None:
    c = ipc_container(runc, plan, ipc_host, f"ls -A {MPS}; test -S {PERSISTENCED} && echo socket")
    report = start(c.pid, with_ipc(work, ipc_host))
    assert "IPC endpoints" in report.timings_ms
    assert c.run().splitlines() == ["socket"]


def _link_at_bind_then_root_folder_again(root: Path) -> Callable[[], None]:
    """runc followed a user's link to another folder; root's folder is back by the start."""
    os.rmdir(root / "tmp/nvidia-mps")
    os.symlink(str(root / "decoy"), root / "tmp/nvidia-mps")

    def after_create() -> None:
        os.unlink(root / "tmp/nvidia-mps")
        (root / "tmp/nvidia-mps").mkdir(mode=0o755)

    return after_create


def _link_still_there(root: Path) -> Callable[[], None]:
    os.rmdir(root / "tmp/nvidia-mps")
    os.symlink(str(root / "decoy"), root / "tmp/nvidia-mps")
    return lambda: None


def _gone_after_create(root: Path) -> Callable[[], None]:
    return lambda: os.rmdir(root / "tmp/nvidia-mps")


def _folder_swapped_after_create(root: Path) -> Callable[[], None]:
    def after_create() -> None:
        os.rename(root / "tmp/nvidia-mps", root / "decoy/old")
        (root / "tmp/nvidia-mps").mkdir(mode=0o755)

    return after_create


SWAPS = {
    "link-at-bind-then-root-folder-again": (_link_at_bind_then_root_folder_again, "the container's mount is not"),
    "link-still-there": (_link_still_there, "is a symbolic link"),
    "gone-after-create": (_gone_after_create, "is gone from the host"),
    "folder-swapped-after-create": (_folder_swapped_after_create, "the container's mount is not"),
}


@pytest.mark.parametrize("case", list(SWAPS))
def test_an_ipc_endpoint_swapped_after_create_fails_the_start(
    runc: RuncHost, plan: Plan, work: StartWork, ipc_host: Path, case: str
) -> None:
    """(Before: the start went on, and the container ran with the decoy, standing for
    the host's / that runc binds through `ln -s / /tmp/nvidia-mps`.)"""
    swap, why = SWAPS[case]
    after_create = swap(ipc_host)
    c = ipc_container(runc, plan, ipc_host)
    after_create()
    with pytest.raises(StartError) as caught:
        run_start(c.pid, with_ipc(work, ipc_host))
    assert caught.value.step == "IPC endpoints"
    assert f"IPC endpoint {MPS}" in str(caught.value) and why in str(caught.value), str(caught.value)
