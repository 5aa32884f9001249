"""Engine plan -> NRI ``ContainerAdjustment``.  (pure)

The adjustment carries only what the plan adds and the container does not
already have: a device node the device plugin already put in the spec (same
path, same numbers) or an identical bind mount is left out, so two sources of
the same edit never fight over it. A different mount already at one of our
destinations is a conflict and refuses the container; silently replacing it
would hide the operator's mistake.
"""

from __future__ import annotations

from nri_gpu.engine import Plan
from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.errors import PluginError
from nri_gpu.plugin.request import first_values

# Records what the container was given, for people and tools reading the spec.
GPUS_ANNOTATION = "nri-gpu.io/gpus"


def to_adjustment(plan: Plan, container: api.Container) -> api.ContainerAdjustment:
    adjust = api.ContainerAdjustment()
    existing_devices = {d.path: (d.type, d.major, d.minor) for d in container.linux.devices}
    for node in plan.devices:
        if existing_devices.get(node.path) == (node.type, node.major, node.minor):
            continue
        device = adjust.linux.devices.add(path=node.path, type=node.type, major=node.major, minor=node.minor)
        device.file_mode.value = node.mode
        if node.uid is not None:
            device.uid.value = node.uid
        if node.gid is not None:
            device.gid.value = node.gid
    existing_mounts = {m.destination: m.source for m in container.mounts}
    for mount in plan.mounts:
        source = existing_mounts.get(mount.destination)
        if source == mount.source:
            continue
        if source is not None:
            raise PluginError(
                f"the container already mounts {source} at {mount.destination}, where its GPU driver file goes"
            )
        adjust.mounts.add(destination=mount.destination, type="bind", source=mount.source, options=list(mount.options))
    env = first_values(container, tuple(key for key, _ in plan.env))
    for key, value in plan.env:
        if env.get(key) != value:
            adjust.env.add(key=key, value=value)
    adjust.annotations[GPUS_ANNOTATION] = ",".join(plan.device_names) or "none"
    return adjust
