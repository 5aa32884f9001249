"""The compiled CDI hook (``nri-gpu-hook``), run as runc runs a ``createContainer`` hook.

A CDI spec's hook must give a container what the NRI path gives it for the same
GPUs: ``nvidia.com/gpu=0`` what the annotation ``nvidia.com/gpus: 0`` gives. Here
the binary runs on a bundle made from ``engine.cdi.cdi_spec`` (the spec's device
nodes in ``linux.devices``, its mounts bound under the root, its hook's argv and
environment exactly; tests/integration/hookrun.py), and what it leaves in the
container is compared with

* ``engine.plan.plan`` for the equivalent request (``ByIndex``, ``ByMigPlacement``,
  the MIG grants): the procfs view's GPUs, capability files and ``params``, the
  links, ``00-nri-gpu.conf``, the application profile, the driver's entries in the
  ld.so.cache;
* and byte for byte with what the NRI path's worker (``engine.start``) leaves in a
  runc container made from the same image: the view (every entry, mode and
  content, and its mounts), ``/etc`` (the conf files, the cache's bytes), the
  links and the library folders.

Then what the Python hook's tests held, now of the binary: the OCI state's and
config.json's bounds and messages, the time limit, usage errors, a work
description of another version, CUDA compatibility, the IPC endpoints' check,
the rebuild mode, a read-only root, hostile roots, a second run.

The nodes are simulated (hack/testbed/gpunode.py, the committed fixture driver:
nothing downloaded but the test image and runc). What runs the hook on a container
root needs root (mount namespaces, runc); without it, and without the binary
(hack/setup builds it), the tests skip saying why, and ``NRI_GPU_E2E_REQUIRE=1``
turns the skips into failures. The command line's tests need only the binary.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine.cdi import HOOK_TIME_LIMIT, HOOK_WORK_VERSION, cdi_spec, hook_command, hook_work
from nri_gpu.engine.config import EngineConfig, LdCache, Policy
from nri_gpu.engine.discover import discover
from nri_gpu.engine.graphics import APP_PROFILE_PATH
from nri_gpu.engine.ldcache import parse_ld_so_cache
from nri_gpu.engine.model import DEFAULT_CAPABILITIES, Capability, Inventory, NvmlSnapshot, Plan
from nri_gpu.engine.plan import plan as make_plan
from nri_gpu.engine.request import ByIndex, ByMigPlacement, GpuRequest, Selection
from nri_gpu.engine.start import StartWork, start_work
from testbed import debs, hostops
from testbed.bundle import RuncHost, busybox_rootfs
from testbed.cudacompat import COMPAT_VERSION, install_compat
from testbed.gpunode import CAPS_MAJOR, FIXTURE_DRIVER, NVIDIA_MAJOR, SimNode, build_node, cap_minor, run_ldconfig
from testbed.openwatch import OpenWatch
from tests.integration import hookrun
from tests.integration.hookrun import Bundle, Result, Spec, call, comparable, run_hook, tree_of_container
from tests.integration.startcall import run_start

# The NRI worker's tests: the same hostile trees are planted for the hook.
from tests.integration.test_start import (  # noqa: F401
    MPS,
    PERSISTENCED,
    _big_cache,
    _link,
    _plant,
    _shared_library,
    gcc,
    ipc_host,
)

LIB = "/usr/lib/x86_64-linux-gnu"
WHO = "c1"  # the container as the hook names it: the OCI state's id
GRAPHICS = DEFAULT_CAPABILITIES | {Capability.GRAPHICS}
MIG = {2: [(2, [0, 1]), (3, [0])]}
STATE_LIMIT = 1 << 20  # hook/src/cli.rs
CONFIG_LIMIT = 16 << 20


# --------------------------------------------------------------------------- nodes and runs


@dataclass(frozen=True)
class Node:
    """A simulated node as the engine sees it, and the spec and plans made of it."""

    sim: SimNode
    config: EngineConfig
    inventory: Inventory

    def replace(self, **config: Any) -> Node:
        return dataclasses.replace(self, config=dataclasses.replace(self.config, **config))

    def spec(self, caps: frozenset[Capability] = DEFAULT_CAPABILITIES) -> Spec:
        return Spec(cdi_spec(self.inventory, self.config, caps, hook_command(str(hookrun.BINARY))))

    def work(self, caps: frozenset[Capability] = DEFAULT_CAPABILITIES, **changes: Any) -> dict[str, Any]:
        return {**hook_work(self.inventory, self.config, caps), **changes}

    def plan(self, request: GpuRequest) -> Plan:
        return make_plan(request, self.inventory, self.config)

    def nri_work(self, plan: Plan) -> StartWork:
        """What the NRI path's StartContainer does for ``plan`` (plugin.handlers' call)."""
        return start_work(
            plan,
            WHO,
            str(self.sim.proc_root),
            self.config.ld_cache,
            driver_root=self.config.driver_root,
            cuda_compat=self.config.policy.cuda_compat,
            driver_version=self.inventory.driver_version or "",
        )


def _argv(work: dict[str, Any]) -> list[str]:
    """The spec's argv for a work description (``cdi_spec`` writes the same)."""
    return [*hook_command(str(hookrun.BINARY)).args, "--work", json.dumps(work)]


ENV = list(hook_command("/x").env)


def _no_nvml(path: str) -> tuple[NvmlSnapshot | None, str | None]:
    return None, "NVML unavailable (test)"


def _node(root: Path, **kw: Any) -> Node:
    sim = build_node(root, driver_files=FIXTURE_DRIVER, **kw)
    config = EngineConfig(driver_root=str(sim.driver_root), dev_root=str(sim.dev_root), proc_root=str(sim.proc_root))
    return Node(sim, config, discover(config, cuda_version=lambda path: ("12.4", None), nvml=_no_nvml))


@pytest.fixture(scope="module")
def binary() -> Path:
    return hookrun.hook_binary()


@pytest.fixture(scope="module")
def root(binary: Path) -> None:
    """For what runs the hook on a container root: mount namespaces, mounts, runc."""
    if os.geteuid() != 0:
        hookrun.cannot_run("needs root: mount namespaces, mounts and runc")


