"""Inventories and plans as plain data (JSON) and as text for people.  (pure)

The dictionaries are the stable, documented form: ``nri-gpu info --json`` and
``nri-gpu plan --json`` print them, golden tests compare them.
"""

from __future__ import annotations

from typing import Any

from nri_gpu.engine.graphics import APP_PROFILE_PATH
from nri_gpu.engine.model import (
    Capability,
    DeviceNode,
    Fabric,
    Gpu,
    Inventory,
    MigCap,
    MigDevice,
    MigLayout,
    NvmlGpu,
    NvmlMigDevice,
    NvmlSnapshot,
    Plan,
)


def _gpu(g: Gpu) -> dict[str, Any]:
    return {
        "index": g.index,
        "minor": g.minor,
        "bus_id": g.bus_id,
        "uuid": g.uuid,
        "model": g.model,
        "arch": g.arch,
        "brand": g.brand,
    }


def _device(d: DeviceNode) -> dict[str, Any]:
    return {"path": d.path, "type": d.type, "major": d.major, "minor": d.minor, "mode": f"{d.mode:04o}"}


def capability_counts(inventory: Inventory) -> dict[str, int]:
    counts = {cap.value: 0 for cap in Capability}
    for lib in inventory.libraries:
        if lib.is_64bit:
            for cap in lib.capabilities:
                counts[cap.value] += 1
        else:
            counts[Capability.COMPAT32.value] += 1
    return counts


def _cap(cap: MigCap | None) -> dict[str, Any] | None:
    return None if cap is None else {"path": cap.path, "minor": cap.minor, "mode": f"{cap.mode:04o}"}


def nvml_names(snapshot: NvmlSnapshot | None) -> dict[tuple[int, int, int], tuple[str, str]]:
    """(GPU minor, gi, ci) -> (MIG UUID, "i:j") of every MIG device NVML listed."""
    if snapshot is None:
        return {}
    return {(g.minor, d.gi, d.ci): (d.uuid, f"{g.index}:{d.index}") for g in snapshot.gpus for d in g.mig_devices}


def _nvml_gpu(g: NvmlGpu) -> dict[str, Any]:
    def device(d: NvmlMigDevice) -> dict[str, Any]:
        return {"index": f"{g.index}:{d.index}", "uuid": d.uuid, "gi": d.gi, "ci": d.ci}

    return {
        "index": g.index,
        "uuid": g.uuid,
        "minor": g.minor,
        "mig_mode": {"current": g.mig_current, "pending": g.mig_pending},
        "mig_devices": [device(d) for d in g.mig_devices],
    }


def mig_to_dict(mig: MigLayout) -> dict[str, Any]:
    """The MIG layout procfs shows: instances by GPU device minor, with their caps, each
    compute instance with NVML's ``uuid`` and ``index`` (``"i:j"``) or None; ``nvml``:
    what the NVML probe said (None when it failed: ``nvml_error`` says why)."""
    names = nvml_names(mig.nvml)

    def ci_dict(minor: int, gi: int, ci: int, access: MigCap) -> dict[str, Any]:
        uuid, index = names.get((minor, gi, ci), (None, None))
        return {"ci": ci, "access": _cap(access), "uuid": uuid, "index": index}

    return {
        "caps_major": mig.caps_major,
        "config": _cap(mig.config),
        "monitor": _cap(mig.monitor),
        "gpu_instances": [
            {
                "gpu_minor": g.gpu_minor,
                "gi": g.gi,
                "access": _cap(g.access),
                "compute_instances": [ci_dict(g.gpu_minor, g.gi, c.ci, c.access) for c in g.compute_instances],
            }
            for g in mig.gpu_instances
        ],
        "nvml": None if mig.nvml is None else {"gpus": [_nvml_gpu(g) for g in mig.nvml.gpus]},
        "nvml_error": mig.nvml_error,
    }


def _mig_mode(gpu: Gpu, mig: MigLayout) -> str:
    """What can be said of one GPU's MIG mode: NVML's word, else procfs's hint."""
    has_instances = bool(mig.instances_of(gpu.minor))
    if mig.nvml is None:
        return "instances present (procfs)" if has_instances else "unknown (no NVML); no instances in procfs"
    found = mig.nvml.gpu(gpu.uuid)
    if found is None:
        return "unknown (NVML does not list it)"
    if found.mig_current is None:
        return "not supported (NVML)"
    mode = f"{'enabled' if found.mig_current else 'disabled'} (NVML)"
    if found.mig_pending != found.mig_current:
        mode += f", {'enabled' if found.mig_pending else 'disabled'} after the next GPU reset"
    return mode


