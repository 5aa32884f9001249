"""Resolve a request's device ids against the node's GPUs and MIG devices, all or nothing.  (pure)

Whole GPUs resolve from procfs (index, UUID, bus id). MIG devices resolve three ways:

* ``MIG-GPU-<gpu uuid>/<gi>/<ci>`` (the legacy form) from procfs alone: the GPU by
  UUID, then ``capabilities/gpu<minor>/mig/gi<G>/ci<C>`` must exist;
* ``MIG-<uuid>`` and ``i:j`` only from NVML's snapshot (``Inventory.mig.nvml``): a
  MIG UUID is a hash of values the driver does not export, and ``j`` is NVML's
  own, undocumented order. Without a snapshot they are refused with NVML's reason.

``all`` follows the toolkit's jit-cdi mode: every whole GPU not in MIG mode, and
every MIG device. "In MIG mode" is what can be known: NVML says so, or procfs shows
instances; a GPU in MIG mode with no instances looks, without NVML, like one with
MIG off, and is then handed out whole (CUDA sees no device in it either way).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from nri_gpu.engine.errors import RequestError, UnknownDeviceError
from nri_gpu.engine.model import Gpu, Inventory, MigDevice, MigLayout
from nri_gpu.engine.request import ByIndex, ByMigIndex, ByMigPlacement, ByMigUuid, ByUuid, GpuRequest, Selection

__all__ = ["Selected", "UnknownMigDeviceError", "in_mig_mode", "mig_devices", "mig_devices_in", "select"]


class UnknownMigDeviceError(UnknownDeviceError):
    """A ``MIG-<uuid>`` or ``i:j`` NVML's snapshot does not have: the snapshot may be
    older than the instance (destroyed and made again under the same ids, which
    procfs cannot tell), so the caller may take NVML's view again before refusing."""


