"""The engine's values: what a node has, what a container asked for, what it gets.  (pure)

Frozen dataclasses only. Paths inside an ``Inventory`` are *node paths*: what the
path is on a host whose driver root is ``/`` (``/usr/lib/x86_64-linux-gnu/libcuda.so.1``),
so the same inventory reads the same whether the driver lives at ``/`` or under
``/run/nvidia/driver``; the plan adds the driver root back for mount sources.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Capability(enum.Enum):
    """``NVIDIA_DRIVER_CAPABILITIES`` values."""

    COMPUTE = "compute"
    COMPAT32 = "compat32"
    GRAPHICS = "graphics"
    UTILITY = "utility"
    VIDEO = "video"
    DISPLAY = "display"
    NGX = "ngx"


ALL_CAPABILITIES = frozenset(Capability)
DEFAULT_CAPABILITIES = frozenset({Capability.UTILITY, Capability.COMPUTE})


@dataclass(frozen=True)
class Gpu:
    """One whole GPU, from ``/proc/driver/nvidia/gpus/<bus>/information``.

    ``index`` is the position in PCI bus-id order (what nvidia-smi shows);
    ``minor`` names the device node ``/dev/nvidia<minor>`` and may differ.
    """

    index: int
    minor: int
    bus_id: str  # as procfs names the directory: "0000:07:00.0"
    uuid: str  # "GPU-8e9f...": as the driver prints it
    model: str
    arch: str | None = None  # compute capability "8.0", when known
    brand: str | None = None  # "tesla", "geforce", ... when known


@dataclass(frozen=True)
class LdCacheEntry:
    """One entry of glibc's ld.so.cache: ``libcuda.so.1 (libc6,x86-64) => /usr/lib/.../libcuda.so.1``."""

    name: str  # the key, normally the SONAME: "libcuda.so.1"
    path: str  # as written in the cache (relative to the root ldconfig ran for)
    flags: int  # raw glibc flags word
    is_64bit: bool  # x86-64 (or another 64-bit ABI) vs 32-bit (i386)
    hwcap: int = 0
    osversion: int = 0  # the minimum kernel from the library's ABI note ("OS ABI: Linux 3.2.0"), 0 if none


@dataclass(frozen=True)
class Library:
    """A driver library found through the ld.so cache.

    ``path`` is the real file (``libcuda.so.550.163.01``) after resolving the
    cache entry's symlink within the driver root; ``soname`` is the cache key.
    """

    soname: str  # "libcuda.so.1"
    path: str  # node path of the real file: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.163.01"
    capabilities: frozenset[Capability]
    is_64bit: bool = True
    # The node cache entry's flags word and ABI note, given to the container's cache
    # as they are (the loader takes only entries of its own ABI). 0: made by hand.
    cache_flags: int = 0
    osversion: int = 0

    @property
    def folder(self) -> str:
        return self.path.rsplit("/", 1)[0] or "/"

    @property
    def basename(self) -> str:
        return self.path.rsplit("/", 1)[1]


class FileKind(enum.Enum):
    BINARY = "binary"
    FIRMWARE = "firmware"
    IPC = "ipc"  # a daemon's socket or pipe folder: mounted read-only (connecting needs no writable mount)
    CONFIG = "config"  # a graphics or OpenCL configuration or data file (ICD JSONs, nvoptix.bin, xorg.conf.d)
    XORG = "xorg"  # an X.Org module (nvidia_drv.so, libglxserver_nvidia.so.<version>)


class EntryType(enum.Enum):
    """What an IPC endpoint must be; anything else at its path is refused."""

    SOCKET = "socket"
    DIRECTORY = "directory"


@dataclass(frozen=True)
class DriverFile:
    """A binary, firmware blob or IPC endpoint injected as a bind mount.

    ``path`` is where it appears (in the container, as on the node); ``source`` is
    the node path of the real file after links (``/usr/bin/nvidia-smi`` may be a
    link into ``/usr/lib/nvidia/current``).
    """

    path: str
    source: str
    kind: FileKind
    capabilities: frozenset[Capability]  # empty = every GPU container gets it


