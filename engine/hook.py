"""The CDI path's ``createContainer`` hook: the StartContainer work, run by the runtime.

runc runs a ``createContainer`` hook in the container's namespaces after the
spec's mounts are in place and before ``pivot_root``, with the OCI state on
stdin. The container's root is then the bundle's ``root.path`` directory, not
``/``; the host's files are still at their paths (the hook's own executable,
the trusted ldconfig, a simulated node's procfs). The GPUs are the ones the
CDI devices put into the bundle's ``config.json`` (``linux.devices``), found by
their numbers: whole GPUs by ``/dev/nvidia<M>``, MIG devices by their
``nvidia-caps`` nodes (``gpu_request``); the capabilities are those the spec
was generated for (the hook's arguments).

The parsing half is pure; ``run_hook`` does the I/O and the work
(``engine.start.actions.perform_in_bundle``).

Time: the runtime waits for a hook as long as the spec's ``timeout`` says
(``engine.cdi.HOOK_TIMEOUT``), and the container's start with it. The hook
bounds itself first: ``time_limit`` ends the process with a message once
its limit is over, whatever it is doing (reading a stdin that never closes,
discovery on a stuck file system), and the start work gets a deadline a little
before that, so that a slow ldconfig is killed and reported by the work itself.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from engine.cdi import HOOK_TIME_LIMIT
from engine.config import EngineConfig
from engine.errors import EngineError, StartError
from engine.model import Capability, Inventory
from engine.plan import ipc_in_mounts
from engine.plan import plan as make_plan
from engine.request import ByIndex, ByMigPlacement, DeviceId, GpuRequest, Selection
from engine.selection import mig_devices_in
from engine.start import actions
from engine.start.work import StartReport, start_work

__all__ = [
    "HOOK_TIME_LIMIT",
    "STATE_LIMIT",
    "HookError",
    "HookState",
    "gpu_request",
    "ipc_mounts",
    "parse_state",
    "rootfs",
    "run_hook",
    "time_limit",
    "work_timeout",
]

STATE_LIMIT = 1 << 20
_CONFIG_LIMIT = 16 << 20
# The start work's deadline comes this long before the process's own limit: its
# own timeout (a killed ldconfig) then reports the step, not the bare limit.
_WORK_MARGIN = 1.0


class HookError(EngineError):
    """The OCI state or the bundle's config cannot be used (the message names the value)."""


@dataclass(frozen=True)
class HookState:
    container_id: str
    bundle: str


def parse_state(data: bytes) -> HookState:
    """The OCI state a hook reads on stdin (``id``, ``bundle``).

    >>> parse_state(b'{"ociVersion": "1.0.2", "id": "abc", "status": "creating", "bundle": "/b"}')
    HookState(container_id='abc', bundle='/b')
    """
    state = _json_object(data, "the OCI state on stdin", STATE_LIMIT)
    container, bundle = state.get("id"), state.get("bundle")
    if not isinstance(container, str) or not container:
        raise HookError(f"the OCI state has no container id (id: {container!r})")
    if not isinstance(bundle, str) or not bundle.startswith("/"):
        raise HookError(f"the OCI state's bundle {bundle!r} is not an absolute path")
    return HookState(container, bundle)


def rootfs(bundle: str, config: Mapping[str, Any]) -> str:
    """The container's root directory: ``root.path``, relative to the bundle unless absolute."""
    root = config.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise HookError(f"{bundle}/config.json has no root.path")
    return os.path.normpath(os.path.join(bundle, path))


def gpu_request(config: Mapping[str, Any], inventory: Inventory, capabilities: frozenset[Capability]) -> GpuRequest:
    """What the CDI devices put into ``linux.devices``, found by (major, minor) of
    character devices: the request that gives the same plan (and procfs view).

    * A MIG device: its parent's ``/dev/nvidia<M>`` with both its GPU instance's
      and its compute instance's ``nvidia-caps`` node (the minors procfs names)
      -> ``ByMigPlacement`` (resolvable without NVML).
    * A whole GPU: its ``/dev/nvidia<M>``, unless it is there only as the parent
      of MIG devices. A node is a node, so the two cannot be told apart: a MIG
      device's spec entry always carries its parent, and giving the whole GPU as
      well would show what the MIG device must not (and a whole GPU in MIG mode
      gives CUDA nothing anyway). A container that has both loses nothing it
      could use.
    * ``mig/monitor``'s and ``mig/config``'s nodes -> the monitor and config grants.

    Ids come by GPU index, then GPU and compute instance.
    """
    found = _char_devices(config)
    gpus = found.get(inventory.nvidia_major, set()) if inventory.nvidia_major is not None else set()
    layout = inventory.mig
    caps = found.get(layout.caps_major, set()) if layout.caps_major is not None else set()
    given = mig_devices_in(((major, minor) for major, minors in found.items() for minor in minors), inventory)
    mig_ids: list[DeviceId] = [
        ByMigPlacement(m.parent.uuid[:4] + m.parent.uuid[4:].lower(), m.gpu_instance.gi, m.compute_instance.ci)
        for m in given
    ]
    parents = {m.parent.minor for m in given}
    whole = [ByIndex(g.index) for g in sorted(inventory.gpus, key=lambda g: g.index) if g.minor in gpus - parents]
    ids = (*whole, *mig_ids)
    return GpuRequest(
        Selection.LIST if ids else Selection.NONE,
        ids,
        capabilities,
        (),
        "CDI devices",
        mig_monitor=layout.monitor is not None and layout.monitor.minor in caps,
        mig_config=layout.config is not None and layout.config.minor in caps,
    )


