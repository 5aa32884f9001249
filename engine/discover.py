"""Discovery: the node's files -> ``Inventory``, without NVML.

Sources, all read through ``Root`` objects:

* ``<proc_root>/driver/nvidia/version``: the driver version; its absence means
  "no driver", which is an empty inventory, not an error;
* ``<proc_root>/driver/nvidia/gpus/<bus>/information``: one file per GPU. The
  GPU *index* is its position in PCI bus-id order (what nvidia-smi shows); the
  *minor* names ``/dev/nvidia<minor>`` and is often, not always, the same;
* ``<proc_root>/devices``: the majors of ``nvidia`` (``nvidia-frontend`` before
  550.40), ``nvidia-uvm`` and ``nvidia-caps``;
* ``<proc_root>/driver/nvidia/capabilities/``: the MIG layout (``engine.migfs``);
  when it shows MIG instances, and only then, NVML is asked for their ``MIG-`` UUIDs
  and ``i:j`` indexes (``engine.nvml``, in a child process);
* ``<dev_root>/dev/nvidia*``: which control nodes exist;
* the fabric and I/O nodes (``engine.fabric``): ``/dev/nvidia-fs*``,
  ``/dev/infiniband/uverbs*`` and ``rdma_cm``, ``/dev/gdrdrv``,
  ``/dev/nvidia-nvswitchctl`` and ``/dev/nvidia-nvswitch*``, each a character
  device (never a link followed) whose numbers and mode are taken as the host has
  them, at most ``FABRIC_LIMIT`` of each kind; the ``nvidia-caps-imex-channels``
  major and ``ImexChannelCount`` from ``params``; with nvidia-fs nodes, GDS's
  ``/etc/cufile.json`` and ``/run/udev/data`` under the driver root;
* ``<driver_root>/etc/ld.so.cache``: the driver libraries, kept when their file
  name carries the driver version, sorted into capabilities;
* the driver root's binary folders, GSP firmware and daemons' IPC endpoints;
* the graphics, display and OpenCL configuration files and X.Org modules
  (``catalogue.CONFIGS``, ``VULKAN_CONFIGS``, ``XORG_MODULES``) under the driver
  root, and each GPU's DRM nodes through ``<dev_root>/dev/dri/by-path/pci-<bus>-card``
  and ``-render``.

Anything optional that is missing or unreadable becomes a warning in the
inventory. Discovery runs once at start and again when ``fingerprint`` changes;
the daemons' IPC endpoints, which come and go with their daemons, are checked
again for each GPU container (``current_ipc``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import stat
import time
from collections.abc import Callable, Iterable

from nri_gpu.engine import catalogue, fabric, migfs, procfs
from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.ldcache import parse_ld_so_cache
from nri_gpu.engine.model import (
    Capability,
    ComputeInstance,
    DeviceKind,
    DeviceNode,
    DriverFile,
    DrmNodes,
    Fabric,
    FileKind,
    Gpu,
    GpuInstance,
    Inventory,
    Library,
    MigCap,
    MigLayout,
    NvmlSnapshot,
)
from nri_gpu.engine.root import Root

logger = logging.getLogger(__name__)

CudaVersionReader = Callable[[str], tuple[str | None, str | None]]
NvmlReader = Callable[[str], tuple[NvmlSnapshot | None, str | None]]

_GPUS = "/driver/nvidia/gpus"
_VERSION = "/driver/nvidia/version"
_CAPS = "/driver/nvidia/capabilities"
_CAP_FILE_LIMIT = 1024  # three short lines; anything longer is not the driver's
CONTROL_MINOR = 255
MODESET_MINOR = 254
FABRIC_LIMIT = 256  # nodes of one fabric kind taken (a node has 16 nvidia-fs, a few dozen uverbs)
# GDS's files, where the toolkit looks for them: under the driver root. /run/udev's
# database only: /run/udev also holds udevd's control socket, which a container's
# root could use to stop or reconfigure the host's udevd.
GDS_FILES = (("/etc/cufile.json", False), ("/run/udev/data", True))  # (path, is a folder)


def fingerprint(config: EngineConfig) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Cheap identity of the driver state: version file text, the GPU folder names,
    the MIG instances' folders (``gpu2/mig/gi2``, ``gpu2/mig/gi2/ci0``, ...), the
    fabric nodes' paths and the DRM by-path links (a module such as nvidia-fs or
    nvidia-drm is often loaded after us).

    A new driver (version line changes), GPUs appearing or disappearing (folders
    change) or GPU or compute instances created or destroyed make it differ;
    checking it costs two small reads and one listing per MIG folder (none on a
    node whose GPUs have no MIG capability folders).
    """
    proc = Root(config.proc_root)
    try:
        version = proc.read_text(_VERSION, limit=4096)
    except DiscoveryError:
        version = ""
    dev = Root(config.dev_root)
    try:
        fabric_paths = tuple(path for path, _ in _fabric_candidates(dev, []))
    except DiscoveryError:
        fabric_paths = ()
    # nvidia-drm, too, may be loaded after us: its by-path links come with it.
    try:
        drm_links = tuple(f"/dev/dri/by-path/{name}" for name in dev.listdir("/dev/dri/by-path")[:1024])
    except DiscoveryError:  # discovery warns and goes on; so does the fingerprint
        drm_links = ()
    migs = tuple(_placement_folder(p) for p in _mig_placements(proc))
    return version, tuple(proc.listdir(_GPUS)), migs, fabric_paths + drm_links