class DeviceKind(enum.Enum):
    CONTROL = "control"  # /dev/nvidiactl
    GPU = "gpu"  # /dev/nvidia<minor>
    UVM = "uvm"  # /dev/nvidia-uvm
    UVM_TOOLS = "uvm-tools"  # /dev/nvidia-uvm-tools
    MODESET = "modeset"  # /dev/nvidia-modeset
    MIG_CAP = "mig-cap"  # /dev/nvidia-caps/nvidia-cap<minor>: a MIG instance's, monitor's or config's capability
    IMEX_CHANNEL = "imex-channel"  # /dev/nvidia-caps-imex-channels/channel<n>
    NVIDIA_FS = "nvidia-fs"  # /dev/nvidia-fs<n> (GPUDirect Storage)
    INFINIBAND = "infiniband"  # /dev/infiniband/uverbs<n>, /dev/infiniband/rdma_cm (MOFED)
    GDRDRV = "gdrdrv"  # /dev/gdrdrv (GDRCopy)
    NVSWITCH = "nvswitch"  # /dev/nvidia-nvswitchctl, /dev/nvidia-nvswitch<n>
    DRM = "drm"  # /dev/dri/card<n>, /dev/dri/renderD<n> (nvidia-drm)


class Feature(enum.Enum):
    """The toolkit's feature-gated device sets, each asked for with ``NVIDIA_<NAME>=enabled``."""

    GDS = "gds"
    MOFED = "mofed"
    GDRCOPY = "gdrcopy"
    NVSWITCH = "nvswitch"

    @property
    def env(self) -> str:
        return "NVIDIA_" + self.name


@dataclass(frozen=True)
class DeviceNode:
    """A character device for the container: path in the container, numbers, mode."""

    path: str
    major: int
    minor: int
    type: str = "c"
    mode: int = 0o666
    kind: DeviceKind = DeviceKind.GPU
    # The host node's owner, where its group grants access (DRM nodes: root:video 0660,
    # root:render 0660): the container's node gets them, as a runtime copying the
    # host's node does. None: root's.
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True)
class MigCap:
    """A MIG capability: the ``nvidia-caps`` device minor and mode its procfs file names."""

    path: str  # node path of the procfs file: "/proc/driver/nvidia/capabilities/gpu2/mig/gi2/access"
    minor: int  # of /dev/nvidia-caps/nvidia-cap<minor>
    mode: int  # DeviceFileMode: 0o444 for instances and monitor, 0o400 for config


@dataclass(frozen=True)
class ComputeInstance:
    """``capabilities/gpu<M>/mig/gi<G>/ci<C>``: one compute instance of a GPU instance."""

    ci: int  # 0..7
    access: MigCap


@dataclass(frozen=True)
class GpuInstance:
    """``capabilities/gpu<M>/mig/gi<G>``: one GPU instance and its compute instances.

    ``gpu_minor`` is the parent's device minor (``/dev/nvidia<M>``), not its index.
    """

    gpu_minor: int
    gi: int  # the swizzId, 0..14
    access: MigCap
    compute_instances: tuple[ComputeInstance, ...] = ()  # by ci


@dataclass(frozen=True)
class NvmlMigDevice:
    """One MIG device as NVML lists it under its GPU."""

    index: int  # j of "i:j": NVML's raw index on its GPU (gaps kept, as go-nvlib does)
    uuid: str  # "MIG-..." as NVML prints it
    gi: int  # GPU instance id (the swizzId of capabilities/gpu<M>/mig/gi<G>)
    ci: int  # compute instance id


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML sees it: what procfs cannot tell (its MIG mode and MIG devices)."""

    index: int  # i of "i:j": NVML's index
    uuid: str  # "GPU-..."
    minor: int  # /dev/nvidia<minor>: matched against procfs with the UUID
    mig_current: bool | None  # None: MIG not supported on this GPU
    mig_pending: bool | None
    mig_devices: tuple[NvmlMigDevice, ...] = ()


@dataclass(frozen=True)
class NvmlSnapshot:
    """What the NVML probe reported (``engine.nvml``), already checked against procfs:
    every GPU matched by UUID and minor, every MIG device's (GPU, GI, CI) present."""

    gpus: tuple[NvmlGpu, ...] = ()

    def gpu(self, uuid: str) -> NvmlGpu | None:
        wanted = uuid.lower()
        return next((g for g in self.gpus if g.uuid.lower() == wanted), None)