@pytest.fixture(scope="module")
def four(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Node:
    return _node(tmp_path_factory.mktemp("four"), gpus=4)


@pytest.fixture(scope="module")
def mig(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Node:
    # NVML is not asked (the hook never does): the real library of the fixture stays.
    return _node(tmp_path_factory.mktemp("mig"), gpus=4, mig=MIG, nvml="real")


@pytest.fixture(scope="module")
def past31(four: Node) -> Node:
    """The 4-GPU node with GPU 1 at minor 40: past the profile's 32-bit mask."""
    gpus = tuple(dataclasses.replace(g, minor=40) if g.index == 1 else g for g in four.inventory.gpus)
    return dataclasses.replace(four, inventory=dataclasses.replace(four.inventory, gpus=gpus))


@pytest.fixture(scope="module")
def lower(root: None) -> Path:
    """The image runc's test containers have (busybox, Debian's libc6 and libc-bin)."""
    try:
        return busybox_rootfs(glibc=True)
    except debs.DebUnavailable as exc:
        hookrun.cannot_run(f"the test image cannot be fetched: {exc}")
        raise


@pytest.fixture(scope="module")
def runc(root: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuncHost]:
    try:
        host = RuncHost(tmp_path_factory.mktemp("runc"))
    except debs.DebUnavailable as exc:
        hookrun.cannot_run(f"runc cannot be fetched: {exc}")
    try:
        yield host
    finally:
        host.close()


@pytest.fixture
def where(root: None, tmp_path: Path) -> Iterator[Path]:
    """A test's folder; the overlays mounted under it are gone after the test."""
    try:
        yield tmp_path
    finally:
        hostops.unmount_under(tmp_path)


def image_cache(rootfs: Path) -> None:
    """The image's own ld.so.cache, as its build would have left it."""
    conf = rootfs / "etc/ld.so.conf.d"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "x86_64-linux-gnu.conf").write_text("/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
    run_ldconfig(rootfs)


def _cache(found: dict[str, Any]) -> list[tuple[str, str]]:
    data = hookrun.cache_bytes(found)
    assert data is not None, "no ld.so.cache"
    return [(e.name, e.path) for e in parse_ld_so_cache(data) if e.is_64bit]


def _bare(where: Path, node: Node, caps: frozenset[Capability] = DEFAULT_CAPABILITIES, *names: str) -> Bundle:
    spec = node.spec(caps)
    return Bundle(where / "bundle", devices=spec.devices(*names), mounts=spec.mounts)


# --------------------------------------------------------------------------- the hook runs the spec's command


def test_the_harness_runs_the_specs_own_command(four: Node) -> None:
    """What every test here runs: the spec's argv (its ``--work`` ``hook_work``'s JSON),
    its environment (PATH only) and a runtime timeout above the hook's own limit."""
    hook = four.spec().hook
    assert hook["path"] == str(hookrun.BINARY) == hook["args"][0]
    assert hook["args"][:-1] == [*hook_command(str(hookrun.BINARY)).args, "--work"]
    assert json.loads(hook["args"][-1]) == hook_work(four.inventory, four.config, DEFAULT_CAPABILITIES)
    assert [e.split("=")[0] for e in hook["env"]] == ["PATH"] and hook["env"] == ENV
    assert HOOK_TIME_LIMIT < hook["timeout"]


# --------------------------------------------------------------------------- what the container gets


Devices = Callable[[Node, Spec], list[dict[str, Any]]]
Request = Callable[[Node], GpuRequest]


def _named(*names: str) -> Devices:
    return lambda node, spec: spec.devices(*names)


def _numbers(*numbers: Callable[[Node], tuple[int, int]]) -> Devices:
    """The spec-wide nodes and these (major, minor) pairs, as a runtime lists them."""

    def devices(node: Node, spec: Spec) -> list[dict[str, Any]]:
        found = [n(node) for n in numbers]
        return spec.devices() + [
            {"path": f"/dev/x{ma}-{mi}", "type": "c", "major": ma, "minor": mi} for ma, mi in found
        ]

    return devices


def _gpu(index: int) -> Callable[[Node], tuple[int, int]]:
    return lambda node: (NVIDIA_MAJOR, node.sim.gpus[index].minor)


def _cap(gi: int, ci: int | None = None, major: int = CAPS_MAJOR) -> Callable[[Node], tuple[int, int]]:
    return lambda node: (major, cap_minor(node.sim.gpus[2].minor, gi, ci))


def _grant(name: str) -> Callable[[Node], tuple[int, int]]:
    def number(node: Node) -> tuple[int, int]:
        cap = getattr(node.inventory.mig, name)
        assert cap is not None
        return CAPS_MAJOR, cap.minor

    return number


def _asked(
    selection: Selection, *ids: Callable[[Node], Any], monitor: bool = False, config: bool = False
) -> Callable[[Node, frozenset[Capability]], GpuRequest]:
    def request(node: Node, caps: frozenset[Capability]) -> GpuRequest:
        return GpuRequest(selection, tuple(i(node) for i in ids), caps, (), "test", monitor, config)

    return request


def _index(i: int) -> Callable[[Node], ByIndex]:
    return lambda node: ByIndex(i)


def _placement(gi: int, ci: int) -> Callable[[Node], ByMigPlacement]:
    return lambda node: ByMigPlacement("GPU-" + node.sim.gpus[2].uuid[4:].lower(), gi, ci)


@dataclass(frozen=True)
class Case:
    node: str  # the fixture
    devices: Devices
    request: Callable[[Node, frozenset[Capability]], GpuRequest]
    # What the plan shows, so that no case passes with both sides showing nothing:
    # (GPUs in the view, capability files, an application profile).
    want: tuple[int, int, bool]
    caps: frozenset[Capability] = DEFAULT_CAPABILITIES


CASES = {
    "nothing": Case("four", _named(), _asked(Selection.NONE), (0, 0, False)),
    "one-gpu": Case("four", _named("2"), _asked(Selection.LIST, _index(2)), (1, 0, False)),
    "two-gpus": Case("four", _named("3", "0"), _asked(Selection.LIST, _index(0), _index(3)), (2, 0, False)),
    "all": Case("four", _named("all"), _asked(Selection.ALL), (4, 0, False)),
    # Not a device of the spec's: nvidiactl, another major, a block device, numbers
    # that are a bool, a string or a float, junk.
    "other-numbers": Case(
        "four",
        lambda node, spec: [
            *_named("1")(node, spec),
            {"path": "/dev/other", "type": "c", "major": 10, "minor": node.sim.gpus[3].minor},
            {"path": "/dev/blk", "type": "b", "major": NVIDIA_MAJOR, "minor": node.sim.gpus[0].minor},
            {"path": "/dev/t", "type": "c", "major": NVIDIA_MAJOR, "minor": True},
            {"path": "/dev/s", "type": "c", "major": NVIDIA_MAJOR, "minor": str(node.sim.gpus[2].minor)},
            {"path": "/dev/f", "type": "c", "major": float(NVIDIA_MAJOR), "minor": node.sim.gpus[2].minor},
            "garbage",
        ],
        _asked(Selection.LIST, _index(1)),
        (1, 0, False),
    ),
    # The node's monitor capability exists without MIG (as before MIG was simulated).
    "monitor-without-mig": Case(
        "four", _numbers(_gpu(1), _grant("monitor")), _asked(Selection.LIST, _index(1), monitor=True), (1, 1, False)
    ),
    "mig-device": Case(
        "mig", _numbers(_gpu(2), _cap(2), _cap(2, 1)), _asked(Selection.LIST, _placement(2, 1)), (1, 2, False)
    ),
    "mig-devices-and-whole-gpus": Case(
        "mig",
        _numbers(_gpu(3), _cap(3), _cap(3, 0), _gpu(2), _cap(2), _cap(2, 0), _gpu(0)),
        _asked(Selection.LIST, _index(0), _index(3), _placement(2, 0), _placement(3, 0)),
        (3, 4, False),
    ),
    # Half a MIG device is none: the parent alone is the whole GPU, as before MIG.
    "gi-cap-alone": Case("mig", _numbers(_gpu(2), _cap(2)), _asked(Selection.LIST, _index(2)), (1, 0, False)),
    "ci-cap-without-its-gi": Case(
        "mig", _numbers(_gpu(2), _cap(2, 0)), _asked(Selection.LIST, _index(2)), (1, 0, False)
    ),
    "caps-without-the-parent": Case("mig", _numbers(_cap(2), _cap(2, 0)), _asked(Selection.NONE), (0, 0, False)),
    "caps-of-another-major": Case(
        "mig",
        _numbers(_gpu(2), _cap(2, major=CAPS_MAJOR + 1), _cap(2, 0, major=CAPS_MAJOR + 1)),
        _asked(Selection.LIST, _index(2)),
        (1, 0, False),
    ),
    "mig-parent-whole": Case("mig", _numbers(_gpu(2)), _asked(Selection.LIST, _index(2)), (1, 0, False)),
    "monitor": Case("mig", _numbers(_grant("monitor")), _asked(Selection.NONE, monitor=True), (0, 1, False)),
    # Config shows the whole capabilities/ folder, live, and every instance of its GPU.
    "config-with-its-gpu": Case(
        "mig", _numbers(_gpu(2), _grant("config")), _asked(Selection.LIST, _index(2), config=True), (1, 6, False)
    ),
    "graphics-some-gpus": Case(
        "four", _named("0", "2"), _asked(Selection.LIST, _index(0), _index(2)), (2, 0, True), GRAPHICS
    ),
    "graphics-all-gpus": Case("four", _named("all"), _asked(Selection.ALL), (4, 0, False), GRAPHICS),
    "graphics-minor-past-31": Case(
        "past31", _named("1", "2"), _asked(Selection.LIST, _index(1), _index(2)), (2, 0, False), GRAPHICS
    ),
}


def _view_files(found: dict[str, Any], folder: str) -> dict[str, list[Any]]:
    prefix = f"nvidia/{folder}/"
    return {k[len(prefix) :]: v for k, v in (found["view"] or {}).items() if k.startswith(prefix)}


def assert_as_planned(found: dict[str, Any], plan: Plan, node: Node) -> None:
    """The container shows what ``plan`` says (the NRI path's plan for the same request)."""
    gpus = sorted(k for k in _view_files(found, "gpus") if "/" not in k)
    assert gpus == sorted(plan.visible_bus_ids)
    for bus in gpus:  # the driver's own folder, bound
        source = node.sim.proc_root / "driver/nvidia/gpus" / bus / "information"
        assert _view_files(found, "gpus")[f"{bus}/information"][2] == source.read_text()
    caps = {k: v for k, v in _view_files(found, "capabilities").items() if v[0] == "f"}
    source = hookrun.walk(node.sim.proc_root / "driver/nvidia/capabilities")
    assert source is not None
    if plan.proc_caps_all:  # the whole folder, live
        assert _view_files(found, "capabilities") == {k: v for k, v in source.items() if k != "."}
    else:
        assert sorted(caps) == sorted(plan.proc_caps)
        assert all(caps[c] == source[c] for c in caps)  # each the driver's own file
    assert "ModifyDeviceFiles: 0" in found["view"]["nvidia/params"][2].splitlines()
    assert found["links"] == {s.path: s.target for s in plan.symlinks}
    conf = found["etc"]["ld.so.conf.d/00-nri-gpu.conf"]
    assert (conf[0], conf[1], conf[2].splitlines()[1:]) == ("f", 0o644, list(plan.ldconfig_folders))
    profile = APP_PROFILE_PATH.removeprefix("/etc/")
    assert (found["etc"].get(profile) or [None, None, ""])[2] == plan.app_profile
    data = hookrun.cache_bytes(found)
    assert data is not None
    driver = {e.path for e in plan.ld_cache_entries}
    cached = [e for e in parse_ld_so_cache(data) if e.path in driver]
    assert sorted(cached, key=repr) == sorted(plan.ld_cache_entries, key=repr)


@pytest.mark.parametrize("case", list(CASES))
def test_the_container_gets_what_the_nri_path_gives(
    case: str, request: pytest.FixtureRequest, where: Path, lower: Path, runc: RuncHost
) -> None:
    how = CASES[case]
    node: Node = request.getfixturevalue(how.node)
    spec = node.spec(how.caps)
    plan = node.plan(how.request(node, how.caps))
    assert (len(plan.visible_bus_ids), len(plan.proc_caps), bool(plan.app_profile)) == how.want
    links, folders = [s.path for s in plan.symlinks], list(plan.ldconfig_folders)
    bundle = Bundle(where / "bundle", devices=how.devices(node, spec), mounts=spec.mounts)
    hookrun.image_root(bundle, lower, image_cache)
    hooked = run_hook(bundle, spec.hook["args"], spec.hook["env"], links=links, folders=folders).ok()
    assert_as_planned(hooked, plan, node)
    # The NRI path's worker on a runc container of the same image and mounts.
    c = runc.create("gpu", ["true"], binds=spec.mounts, glibc=True, prepare=image_cache)
    try:
        run_start(c.pid, node.nri_work(plan))
        assert comparable(hooked) == comparable(tree_of_container(c.pid, links, folders))
    finally:
        c.delete()


def test_the_profile_is_the_one_libnvidia_container_writes(four: Node, where: Path) -> None:
    spec = four.spec(GRAPHICS)
    bundle = Bundle(where / "bundle", devices=spec.devices("0", "2"), mounts=spec.mounts)
    found = run_hook(bundle, spec.hook["args"], spec.hook["env"]).ok()
    mask = (1 << four.sim.gpus[0].minor) | (1 << four.sim.gpus[2].minor)
    assert found["etc"][APP_PROFILE_PATH.removeprefix("/etc/")] == [
        "f",
        0o644,
        f'{{"profiles": [{{"name": "_container_", "settings": ["EGLVisibleDGPUDevices", {mask:#x}]}}],\n'
        ' "rules": [{"pattern": [], "profile": "_container_"}]}\n',
    ]


# --------------------------------------------------------------------------- the command line and its inputs


@pytest.fixture(scope="module")
def argv(four: Node) -> list[str]:
    return four.spec().hook["args"]


def _state(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (b"not json", "the OCI state on stdin is not JSON: Expecting value: line 1 column 1 (char 0)"),
        (b"[]", "the OCI state on stdin is not a JSON object"),
        (_state(bundle="/b"), "the OCI state has no container id (id: None)"),
        (_state(id="", bundle="/b"), "the OCI state has no container id (id: '')"),
        (_state(id="c", bundle="relative"), "the OCI state's bundle 'relative' is not an absolute path"),
        (_state(id="c"), "the OCI state's bundle None is not an absolute path"),
        (b" " * (STATE_LIMIT + 1), f"the OCI state on stdin is over {STATE_LIMIT} bytes"),
    ],
    ids=["not-json", "not-an-object", "no-id", "empty-id", "relative-bundle", "no-bundle", "over-the-limit"],
)
def test_a_bad_state_is_named(argv: list[str], state: bytes, message: str) -> None:
    run = call(argv, stdin=state, env=dict(e.split("=", 1) for e in ENV))
    assert (run.returncode, run.stderr) == (1, f"nri-gpu hook: {message}\n")


def test_the_state_is_read_no_further_than_its_limit(argv: list[str], tmp_path: Path) -> None:
    """The state carries the pod's annotations: the hook reads one byte past its limit
    and no further, whatever the runtime writes (the file's offset, shared with the
    hook's stdin, shows how far it read; std's buffered ``Stdin`` read 8 KiB ahead)."""
    big = tmp_path / "state"
    with open(big, "wb") as f:
        f.truncate(STATE_LIMIT + (8 << 20))
    fd = os.open(big, os.O_RDONLY)
    try:
        run = call(argv, stdin=fd, env={})
        assert run.returncode == 1 and f"is over {STATE_LIMIT} bytes" in run.stderr
        assert os.lseek(fd, 0, os.SEEK_CUR) == STATE_LIMIT + 1
    finally:
        os.close(fd)


def _config_json(bundle: Path, how: str) -> None:
    path = bundle / "config.json"
    if how == "missing":
        return
    if how == "over":
        with open(path, "wb") as f:
            f.truncate(CONFIG_LIMIT + 1)  # spaces would do as well: the size is refused before parsing
        return
    path.write_bytes(
        {
            "not-json": b"{root",
            "not-an-object": b'["root"]',
            "no-root": b'{"linux": {}}',
            "no-path": b'{"root": {}}',
            "empty-path": b'{"root": {"path": ""}}',
            "path-not-a-string": b'{"root": {"path": 7}}',
        }[how]
    )


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("missing", "{b}/config.json: No such file or directory"),
        ("over", f"{{b}}/config.json is over {CONFIG_LIMIT} bytes"),
        ("not-json", "{b}/config.json is not JSON: Expecting property name enclosed in double quotes: line 1 column 2"),
        ("not-an-object", "{b}/config.json is not a JSON object"),
        ("no-root", "{b}/config.json has no root.path"),
        ("no-path", "{b}/config.json has no root.path"),
        ("empty-path", "{b}/config.json has no root.path"),
        ("path-not-a-string", "{b}/config.json has no root.path"),
    ],
)
def test_a_bad_config_json_is_named(argv: list[str], tmp_path: Path, how: str, message: str) -> None:
    _config_json(tmp_path, how)
    run = call(argv, stdin=_state(id="c1", bundle=str(tmp_path)), env={})
    assert run.returncode == 1
    assert run.stderr.startswith("nri-gpu hook: " + message.format(b=tmp_path)), run.stderr