@dataclass(frozen=True)
class Selected:
    """What a request selects: whole GPUs and MIG devices, each in request order,
    and notes worth a log line (a whole GPU in MIG mode)."""

    gpus: tuple[Gpu, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    notes: tuple[str, ...] = ()


def in_mig_mode(gpu: Gpu, layout: MigLayout) -> bool:
    """NVML says MIG is on, or procfs shows instances of ``gpu``."""
    if layout.instances_of(gpu.minor):
        return True
    seen = layout.nvml.gpu(gpu.uuid) if layout.nvml is not None else None
    return bool(seen is not None and seen.mig_current)


def mig_devices(inventory: Inventory) -> tuple[MigDevice, ...]:
    """Every MIG device of the node (every compute instance procfs shows), by
    parent index, GPU instance and compute instance; with NVML's UUID and ``i:j``
    where its snapshot has them."""
    layout = inventory.mig
    by_minor = {g.minor: g for g in inventory.gpus}
    named = _nvml_names(layout)
    found: list[MigDevice] = []
    for gi in layout.gpu_instances:
        parent = by_minor.get(gi.gpu_minor)
        if parent is None:
            continue
        for ci in gi.compute_instances:
            uuid, index = named.get((gi.gpu_minor, gi.gi, ci.ci), (None, None))
            found.append(MigDevice(parent, gi, ci, uuid, index))
    return tuple(sorted(found, key=lambda m: (m.parent.index, m.gpu_instance.gi, m.compute_instance.ci)))


def mig_devices_in(devices: Iterable[tuple[int, int]], inventory: Inventory) -> tuple[MigDevice, ...]:
    """The MIG devices whose three nodes are all among ``devices`` ((major, minor) of
    character devices): the parent's ``/dev/nvidia<M>``, and the ``nvidia-caps``
    nodes of its GPU and compute instance (the minors procfs names). What a CDI
    spec entry or the device plugin's device specs put into a container."""
    layout = inventory.mig
    if inventory.nvidia_major is None or layout.caps_major is None:
        return ()
    present: dict[int, set[int]] = {}
    for major, minor in devices:
        present.setdefault(major, set()).add(minor)
    parents = present.get(inventory.nvidia_major, set())
    caps = present.get(layout.caps_major, set())
    return tuple(
        m
        for m in mig_devices(inventory)
        if m.parent.minor in parents and m.gpu_instance.access.minor in caps and m.compute_instance.access.minor in caps
    )


def select(request: GpuRequest, inventory: Inventory, *, refuse_mig_mode: bool = False) -> Selected:
    """The GPUs and MIG devices ``request`` names. Raises before returning anything partial.

    Raises RequestError when the node has no driver at all, or a MIG form needs
    NVML that is not available; UnknownDeviceError for an id that matches nothing
    (naming the id, its source and what the node has); UnknownMigDeviceError for
    a MIG UUID or ``i:j`` NVML's snapshot lacks. ``refuse_mig_mode``: a whole GPU
    in MIG mode is refused rather than noted (``policy.refuse_mig_mode_gpus``).
    """
    if not inventory.has_driver:
        raise RequestError(f"{request.source} asks for NVIDIA GPUs, but this node has no NVIDIA driver")
    if request.selection is Selection.NONE:
        return Selected()
    layout = inventory.mig
    if request.selection is Selection.ALL:
        whole = tuple(g for g in inventory.gpus if not in_mig_mode(g, layout))
        return Selected(whole, mig_devices(inventory))
    by_uuid = {g.uuid.lower(): g for g in inventory.gpus}
    by_bus = {g.bus_id: g for g in inventory.gpus}
    gpus: list[Gpu] = []
    migs: list[MigDevice] = []
    unnamed: list[ByMigUuid | ByMigIndex] = []  # NVML's names, with NVML not available
    for device_id in request.ids:
        if isinstance(device_id, (ByMigUuid, ByMigIndex)) and layout.gpu_instances and layout.nvml is None:
            unnamed.append(device_id)
            continue
        if isinstance(device_id, (ByMigUuid, ByMigIndex, ByMigPlacement)):
            mig = _mig(device_id, request.source, inventory, by_uuid)
            if mig not in migs:
                migs.append(mig)
            continue
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
        else:
            gpu = by_bus.get(device_id.bus_id)
            if gpu is None:
                buses = ", ".join(g.bus_id for g in inventory.gpus) or "none"
                raise UnknownDeviceError(
                    f"{request.source}: no GPU at PCI bus id {device_id.bus_id} (this node has: {buses})"
                )
        if gpu not in gpus:
            gpus.append(gpu)
    notes = []
    if unnamed:
        given = _given_by_device_specs(request, inventory, unnamed, migs)
        migs.extend(given)
        notes.append(
            f"{', '.join(_shown(i) for i in unnamed)}: NVML is not available ({layout.nvml_error or 'not asked'}); "
            f"served as the MIG device(s) whose nodes the container already has: {', '.join(m.name for m in given)}"
        )
    for gpu in gpus:
        if in_mig_mode(gpu, layout):
            what = f"GPU {gpu.index} ({gpu.uuid}) is in MIG mode: a container given the whole GPU sees no CUDA device"
            if refuse_mig_mode:
                raise RequestError(
                    f"{request.source}: {what}; ask for its MIG devices ({_mig_list(inventory, gpu)}), "
                    "or set policy.refuse_mig_mode_gpus = false"
                )
            notes.append(f"{what}; its MIG devices: {_mig_list(inventory, gpu)}")
    return Selected(tuple(gpus), tuple(migs), tuple(notes))


def _shown(device_id: ByMigUuid | ByMigIndex) -> str:
    return device_id.uuid if isinstance(device_id, ByMigUuid) else f"{device_id.gpu}:{device_id.mig}"


def _given_by_device_specs(
    request: GpuRequest, inventory: Inventory, unnamed: list[ByMigUuid | ByMigIndex], named: list[MigDevice]
) -> tuple[MigDevice, ...]:
    """The MIG devices NVML's names stand for, without NVML: those whose three nodes
    the container's spec already holds (the device plugin's device specs, with
    ``passDeviceSpecs``: the same Allocate answer that named them), when they are
    exactly as many as the names. The container gets nothing its spec did not
    already open to it. Otherwise RequestError with NVML's reason."""
    given = tuple(m for m in mig_devices_in(request.devices, inventory) if m not in named)
    if len(given) == len(unnamed):
        if len(given) == 1 and isinstance(unnamed[0], ByMigUuid):
            # One name, one device: the pairing is certain, keep the name asked for.
            return (dataclasses.replace(given[0], uuid=unnamed[0].uuid),)
        return given
    why = inventory.mig.nvml_error or "NVML was not asked"
    names = ", ".join(_shown(i) for i in unnamed[:8])
    found = f"; the container's own device nodes hold {len(given)} MIG device(s)" if given else ""
    raise RequestError(
        f"{request.source}: MIG device(s) {names} can only be found through NVML, which is not available ({why})"
        f"{found}; name them by placement instead: {_node_migs(inventory)}"
    )


def _nvml_names(layout: MigLayout) -> dict[tuple[int, int, int], tuple[str, str]]:
    """(parent minor, gi, ci) -> (MIG UUID, "i:j") from NVML's snapshot."""
    if layout.nvml is None:
        return {}
    return {
        (gpu.minor, dev.gi, dev.ci): (dev.uuid, f"{gpu.index}:{dev.index}")
        for gpu in layout.nvml.gpus
        for dev in gpu.mig_devices
    }


def _mig_list(inventory: Inventory, gpu: Gpu, limit: int = 8) -> str:
    names = [m.name for m in mig_devices(inventory) if m.parent == gpu]
    if not names:
        return "none: it has no MIG instances"
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _node_migs(inventory: Inventory, limit: int = 8) -> str:
    """What the node has, for a message: its MIG devices by name, or that it has none."""
    every = mig_devices(inventory)
    if not every:
        return "this node has no MIG devices"
    names = [m.name if m.index is None else f"{m.index} ({m.name})" for m in every]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"this node has {', '.join(names[:limit])}{more}"


def _mig(
    device_id: ByMigUuid | ByMigIndex | ByMigPlacement, source: str, inventory: Inventory, by_uuid: dict[str, Gpu]
) -> MigDevice:
    layout = inventory.mig
    if isinstance(device_id, ByMigPlacement):
        parent = by_uuid.get(device_id.gpu_uuid.lower())
        what = f"MIG-{device_id.gpu_uuid}/{device_id.gi}/{device_id.ci}"
        if parent is None:
            raise UnknownDeviceError(f"{source}: MIG device {what}: no GPU with UUID {device_id.gpu_uuid} on this node")
        found = next(
            (
                m
                for m in mig_devices(inventory)
                if m.parent == parent and m.gpu_instance.gi == device_id.gi and m.compute_instance.ci == device_id.ci
            ),
            None,
        )
        if found is None:
            raise UnknownDeviceError(
                f"{source}: no MIG device {what}: GPU {parent.index} has no GPU instance {device_id.gi} with "
                f"compute instance {device_id.ci} (its MIG devices: {_mig_list(inventory, parent)})"
            )
        return found
    what = device_id.uuid if isinstance(device_id, ByMigUuid) else f"{device_id.gpu}:{device_id.mig}"
    if not layout.gpu_instances:
        raise UnknownDeviceError(f"{source}: no MIG device {what}: {_node_migs(inventory)}")
    # (With instances but no NVML, ``select`` looks in the container's device specs instead.)
    for m in mig_devices(inventory):
        if isinstance(device_id, ByMigUuid):
            if m.uuid is not None and m.uuid.lower() == device_id.uuid.lower():
                return m
        elif m.index == what:
            return m
    raise UnknownMigDeviceError(f"{source}: no MIG device {what}: {_node_migs(inventory)}")