@dataclass(frozen=True)
class MigLayout:
    """The MIG instances procfs shows, without NVML: placements and capability minors.

    No GPU instance means MIG is off *or* on with nothing carved out: procfs does
    not tell the two apart (only NVML knows the mode), and either way there is
    nothing MIG to hand out. MIG UUIDs and NVML's ``i:j`` indexes are not here.
    """

    caps_major: int | None = None  # "nvidia-caps" in /proc/devices
    config: MigCap | None = None  # capabilities/mig/config
    monitor: MigCap | None = None  # capabilities/mig/monitor
    gpu_instances: tuple[GpuInstance, ...] = ()  # by (gpu_minor, gi)
    # NVML's view, probed only when procfs shows instances (None otherwise, or when
    # the probe failed: ``nvml_error`` then says why, for the request it fails).
    nvml: NvmlSnapshot | None = None
    nvml_error: str | None = None

    def instance(self, gpu_minor: int, gi: int) -> GpuInstance | None:
        return next((g for g in self.gpu_instances if g.gpu_minor == gpu_minor and g.gi == gi), None)

    def instances_of(self, gpu_minor: int) -> tuple[GpuInstance, ...]:
        return tuple(g for g in self.gpu_instances if g.gpu_minor == gpu_minor)


@dataclass(frozen=True)
class MigDevice:
    """One MIG device a container gets: a compute instance of a GPU instance of ``parent``.

    ``uuid`` and ``index`` (``"i:j"``) are NVML's, when it was asked; without them
    the device is named by its placement, ``MIG-GPU-<parent uuid>/<gi>/<ci>``,
    which the driver and NVML accept too.
    """

    parent: Gpu
    gpu_instance: GpuInstance
    compute_instance: ComputeInstance
    uuid: str | None = None
    index: str | None = None

    @property
    def name(self) -> str:
        """What ``NVIDIA_VISIBLE_DEVICES`` names it by in the container."""
        if self.uuid is not None:
            return self.uuid
        return f"MIG-{self.parent.uuid}/{self.gpu_instance.gi}/{self.compute_instance.ci}"

    @property
    def placement(self) -> str:
        """``gpu2/mig/gi2/ci0``: where its capability lies under ``capabilities/``."""
        return f"gpu{self.parent.minor}/mig/gi{self.gpu_instance.gi}/ci{self.compute_instance.ci}"


@dataclass(frozen=True)
class Fabric:
    """The node's fabric and I/O devices beside the GPUs (``engine.fabric``).

    ``nodes``: the character devices found under the dev root, numbers and mode as
    the host's node has them (kinds ``NVIDIA_FS``, ``INFINIBAND``, ``GDRDRV``,
    ``NVSWITCH``), ``/dev`` then ``/dev/infiniband``, by name. IMEX channels are not listed: a container's channel
    node is made from ``imex_major`` and the channel number, host node or not.
    ``gds_files``: (path, node path of the real entry under the driver root) of
    ``/etc/cufile.json`` and ``/run/udev/data``, looked for only when nvidia-fs
    nodes exist.
    """

    imex_major: int | None = None  # "nvidia-caps-imex-channels" in /proc/devices
    imex_channel_count: int | None = None  # ImexChannelCount in params; None: unknown
    nodes: tuple[DeviceNode, ...] = ()
    gds_files: tuple[tuple[str, str], ...] = ()

    def nodes_of(self, kind: DeviceKind) -> tuple[DeviceNode, ...]:
        return tuple(n for n in self.nodes if n.kind is kind)