def _read_cuda_version(libcuda: str) -> tuple[str | None, str | None]:
    """``engine.cudaversion.read_cuda_version``, imported on first use: a caller that
    passes its own probe (tests, the benchmark) does not pay for its imports."""
    from nri_gpu.engine.cudaversion import read_cuda_version

    return read_cuda_version(libcuda)


def _read_nvml(libnvml: str) -> tuple[NvmlSnapshot | None, str | None]:
    """``engine.nvml.read_nvml``, imported on first use (as ``_read_cuda_version``)."""
    from nri_gpu.engine.nvml import read_nvml

    return read_nvml(libnvml)


def discover(
    config: EngineConfig, *, cuda_version: CudaVersionReader = _read_cuda_version, nvml: NvmlReader = _read_nvml
) -> Inventory:
    """Take the node's inventory. Raises nothing for missing pieces; see ``Inventory.warnings``.

    ``cuda_version`` and ``nvml`` take the host path of the 64-bit ``libcuda.so.1``
    and ``libnvidia-ml.so.1``; ``nvml`` is called only when procfs shows MIG instances.
    The defaults are the real probes, a child interpreter each.
    """
    warnings: list[str] = []
    proc, dev, driver = Root(config.proc_root), Root(config.dev_root), Root(config.driver_root)
    try:
        version = procfs.parse_driver_version(proc.read_text(_VERSION, limit=4096))
    except DiscoveryError as exc:
        warnings.append(f"no NVIDIA driver on this node: {exc}")
        return Inventory(None, None, (), (), None, (), (), tuple(warnings))

    majors = _majors(proc, warnings)
    nvidia_major = procfs.nvidia_major(majors)
    gpus = _gpus(proc, warnings)
    controls = _control_devices(dev, nvidia_major, majors.get("nvidia-uvm"), warnings)
    if nvidia_major is not None:
        for gpu in gpus:
            if not dev.exists(f"/dev/nvidia{gpu.minor}"):
                warnings.append(f"GPU {gpu.index} ({gpu.bus_id}): {dev.host_path(f'/dev/nvidia{gpu.minor}')} missing")
    libraries = _libraries(driver, version, warnings)
    ipc, ipc_warnings = current_ipc(config)
    warnings += ipc_warnings
    files = _binaries(driver) + _firmware(driver, version) + _configs(driver) + _xorg(driver, version, libraries) + ipc
    cuda = _cuda_version(driver, libraries, cuda_version, warnings)
    mig = _mig(proc, majors.get("nvidia-caps"), gpus, warnings)
    if mig.gpu_instances:
        mig = _nvml(driver, libraries, gpus, mig, nvml, warnings)
    found = _fabric(proc, dev, driver, majors, warnings)
    drm = _drm(dev, gpus, warnings)
    for warning in warnings:
        logger.warning("discovery: %s", warning)
    return Inventory(version, cuda, gpus, controls, nvidia_major, libraries, files, tuple(warnings), mig, found, drm)


def _majors(proc: Root, warnings: list[str]) -> dict[str, int]:
    try:
        return procfs.parse_proc_devices(proc.read_text("/devices", limit=1 << 20))
    except DiscoveryError as exc:
        warnings.append(f"device majors unknown: {exc}")
        return {}