def test_the_root_path_is_the_bundles_or_absolute(four: Node, where: Path) -> None:
    spec = four.spec()
    elsewhere = where / "images/abc/rootfs"
    for root_path in ("./rootfs/../rootfs", str(elsewhere)):
        bundle = Bundle(where / "bundle", devices=spec.devices("1"), mounts=spec.mounts, root_path=root_path)
        found = run_hook(bundle, spec.hook["args"], spec.hook["env"]).ok()
        assert sorted(_view_files(found, "gpus")) == sorted(_gpu_files(four, 1))
    assert (elsewhere / "etc/ld.so.conf.d/00-nri-gpu.conf").is_file()
    assert (where / "bundle/rootfs/etc/ld.so.conf.d/00-nri-gpu.conf").is_file()


def _gpu_files(node: Node, index: int) -> list[str]:
    bus = node.sim.gpus[index].bus_id
    return [bus, *(f"{bus}/{p.name}" for p in (node.sim.proc_root / "driver/nvidia/gpus" / bus).iterdir())]


def _blocking_sigalrm() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})


@pytest.mark.parametrize(
    ("limit", "shown", "before_exec"),
    [
        ("1", "1", None),
        # Below a microsecond: rounded down to {0, 0}, setitimer would turn the timer off.
        ("0.0000001", "0.0000001", None),
        # A runtime that starts the hook with SIGALRM blocked (a mask survives exec).
        ("1", "1", _blocking_sigalrm),
    ],
    ids=["one-second", "sub-microsecond", "sigalrm-blocked"],
)
def test_the_hook_ends_itself_at_its_time_limit(
    four: Node, limit: str, shown: str, before_exec: Callable[[], None] | None
) -> None:
    """A stdin that never closes (or a stuck file system) must not hold the start
    until the runtime's own timeout, or forever without one."""
    argv = [*hook_command(str(hookrun.BINARY)).args[:2], "--time-limit", limit, "--work", json.dumps(four.work())]
    began = time.monotonic()
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env={}, preexec_fn=before_exec) as proc:
        try:
            proc.wait(timeout=10)  # stdin stays open: communicate() would close it
        finally:
            proc.kill()
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
    assert proc.returncode == 1, err
    assert err == f"nri-gpu hook: did not finish within its time limit of {shown} s; giving up\n"
    assert time.monotonic() - began < 5