def _mig_lines(inventory: Inventory) -> list[str]:
    mig = inventory.mig
    lines = ["", "MIG mode:"]
    lines += [f"  GPU {g.index} (minor {g.minor}): {_mig_mode(g, mig)}" for g in inventory.gpus]
    names = nvml_names(mig.nvml)
    for minor in sorted({g.gpu_minor for g in mig.gpu_instances}):
        shown = " ".join(
            f"gi{g.gi}({','.join(f'ci{c.ci}' for c in g.compute_instances) or 'no CIs'})"
            for g in mig.instances_of(minor)
        )
        lines.append(f"MIG instances of GPU minor {minor}: {shown}")
        for g in mig.instances_of(minor):
            for c in g.compute_instances:
                uuid, index = names.get((minor, g.gi, c.ci), ("(no MIG UUID)", "-"))
                place = f"gpu{minor}/mig/gi{g.gi}/ci{c.ci}"
                lines.append(f"  {place:<22} {index:<6} {uuid}  caps {g.access.minor},{c.access.minor}")
    if mig.nvml_error is not None:
        lines.append(f"NVML: {mig.nvml_error} (MIG devices can be requested by placement only)")
    return lines


def fabric_to_dict(fabric: Fabric) -> dict[str, Any]:
    """The fabric and I/O devices: the IMEX major and channel count, the nodes found
    (with their kind), GDS's files (path, source node path)."""
    return {
        "imex_major": fabric.imex_major,
        "imex_channel_count": fabric.imex_channel_count,
        "nodes": [{**_device(d), "kind": d.kind.value} for d in fabric.nodes],
        "gds_files": [{"path": path, "source": source} for path, source in fabric.gds_files],
    }


def _fabric_lines(fabric: Fabric) -> list[str]:
    lines = []
    if fabric.imex_major is not None:
        count = fabric.imex_channel_count
        lines.append(f"IMEX channels: major {fabric.imex_major}, {'count unknown' if count is None else count}")
    if fabric.nodes:
        lines.append("Fabric devices: " + ", ".join(f"{d.path} ({d.kind.value})" for d in fabric.nodes))
    return lines


def inventory_to_dict(inventory: Inventory) -> dict[str, Any]:
    """The inventory as data. ``mig`` is there only when some GPU has MIG instances,
    and ``fabric`` only when the node has fabric or I/O device nodes, so the form for
    every other node stays as it was."""
    out = {
        "driver_version": inventory.driver_version,
        "cuda_version": inventory.cuda_version,
        "gpus": [_gpu(g) for g in inventory.gpus],
        "control_devices": [_device(d) for d in inventory.control_devices],
        "libraries": [
            {
                "soname": lib.soname,
                "path": lib.path,
                "bits": 64 if lib.is_64bit else 32,
                "capabilities": sorted(c.value for c in lib.capabilities),
            }
            for lib in inventory.libraries
        ],
        "files": [
            {
                "path": f.path,
                "source": f.source,
                "kind": f.kind.value,
                "capabilities": sorted(c.value for c in f.capabilities),
            }
            for f in inventory.files
        ],
        "libraries_per_capability": capability_counts(inventory),
        "warnings": list(inventory.warnings),
    }
    if inventory.mig.gpu_instances:
        out["mig"] = mig_to_dict(inventory.mig)
    if inventory.fabric.nodes:
        out["fabric"] = fabric_to_dict(inventory.fabric)
    return out