def _gpus(proc: Root, warnings: list[str]) -> tuple[Gpu, ...]:
    found: list[tuple[str, procfs.GpuInformation]] = []
    for name in proc.listdir(_GPUS):
        path = f"{_GPUS}/{name}/information"
        try:
            info = procfs.parse_gpu_information(proc.read_text(path, limit=1 << 16), source=proc.host_path(path))
            bus_id = procfs.canonical_bus_id(info.bus_location)
        except (DiscoveryError, ValueError) as exc:
            warnings.append(f"GPU {name} skipped: {exc}")
            continue
        if info.excluded:
            warnings.append(f"GPU {bus_id} is excluded by the driver (NVreg_ExcludedGpus); not offered")
            continue
        found.append((bus_id, info))
    found.sort(key=lambda item: item[0])
    gpus = []
    for index, (bus_id, info) in enumerate(found):
        arch, brand = catalogue.gpu_facts(info.model)
        gpus.append(Gpu(index, info.minor, bus_id, info.uuid, info.model, arch, brand))
    minors = [g.minor for g in gpus]
    if len(set(minors)) != len(minors):
        warnings.append(f"GPUs share device minors {minors}; procfs is inconsistent")
    return tuple(gpus)


_Placement = tuple[int, int, int | None]  # (GPU device minor, gi, ci or None for the GPU instance itself)


def _mig_placements(
    proc: Root, minors: Iterable[int] | None = None, warnings: list[str] | None = None
) -> list[_Placement]:
    """The GPU and compute instance folders under ``capabilities``, each GPU instance
    followed by its compute instances, in the order of their numbers.

    Only names the driver can make are taken (``migfs``: 32 GPUs, 15 GPU instances,
    8 compute instances each), which bounds the answer to 4 320 entries and the
    listings to one per GPU and GPU instance, whatever else a tree holds.
    ``minors``: only those GPUs' folders (default: every ``gpu<M>`` there is). A
    folder that cannot be listed counts as empty (and is a warning when
    ``warnings`` is given): the fingerprint must not fail where discovery would not.
    """

    def names(path: str) -> list[str]:
        try:
            return proc.listdir(path)
        except DiscoveryError as exc:
            if warnings is not None:
                warnings.append(f"MIG folder skipped: {exc}")
            return []

    if minors is None:
        found = (migfs.gpu_dir_minor(name) for name in names(_CAPS))
        minors = [m for m in found if m is not None]
    out: list[_Placement] = []
    for minor in sorted({m for m in minors if 0 <= m <= migfs.MAX_GPU_MINOR}):
        gis = (migfs.gpu_instance_id(name) for name in names(f"{_CAPS}/gpu{minor}/mig"))
        for gi in sorted(g for g in gis if g is not None):
            out.append((minor, gi, None))
            cis = (migfs.compute_instance_id(name) for name in names(f"{_CAPS}/gpu{minor}/mig/gi{gi}"))
            out += [(minor, gi, ci) for ci in sorted(c for c in cis if c is not None)]
    return out


def _placement_folder(placement: _Placement) -> str:
    """``gpu2/mig/gi2`` or ``gpu2/mig/gi2/ci0``: where it lies under ``capabilities``."""
    minor, gi, ci = placement
    return f"gpu{minor}/mig/gi{gi}" + ("" if ci is None else f"/ci{ci}")


def _mig(proc: Root, caps_major: int | None, gpus: tuple[Gpu, ...], warnings: list[str]) -> MigLayout:
    """The MIG layout of the inventory's GPUs (by device minor) and the global caps.

    Instances come and go while this reads: a folder listed but gone by the time
    its access file is read was destroyed in between, and is left out without a
    word; the next fingerprint check notices the change. A GPU instance whose own
    access file cannot be read is left out with its compute instances (none of
    them can be used without it).
    """
    config = _cap(proc, f"{_CAPS}/mig/config", warnings)
    monitor = _cap(proc, f"{_CAPS}/mig/monitor", warnings)
    instances: list[GpuInstance] = []
    for placement in _mig_placements(proc, [g.minor for g in gpus], warnings):
        minor, gi, ci = placement
        parent = instances[-1] if instances else None
        if ci is not None and (parent is None or (parent.gpu_minor, parent.gi) != (minor, gi)):
            continue  # its GPU instance was left out
        cap = _cap(proc, f"{_CAPS}/{_placement_folder(placement)}/access", warnings)
        if cap is None:
            continue
        if ci is None:
            instances.append(GpuInstance(minor, gi, cap))
        elif parent is not None:
            cis = (*parent.compute_instances, ComputeInstance(ci, cap))
            instances[-1] = dataclasses.replace(parent, compute_instances=cis)
    if instances and caps_major is None:
        warnings.append("MIG instances exist but /proc/devices has no nvidia-caps major")
    return MigLayout(caps_major, config, monitor, tuple(instances))