@pytest.mark.parametrize(
    ("words", "problem"),
    [
        ([], "an action is required (start-container)"),
        (["stop-container", "--work", "{}"], "unknown action 'stop-container' (expected start-container)"),
        (["start-container"], "the argument --work is required"),
        (["start-container", "--work"], "--work needs a value"),
        (["start-container", "--work", "{}", "--work", "{}"], "unrecognized or repeated argument '--work'"),
        (["start-container", "--work=x"], "--work=x needs a value"),
        (["start-container", "--other", "x", "--work", "{}"], "unrecognized or repeated argument '--other'"),
        *(
            (["start-container", "--time-limit", v, "--work", "{}"], f"argument --time-limit: '{v}' is not a number")
            for v in ("0", "-1", "nan", "soon", "4000")
        ),
    ],
)
def test_usage_errors_exit_2(binary: Path, words: list[str], problem: str) -> None:
    run = call([str(binary), *words])
    assert run.returncode == 2
    assert run.stderr.startswith("usage: nri-gpu-hook start-container [--time-limit SECONDS] --work JSON\n")
    assert f"nri-gpu-hook: error: {problem}" in run.stderr, run.stderr


def test_help_is_on_stdout(binary: Path) -> None:
    done = subprocess.run([str(binary), "start-container", "--help"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("usage: nri-gpu-hook start-container")


@pytest.mark.parametrize("version", [HOOK_WORK_VERSION + 1, str(HOOK_WORK_VERSION), 0])
def test_a_work_of_another_version_is_refused_by_name(four: Node, version: object) -> None:
    """A spec written by another nri-gpu fails every start loudly, saying what to do,
    before anything is read (the state here would be refused too)."""
    run = call(_argv(four.work(version=version)), stdin=b"{}", env={})
    assert run.returncode == 2
    assert run.stderr == (
        f"nri-gpu hook: --work: the work description is of version {version!r}, this hook reads version "
        f"{HOOK_WORK_VERSION}: write the spec again with this nri-gpu (`nri-gpu cdi generate`)\n"
    )


@pytest.mark.parametrize(
    ("work", "problem"),
    [
        ("{", "the work description is not JSON"),
        ("[]", "the work description is not a JSON object"),
        ('{"version": 1}', "the work description has no symlinks"),
    ],
)
def test_a_bad_work_description_is_a_usage_error(binary: Path, work: str, problem: str) -> None:
    run = call([str(binary), "start-container", "--work", work], stdin=b"{}")
    assert run.returncode == 2 and run.stderr.startswith(f"nri-gpu hook: --work: {problem}"), run.stderr


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("ipc_root", "run/nvidia/driver", "ipc_root: 'run/nvidia/driver' is not a clean absolute path"),
        ("proc_source", "/sim/../proc", "proc_source: '/sim/../proc' is not a clean absolute path"),
        ("ldconfig", "ldconfig", "ldconfig: 'ldconfig' is not a clean absolute path"),
    ],
)
def test_a_bad_root_in_the_work_is_named_by_its_field(four: Node, field: str, value: str, problem: str) -> None:
    """The hook has no flags for roots (the Python hook's ``--driver-root``): they are
    the work's fields, and a bad one is named by its field, before any start."""
    run = call(_argv(four.work(**{field: value})), stdin=b"{}", env={})
    assert (run.returncode, run.stderr) == (2, f"nri-gpu hook: --work: {problem}\n")


# --------------------------------------------------------------------------- the start work


@pytest.fixture(params=["merge", "rebuild"])
def each(request: pytest.FixtureRequest, four: Node) -> Node:
    """The 4-GPU node with either way of making the cache, for what must hold either way."""
    return four.replace(ld_cache=LdCache(request.param))


def test_a_second_run_changes_nothing(each: Node, where: Path, lower: Path) -> None:
    spec = each.spec()
    bundle = Bundle(where / "bundle", devices=spec.devices("0", "2"), mounts=spec.mounts)
    hookrun.image_root(bundle, lower, image_cache)
    result = run_hook(bundle, spec.hook["args"], spec.hook["env"], times=2, folders=[LIB])
    first, second = result.trees
    result.ok()
    assert first == second  # the same tree, the view's mounts (kept, not made again) and the cache's inode
    assert len(first["view_ids"]) == 3 and first["cache_id"] is not None


