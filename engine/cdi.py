"""A CDI spec of the node, for runtimes that never reach NRI (nerdctl, podman).  (pure)

CDI (the Container Device Interface) names devices ``vendor/class=name``; the
runtime reads a spec file and applies the named devices' edits to the OCI spec.
Ours is kind ``nvidia.com/gpu`` with one device per GPU under two names, its
index (``nvidia.com/gpu=0``) and its UUID (``nvidia.com/gpu=GPU-...``), and
``all``. A device's own edits are its ``/dev/nvidiaN`` node. The spec-wide
edits, applied once whenever any of its devices is, are the rest of the
engine's plan for the same capabilities: the control nodes, the driver's files
as read-only binds, the env, and a ``createContainer`` hook that does the start
work the NRI path does at StartContainer (the procfs view, the library links,
the ld.so cache). So ``nvidia.com/gpu=0`` gives what the annotation
``nvidia.com/gpus: 0`` gives through NRI.

Two deliberate differences from the plan:

* ``NVIDIA_VISIBLE_DEVICES=void``: the GPUs are chosen by the CDI device names,
  and ``void`` keeps nri-gpu (or the NVIDIA runtime) on the same node from
  acting on the container a second time.
* The hook finds which GPUs it serves in the bundle's device list (a CDI hook
  cannot be per device: two devices would run it twice with different views).

The hook runs as root at every start of a GPU container, with runc's working
directory in the container's bundle. Its environment makes Python import
nothing from there (``PYTHONSAFEPATH``: no script or working directory on
``sys.path``; ``PYTHONNOUSERSITE``: no ``~/.local``), and its ``timeout`` lets
the runtime kill a hook that hangs, after the hook's own limit
(``engine.hook``) has had its chance to fail it with a message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.errors import DiscoveryError
from engine.model import Capability, DeviceKind, DeviceNode, Inventory, Plan
from engine.plan import plan as make_plan
from engine.request import GpuRequest, Selection

__all__ = [
    "CDI_VERSION",
    "HOOK_ENV",
    "HOOK_TIMEOUT",
    "HOOK_TIME_LIMIT",
    "KIND",
    "HookCommand",
    "cdi_spec",
    "hook_command",
]

# 0.5.0 has every field used here and is read by the CDI library of containerd
# 1.7 and 2.x, podman and nerdctl alike.
CDI_VERSION = "0.5.0"
KIND = "nvidia.com/gpu"
HOOK_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    # What ``python -I`` does, for a console script whose ``#!`` line we do not
    # write: without it a ``python -m`` wrapper would import from the working
    # directory, which runc sets to the container's bundle.
    "PYTHONSAFEPATH=1",
    "PYTHONNOUSERSITE=1",
)
# Seconds the hook gives its own whole run (``engine.hook.time_limit``): far
# above a normal run (well under a second), low enough that a stuck hook does not
# hold a container's start for long.
HOOK_TIME_LIMIT = 10.0
# Seconds the runtime gives the hook before killing it (whole seconds: the OCI
# field is an integer). Above the hook's own limit, with room for Python's start,
# so that a slow hook ends with its own message rather than runc's "timed out".
HOOK_TIMEOUT = 15


@dataclass(frozen=True)
class HookCommand:
    """The ``createContainer`` hook: an absolute executable, its argv (argv[0]
    included), the whole of its environment (a hook gets nothing else) and the
    seconds the runtime waits for it."""

    path: str
    args: tuple[str, ...]
    env: tuple[str, ...] = HOOK_ENV
    timeout: int = HOOK_TIMEOUT


def hook_command(executable: str, config: EngineConfig, capabilities: frozenset[Capability]) -> HookCommand:
    """``nri-gpu hook start-container`` with the roots and capabilities the spec was made for.

    The hook runs on the host (before ``pivot_root``), so every root is given as
    the host sees it.

    >>> from engine.model import Capability
    >>> hook_command("/usr/bin/nri-gpu", EngineConfig(), frozenset({Capability.COMPUTE})).args[1:4]
    ('hook', 'start-container', '--driver-root')
    """
    if not executable.startswith("/"):
        raise ValueError(f"the hook's executable must be an absolute path, not {executable!r}")
    args = [executable, "hook", "start-container"]
    for flag, value in (
        ("--driver-root", config.driver_root),
        ("--dev-root", config.dev_root),
        ("--proc-root", config.proc_root),
    ):
        args += [flag, config.to_host_path(value)]
    # Not translated: the ldconfig setting names the binary that runs ours, which
    # is the host's only when we run on the host (``cdi generate --ldconfig``).
    args += ["--ld-cache", config.ld_cache, "--ldconfig", config.ldconfig]
    args += ["--capabilities", ",".join(sorted(c.value for c in capabilities))]
    return HookCommand(executable, tuple(args))


def cdi_spec(
    inventory: Inventory, config: EngineConfig, capabilities: frozenset[Capability], hook: HookCommand
) -> dict[str, Any]:
    """The spec as plain data (the JSON a CDI spec file holds).

    Raises DiscoveryError on a node without GPUs: a CDI spec must name a device.
    """
    if not inventory.gpus:
        raise DiscoveryError("no GPU found on this node (see `nri-gpu info`): a CDI spec needs at least one device")
    every = make_plan(GpuRequest(Selection.ALL, (), capabilities, (), "CDI spec"), inventory, config)
    per_gpu = {node.minor: node for node in every.devices if node.kind is DeviceKind.GPU}
    devices: list[dict[str, Any]] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        edits = {"deviceNodes": [_device(per_gpu[gpu.minor])]} if gpu.minor in per_gpu else {}
        devices.append({"name": str(gpu.index), "containerEdits": edits})
        devices.append({"name": gpu.uuid, "containerEdits": edits})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [_device(per_gpu[m]) for m in sorted(per_gpu)]}})
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices, "containerEdits": _common(every, hook)}


def _common(every: Plan, hook: HookCommand) -> dict[str, Any]:
    env = dict(every.env)
    env["NVIDIA_VISIBLE_DEVICES"] = "void"
    return {
        "env": [f"{key}={value}" for key, value in env.items()],
        "deviceNodes": [_device(node) for node in every.devices if node.kind is not DeviceKind.GPU],
        "mounts": [
            {"hostPath": m.source, "containerPath": m.destination, "type": "bind", "options": list(m.options)}
            for m in every.mounts
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": hook.path,
                "args": list(hook.args),
                "env": list(hook.env),
                "timeout": hook.timeout,
            }
        ],
    }


def _device(node: DeviceNode) -> dict[str, Any]:
    # Type and numbers given: the runtime creates the node without looking for one on the host.
    return {"path": node.path, "type": node.type, "major": node.major, "minor": node.minor, "fileMode": node.mode}
