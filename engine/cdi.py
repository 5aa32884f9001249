"""A CDI spec of the node, for runtimes that never reach NRI (nerdctl, podman).  (pure)

CDI (the Container Device Interface) names devices ``vendor/class=name``; the
runtime reads a spec file and applies the named devices' edits to the OCI spec.
Ours is kind ``nvidia.com/gpu`` with one device per GPU under two names, its
index (``nvidia.com/gpu=0``) and its UUID (``nvidia.com/gpu=GPU-...``); one
per MIG device under the toolkit's two names, ``<i>:<j>`` and ``MIG-<uuid>``;
and ``all``. A device's own edits are its nodes: a GPU's ``/dev/nvidiaN`` (and,
with ``graphics`` or ``display``, its ``/dev/dri`` card and render nodes), a
MIG device's parent ``/dev/nvidiaN`` and its GPU and compute instances'
``/dev/nvidia-caps/nvidia-cap<minor>``. The spec-wide edits, applied once
whenever any of its devices is, are the rest of the engine's plan for the same
capabilities: the control nodes, the driver's files as read-only binds, the
env, and a ``createContainer`` hook that does the start work the NRI path does
at StartContainer (the procfs view, the library links, the ld.so cache). So
``nvidia.com/gpu=0`` gives what the annotation ``nvidia.com/gpus: 0`` gives
through NRI.

MIG, as the toolkit's jit-cdi mode does it: ``all`` is every whole GPU not in
MIG mode plus every MIG device (a GPU with instances is in MIG mode, whatever
NVML says). MIG devices are named only as NVML names them (``i:j`` and their
UUID cannot be had from procfs): on a node with instances whose NVML could not
be asked the spec has none, and ``spec_warnings`` says so. The spec is written
once: instances made or destroyed later need it generated again.

Two deliberate differences from the plan:

* ``NVIDIA_VISIBLE_DEVICES=void``: the GPUs are chosen by the CDI device names,
  and ``void`` keeps nri-gpu (or the NVIDIA runtime) on the same node from
  acting on the container a second time.
* The hook finds which GPUs and MIG devices it serves in the bundle's device
  list (a CDI hook cannot be per device: two devices would run it twice with
  different views).

The hook is ``nri-gpu-hook`` (the ``hook/`` crate), compiled: the runtime runs
it as root at every start of a GPU container and waits for it, and a Python
interpreter's start alone would cost more than the whole start work. It plans
nothing: ``hook_work`` writes into its one ``--work`` argument everything the
plan decides that the start work needs (links, ld.so.conf folders, ld.so.cache
entries, the procfs source, the IPC endpoints a mount may bind) and the node's
devices as the spec names them (minors, bus ids, MIG instances), and the hook
picks from it what the container's ``linux.devices`` select. The spec and its
hook thus come from one plan at one time; a driver change needs a new spec
either way (its mounts name the driver's files). The hook's ``timeout`` lets the
runtime kill a hook that hangs, after the hook's own limit has had its chance
to fail it with a message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from nri_gpu.engine.catalogue import IPC_TYPES
from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.model import Capability, DeviceKind, DeviceNode, Gpu, Inventory, MigCap, MigDevice, Plan
from nri_gpu.engine.plan import host_source
from nri_gpu.engine.plan import plan as make_plan
from nri_gpu.engine.request import GpuRequest, Selection
from nri_gpu.engine.start.work import start_work

__all__ = [
    "CDI_VERSION",
    "HOOK_ENV",
    "HOOK_TIMEOUT",
    "HOOK_TIME_LIMIT",
    "HOOK_WORK_VERSION",
    "KIND",
    "HookCommand",
    "cdi_spec",
    "hook_command",
    "hook_work",
    "named_mig_devices",
    "spec_warnings",
]

# 0.5.0 has every field used here and is read by the CDI library of containerd
# 1.7 and 2.x, podman and nerdctl alike.
CDI_VERSION = "0.5.0"
KIND = "nvidia.com/gpu"
# The hook reads nothing of its environment; a PATH is all any hook is given.
HOOK_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
# The format of ``hook_work``'s description; the hook refuses another by name.
HOOK_WORK_VERSION = 1
# Seconds the hook gives its own whole run (its ``--time-limit``): far
# above a normal run (well under a second), low enough that a stuck hook does not
# hold a container's start for long.
HOOK_TIME_LIMIT = 10.0
# Seconds the runtime gives the hook before killing it (whole seconds: the OCI
# field is an integer). Above the hook's own limit, so that a slow hook ends
# with its own message rather than runc's "timed out".
HOOK_TIMEOUT = 15
CAPS_DIR = "/dev/nvidia-caps"
# CDI's rule for a device name (the "name" part of vendor/class=name).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*", re.ASCII)
_NAMES_SHOWN = 8


@dataclass(frozen=True)
class HookCommand:
    """The ``createContainer`` hook: an absolute executable, its argv (argv[0]
    included) before the work description (``cdi_spec`` appends ``--work``), the
    whole of its environment (a hook gets nothing else) and the seconds the
    runtime waits for it."""

    path: str
    args: tuple[str, ...]
    env: tuple[str, ...] = HOOK_ENV
    timeout: int = HOOK_TIMEOUT


def hook_command(executable: str) -> HookCommand:
    """``nri-gpu-hook start-container`` at ``executable`` (an absolute path).

    >>> hook_command("/usr/bin/nri-gpu-hook").args
    ('/usr/bin/nri-gpu-hook', 'start-container', '--time-limit', '10')
    """
    if not executable.startswith("/"):
        raise ValueError(f"the hook's executable must be an absolute path, not {executable!r}")
    return HookCommand(executable, (executable, "start-container", "--time-limit", f"{HOOK_TIME_LIMIT:g}"))


def hook_work(inventory: Inventory, config: EngineConfig, capabilities: frozenset[Capability]) -> dict[str, Any]:
    """What the hook needs of the plan and the node, as the JSON of its ``--work``
    argument (read by the hook's ``work`` module; ``HOOK_WORK_VERSION``).

    The spec-wide start work is the plan's for ``capabilities`` (the same for any
    GPUs); the devices are every GPU's minor and bus id, by index, and the MIG
    instances' capability minors, from which the hook tells what a container's
    ``linux.devices`` hold. Every root is given as the host sees it: the hook runs
    on the host, before ``pivot_root``.
    """
    return _hook_work(_plan_for_every_container(inventory, config, capabilities), inventory, config, capabilities)


def _plan_for_every_container(inventory: Inventory, config: EngineConfig, capabilities: frozenset[Capability]) -> Plan:
    """What every container of the spec gets besides its devices: the plan for none."""
    return make_plan(GpuRequest(Selection.NONE, (), capabilities, (), "CDI spec"), inventory, config)


def _hook_work(
    common: Plan, inventory: Inventory, config: EngineConfig, capabilities: frozenset[Capability]
) -> dict[str, Any]:
    # The NRI path's own projection of a plan onto the start work, with the roots
    # as the host sees them: one derivation of the procfs source and the IPC root.
    work = start_work(
        common,
        "CDI spec",
        config.to_host_path(config.proc_root),
        config.ld_cache,
        driver_root=config.to_host_path(config.driver_root),
        cuda_compat=config.policy.cuda_compat,
        driver_version=inventory.driver_version or "",
    )
    layout = inventory.mig
    return {
        "version": HOOK_WORK_VERSION,
        "symlinks": [[link.path, link.target] for link in work.symlinks],
        "ldconfig_folders": list(work.ldconfig_folders),
        "ld_cache_entries": [
            [e.name, e.path, e.flags, e.is_64bit, e.hwcap, e.osversion] for e in work.ld_cache_entries
        ],
        "ld_cache": work.ld_cache.value,
        "ldconfig": config.ldconfig,
        "proc_source": work.proc_source,
        "ipc_root": work.ipc_root,
        "ipc": [[path, kind.value, host_source(path, config)] for path, kind in sorted(IPC_TYPES.items())],
        "cuda_compat": work.cuda_compat,
        "driver_version": work.driver_version,
        "graphics": bool(capabilities & {Capability.GRAPHICS, Capability.DISPLAY}),
        "nvidia_major": inventory.nvidia_major,
        "caps_major": layout.caps_major,
        "gpus": [[gpu.minor, gpu.bus_id] for gpu in sorted(inventory.gpus, key=lambda g: g.index)],
        "gpu_instances": [
            [gi.gpu_minor, gi.gi, gi.access.minor, [[ci.ci, ci.access.minor] for ci in gi.compute_instances]]
            for gi in layout.gpu_instances
        ],
        "monitor_minor": layout.monitor.minor if layout.monitor is not None else None,
        "config_minor": layout.config.minor if layout.config is not None else None,
    }


def cdi_spec(
    inventory: Inventory, config: EngineConfig, capabilities: frozenset[Capability], hook: HookCommand
) -> dict[str, Any]:
    """The spec as plain data (the JSON a CDI spec file holds).

    Raises DiscoveryError on a node without GPUs: a CDI spec must name a device.
    What it leaves out is in ``spec_warnings(inventory)``.
    """
    if not inventory.gpus:
        raise DiscoveryError("no GPU found on this node (see `nri-gpu info`): a CDI spec needs at least one device")
    common = _plan_for_every_container(inventory, config, capabilities)
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    devices: list[dict[str, Any]] = []
    for gpu in gpus:
        node = _gpu_node(inventory, gpu)
        edits = {"deviceNodes": [_device(node)]} if node is not None else {}
        drm = _drm_nodes(inventory, gpu, capabilities)
        if drm:
            edits = {"deviceNodes": [*edits.get("deviceNodes", []), *(_device(n) for n in drm)]}
        devices.append({"name": str(gpu.index), "containerEdits": edits})
        devices.append({"name": gpu.uuid, "containerEdits": edits})
    migs, _ = _mig_devices(inventory)
    for mig in migs:
        edits = {"deviceNodes": [_device(node) for node in _mig_nodes(inventory, mig)]}
        devices.append({"name": mig.index, "containerEdits": edits})
        devices.append({"name": mig.uuid, "containerEdits": edits})
    whole = [gpu for gpu in gpus if not _in_mig_mode(inventory, gpu)]
    every = {n.minor: n for n in (_gpu_node(inventory, g) for g in (*whole, *(m.parent for m in migs))) if n}
    caps = {n.minor: n for mig in migs for n in _mig_nodes(inventory, mig) if n.kind is DeviceKind.MIG_CAP}
    nodes = [every[m] for m in sorted(every)] + [caps[m] for m in sorted(caps)]
    nodes += [n for g in whole for n in _drm_nodes(inventory, g, capabilities)]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [_device(n) for n in nodes]}})
    work = json.dumps(_hook_work(common, inventory, config, capabilities), separators=(",", ":"))
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": devices,
        "containerEdits": _common(common, hook, work),
    }


def spec_warnings(inventory: Inventory) -> tuple[str, ...]:
    """What ``cdi_spec`` leaves out of the node's MIG devices, and why (for the
    command that writes the spec to print); () when it leaves out nothing."""
    return _mig_devices(inventory)[1]


def named_mig_devices(inventory: Inventory) -> tuple[MigDevice, ...]:
    """Every MIG device NVML's snapshot names (``inventory.mig.nvml``) whose parent
    GPU (by UUID and minor) and GPU and compute instances procfs shows, with its
    UUID and ``i:j``; by NVML's GPU index, then MIG index. () without a snapshot."""
    layout = inventory.mig
    if layout.nvml is None:
        return ()
    found: list[tuple[tuple[int, int], MigDevice]] = []
    for seen in layout.nvml.gpus:
        parent = next((g for g in inventory.gpus if g.uuid.lower() == seen.uuid.lower()), None)
        if parent is None or parent.minor != seen.minor:
            continue
        for dev in seen.mig_devices:
            gi = layout.instance(parent.minor, dev.gi)
            ci = next((c for c in gi.compute_instances if c.ci == dev.ci), None) if gi is not None else None
            if gi is not None and ci is not None:
                found.append(
                    ((seen.index, dev.index), MigDevice(parent, gi, ci, dev.uuid, f"{seen.index}:{dev.index}"))
                )
    return tuple(mig for _, mig in sorted(found, key=lambda pair: pair[0]))