@dataclass(frozen=True)
class DrmNodes:
    """One GPU's DRM nodes (``nvidia-drm``), found through ``/dev/dri/by-path/pci-<bus>-card``
    and ``-render``: ``/dev/dri/card<n>`` and ``/dev/dri/renderD<n>``, numbers and mode
    as the host's nodes have them."""

    bus_id: str
    nodes: tuple[DeviceNode, ...]


@dataclass(frozen=True)
class Inventory:
    """Everything the engine knows about the node; made once by discovery, then read-only."""

    driver_version: str | None  # "550.163.01"; None when there is no driver
    cuda_version: str | None  # "12.4" as cuDriverGetVersion reports it; None if unknown
    gpus: tuple[Gpu, ...]
    control_devices: tuple[DeviceNode, ...]  # nvidiactl, uvm, uvm-tools, modeset (those the node has)
    nvidia_major: int | None
    libraries: tuple[Library, ...]
    files: tuple[DriverFile, ...]  # binaries, firmware, IPC sockets
    warnings: tuple[str, ...] = ()
    mig: MigLayout = MigLayout()  # empty on a node without MIG capability files
    fabric: Fabric = Fabric()  # IMEX, GDS, MOFED, GDRCOPY and NVSWITCH devices
    drm: tuple[DrmNodes, ...] = ()  # the GPUs' DRM nodes, by bus id; a GPU without any is not listed

    def drm_nodes(self, bus_id: str) -> tuple[DeviceNode, ...] | None:
        """The DRM nodes of the GPU at ``bus_id``; None when it has none."""
        return next((d.nodes for d in self.drm if d.bus_id == bus_id), None)

    @property
    def has_driver(self) -> bool:
        return self.driver_version is not None


@dataclass(frozen=True)
class Mount:
    """A bind mount: ``source`` on the host, ``destination`` in the container."""

    source: str
    destination: str
    options: tuple[str, ...] = ("ro", "nosuid", "nodev", "rbind", "rprivate")


@dataclass(frozen=True)
class Symlink:
    """A link to create in the container at start: ``path`` -> ``target``."""

    path: str
    target: str


@dataclass(frozen=True)
class Plan:
    """Exactly what one container gets. Empty for a container that asked for nothing."""

    gpus: tuple[Gpu, ...] = ()  # whole GPUs (a MIG device's parent is in ``mig_devices`` only)
    capabilities: frozenset[Capability] = frozenset()
    devices: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # Work for container start (inside its mount namespace):
    visible_bus_ids: tuple[str, ...] = ()  # what stays under /proc/driver/nvidia/gpus
    # MIG: the devices granted, and what the view shows under capabilities/
    # (paths relative to it, sorted: "gpu2/mig/gi2/access", "mig/monitor", ...);
    # ``proc_caps_all``: the whole capabilities/ folder instead (a MIG config grant,
    # which must see instances created after its start).
    mig_devices: tuple[MigDevice, ...] = ()
    proc_caps: tuple[str, ...] = ()
    proc_caps_all: bool = False
    symlinks: tuple[Symlink, ...] = ()
    ldconfig_folders: tuple[str, ...] = ()
    ld_cache_entries: tuple[LdCacheEntry, ...] = ()  # what the container's ld.so.cache gains
    # The IPC endpoints mounted (node paths, sorted): at start, each mount must
    # still be the root-only entry at its host path (``StartWork.ipc``).
    ipc: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())  # decisions worth a log line (capabilities capped, ...)
    # Fabric and I/O devices granted (their nodes and mounts are in ``devices`` and ``mounts``).
    imex_channels: tuple[int, ...] = ()
    features: tuple[Feature, ...] = ()
    # Graphics on some of the node's GPUs: the NVIDIA application profile written at
    # start (``engine.graphics.APP_PROFILE_PATH``) that limits EGL and Vulkan to them.
    app_profile: str = ""

    @property
    def is_empty(self) -> bool:
        return not (self.devices or self.mounts or self.env)

    @property
    def device_names(self) -> tuple[str, ...]:
        """The whole GPUs' UUIDs, then the MIG devices' names: ``NVIDIA_VISIBLE_DEVICES``."""
        return tuple(g.uuid for g in self.gpus) + tuple(m.name for m in self.mig_devices)