def _cap(proc: Root, path: str, warnings: list[str]) -> MigCap | None:
    """One capability file; None, quietly, if it is not there (never was, or vanished)."""
    try:
        text = proc.read_text(path, limit=_CAP_FILE_LIMIT)
        parsed = migfs.parse_cap_file(text, source=proc.host_path(path))
    except DiscoveryError as exc:
        if proc.lstat(path) is not None:
            warnings.append(f"MIG capability skipped: {exc}")
        return None
    return MigCap("/proc" + path, parsed.minor, parsed.mode)


def _fabric_candidates(dev: Root, warnings: list[str]) -> list[tuple[str, DeviceKind]]:
    """The fabric node paths under the dev root and their kinds, at most
    ``FABRIC_LIMIT`` of each kind (by name). Raises DiscoveryError for a folder that
    cannot be listed."""

    def kind_in_dev(name: str) -> DeviceKind | None:
        if name.startswith("nvidia-fs"):
            return DeviceKind.NVIDIA_FS
        if name.startswith("nvidia-nvswitch"):  # nvidia-nvswitchctl and nvidia-nvswitch<n>
            return DeviceKind.NVSWITCH
        return DeviceKind.GDRDRV if name == "gdrdrv" else None

    def kind_in_infiniband(name: str) -> DeviceKind | None:
        return DeviceKind.INFINIBAND if name.startswith("uverbs") or name == "rdma_cm" else None

    found: list[tuple[str, DeviceKind]] = []
    counts: dict[DeviceKind, int] = {}
    for folder, kind_of in (("/dev", kind_in_dev), ("/dev/infiniband", kind_in_infiniband)):
        for name in sorted(dev.listdir(folder), key=_natural):
            kind = kind_of(name)
            if kind is None or not name.isprintable():
                continue
            counts[kind] = counts.get(kind, 0) + 1
            if counts[kind] == FABRIC_LIMIT + 1:
                warnings.append(f"more than {FABRIC_LIMIT} {kind.value} nodes under {dev.path}; the rest are left out")
            if counts[kind] <= FABRIC_LIMIT:
                found.append((f"{folder}/{name}", kind))
    return found