def test_the_view_is_a_locked_tmpfs(four: Node, where: Path) -> None:
    found = run_hook(_bare(where, four, DEFAULT_CAPABILITIES, "0", "2"), *_spec_command(four)).ok()
    locked = ["nodev", "noexec", "nosuid", "ro"]
    buses = sorted(four.sim.gpus[i].bus_id for i in (0, 2))
    assert found["view_mounts"][0] == ["/proc/driver", "tmpfs", "nri-gpu", locked]
    assert [(m[0], m[3]) for m in found["view_mounts"][1:]] == [
        (f"/proc/driver/nvidia/gpus/{b}", locked) for b in buses
    ]
    # Host files are never touched: the view holds copies.
    assert "ModifyDeviceFiles: 1" in (four.sim.proc_root / "driver/nvidia/params").read_text().splitlines()
    # Nothing propagates: the view stayed in the hook's (the container's) namespace.
    assert " - tmpfs nri-gpu " not in Path("/proc/self/mountinfo").read_text()


def _spec_command(node: Node, caps: frozenset[Capability] = DEFAULT_CAPABILITIES) -> tuple[list[str], list[str]]:
    hook = node.spec(caps).hook
    return hook["args"], hook["env"]


def test_other_devices_replace_the_view(four: Node, where: Path) -> None:
    spec = four.spec()
    bundle = Bundle(where / "bundle", devices=spec.devices("0", "2"), mounts=spec.mounts)

    def other_gpus(i: int) -> None:
        if i == 1:
            bundle.devices = spec.devices("3")
            bundle.write()

    result = run_hook(bundle, spec.hook["args"], spec.hook["env"], times=2, before=other_gpus)
    first, second = result.trees
    result.ok()
    assert sorted(k for k in _view_files(second, "gpus") if "/" not in k) == [four.sim.gpus[3].bus_id]
    assert [m[0] for m in second["view_mounts"]].count("/proc/driver") == 1
    assert not set(first["view_ids"]) & set(second["view_ids"])


def test_a_read_only_root_stays_read_only(each: Node, where: Path, lower: Path) -> None:
    """The hook's writes go through its ``nodev`` clone of the root, writable at its
    top; the container's own mount keeps its flags."""
    spec = each.spec()
    bundle = Bundle(where / "bundle", devices=spec.devices("1"), mounts=spec.mounts)
    hookrun.image_root(bundle, lower, image_cache)
    found = run_hook(bundle, spec.hook["args"], spec.hook["env"], readonly=True).ok()
    assert "ro" in found["root_options"]
    assert ("libcuda.so.1", f"{LIB}/libcuda.so.1") in _cache(found)
    assert found["etc"]["ld.so.conf.d/00-nri-gpu.conf"][2].splitlines()[1:] == [LIB]


def test_the_rebuild_is_the_trusted_ldconfigs_and_matches_the_nri_path(
    four: Node, where: Path, lower: Path, runc: RuncHost
) -> None:
    """``ld_cache = "rebuild"``: the host's static ldconfig rebuilds the image's cache
    in the container; the same bytes as the NRI worker's rebuild, and the same
    entries as the merge."""
    rebuild = four.replace(ld_cache=LdCache.REBUILD, ldconfig="/sbin/ldconfig")
    trees = {}
    for name, node in (("merge", four), ("rebuild", rebuild)):
        spec = node.spec()
        bundle = Bundle(where / name, devices=spec.devices("1"), mounts=spec.mounts)
        hookrun.image_root(bundle, lower, image_cache)
        trees[name] = run_hook(bundle, spec.hook["args"], spec.hook["env"], folders=[LIB]).ok()
    cached = _cache(trees["rebuild"])
    assert ("libcuda.so.1", f"{LIB}/libcuda.so.1") in cached and (
        "libc.so.6",
        "/lib/x86_64-linux-gnu/libc.so.6",
    ) in cached
    assert cached == _cache(trees["merge"])
    plan = rebuild.plan(GpuRequest(Selection.LIST, (ByIndex(1),), DEFAULT_CAPABILITIES, (), "test"))
    c = runc.create("gpu", ["true"], binds=rebuild.spec().mounts, glibc=True, prepare=image_cache)
    try:
        run_start(c.pid, rebuild.nri_work(plan))
        assert comparable(trees["rebuild"]) == comparable(tree_of_container(c.pid, folders=[LIB]))
    finally:
        c.delete()


def test_a_dynamic_ldconfig_is_refused(four: Node, where: Path) -> None:
    dynamic = os.path.realpath(shutil.which("true") or "/bin/true")
    node = four.replace(ld_cache=LdCache.REBUILD, ldconfig=dynamic)
    spec = node.spec()
    bundle = Bundle(where / "bundle", devices=spec.devices("1"), mounts=spec.mounts)
    result = run_hook(bundle, spec.hook["args"], spec.hook["env"])
    assert result.run.returncode == 1
    assert result.run.stderr.startswith(f"nri-gpu hook: container {WHO}: ldconfig: {dynamic}"), result.run.stderr
    assert "is dynamically linked (interpreter /lib64/ld-linux" in result.run.stderr
    assert result.tree["view_mounts"] == [] and result.tree["etc"] is None  # refused before any work


