"""(request, inventory, config) -> plan: exactly what one GPU container gets.  (pure)

Theory of operation: everything that can fail is done first (GPU selection,
requirements), so a refusal leaves nothing behind; the rest is a deterministic
projection of the inventory through the requested capabilities:

* devices: ``/dev/nvidiactl``, one ``/dev/nvidia<minor>`` per selected GPU and
  per parent of a selected MIG device (the minor from procfs, never the index),
  the uvm pair with compute (and video, which needs compute), ``nvidia-modeset``
  with display; for each MIG device its GPU and compute instance capabilities,
  ``/dev/nvidia-caps/nvidia-cap<minor>`` (``nvidia-caps`` major, minor and mode
  from the access files: the kernel's own numbers, never computed), and the
  ``monitor`` / ``config`` capabilities when granted (config with every instance
  of the selected GPUs: it must reach them all);
* graphics and display (``engine.graphics``): the whole GPUs' DRM nodes, the GBM
  and GLX module links, and, with some of the node's GPUs only, the
  ``EGLVisibleDGPUDevices`` application profile written at start;
* fabric and I/O devices, with GPUs only (``engine.fabric``): the IMEX channels
  asked for, each ``/dev/nvidia-caps-imex-channels/channel<n>`` (major from
  ``/proc/devices``, minor the channel, below ``ImexChannelCount``), and every
  node of each feature turned on (GDS also binds ``/etc/cufile.json`` and
  ``/run/udev/data``); a channel or feature the node cannot serve is refused;
* mounts: every driver library, binary and IPC endpoint the capabilities need,
  plus the GSP firmware, bound read-only ``nosuid,nodev`` (IPC endpoints
  also ``noexec``, and a plain bind) at the same path in the container as on
  the node, from the file under the driver root; every source a clean absolute
  path inside the host root (``EngineConfig.to_host_path``);
* env: ``NVIDIA_VISIBLE_DEVICES`` (the selected GPUs' UUIDs, then the MIG
  devices' names, never their parents' UUIDs; or ``none``) and
  ``NVIDIA_DRIVER_CAPABILITIES`` as granted;
* container-start work: the bus ids that stay visible under
  ``/proc/driver/nvidia/gpus`` (MIG parents included), the capability files
  shown under ``capabilities/`` (each MIG device's two access files, the
  monitor's or config's file; the whole folder with config), the library symlinks (``libcuda.so.1`` ->
  ``libcuda.so.<ver>``, ``libcuda.so`` -> ``libcuda.so.1``), the folders for
  the ld.so.conf.d entry, and the entries the container's ld.so.cache gains
  (the node cache's name, flags and ABI note of each library, at the path of
  its SONAME link in the container).

The same inputs always give the same plan, in the same order.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from nri_gpu.engine import catalogue, fabric, graphics, requirements
from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.errors import RequestError
from nri_gpu.engine.model import (
    Capability,
    DeviceKind,
    DeviceNode,
    DriverFile,
    FileKind,
    Gpu,
    Inventory,
    LdCacheEntry,
    Library,
    MigCap,
    MigDevice,
    Mount,
    Plan,
    Symlink,
)
from nri_gpu.engine.request import GpuRequest
from nri_gpu.engine.selection import select

CAPS_DIR = "/dev/nvidia-caps"

RO_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
# Read-only: connect(2) needs write permission on the socket's inode, not a writable
# mount, and a FIFO opens for writing on a read-only mount (both tested); a writable
# bind would let a container's root chmod the host's socket or plant files in the
# host's MPS folder for the next tenant. A plain bind: nothing mounted below comes along.
IPC_OPTIONS = ("ro", "nosuid", "nodev", "noexec", "bind", "rprivate")

_DEVICE_FOR_CAPABILITY = {
    DeviceKind.UVM: frozenset({Capability.COMPUTE, Capability.VIDEO}),
    DeviceKind.UVM_TOOLS: frozenset({Capability.COMPUTE, Capability.VIDEO}),
    DeviceKind.MODESET: frozenset({Capability.DISPLAY}),
}


def plan(
    request: GpuRequest, inventory: Inventory, config: EngineConfig, *, ipc: tuple[DriverFile, ...] | None = None
) -> Plan:
    """The plan for ``request`` on this node. ``ipc``: the daemons' IPC endpoints as
    checked just now (``discover.current_ipc``), in place of the inventory's, which
    may be long out of date (a daemon stopped or started since, a folder replaced).

    Raises RequestError / UnknownDeviceError (selection) and RequirementError
    (an unmet NVIDIA_REQUIRE_* condition) before building anything.
    """
    selected = select(request, inventory, refuse_mig_mode=config.policy.refuse_mig_mode_gpus)
    gpus, migs = selected.gpus, selected.mig_devices
    # The GPUs whose device node, procfs folder and requirements count: whole ones and MIG parents.
    physical = tuple(dict.fromkeys((*gpus, *(m.parent for m in migs))))
    cap_nodes, proc_caps = _mig_caps(request, inventory, physical, migs)
    fabric_plan = fabric.plan_fabric(request.fabric, inventory.fabric, with_gpus=bool(gpus or migs))
    notes: list[str] = list(selected.notes)
    if request.requirements and config.policy.require_checks:
        facts = requirements.NodeFacts(cuda=inventory.cuda_version, driver=inventory.driver_version)
        notes.extend(requirements.check(request.requirements, facts, physical))
    caps = request.capabilities
    libraries = _libraries(inventory.libraries, caps)
    known = inventory.files
    if ipc is not None:
        known = tuple(f for f in known if f.kind is not FileKind.IPC) + ipc
    files = tuple(f for f in known if not f.capabilities or f.capabilities & caps)
    notes.extend(fabric_plan.notes)
    gfx = graphics.plan_graphics(caps, gpus, inventory, libraries, files)
    notes.extend(gfx.notes)
    return Plan(
        gpus=gpus,
        capabilities=caps,
        devices=_devices(physical, inventory, caps) + cap_nodes + fabric_plan.devices + gfx.devices,
        mounts=_mounts(libraries, files, config, fabric_plan.mounts),
        env=(
            ("NVIDIA_VISIBLE_DEVICES", ",".join((*(g.uuid for g in gpus), *(m.name for m in migs))) or "none"),
            ("NVIDIA_DRIVER_CAPABILITIES", ",".join(sorted(c.value for c in caps))),
        ),
        visible_bus_ids=tuple(sorted(g.bus_id for g in physical)),
        mig_devices=migs,
        proc_caps=proc_caps,
        proc_caps_all=request.mig_config,
        symlinks=_symlinks(libraries) + gfx.symlinks,
        ldconfig_folders=tuple(sorted({lib.folder for lib in libraries})),
        ld_cache_entries=_ld_cache_entries(libraries),
        ipc=tuple(sorted(f.path for f in files if f.kind is FileKind.IPC)),
        notes=tuple(notes),
        imex_channels=fabric_plan.imex_channels,
        features=fabric_plan.features,
        app_profile=gfx.app_profile,
    )


def _devices(gpus: tuple[Gpu, ...], inventory: Inventory, caps: frozenset[Capability]) -> tuple[DeviceNode, ...]:
    controls = {node.kind: node for node in inventory.control_devices}
    nodes: list[DeviceNode] = []
    if DeviceKind.CONTROL in controls:
        nodes.append(controls[DeviceKind.CONTROL])
    if inventory.nvidia_major is not None:
        nodes.extend(
            DeviceNode(f"/dev/nvidia{g.minor}", inventory.nvidia_major, g.minor, kind=DeviceKind.GPU)
            for g in sorted(gpus, key=lambda g: g.index)
        )
    for kind in (DeviceKind.UVM, DeviceKind.UVM_TOOLS, DeviceKind.MODESET):
        if kind in controls and _DEVICE_FOR_CAPABILITY[kind] & caps:
            nodes.append(controls[kind])
    return tuple(nodes)


def _mig_caps(
    request: GpuRequest, inventory: Inventory, physical: tuple[Gpu, ...], migs: tuple[MigDevice, ...]
) -> tuple[tuple[DeviceNode, ...], tuple[str, ...]]:
    """The ``nvidia-caps`` nodes and the ``capabilities/`` files (relative paths) of the
    MIG devices and grants. Raises RequestError where the node lacks what they need."""
    layout = inventory.mig
    wanted: dict[str, MigCap] = {}  # relative path under capabilities/ -> its cap
    for m in migs:
        folder = f"gpu{m.parent.minor}/mig/gi{m.gpu_instance.gi}"
        wanted[f"{folder}/access"] = m.gpu_instance.access
        wanted[f"{folder}/ci{m.compute_instance.ci}/access"] = m.compute_instance.access
    for granted, name, cap in (
        (request.mig_monitor, "monitor", layout.monitor),
        (request.mig_config, "config", layout.config),
    ):
        if not granted:
            continue
        if cap is None:
            raise RequestError(
                f"{request.source}: the MIG {name} capability was asked for, but this node has no "
                f"/proc/driver/nvidia/capabilities/mig/{name}"
            )
        wanted[f"mig/{name}"] = cap
    if request.mig_config:
        # Config reaches every instance of its GPUs (creating one needs no node; using
        # or destroying one does); instances made later need a new container.
        for gpu in physical:
            for gi in layout.instances_of(gpu.minor):
                wanted.setdefault(f"gpu{gpu.minor}/mig/gi{gi.gi}/access", gi.access)
                for ci in gi.compute_instances:
                    wanted.setdefault(f"gpu{gpu.minor}/mig/gi{gi.gi}/ci{ci.ci}/access", ci.access)
    if not wanted:
        return (), ()
    if layout.caps_major is None:
        raise RequestError(
            f"{request.source}: MIG capabilities need the nvidia-caps device major, which /proc/devices does not list"
        )
    nodes = {
        cap.minor: DeviceNode(
            f"{CAPS_DIR}/nvidia-cap{cap.minor}", layout.caps_major, cap.minor, "c", cap.mode, DeviceKind.MIG_CAP
        )
        for cap in wanted.values()
    }
    return tuple(nodes[minor] for minor in sorted(nodes)), tuple(sorted(wanted))


def _libraries(libraries: tuple[Library, ...], caps: frozenset[Capability]) -> tuple[Library, ...]:
    wanted = catalogue.wanted_library_capabilities(caps)
    compat32 = Capability.COMPAT32 in caps
    return tuple(lib for lib in libraries if lib.capabilities & wanted and (lib.is_64bit or compat32))


def host_source(node_path: str, config: EngineConfig) -> str:
    """The mount source of the node path ``node_path``, as the runtime sees it on the
    host. Raises EngineConfigError (``EngineConfig.to_host_path``)."""
    driver_root = config.driver_root
    ours = node_path if driver_root == "/" else posixpath.join(driver_root, node_path.lstrip("/"))
    return config.to_host_path(ours)


def ipc_in_mounts(mounts: Iterable[tuple[object, object]], config: EngineConfig) -> tuple[str, ...]:
    """The daemons' IPC endpoints among ``mounts`` ((source, destination) pairs): a
    mount at a catalogue endpoint from that endpoint's host path, sorted. What a
    container was actually given, where the plan that gave it is not at hand (a
    plugin restarted since, a CDI spec written long ago). Raises EngineConfigError
    (``host_source``)."""
    found: set[str] = set()
    for source, destination in mounts:
        if isinstance(destination, str) and destination in catalogue.IPC_TYPES:
            if source == host_source(destination, config):
                found.add(destination)
    return tuple(sorted(found))


def _mounts(
    libraries: tuple[Library, ...],
    files: tuple[DriverFile, ...],
    config: EngineConfig,
    others: tuple[tuple[str, str], ...] = (),
) -> tuple[Mount, ...]:
    """``others``: more (destination, source node path) read-only binds (GDS's files)."""

    def host(node_path: str) -> str:
        return host_source(node_path, config)

    mounts = {lib.path: Mount(host(lib.path), lib.path, RO_OPTIONS) for lib in libraries}
    for f in files:
        mounts.setdefault(f.path, Mount(host(f.source), f.path, IPC_OPTIONS if f.kind is FileKind.IPC else RO_OPTIONS))
    for destination, source in others:
        mounts.setdefault(destination, Mount(host(source), destination, RO_OPTIONS))
    # Parents before children, then by name: a stable order the runtime applies as is.
    return tuple(sorted(mounts.values(), key=lambda m: (m.destination.count("/"), m.destination)))


def _ld_cache_entries(libraries: tuple[Library, ...]) -> tuple[LdCacheEntry, ...]:
    """What ldconfig would list for the libraries in the container: each SONAME
    and, as glibc's ldconfig keys a ``lib*.so`` link whose name begins its
    target's SONAME under that name, each ``.so`` development link too."""
    entries: dict[tuple[str, str], LdCacheEntry] = {}
    for lib in libraries:
        stem = catalogue.library_stem(lib.soname)
        names = [lib.soname] if stem is None else [lib.soname, f"{stem}.so"]
        for name in names:
            path = posixpath.join(lib.folder, name)
            entry = LdCacheEntry(name, path, lib.cache_flags, lib.is_64bit, 0, lib.osversion)
            entries.setdefault((name, path), entry)
    return tuple(entries.values())


def _symlinks(libraries: tuple[Library, ...]) -> tuple[Symlink, ...]:
    links: dict[str, Symlink] = {}
    for lib in libraries:
        stem = catalogue.library_stem(lib.soname)
        if lib.soname != lib.basename:
            path = posixpath.join(lib.folder, lib.soname)
            links.setdefault(path, Symlink(path, lib.basename))
        if stem is not None:
            dev = posixpath.join(lib.folder, f"{stem}.so")
            links.setdefault(dev, Symlink(dev, lib.soname))
    return tuple(sorted(links.values(), key=lambda s: s.path))
