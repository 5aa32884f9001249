"""Graphics and display on simulated nodes (``engine.graphics``, the catalogue's graphics
files, DRM discovery); golden plans in tests/golden/plan-graphics.json
(``NRI_GPU_UPDATE_GOLDEN=1`` rewrites it). Integration, not unit: they need NVIDIA's
own graphics files (Vulkan, EGL and X.Org's), from the simulated node's real tree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine import catalogue
from nri_gpu.engine.discover import discover
from nri_gpu.engine.errors import EngineError
from nri_gpu.engine.graphics import APP_PROFILE_PATH, app_profile_text
from nri_gpu.engine.model import Capability as C
from nri_gpu.engine.model import DeviceKind, FileKind
from nri_gpu.engine.report import plan_text, plan_to_dict
from testbed.gpunode import DRM_MAJOR, SimNode
from tests.unit.engine import golden
from tests.unit.engine.test_plan import GOLDEN, Node, _normalize, cuda_12_4

LIB = "/usr/lib/x86_64-linux-gnu"
VULKAN_ICD = "/etc/vulkan/icd.d/nvidia_icd.json"
GRAPHICS_FILES = {
    VULKAN_ICD,
    "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
    "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    "/usr/share/nvidia/nvoptix.bin",
}
XORG_FILES = {
    "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
    "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.550.163.01",
    "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
}
OPENCL_ICD = "/etc/OpenCL/vendors/nvidia.icd"


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(tmp_path_factory.mktemp("gfx"), gpus=4, real=True)


def env(devices: str, caps: str) -> dict[str, Any]:
    return {"env": {"NVIDIA_VISIBLE_DEVICES": devices, "NVIDIA_DRIVER_CAPABILITIES": caps}}


def destinations(plan: Any) -> set[str]:
    return {m.destination for m in plan.mounts}


def drm(plan: Any) -> list[tuple[str, int, int]]:
    return [(d.path, d.major, d.minor) for d in plan.devices if d.kind is DeviceKind.DRM]


def sim_drm(sim: SimNode, index: int) -> list[tuple[str, int, int]]:
    return [(f"/dev/{rel}", major, minor) for rel, major, minor, _ in sim.drm_nodes(sim.gpus[index])]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("libnvidia-egl-gbm.so.1.1.2", {C.GRAPHICS, C.DISPLAY}),
        ("libnvidia-egl-wayland.so.1.1.18", {C.GRAPHICS, C.DISPLAY}),
        ("libnvidia-egl-xlib.so.1.0.0", {C.GRAPHICS, C.DISPLAY}),
        ("libnvidia-egl-gbm.so.1", None),  # the SONAME link, not the file
        ("libnvidia-egl-gbm.so", None),
        ("libnvidia-egl-gbm.so.1.x", None),
        ("libnvidia-egl-gbmx.so.1.1.2", None),
        ("libcuda.so.550.163.01", None),  # the driver's own: library_capabilities
    ],
)
def test_libraries_with_their_own_version(name: str, expected: set[C] | None) -> None:
    caps = catalogue.own_version_library_capabilities(name)
    assert caps == (frozenset(expected) if expected is not None else None)


def test_graphics_files_are_found_and_vulkan_goes_under_etc(four: Node) -> None:
    files = {f.path: f for f in four.inventory.files}
    icd = files[VULKAN_ICD]
    assert icd.source == "/usr/share/vulkan/icd.d/nvidia_icd.json" and icd.kind is FileKind.CONFIG
    assert files["/usr/share/glvnd/egl_vendor.d/10_nvidia.json"].capabilities == {C.GRAPHICS, C.DISPLAY}
    assert files[OPENCL_ICD].capabilities == {C.COMPUTE}
    assert files["/usr/lib/xorg/modules/drivers/nvidia_drv.so"].kind is FileKind.XORG
    libs = {lib.soname: lib for lib in four.inventory.libraries if lib.is_64bit}
    assert libs["libnvidia-egl-gbm.so.1"].path == f"{LIB}/libnvidia-egl-gbm.so.1.1.2"
    assert libs["libnvidia-egl-wayland.so.1"].capabilities == {C.GRAPHICS, C.DISPLAY}
    # The GL cores need gpucomp: a graphics-only container must get it.
    assert C.GRAPHICS in libs["libnvidia-gpucomp.so.550.163.01"].capabilities


def test_compute_gets_the_opencl_icd_and_no_graphics(four: Node) -> None:
    p = four.plan(**env("0", "compute,utility"))
    got = destinations(p)
    assert OPENCL_ICD in got
    assert not (GRAPHICS_FILES | XORG_FILES) & got
    assert not any("egl" in d.lower() or "GLX" in d for d in got)
    assert drm(p) == [] and p.app_profile == ""


def test_graphics_gets_icds_libraries_drm_nodes_of_its_gpu_and_the_profile(four: Node) -> None:
    gpu = four.inventory.gpus[2]
    p = four.plan(**env("2", "graphics"))
    got = destinations(p)
    assert GRAPHICS_FILES <= got
    assert not XORG_FILES & got and OPENCL_ICD not in got
    assert {
        f"{LIB}/libGLX_nvidia.so.550.163.01",
        f"{LIB}/libnvidia-egl-gbm.so.1.1.2",
        f"{LIB}/libnvidia-gpucomp.so.550.163.01",
    } <= got
    links = {s.path: s.target for s in p.symlinks}
    assert links[f"{LIB}/libGLX_nvidia.so.0"] == "libGLX_nvidia.so.550.163.01"  # the ICD JSON's library_path
    assert links[f"{LIB}/libnvidia-egl-gbm.so.1"] == "libnvidia-egl-gbm.so.1.1.2"
    assert links[f"{LIB}/gbm/nvidia-drm_gbm.so"] == "../libnvidia-allocator.so.1"
    assert any(e.name == "libnvidia-egl-wayland.so.1" for e in p.ld_cache_entries)
    # GPU index 2: card3 and renderD130 on the simulated node; its minor is 0.
    assert drm(p) == sim_drm(four.sim, 2) == [("/dev/dri/card3", DRM_MAJOR, 3), ("/dev/dri/renderD130", DRM_MAJOR, 130)]
    assert gpu.minor != 2
    assert p.app_profile == app_profile_text((gpu.minor,))
    assert f'"EGLVisibleDGPUDevices", {1 << gpu.minor:#x}]' in p.app_profile
    assert "/dev/nvidia-modeset" not in [d.path for d in p.devices]


def test_the_profile_has_a_bit_per_device_minor_and_is_left_out_with_every_gpu(four: Node) -> None:
    two = four.plan(**env("0,3", "graphics"))
    minors = sorted(four.inventory.gpus[i].minor for i in (0, 3))
    assert json.loads(two.app_profile.replace(f"{sum(1 << m for m in minors):#x}", "0"))["rules"][0]["pattern"] == []
    assert f"{sum(1 << m for m in minors):#x}]" in two.app_profile
    assert drm(two) == sim_drm(four.sim, 0) + sim_drm(four.sim, 3)
    every = four.plan(**env("all", "graphics"))
    assert every.app_profile == ""
    assert len(drm(every)) == 8
    assert f"write {APP_PROFILE_PATH}" in plan_text(two) and APP_PROFILE_PATH not in plan_text(every)


def test_display_adds_xorg_modules_modeset_and_the_glx_link(four: Node) -> None:
    p = four.plan(**env("1", "display"))
    got = destinations(p)
    assert XORG_FILES | GRAPHICS_FILES <= got
    assert "/dev/nvidia-modeset" in [d.path for d in p.devices]
    links = {s.path: s.target for s in p.symlinks}
    assert links["/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so"] == "libglxserver_nvidia.so.550.163.01"
    assert drm(p) == sim_drm(four.sim, 1)


def test_none_with_graphics_gets_files_but_no_drm_node_or_profile(four: Node) -> None:
    p = four.plan(**env("none", "graphics"))
    assert GRAPHICS_FILES <= destinations(p)
    assert drm(p) == [] and p.app_profile == ""


def test_a_gpu_without_drm_nodes_is_a_note_not_a_refusal(tmp_path: Path) -> None:
    node = Node(tmp_path / "n", gpus=2, drm=False, real=True)
    assert node.inventory.drm == ()
    p = node.plan(**env("0", "graphics"))
    assert drm(p) == [] and GRAPHICS_FILES <= destinations(p)
    assert any("no DRM nodes" in n and node.inventory.gpus[0].bus_id in n for n in p.notes)
    assert node.plan(**env("0", "compute")).notes == ()


def test_drm_links_are_read_inside_the_dev_root_and_must_lead_to_dri_nodes(tmp_path: Path) -> None:
    node = Node(tmp_path / "n", gpus=3, in_bus_order=True, real=True)
    sim = node.sim
    if not sim.real_device_nodes:
        pytest.skip("needs real character devices (root)")
    by_path = sim.dev_root / "dev/dri/by-path"
    buses = [g.bus_id for g in sim.gpus]
    # GPU 1's render link climbs with .. (resolved in the dev root, as in a chroot) to a
    # regular file; GPU 2's card link leads to /dev/null: neither is taken.
    (by_path / f"pci-{buses[1]}-render").unlink()
    os.symlink("../../../../../../dev/dri/renderD999", by_path / f"pci-{buses[1]}-render")
    (sim.dev_root / "dev/dri/renderD999").write_text("")
    (by_path / f"pci-{buses[2]}-card").unlink()
    os.symlink("/dev/null", by_path / f"pci-{buses[2]}-card")
    inv = discover(node.config, cuda_version=cuda_12_4)
    nodes = {d.bus_id: [(n.path, n.minor) for n in d.nodes] for d in inv.drm}
    assert nodes[buses[1]] == [("/dev/dri/card2", 2)]
    assert nodes[buses[2]] == [("/dev/dri/renderD130", 130)]
    assert f"{sim.dev_root}/dev/dri/renderD999: not a character device; skipped" in inv.warnings
    assert any("leads to /dev/null, not /dev/dri/card<n>" in w for w in inv.warnings)


# -- golden ---------------------------------------------------------------------

REQUESTS: dict[str, dict[str, Any]] = {
    "graphics-gpu-1": env("1", "graphics"),
    "display-gpus-0,2": env("0,2", "display"),
    "graphics-all": env("all", "graphics,compute,utility"),
    "compute-gpu-0": env("0", "compute"),
}


@pytest.mark.parametrize("scenario", ["graphics", "graphics-no-drm"])
def test_golden(scenario: str, tmp_path: Path) -> None:
    node = Node(tmp_path / "node", gpus=4, drm=scenario == "graphics", real=True)
    plans: dict[str, Any] = {}
    for name, request in REQUESTS.items():
        try:
            plans[name] = plan_to_dict(node.plan(**request))
        except EngineError as exc:
            plans[name] = {"error": f"{type(exc).__name__}: {exc}"}
    drm_nodes = {d.bus_id: [n.path for n in d.nodes] for d in node.inventory.drm}
    result = _normalize({"drm": drm_nodes, "plans": plans}, node.sim)
    golden.check(GOLDEN / f"plan-{scenario}.json", result)


def test_a_cdi_spec_with_graphics_gives_each_gpu_its_drm_nodes(four: Node) -> None:
    from nri_gpu.engine.cdi import cdi_spec, hook_command
    from nri_gpu.engine.model import DEFAULT_CAPABILITIES

    hook = hook_command("/usr/bin/nri-gpu-hook")
    works: list[dict[str, Any]] = []

    def nodes(caps: frozenset[C]) -> dict[str, list[str]]:
        spec = cdi_spec(four.inventory, four.config, caps, hook)
        works.append(json.loads(spec["containerEdits"]["hooks"][0]["args"][-1]))
        return {d["name"]: [n["path"] for n in d["containerEdits"].get("deviceNodes", [])] for d in spec["devices"]}

    graphics = nodes(frozenset({C.GRAPHICS, C.COMPUTE}))
    gpu = four.inventory.gpus[1]
    assert graphics["1"] == graphics[gpu.uuid] == [f"/dev/nvidia{gpu.minor}", "/dev/dri/card2", "/dev/dri/renderD129"]
    assert [p for p in graphics["all"] if p.startswith("/dev/dri/")] == [
        p for i in range(4) for p, _, _ in sim_drm(four.sim, i)
    ]
    assert not any(p.startswith("/dev/dri/") for paths in nodes(DEFAULT_CAPABILITIES).values() for p in paths)
    # The hook writes the application profile of a container's GPUs with graphics only;
    # it tells a GPU by the minor its device carries, as the spec names it.
    assert [w["graphics"] for w in works] == [True, False]
    assert works[0]["gpus"] == [[g.minor, g.bus_id] for g in sorted(four.inventory.gpus, key=lambda g: g.index)]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown of the simulated node needs root")
def test_drm_nodes_keep_the_host_nodes_group_in_the_container_and_the_cdi_spec(tmp_path: Path) -> None:
    """Host render nodes are often root:render 0660: a container's non-root user in
    that group can open them only if the container's node has the same group, as a
    runtime copying the host's node (the toolkit's CDI) gives it."""
    from nri_gpu.engine.cdi import cdi_spec, hook_command
    from nri_gpu.plugin._proto import nri_pb2 as api
    from nri_gpu.plugin.adjustment import to_adjustment

    node = Node(tmp_path / "node", gpus=1, real=True)
    card, render = (node.sim.dev_root / "dev" / rel for rel, *_ in node.sim.drm_nodes(node.sim.gpus[0]))
    os.chown(render, 0, 109)
    os.chown(card, 0, 44)
    node.inventory = discover(node.config, cuda_version=cuda_12_4)
    plan = node.plan(**env("0", "graphics"))
    owners = {d.path: (d.uid, d.gid) for d in plan.devices if d.kind is DeviceKind.DRM}
    assert sorted(owners.values()) == [(0, 44), (0, 109)]
    adjusted = {d.path: d.gid.value for d in to_adjustment(plan, api.Container()).linux.devices}
    assert {path: adjusted[path] for path in owners} == {path: gid for path, (_, gid) in owners.items()}
    hook = hook_command("/usr/bin/nri-gpu-hook")
    spec = cdi_spec(node.inventory, node.config, frozenset({C.GRAPHICS}), hook)
    gids = {d["path"]: d.get("gid") for dev in spec["devices"] for d in dev["containerEdits"].get("deviceNodes", [])}
    assert {path: gids[path] for path in owners} == {path: gid for path, (_, gid) in owners.items()}