def test_a_fifo_among_the_images_conf_files_costs_the_rebuild_its_deadline_only(four: Node, where: Path) -> None:
    """ldconfig opens the image's conf files as they are, and an open of a FIFO waits
    for a writer: the hook's deadline (a second before its time limit) ends it, and
    the container's start fails, clearly, in time."""
    node = four.replace(ld_cache=LdCache.REBUILD, ldconfig="/sbin/ldconfig")
    bundle = _bare(where, node)
    (bundle.rootfs / "etc/ld.so.conf.d").mkdir(parents=True)
    (bundle.rootfs / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    os.mkfifo(bundle.rootfs / "etc/ld.so.conf.d/zz-fifo.conf")
    argv = [*_argv(node.work())]
    argv[argv.index("--time-limit") + 1] = "2"
    result = run_hook(bundle, argv, ENV)
    assert result.run.returncode == 1
    assert f"container {WHO}: ldconfig: " in result.run.stderr
    assert "did not finish before the deadline and was killed" in result.run.stderr, result.run.stderr
    assert 1 <= result.run.seconds < 2


# --------------------------------------------------------------------------- CUDA forward compatibility


@pytest.fixture(scope="module")
def compat_lib(binary: Path) -> None:
    try:
        from testbed.cudacompat import libcuda

        libcuda()
    except debs.DebUnavailable as exc:
        hookrun.cannot_run(f"libcuda1 {COMPAT_VERSION} cannot be fetched: {exc}")


def _compat_image(rootfs: Path) -> None:
    install_compat(rootfs)
    image_cache(rootfs)  # the compat folder is in no conf file, as in nvidia/cuda


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_cuda_compat_follows_the_policy_as_the_nri_path_does(
    four: Node, on: bool, compat_lib: None, where: Path, lower: Path, runc: RuncHost
) -> None:
    """``hook_work``'s ``cuda_compat`` and driver version: an image whose
    /usr/local/cuda/compat holds a newer libcuda gets it first, in the conf files and
    the cache, only with the policy on; byte for byte what the NRI worker does."""
    node = four.replace(policy=Policy(cuda_compat=on))
    assert node.work()["cuda_compat"] is on and node.work()["driver_version"] == "550.163.01"
    spec = node.spec()
    bundle = Bundle(where / "bundle", devices=spec.devices("1"), mounts=spec.mounts)
    hookrun.image_root(bundle, lower, _compat_image)
    found = run_hook(bundle, spec.hook["args"], spec.hook["env"], folders=[LIB]).ok()
    order = [path for name, path in _cache(found) if name == "libcuda.so.1"]
    conf = found["etc"].get("ld.so.conf.d/00-compat-nri-gpu.conf")
    if on:
        assert order == ["/usr/local/cuda/compat/libcuda.so.1", f"{LIB}/libcuda.so.1"]
        assert conf[:2] == ["f", 0o644] and conf[2].splitlines()[1:] == ["/usr/local/cuda/compat"]
    else:
        assert order == [f"{LIB}/libcuda.so.1"] and conf is None
    plan = node.plan(GpuRequest(Selection.LIST, (ByIndex(1),), DEFAULT_CAPABILITIES, (), "test"))
    c = runc.create("gpu", ["true"], binds=spec.mounts, glibc=True, prepare=_compat_image)
    try:
        run_start(c.pid, node.nri_work(plan))
        assert comparable(found) == comparable(tree_of_container(c.pid, folders=[LIB]))
    finally:
        c.delete()


# --------------------------------------------------------------------------- the host's IPC endpoints
#
# The spec named the endpoints when it was written; runc binds their host paths
# later, following links. The hook must find in the container exactly the inode the
# host path holds now, still root's alone (tests/integration/test_start.py holds the
# same for the NRI path's worker).


def _ipc_bundle(four: Node, where: Path, root: Path) -> tuple[Bundle, list[str]]:
    """A bundle whose config.json binds both endpoints from their host paths under
    ``root`` (the spec's ``ipc_root``), and the argv of a spec written for that root."""
    ipc = four.replace(driver_root=str(root))
    work = ipc.work()
    assert work["ipc_root"] == str(root)
    assert [MPS, f"{root}{MPS}"] in [[p, s] for p, _, s in work["ipc"]]
    spec = four.spec()
    bundle = Bundle(
        where / "bundle",
        devices=spec.devices("1"),
        mounts=[*spec.mounts, (f"{root}{MPS}", MPS), (f"{root}{PERSISTENCED}", PERSISTENCED)],
    )
    return bundle, _argv(work)


def _relink(root: Path) -> None:
    os.rmdir(root / "tmp/nvidia-mps")
    os.symlink(str(root / "decoy"), root / "tmp/nvidia-mps")


def _folder_swapped(root: Path) -> None:
    os.rename(root / "tmp/nvidia-mps", root / "decoy/old")
    (root / "tmp/nvidia-mps").mkdir(mode=0o755)


# What runc bound at /tmp/nvidia-mps, what happens on the host before the hook runs
# (in the hook's namespace, its mounts made), and what the hook says.
SWAPS: dict[str, tuple[str, Callable[[Path], None] | None, Callable[[Path], None] | None, str]] = {
    # runc followed a user's link to another folder; root's folder is back by the hook.
    "link-at-bind-then-root-folder-again": ("decoy", None, None, "the container's mount is not"),
    "link-still-there": ("decoy", _relink, None, "is a symbolic link"),
    "gone-after-create": ("tmp/nvidia-mps", None, lambda root: os.rmdir(root / "tmp/nvidia-mps"), "is gone"),
    "folder-swapped-after-create": ("tmp/nvidia-mps", None, _folder_swapped, "the container's mount is not"),
}


def test_ipc_mounts_of_the_hosts_entries_pass(four: Node, where: Path, ipc_host: Path) -> None:  # noqa: F811
    bundle, argv = _ipc_bundle(four, where, ipc_host)
    found = run_hook(bundle, argv, ENV).ok()
    assert found["etc"]["ld.so.conf.d/00-nri-gpu.conf"][0] == "f"


@pytest.mark.parametrize("case", list(SWAPS))
def test_the_cdi_hook_refuses_an_ipc_mount_that_is_not_the_hosts_entry(
    four: Node,
    where: Path,
    ipc_host: Path,  # noqa: F811
    case: str,
) -> None:
    bound, before_binding, after_binding, why = SWAPS[case]
    bundle, argv = _ipc_bundle(four, where, ipc_host)
    if before_binding is not None:
        before_binding(ipc_host)
    binds = [*bundle.mounts[:-2], (str(ipc_host / bound), MPS), bundle.mounts[-1]]
    result = run_hook(
        bundle, argv, ENV, binds=binds, before=None if after_binding is None else lambda i: after_binding(ipc_host)
    )
    assert result.run.returncode == 1
    assert result.run.stderr.startswith(f"nri-gpu hook: container {WHO}: IPC endpoints: IPC endpoint {MPS}: ")
    assert why in result.run.stderr, result.run.stderr
    assert result.tree["etc"] is None and result.tree["view_mounts"] == []  # refused before any write


def test_a_mount_of_another_source_at_an_endpoint_is_not_ours_to_judge(
    four: Node,
    where: Path,
    ipc_host: Path,  # noqa: F811
) -> None:
    """The spec binds an endpoint from its host path; a mount of another source at the
    same place is the user's own (a volume), and the hook checks nothing of it."""
    bundle, argv = _ipc_bundle(four, where, ipc_host)
    bundle.mounts[-2] = (str(ipc_host / "decoy"), MPS)
    bundle.write()
    run_hook(bundle, argv, ENV).ok()


# --------------------------------------------------------------------------- hostile roots


@pytest.fixture
def bait(tmp_path: Path) -> Path:
    """A host folder an escape would write into; compared before and after."""
    d = tmp_path / "bait"
    (d / "ld.so.conf.d").mkdir(parents=True)
    (d / "ld.so.conf.d/host.conf").write_text("/host/only\n")
    (d / "ld.so.cache").write_bytes(b"host cache\n")
    (d / "etc").mkdir()
    (d / "opt").mkdir()
    return d


def _snapshot(path: Path) -> dict[str, list[Any]] | None:
    return hookrun.walk(path)


def _hostile(
    node: Node, where: Path, prepare: Callable[[Path], None], work: dict[str, Any] | None = None, **kw: Any
) -> Result:
    spec = node.spec()
    bundle = Bundle(where / "bundle", devices=spec.devices("1"), mounts=spec.mounts)
    prepare(bundle.rootfs)
    return run_hook(bundle, _argv(work or node.work()), ENV, **kw)


def test_cache_linked_to_a_host_file(each: Node, where: Path, bait: Path) -> None:
    before = _snapshot(bait)

    def prepare(rootfs: Path) -> None:
        _link(rootfs, "/etc/ld.so.cache", str(bait / "ld.so.cache"))
        _link(rootfs, "/etc/ld.so.cache~", str(bait / "ld.so.cache"))  # ldconfig's own temporary name

    found = _hostile(each, where, prepare).ok()
    assert _snapshot(bait) == before
    assert found["etc"]["ld.so.cache"][0] == "f"  # the new cache was renamed over the link
    assert ("libcuda.so.1", f"{LIB}/libcuda.so.1") in _cache(found)


@pytest.fixture
def sleeper(bait: Path) -> Iterator[int]:
    """A host process whose cwd is the bait and whose stdout is ``bait/stdout``: its
    ``/proc/<pid>/cwd`` and ``fd/1`` are magic links to them, and the hook sees the
    host's procfs at the root's /proc (runc's is the container's; the class of
    CVE-2024-21626)."""
    with open(bait / "stdout", "wb") as out:
        proc = subprocess.Popen(["sleep", "60"], cwd=bait, stdout=out)
    try:
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_cache_linked_through_a_magic_link_to_a_host_file(each: Node, where: Path, bait: Path, sleeper: int) -> None:
    before = _snapshot(bait)
    found = _hostile(each, where, lambda r: _link(r, "/etc/ld.so.cache", f"/proc/{sleeper}/fd/1")).ok()
    assert _snapshot(bait) == before and (bait / "stdout").read_bytes() == b""
    assert ("libcuda.so.1", f"{LIB}/libcuda.so.1") in _cache(found)


@pytest.mark.parametrize(
    ("path", "target", "step"),
    [
        ("/etc/ld.so.conf.d", "/proc/{pid}/cwd/ld.so.conf.d", "ld.so.conf"),
        ("/etc", "/proc/{pid}/cwd/etc", "ld.so.conf"),
        ("/opt/nvidia", "/proc/{pid}/cwd/opt", "symlinks"),
    ],
    ids=["conf-dir", "etc", "link-folder"],
)
def test_magic_links_are_refused(
    four: Node, where: Path, bait: Path, sleeper: int, path: str, target: str, step: str
) -> None:
    before = _snapshot(bait)
    work = four.work()
    work["symlinks"] = [*work["symlinks"], ["/opt/nvidia/libx.so.1", "libx.so.1.0"]]
    result = _hostile(four, where, lambda r: _link(r, path, target.format(pid=sleeper)), work)
    assert result.run.returncode == 1
    # Refused either for crossing into the /proc mount or for the magic link itself.
    assert result.run.stderr.startswith(f"nri-gpu hook: container {WHO}: {step}: "), result.run.stderr
    assert "refused: " in result.run.stderr and f": {path}" in result.run.stderr, result.run.stderr
    assert _snapshot(bait) == before


def test_conf_dir_linked_to_a_host_path_that_the_image_lacks(four: Node, where: Path, bait: Path) -> None:
    before = _snapshot(bait)
    result = _hostile(four, where, lambda r: _link(r, "/etc/ld.so.conf.d", str(bait / "ld.so.conf.d")))
    assert result.run.returncode == 1
    assert result.run.stderr == (
        f"nri-gpu hook: container {WHO}: ld.so.conf: /etc/ld.so.conf.d: a symlink to nowhere in the container"
        " is in the way\n"
    )
    assert _snapshot(bait) == before


def test_conf_dir_linked_to_a_host_path_writes_inside(each: Node, where: Path, bait: Path) -> None:
    def prepare(rootfs: Path) -> None:
        _link(rootfs, "/etc/ld.so.conf.d", str(bait / "ld.so.conf.d"))
        (rootfs / str(bait).lstrip("/") / "ld.so.conf.d").mkdir(parents=True)

    before = _snapshot(bait)
    spec = each.spec()
    bundle = Bundle(where / "bundle", devices=spec.devices("1"), mounts=spec.mounts)
    prepare(bundle.rootfs)
    found = run_hook(bundle, spec.hook["args"], spec.hook["env"]).ok()
    assert _snapshot(bait) == before
    inside = bundle.rootfs / str(bait).lstrip("/") / "ld.so.conf.d/00-nri-gpu.conf"
    assert inside.read_text().splitlines()[1:] == [LIB]
    assert ("libcuda.so.1", f"{LIB}/libcuda.so.1") in _cache(found)  # ldconfig read it there too


def test_conf_dir_linked_into_a_volume_is_refused(four: Node, where: Path) -> None:
    volume = where / "volume"
    volume.mkdir(mode=0o755)
    (volume / "data.txt").write_text("the volume's own\n")
    before = _snapshot(volume)
    result = _hostile(four, where, lambda r: _link(r, "/etc/ld.so.conf.d", "/data"), volumes=[(str(volume), "/data")])
    assert result.run.returncode == 1
    assert result.run.stderr == (
        f"nri-gpu hook: container {WHO}: ld.so.conf: /etc/ld.so.conf.d: refused: "
        "it leads out of the container's root file system (into a volume or another mount), "
        "where the plugin's rights are not the container's\n"
    )
    assert _snapshot(volume) == before


COMPAT_CONF = "/etc/ld.so.conf.d/00-compat-nri-gpu.conf"
# Every file the hook writes in /etc: the conf file and the cache always; the
# application profile for a work with graphics; the compat conf file for an image
# with a newer CUDA compat folder, the policy on.
OUR_FILES = {
    "conf": "/etc/ld.so.conf.d/00-nri-gpu.conf",
    "cache": "/etc/ld.so.cache",
    "profile": APP_PROFILE_PATH,
    "compat-conf": COMPAT_CONF,
}


@pytest.mark.parametrize("kind", ["device", "fifo"])
@pytest.mark.parametrize("path", list(OUR_FILES))
def test_a_device_or_fifo_where_our_files_go_is_never_opened(
    each: Node, where: Path, lower: Path, kind: str, path: str, request: pytest.FixtureRequest
) -> None:
    """The hook runs as root, outside the container's device cgroup: an open of an
    image's ``c 10 130`` (a watchdog) would be done with root's rights; a FIFO's
    open waits for a writer. Opens go through a ``nodev`` copy of the root, a FIFO
    is opened ``O_NONBLOCK`` and refused by its type: neither blocks, both are
    replaced by regular files of ours."""
    file, node, caps = OUR_FILES[path], each, DEFAULT_CAPABILITIES
    if path == "profile":
        caps = GRAPHICS
    if path == "compat-conf":
        request.getfixturevalue("compat_lib")
        node = each.replace(policy=Policy(cuda_compat=True))
    spec = node.spec(caps)
    bundle = Bundle(where / "bundle", devices=spec.devices("1"), mounts=spec.mounts)

    def prepare(rootfs: Path) -> None:
        if path == "compat-conf":
            _compat_image(rootfs)
        _plant(kind, rootfs / file.lstrip("/"))

    hookrun.image_root(bundle, lower, prepare)
    with OpenWatch(bundle.rootfs / file.lstrip("/")) as watch:
        result = run_hook(bundle, spec.hook["args"], spec.hook["env"])
        if kind == "device":
            assert watch.opens() == 0, f"the device node at {file} was opened"
    found = result.ok()
    assert result.run.seconds < 1.0
    entry = found["etc"][file.removeprefix("/etc/")]
    assert entry[:2] == ["f", 0o644]
    if path == "profile":
        assert entry[2] == _profile(node, 1)
    if path == "compat-conf":
        assert entry[2].splitlines()[1:] == ["/usr/local/cuda/compat"]
    assert ("libcuda.so.1", f"{LIB}/libcuda.so.1") in _cache(found)


def _profile(node: Node, *gpus: int) -> str:
    """The application profile the NRI path plans for ``gpus`` with graphics."""
    text = node.plan(GpuRequest(Selection.LIST, tuple(map(ByIndex, gpus)), GRAPHICS, (), "test")).app_profile
    assert text
    return text


def test_a_profile_planted_as_a_link_is_replaced_not_followed(four: Node, where: Path, bait: Path) -> None:
    """tests/unit/engine/start/test_appprofile.py's, through the hook: the image's
    ``10-container.conf`` is a link to a host file."""
    (bait / "etc/10-container.conf").write_text("host file\n")
    before = _snapshot(bait)
    bundle = _bare(where, four, GRAPHICS, "1")
    _link(bundle.rootfs, APP_PROFILE_PATH, str(bait / "etc/10-container.conf"))
    found = run_hook(bundle, *_spec_command(four, GRAPHICS)).ok()
    assert _snapshot(bait) == before
    assert found["etc"][APP_PROFILE_PATH.removeprefix("/etc/")] == ["f", 0o644, _profile(four, 1)]


def test_a_profile_folder_linked_to_a_host_path_never_leads_out_of_the_root(four: Node, where: Path) -> None:
    """tests/unit/engine/start/test_appprofile.py's, through the hook: ``/etc/nvidia``
    links to a host folder, which means that path in the root: refused while the
    root lacks it, written there (never on the host) once it has it."""
    escape = where / "escape"
    escape.mkdir()
    bundle = _bare(where, four, GRAPHICS, "1")
    _link(bundle.rootfs, "/etc/nvidia", str(escape))
    result = run_hook(bundle, *_spec_command(four, GRAPHICS))
    assert result.run.returncode == 1
    assert result.run.stderr == (
        f"nri-gpu hook: container {WHO}: application profile: /etc/nvidia: a symlink to nowhere in the container"
        " is in the way\n"
    )
    assert list(escape.iterdir()) == []
    (bundle.rootfs / str(escape).lstrip("/")).mkdir(parents=True)  # now it leads somewhere in the root
    run_hook(bundle, *_spec_command(four, GRAPHICS)).ok()
    assert list(escape.iterdir()) == []
    inside = bundle.rootfs / str(escape).lstrip("/") / "nvidia-application-profiles-rc.d/10-container.conf"
    assert inside.read_text() == _profile(four, 1)


# --------------------------------------------------------------------------- the NRI worker's hostile roots, continued
#
# docs/security.md: the hook refuses the hostile roots of tests/integration/test_start.py
# the same way. Those not ported above, each after its test there.


def test_stale_links_and_files_are_replaced_a_directory_is_not(four: Node, where: Path) -> None:
    bundle = _bare(where, four, DEFAULT_CAPABILITIES, "1")
    lib = bundle.rootfs / LIB.lstrip("/")
    lib.mkdir(parents=True)
    (lib / "libcuda.so.1").symlink_to("libcuda.so.470.0")  # an older driver's link
    (lib / "libnvidia-ml.so.1").write_bytes(b"a stub the image shipped")
    (lib / "libcuda.so").mkdir()
    result = run_hook(bundle, *_spec_command(four))
    assert result.run.returncode == 1
    assert result.run.stderr == (
        f"nri-gpu hook: container {WHO}: symlinks: {LIB}/libcuda.so: a directory is in the way of the link to"
        " libcuda.so.1\n"
    )
    (lib / "libcuda.so").rmdir()
    links = [f"{LIB}/libcuda.so.1", f"{LIB}/libnvidia-ml.so.1", f"{LIB}/libcuda.so"]
    found = run_hook(bundle, *_spec_command(four), links=links, folders=[LIB]).ok()
    assert found["links"] == {
        f"{LIB}/libcuda.so.1": "libcuda.so.550.163.01",
        f"{LIB}/libnvidia-ml.so.1": "libnvidia-ml.so.550.163.01",
        f"{LIB}/libcuda.so": "libcuda.so.1",
    }
    assert not [name for name in found["folders"][LIB] if "nri-gpu-tmp" in name]


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("size", f"{(8 << 20) + 1} bytes, over the limit of {8 << 20} bytes for an image's ld.so.cache"),
        ("entries", f"new-format ld.so.cache nlibs={(1 << 16) + 1} (offset 20): over the limit of 65536 entries"),
    ],
    ids=["size", "entries"],
)
def test_an_image_cache_over_a_limit_fails_the_start(four: Node, where: Path, what: str, message: str) -> None:
    """The merge reads the image's cache: one over a limit fails the start, saying
    which, before any of it is unpacked (its cost: hack/bench's limits part)."""
    bundle = _bare(where, four, DEFAULT_CAPABILITIES, "1")
    (bundle.rootfs / "etc").mkdir()
    _big_cache(bundle.rootfs, what)
    result = run_hook(bundle, *_spec_command(four))
    assert result.run.returncode == 1
    assert result.run.stderr.startswith(f"nri-gpu hook: container {WHO}: ld.so.cache: "), result.run.stderr
    assert message in result.run.stderr, result.run.stderr