def _char_devices(config: Mapping[str, Any]) -> dict[int, set[int]]:
    """major -> minors of the character devices in the bundle's ``linux.devices``."""
    linux = config.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    found: dict[int, set[int]] = {}
    for device in devices if isinstance(devices, list) else ():
        if isinstance(device, dict) and device.get("type") == "c":
            major, minor = device.get("major"), device.get("minor")
            if type(major) is int and type(minor) is int:
                found.setdefault(major, set()).add(minor)
    return found


def ipc_mounts(config: Mapping[str, Any], engine: EngineConfig) -> tuple[str, ...]:
    """The daemons' IPC endpoints the bundle binds (``plan.ipc_in_mounts``).

    The spec was written once, so these are what it named then, whatever the
    hook's own discovery finds now: each one is what the start work must check.
    """
    mounts = config.get("mounts")
    pairs = (
        (mount.get("source"), mount.get("destination"))
        for mount in (mounts if isinstance(mounts, list) else ())
        if isinstance(mount, dict)
    )
    return ipc_in_mounts(pairs, engine)


def run_hook(
    state_data: bytes,
    config: EngineConfig,
    capabilities: frozenset[Capability],
    inventory: Callable[[], Inventory],
    *,
    timeout: float = HOOK_TIME_LIMIT - _WORK_MARGIN,
) -> StartReport:
    """Read the bundle, plan, and do the start work in the container's root.

    Raises HookError (state, config), the planning errors, or StartError naming
    the step that failed.
    """
    deadline = time.monotonic() + timeout
    state = parse_state(state_data)
    bundle_config = _read_config(state.bundle)
    root = rootfs(state.bundle, bundle_config)
    node = inventory()
    plan = make_plan(gpu_request(bundle_config, node, capabilities), node, config)
    who = f"container {state.container_id}"
    work = start_work(
        plan,
        who,
        config.proc_root,
        config.ld_cache,
        driver_root=config.driver_root,
        ipc=ipc_mounts(bundle_config, config),
        cuda_compat=config.policy.cuda_compat,
        driver_version=node.driver_version or "",
    )
    try:
        return actions.perform_in_bundle(root, work, ldconfig_path=config.ldconfig, deadline=deadline)
    except actions.StepFailed as exc:
        raise StartError(who, exc.step, str(exc)) from exc


def work_timeout(time_limit: float) -> float:
    """The start work's timeout within a hook run limited to ``time_limit`` seconds."""
    return max(time_limit - _WORK_MARGIN, time_limit / 2)


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """End this process with exit status 1 and a message on stderr if the block
    has not finished after ``seconds``. A handler, not the default action of
    SIGALRM, so that runc returns the reason with the hook's failure; blocking
    calls are interrupted (EINTR) and the handler runs before they are retried.
    The timer and the old handler are restored when the block ends."""

    def expire(signum: int, frame: object) -> None:
        message = f"nri-gpu hook: did not finish within its time limit of {seconds:g} s; giving up\n"
        os.write(2, message.encode())
        os._exit(1)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _read_config(bundle: str) -> dict[str, Any]:
    path = os.path.join(bundle, "config.json")
    try:
        with open(path, "rb") as f:
            data = f.read(_CONFIG_LIMIT + 1)
    except OSError as exc:
        raise HookError(f"{path}: {exc.strerror}") from exc
    return _json_object(data, path, _CONFIG_LIMIT)


def _json_object(data: bytes, what: str, limit: int) -> dict[str, Any]:
    """``data`` as a JSON object, at most ``limit`` bytes; HookError naming ``what`` otherwise."""
    if len(data) > limit:
        raise HookError(f"{what} is over {limit} bytes")
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise HookError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise HookError(f"{what} is not a JSON object")
    return value