def _mig_devices(inventory: Inventory) -> tuple[tuple[MigDevice, ...], tuple[str, ...]]:
    """The MIG devices the spec names, and what it leaves out (in words)."""
    layout = inventory.mig
    placements = [
        f"gpu{gi.gpu_minor}/mig/gi{gi.gi}/ci{ci.ci}" for gi in layout.gpu_instances for ci in gi.compute_instances
    ]
    if not placements:
        return (), ()
    if layout.nvml is None:
        why = layout.nvml_error or "NVML was not asked"
        return (), (
            f"the spec has no MIG devices: NVML, which alone names them (MIG-<uuid>, i:j), did not answer ({why}); "
            f"this node has {_few(placements)}; `all` leaves out the GPUs in MIG mode",
        )
    if layout.caps_major is None:
        return (), ("the spec has no MIG devices: /proc/devices lists no nvidia-caps major for their nodes",)
    named = named_mig_devices(inventory)
    good = tuple(m for m in named if _NAME.fullmatch(m.uuid or "") and _NAME.fullmatch(m.index or ""))
    warnings = []
    bad = [f"{m.uuid!r} ({m.placement})" for m in named if m not in good]
    if bad:
        warnings.append(f"MIG devices left out, NVML's name is not a CDI device name: {_few(bad)}")
    unnamed = sorted(set(placements) - {m.placement for m in named})
    if unnamed:
        warnings.append(f"MIG devices left out, NVML did not name them (made since it was asked?): {_few(unnamed)}")
    return good, tuple(warnings)