def test_ldconfig_opens_no_device_an_image_conf_file_is(four: Node, where: Path, lower: Path) -> None:
    """``rebuild``: the image's own conf files are read by ldconfig, in its view of
    the container: ``nodev`` too."""
    node = four.replace(ld_cache=LdCache.REBUILD, ldconfig="/sbin/ldconfig")
    spec = node.spec()
    bundle = Bundle(where / "bundle", devices=spec.devices("1"), mounts=spec.mounts)
    conf = "etc/ld.so.conf.d/zz-device.conf"

    def prepare(rootfs: Path) -> None:
        (rootfs / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
        _plant("device", rootfs / conf)

    hookrun.image_root(bundle, lower, prepare)
    with OpenWatch(bundle.rootfs / conf) as watch:
        result = run_hook(bundle, spec.hook["args"], spec.hook["env"])
        assert watch.opens() == 0, "ldconfig opened the device node"
    assert ("libcuda.so.1", f"{LIB}/libcuda.so.1") in _cache(result.ok())


def test_ldconfig_plants_no_link_and_no_aux_cache_in_a_volume(
    four: Node,
    where: Path,
    lower: Path,
    gcc: str,  # noqa: F811
) -> None:
    """``rebuild``: glibc's ldconfig takes a SONAME with "/" as it is: run as root
    without -X it would make /opt/evil/../../data/planted, in the volume; and it
    saves its aux cache under /var/cache/ldconfig whatever -C says."""
    node = four.replace(ld_cache=LdCache.REBUILD, ldconfig="/sbin/ldconfig")
    spec = node.spec()
    lib = _shared_library(gcc, where, "../../data/planted", "libevil.so.1.0")
    volume = where / "volume"
    volume.mkdir(mode=0o755)
    (volume / "data.txt").write_text("the volume's own\n")

    def prepare(rootfs: Path) -> None:
        (rootfs / "opt/evil").mkdir(parents=True)
        shutil.copy(lib, rootfs / "opt/evil/libevil.so.1.0")
        (rootfs / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
        (rootfs / "etc/ld.so.conf.d/zz-evil.conf").write_text("/opt/evil\n")
        _link(rootfs, "/var/cache/ldconfig", "/data")  # the image's own folder, a link now

    bundle = Bundle(where / "bundle", devices=spec.devices("1"), mounts=spec.mounts)
    hookrun.image_root(bundle, lower, prepare)
    before = _snapshot(volume)
    found = run_hook(bundle, spec.hook["args"], spec.hook["env"], volumes=[(str(volume), "/data")]).ok()
    assert _snapshot(volume) == before
    assert not (bundle.rootfs / "opt/evil/planted").is_symlink()
    entries = dict(_cache(found))
    assert entries["libcuda.so.1"] == f"{LIB}/libcuda.so.1"
    assert entries["../../data/planted"] == "/opt/evil/../../data/planted"  # listed, as glibc would; not made


def test_the_images_own_ldconfig_never_runs(four: Node, where: Path, lower: Path) -> None:
    """``rebuild`` runs the host's trusted ldconfig, never the image's ``/sbin/ldconfig``."""
    node = four.replace(ld_cache=LdCache.REBUILD, ldconfig="/sbin/ldconfig")
    spec = node.spec()
    bundle = Bundle(where / "bundle", devices=spec.devices("1"), mounts=spec.mounts)

    def prepare(rootfs: Path) -> None:
        image_cache(rootfs)
        for name in ("sbin/ldconfig", "usr/sbin/ldconfig"):
            (rootfs / name).unlink(missing_ok=True)
            (rootfs / name).write_text("#!/bin/sh\necho image-ldconfig >> /tmp/mark\n")
            (rootfs / name).chmod(0o755)

    hookrun.image_root(bundle, lower, prepare)
    found = run_hook(bundle, spec.hook["args"], spec.hook["env"]).ok()
    assert not (bundle.rootfs / "tmp/mark").exists() and not Path("/tmp/mark").exists()
    assert ("libcuda.so.1", f"{LIB}/libcuda.so.1") in _cache(found)