def inventory_text(inventory: Inventory) -> str:
    if not inventory.has_driver:
        return "No NVIDIA driver on this node: no GPUs.\n" + "".join(f"warning: {w}\n" for w in inventory.warnings)
    lines = [
        f"Driver {inventory.driver_version}, CUDA {inventory.cuda_version or 'unknown'}, {len(inventory.gpus)} GPU(s)",
        "",
    ]
    rows = [("INDEX", "MINOR", "BUS ID", "UUID", "MODEL")]
    rows += [(str(g.index), str(g.minor), g.bus_id, g.uuid, g.model) for g in inventory.gpus]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("")
    counts = capability_counts(inventory)
    lines.append("Libraries per capability: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    others = {kind: sum(1 for f in inventory.files if f.kind.value == kind) for kind in ("binary", "firmware", "ipc")}
    lines.append("Other files: " + ", ".join(f"{k} {v}" for k, v in others.items()))
    lines.append("Control devices: " + (", ".join(d.path for d in inventory.control_devices) or "none"))
    lines += _fabric_lines(inventory.fabric)
    if inventory.drm:
        drm = (f"{d.bus_id} {' '.join(n.path.rsplit('/', 1)[1] for n in d.nodes)}" for d in inventory.drm)
        lines.append("DRM nodes: " + ", ".join(drm))
    if inventory.mig.gpu_instances:
        lines += _mig_lines(inventory)
    lines += [f"warning: {w}" for w in inventory.warnings]
    return "\n".join(lines) + "\n"


def _mig_device(m: MigDevice) -> dict[str, Any]:
    return {
        "name": m.name,
        "parent_index": m.parent.index,
        "parent_minor": m.parent.minor,
        "gi": m.gpu_instance.gi,
        "ci": m.compute_instance.ci,
        "index": m.index,
        "cap_minors": [m.gpu_instance.access.minor, m.compute_instance.access.minor],
    }


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as data; ``mig_devices``, ``imex_channels``, ``features`` and the
    start's ``proc_caps``/``proc_caps_all`` are there only when the plan has them, so
    plans without MIG or fabric devices read as before."""
    out: dict[str, Any] = {
        "gpus": [{"index": g.index, "minor": g.minor, "bus_id": g.bus_id, "uuid": g.uuid} for g in plan.gpus],
        "capabilities": sorted(c.value for c in plan.capabilities),
        "devices": [_device(d) for d in plan.devices],
        "mounts": [{"source": m.source, "destination": m.destination, "options": list(m.options)} for m in plan.mounts],
        "env": [f"{k}={v}" for k, v in plan.env],
        "start": {
            "visible_bus_ids": list(plan.visible_bus_ids),
            "symlinks": [{"path": s.path, "target": s.target} for s in plan.symlinks],
            "ldconfig_folders": list(plan.ldconfig_folders),
            "ld_cache_entries": [
                {"name": e.name, "path": e.path, "flags": e.flags, "osversion": e.osversion}
                for e in plan.ld_cache_entries
            ],
        },
        "notes": list(plan.notes),
    }
    if plan.mig_devices:
        out["mig_devices"] = [_mig_device(m) for m in plan.mig_devices]
    if plan.proc_caps:
        out["start"]["proc_caps"] = list(plan.proc_caps)
    if plan.proc_caps_all:
        out["start"]["proc_caps_all"] = True
    if plan.imex_channels:
        out["imex_channels"] = list(plan.imex_channels)
    if plan.features:
        out["features"] = [f.value for f in plan.features]
    if plan.app_profile:
        out["start"]["app_profile"] = plan.app_profile
    return out


def plan_text(plan: Plan) -> str:
    gpus = ", ".join(f"{g.index} (minor {g.minor}, {g.bus_id})" for g in plan.gpus)
    gpus = gpus or ("none whole (MIG devices below)" if plan.mig_devices else "none (driver only)")
    lines = [f"GPUs: {gpus}"]
    for m in plan.mig_devices:
        caps = f"caps {m.gpu_instance.access.minor},{m.compute_instance.access.minor}"
        where = f"GPU {m.parent.index} (minor {m.parent.minor}) gi{m.gpu_instance.gi} ci{m.compute_instance.ci}"
        lines.append(f"MIG device: {m.name}  {where}{f'  {m.index}' if m.index else ''}  {caps}")
    if plan.imex_channels:
        lines.append(f"IMEX channels: {','.join(map(str, plan.imex_channels))}")
    if plan.features:
        lines.append(f"Features: {', '.join(f'{f.env}=enabled' for f in plan.features)}")
    lines += [f"Capabilities: {', '.join(sorted(c.value for c in plan.capabilities))}", "Devices:"]
    lines += [f"  {d.path}  {d.type} {d.major}:{d.minor}  {d.mode:04o}" for d in plan.devices]
    lines.append(f"Mounts ({len(plan.mounts)}):")
    lines += [f"  {m.destination}  <- {m.source}  ({','.join(m.options)})" for m in plan.mounts]
    lines.append("Env:")
    lines += [f"  {k}={v}" for k, v in plan.env]
    lines.append("At container start:")
    lines.append(f"  keep /proc/driver/nvidia/gpus/: {' '.join(plan.visible_bus_ids) or '(none)'}")
    lines += [f"  link {s.path} -> {s.target}" for s in plan.symlinks]
    if plan.proc_caps_all:
        lines.append("  keep /proc/driver/nvidia/capabilities/: all of it")
    elif plan.proc_caps:
        lines.append(f"  keep /proc/driver/nvidia/capabilities/: {' '.join(plan.proc_caps)}")
    if plan.app_profile:
        lines.append(f"  write {APP_PROFILE_PATH}: {' '.join(plan.app_profile.split())}")
    lines.append(f"  ld.so.conf.d folders: {' '.join(plan.ldconfig_folders) or '(none)'}")
    lines.append(f"  ld.so.cache entries added: {len(plan.ld_cache_entries)}")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"