def _natural(name: str) -> tuple[str, int]:
    """``nvidia-fs2`` before ``nvidia-fs10``: the name without its trailing digits, then their value."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem) :]
    return stem, int(digits) if digits and len(digits) < 10 else -1


def _fabric(proc: Root, dev: Root, driver: Root, majors: dict[str, int], warnings: list[str]) -> Fabric:
    """The fabric and I/O devices: character devices only, never a link followed."""
    nodes: list[DeviceNode] = []
    try:
        candidates = _fabric_candidates(dev, warnings)
    except DiscoveryError as exc:
        warnings.append(f"fabric devices unknown: {exc}")
        candidates = []
    for path, kind in candidates:
        st = dev.lstat(path)
        if st is None:
            continue  # gone since the listing
        if not stat.S_ISCHR(st.st_mode):
            warnings.append(f"{dev.host_path(path)}: not a character device; skipped")
            continue
        rdev = st.st_rdev
        nodes.append(DeviceNode(path, os.major(rdev), os.minor(rdev), "c", stat.S_IMODE(st.st_mode) & 0o777, kind))
    gds: list[tuple[str, str]] = []
    if any(n.kind is DeviceKind.NVIDIA_FS for n in nodes):
        for path, folder in GDS_FILES:
            real = driver.resolve(path)
            if driver.is_dir(real) if folder else driver.is_file(real):
                gds.append((path, real))
    imex_major = majors.get(fabric.IMEX_MAJOR_NAME)
    count = _imex_channel_count(proc, warnings) if imex_major is not None else None
    return Fabric(imex_major, count, tuple(nodes), tuple(gds))


def _imex_channel_count(proc: Root, warnings: list[str]) -> int | None:
    try:
        params = procfs.parse_params(proc.read_text("/driver/nvidia/params", limit=1 << 16))
    except DiscoveryError as exc:
        warnings.append(f"IMEX channel count unknown: {exc}")
        return None
    count = procfs.imex_channel_count(params, fabric.DEFAULT_IMEX_CHANNEL_COUNT)
    if count is None:
        warnings.append(f"IMEX channel count unknown: ImexChannelCount is {params[procfs.IMEX_CHANNEL_COUNT]!r}")
    return count


def _control_devices(
    dev: Root, nvidia_major: int | None, uvm_major: int | None, warnings: list[str]
) -> tuple[DeviceNode, ...]:
    wanted: list[tuple[str, int | None, int, DeviceKind]] = [
        ("/dev/nvidiactl", nvidia_major, CONTROL_MINOR, DeviceKind.CONTROL),
        ("/dev/nvidia-uvm", uvm_major, 0, DeviceKind.UVM),
        ("/dev/nvidia-uvm-tools", uvm_major, 1, DeviceKind.UVM_TOOLS),
        ("/dev/nvidia-modeset", nvidia_major, MODESET_MINOR, DeviceKind.MODESET),
    ]
    nodes = []
    for path, major, minor, kind in wanted:
        if major is None:
            warnings.append(f"{path}: its major is not in /proc/devices")
        elif not dev.exists(path):
            warnings.append(f"{path}: not present under {dev.path}")
        else:
            nodes.append(DeviceNode(path, major, minor, kind=kind))
    return tuple(nodes)


def _libraries(driver: Root, version: str, warnings: list[str]) -> tuple[Library, ...]:
    try:
        entries = parse_ld_so_cache(driver.read_bytes("/etc/ld.so.cache"))
    except DiscoveryError as exc:
        warnings.append(f"driver libraries unknown: {exc}")
        return ()
    found: dict[tuple[str, bool], Library] = {}
    for entry in entries:
        real = driver.resolve(entry.path)
        caps = catalogue.library_capabilities(posixpath.basename(real), version)
        caps = caps or catalogue.own_version_library_capabilities(posixpath.basename(real))
        stem = catalogue.library_stem(entry.name)
        # The cache may also list a development link (libcuda.so); keep the SONAME entry.
        if caps is None or stem is None or entry.name == f"{stem}.so" or not driver.is_file(real):
            continue
        found.setdefault(
            (entry.name, entry.is_64bit), Library(entry.name, real, caps, entry.is_64bit, entry.flags, entry.osversion)
        )
    if not found:
        warnings.append(f"no libraries of driver {version} in {driver.host_path('/etc/ld.so.cache')}")
    return tuple(sorted(found.values(), key=lambda lib: (not lib.is_64bit, lib.soname)))


def _binaries(driver: Root) -> tuple[DriverFile, ...]:
    files = []
    for name, caps in catalogue.BINARIES.items():
        for folder in catalogue.BINARY_FOLDERS:
            path = f"{folder}/{name}"
            if driver.is_file(path):
                files.append(DriverFile(path, driver.resolve(path), FileKind.BINARY, caps))
                break
    return tuple(files)


def _firmware(driver: Root, version: str) -> tuple[DriverFile, ...]:
    seen: dict[str, DriverFile] = {}
    for folder in catalogue.FIRMWARE_FOLDERS:
        base = f"{folder}/{version}"
        for name in driver.listdir(base):
            path = f"{base}/{name}"
            if name.startswith("gsp") and name.endswith(".bin") and driver.is_file(path):
                source = driver.resolve(path)
                # /lib is often a link to /usr/lib: one mount per real file.
                seen.setdefault(source, DriverFile(path, source, FileKind.FIRMWARE, frozenset()))
    return tuple(seen.values())


def _configs(driver: Root) -> tuple[DriverFile, ...]:
    """The graphics and OpenCL configuration files (``catalogue.CONFIGS``, at the path
    found) and Vulkan's (``catalogue.VULKAN_CONFIGS``, under /etc in the container)."""
    found: list[DriverFile] = []
    for rel, caps in catalogue.CONFIGS:
        path = next((f"{d}/{rel}" for d in catalogue.CONFIG_FOLDERS if driver.is_file(f"{d}/{rel}")), None)
        if path is not None:
            found.append(DriverFile(path, driver.resolve(path), FileKind.CONFIG, caps))
    for rel in catalogue.VULKAN_CONFIGS:
        path = next((f"{d}/{rel}" for d in (*catalogue.CONFIG_FOLDERS, "") if driver.is_file(f"{d}/{rel}")), None)
        if path is not None:
            dest = f"{catalogue.VULKAN_CONFIG_FOLDER}/{rel}"
            found.append(DriverFile(dest, driver.resolve(path), FileKind.CONFIG, catalogue.GRAPHICS))
    return tuple(found)