def _few(names: list[str]) -> str:
    more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
    return ", ".join(names[:_NAMES_SHOWN]) + more


def _in_mig_mode(inventory: Inventory, gpu: Gpu) -> bool:
    """Procfs shows instances of ``gpu``, or NVML says its MIG mode is on."""
    if inventory.mig.instances_of(gpu.minor):
        return True
    seen = inventory.mig.nvml.gpu(gpu.uuid) if inventory.mig.nvml is not None else None
    return bool(seen is not None and seen.mig_current)


def _gpu_node(inventory: Inventory, gpu: Gpu) -> DeviceNode | None:
    """``/dev/nvidia<minor>``, as the plan gives it (None without an nvidia major)."""
    if inventory.nvidia_major is None:
        return None
    return DeviceNode(f"/dev/nvidia{gpu.minor}", inventory.nvidia_major, gpu.minor, kind=DeviceKind.GPU)


def _drm_nodes(inventory: Inventory, gpu: Gpu, capabilities: frozenset[Capability]) -> tuple[DeviceNode, ...]:
    """A whole GPU's DRM nodes when the spec's capabilities include graphics or display."""
    if not capabilities & {Capability.GRAPHICS, Capability.DISPLAY}:
        return ()
    return inventory.drm_nodes(gpu.bus_id) or ()


