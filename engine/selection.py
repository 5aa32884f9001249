"""Resolve a request's device ids against the node's GPUs, all or nothing.  (pure)"""

from __future__ import annotations

from engine.errors import RequestError, UnknownDeviceError
from engine.model import Gpu, Inventory
from engine.request import ByBusId, ByIndex, ByUuid, GpuRequest, Selection


def select(request: GpuRequest, inventory: Inventory) -> tuple[Gpu, ...]:
    """The GPUs ``request`` names, in request order. Raises before returning anything partial.

    Raises RequestError when the node has no driver at all, UnknownDeviceError
    for an id that matches no GPU (naming the id, its source and what the node has).
    """
    if not inventory.has_driver:
        raise RequestError(f"{request.source} asks for NVIDIA GPUs, but this node has no NVIDIA driver")
    if request.selection is Selection.NONE:
        return ()
    if request.selection is Selection.ALL:
        return inventory.gpus
    by_uuid = {g.uuid.lower(): g for g in inventory.gpus}
    by_bus = {g.bus_id: g for g in inventory.gpus}
    chosen: list[Gpu] = []
    for device_id in request.ids:
        gpu: Gpu | None
        if isinstance(device_id, ByIndex):
            gpu = inventory.gpus[device_id.index] if device_id.index < len(inventory.gpus) else None
            if gpu is None:
                count = len(inventory.gpus)
                have = f"indexes 0-{count - 1}" if count else "no GPUs"
                raise UnknownDeviceError(
                    f"{request.source}: GPU {device_id.index} does not exist; this node has {count} GPUs ({have})"
                )
        elif isinstance(device_id, ByUuid):
            gpu = by_uuid.get(device_id.uuid.lower())
            if gpu is None:
                raise UnknownDeviceError(f"{request.source}: no GPU with UUID {device_id.uuid} on this node")
        elif isinstance(device_id, ByBusId):
            gpu = by_bus.get(device_id.bus_id)
            if gpu is None:
                buses = ", ".join(g.bus_id for g in inventory.gpus) or "none"
                raise UnknownDeviceError(
                    f"{request.source}: no GPU at PCI bus id {device_id.bus_id} (this node has: {buses})"
                )
        if gpu not in chosen:
            chosen.append(gpu)
    return tuple(chosen)