def _xorg(driver: Root, version: str, libraries: tuple[Library, ...]) -> tuple[DriverFile, ...]:
    """X.Org's NVIDIA driver and GLX module (display), each the first found."""
    libcuda = next((lib for lib in libraries if lib.soname == "libcuda.so.1" and lib.is_64bit), None)
    folders = catalogue.xorg_folders(libcuda.folder if libcuda is not None else None)
    found = []
    for name in (m.format(version=version) for m in catalogue.XORG_MODULES):
        path = next((f"{d}/{name}" for d in folders if driver.is_file(f"{d}/{name}")), None)
        if path is not None:
            found.append(DriverFile(path, driver.resolve(path), FileKind.XORG, frozenset({Capability.DISPLAY})))
    return tuple(found)


_DRM_NAMES = {"card": "card", "render": "renderD"}  # by-path suffix -> node name prefix


def _drm(dev: Root, gpus: tuple[Gpu, ...], warnings: list[str]) -> tuple[DrmNodes, ...]:
    """Each GPU's DRM nodes through ``/dev/dri/by-path/pci-<bus>-{card,render}``.

    The links are resolved inside the dev root (never out of it), and only to
    ``/dev/dri/card<n>`` or ``/dev/dri/renderD<n>`` that is a character device;
    anything else is a warning. A GPU without links (nvidia-drm not loaded) is
    left out quietly: the plan says so to graphics containers.
    """
    found = []
    for gpu in gpus:
        nodes = []
        for suffix, prefix in _DRM_NAMES.items():
            link = f"/dev/dri/by-path/pci-{gpu.bus_id}-{suffix}"
            if dev.lstat(link) is None:
                continue
            try:
                real = dev.resolve(link)
            except DiscoveryError as exc:
                warnings.append(f"DRM node of GPU {gpu.bus_id} skipped: {exc}")
                continue
            folder, name = posixpath.split(real)
            number = name[len(prefix) :]
            st = dev.lstat(real)
            if folder != "/dev/dri" or not name.startswith(prefix) or not number.isdigit() or len(number) > 6:
                warnings.append(f"{dev.host_path(link)} leads to {real}, not /dev/dri/{prefix}<n>; skipped")
            elif st is None or not stat.S_ISCHR(st.st_mode):
                warnings.append(f"{dev.host_path(real)}: not a character device; skipped")
            else:
                mode = stat.S_IMODE(st.st_mode) & 0o777
                rdev = st.st_rdev
                nodes.append(
                    DeviceNode(real, os.major(rdev), os.minor(rdev), "c", mode, DeviceKind.DRM, st.st_uid, st.st_gid)
                )
        if nodes:
            found.append(DrmNodes(gpu.bus_id, tuple(nodes)))
    return tuple(found)


def current_ipc(config: EngineConfig) -> tuple[tuple[DriverFile, ...], tuple[str, ...]]:
    """The daemons' IPC endpoints as they are now, and why each one there is skipped.

    Discovery runs again only when the driver changes, but an endpoint's life is
    its daemon's: a stopped persistenced takes its socket away (runc would then fail
    every container naming it), one started later brings it, and once root's MPS
    folder is gone any local account may put a link to ``/`` in its place. So a
    GPU container's plan takes the endpoints from this, at its CreateContainer: one
    ``O_PATH`` walk per catalogue entry (about 40 microseconds for all three).
    Discovery takes them from here too.

    ``/tmp`` and ``/run`` are where any local account can plant a link to ``/`` or a
    folder of its own, which every GPU container would then get. The source is the
    path itself (no link resolved), and only an entry no one but root can change is
    taken; anything else there is skipped with a warning that says why.
    """
    driver = Root(config.driver_root)
    warnings: list[str] = []
    files = []
    for path, expected, caps in catalogue.IPC:
        if path == catalogue.MPS_PIPE_DIRECTORY and not config.mps:
            continue
        try:
            if driver.root_only_stat(path, expected) is not None:
                files.append(DriverFile(path, path, FileKind.IPC, caps))
        except DiscoveryError as exc:
            warnings.append(f"IPC endpoint {path} skipped: {exc}")
    return tuple(files), tuple(warnings)