def _cap_node(major: int, cap: MigCap) -> DeviceNode:
    return DeviceNode(f"{CAPS_DIR}/nvidia-cap{cap.minor}", major, cap.minor, "c", cap.mode, DeviceKind.MIG_CAP)


def _mig_nodes(inventory: Inventory, mig: MigDevice) -> tuple[DeviceNode, ...]:
    """A MIG device's nodes: its parent's, its GPU instance's and compute instance's caps."""
    assert inventory.mig.caps_major is not None  # _mig_devices names none without it
    parent = _gpu_node(inventory, mig.parent)
    caps = (mig.gpu_instance.access, mig.compute_instance.access)
    return (*((parent,) if parent else ()), *(_cap_node(inventory.mig.caps_major, c) for c in caps))


def _common(every: Plan, hook: HookCommand, work: str) -> dict[str, Any]:
    env = dict(every.env)
    env["NVIDIA_VISIBLE_DEVICES"] = "void"
    return {
        "env": [f"{key}={value}" for key, value in env.items()],
        "deviceNodes": [
            _device(node) for node in every.devices if node.kind not in (DeviceKind.GPU, DeviceKind.MIG_CAP)
        ],
        "mounts": [
            {"hostPath": m.source, "containerPath": m.destination, "type": "bind", "options": list(m.options)}
            for m in every.mounts
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": hook.path,
                "args": [*hook.args, "--work", work],
                "env": list(hook.env),
                "timeout": hook.timeout,
            }
        ],
    }


def _device(node: DeviceNode) -> dict[str, Any]:
    # Type and numbers given: the runtime creates the node without looking for one on the host.
    device: dict[str, Any] = {
        "path": node.path,
        "type": node.type,
        "major": node.major,
        "minor": node.minor,
        "fileMode": node.mode,
    }
    if node.uid is not None:
        device["uid"] = node.uid
    if node.gid is not None:
        device["gid"] = node.gid
    return device