def _cuda_version(
    driver: Root, libraries: tuple[Library, ...], reader: CudaVersionReader, warnings: list[str]
) -> str | None:
    libcuda = next((lib for lib in libraries if lib.soname == "libcuda.so.1" and lib.is_64bit), None)
    if libcuda is None:
        warnings.append("CUDA version unknown: no 64-bit libcuda.so.1 among the driver libraries")
        return None
    version, why = reader(driver.host_path(libcuda.path))
    if version is None:
        warnings.append(f"CUDA version unknown: {why}")
    return version


def _nvml(
    driver: Root,
    libraries: tuple[Library, ...],
    gpus: tuple[Gpu, ...],
    mig: MigLayout,
    reader: NvmlReader,
    warnings: list[str],
) -> MigLayout:
    """``mig`` with NVML's view (checked against procfs), or with why there is none."""
    libnvml = next((lib for lib in libraries if lib.soname == "libnvidia-ml.so.1" and lib.is_64bit), None)
    if libnvml is None:
        why = "NVML unavailable: no 64-bit libnvidia-ml.so.1 among the driver libraries"
    else:
        snapshot, error = reader(driver.host_path(libnvml.path))
        if snapshot is not None:
            from nri_gpu.engine.nvml import check_against_procfs  # imported on first use, as _read_nvml

            checked, found = check_against_procfs(snapshot, gpus, mig)
            warnings += found
            return dataclasses.replace(mig, nvml=checked, nvml_error=None)
        why = error or "NVML unavailable: the probe gave no reason"
    # Not an inventory warning: ``nvml_error`` carries it to ``info`` and to the refusal
    # of a request that needs NVML; requests by placement are served without it.
    logger.warning("discovery: MIG devices can be requested by placement only (no MIG UUIDs, no i:j): %s", why)
    return dataclasses.replace(mig, nvml=None, nvml_error=why)


class InventoryCache:
    """The inventory, taken again only when the driver state changes.

    ``get()`` is cheap enough for every request: at most every ``interval``
    seconds it compares ``fingerprint`` (two small procfs reads and a few
    listings of the MIG folders) with the last one and re-runs discovery when a
    new driver was loaded, GPUs appeared or disappeared or MIG instances were
    created or destroyed. That discovery runs a CUDA probe and, with MIG instances, an NVML
    probe (seconds at worst), and the NVML snapshot is cached with the inventory, so an
    event loop never calls ``get()``: it reads ``current`` and runs ``refresh()``
    in a thread (``plugin.inventory``); the inventory is replaced in a single
    assignment once the new one is complete.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        interval: float = 10.0,
        take: Callable[[EngineConfig], Inventory] = discover,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._interval = interval
        self._take = take
        self._clock = clock
        self._fingerprint = fingerprint(config)
        self._inventory = take(config)
        self._checked = clock()

    @property
    def current(self) -> Inventory:
        """The inventory as last taken; checks nothing."""
        return self._inventory

    @property
    def interval(self) -> float:
        """Seconds between two checks of the fingerprint."""
        return self._interval

    def get(self) -> Inventory:
        if self._clock() - self._checked >= self._interval:
            self.refresh()
        return self._inventory

    def refresh(self, *, force: bool = False) -> bool:
        """Check now; True if the driver state changed and the inventory was taken again.
        ``force``: take it again even when the fingerprint is the same (a MIG instance
        destroyed and made again under the same ids keeps its procfs folders, but NVML
        gives it a new UUID)."""
        self._checked = self._clock()
        current = fingerprint(self._config)
        if current == self._fingerprint and not force:
            return False
        logger.info("driver state changed; taking the node's inventory again")
        inventory = self._take(self._config)
        # Only now: a discovery that raised is tried again at the next check.
        self._fingerprint, self._inventory = current, inventory
        return True
