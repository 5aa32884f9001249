"""A simulated GPU node: the REAL NVIDIA 550.163.01 user-space files, fake procfs and /dev.

The engine reads a node through three roots (``--driver-root``, ``--dev-root``,
``--proc-root``). ``build_node(ROOT)`` fills a directory so that all three point into it
and the engine cannot tell it from a host with a loaded driver and no GPU work running:

* **Driver files** (under ``driver_root``) are NVIDIA's own binaries from Debian
  ``trixie`` (non-free, contrib, non-free-firmware), version ``550.163.01-2``, re-laid
  out to the FLAT paths NVIDIA's ``.run`` installer uses on x86-64 Debian/Ubuntu:
  ``usr/lib/x86_64-linux-gnu/lib<name>.so.550.163.01`` plus the SONAME link
  (``libcuda.so.1 -> libcuda.so.550.163.01``, the SONAME read from the ELF itself) and
  the unversioned ``.so`` link where Debian's runtime package ships one; 32-bit copies in
  ``usr/lib/i386-linux-gnu/``; binaries in ``usr/bin/`` (the real ELF files, never Debian's
  alternatives or wrapper scripts); GSP firmware in ``lib/firmware/nvidia/550.163.01/``.
  Debian's own layout (``.../nvidia/current/`` and alternatives) is deliberately NOT
  reproduced: the installer's layout is what most GPU hosts and the GPU operator's driver
  container have. ``etc/ld.so.cache`` is written by this machine's real glibc
  ``ldconfig -r`` from ``etc/ld.so.conf`` (Debian's ``include /etc/ld.so.conf.d/*.conf``
  form), so the paths in it are node paths (``/usr/lib/x86_64-linux-gnu/libcuda.so.1``).
  One non-NVIDIA library (zlib, from trixie too, so every machine gets the same cache)
  sits beside them: a real host's cache is never NVIDIA-only.
* **procfs** (under ``proc_root``): ``driver/nvidia/{version,params,registry}``,
  ``driver/nvidia/gpus/<bus>/{information,registry,power}``, minimal
  ``driver/nvidia/capabilities/`` and ``driver/nvidia-caps/*-minors``, and ``devices``.
  With ``mig=``, also every GPU's ``capabilities/gpu<minor>/mig/`` and the GPU and
  compute instances asked for (``gi<G>/access``, ``gi<G>/ci<C>/access``, minors as
  ``mig-minors`` lists them), with their ``/dev/nvidia-caps/nvidia-cap<N>`` nodes;
  ``reconfigure_mig`` makes instances disappear and appear on a built node.
* **NVML** (with ``mig=`` only): the real 64-bit ``libnvidia-ml.so.550.163.01`` is
  replaced by a simulated one (``nvmlsim.c``, built with gcc) that lists the GPUs,
  their MIG mode and MIG devices from ``nvml-sim.txt`` beside it, as NVML would on a
  host with that layout: ``MIG-`` UUIDs are a hash of the GPU UUID, GI and CI, and
  the raw index ``j`` of ``i:j`` has a gap (no ``j=1`` on a GPU with three or more
  MIG devices) so that nothing can compute it from a position (``SimNode.mig_devices``).
  ``nvml="real"`` keeps the real library, whose ``nvmlInit_v2`` returns 9, Driver
  Not Loaded.
  Every format is the one the 550.163.01 kernel module prints (checked against
  ``nv-procfs.c``, ``nv-reg.h`` and ``nv-caps.c`` of Debian's nvidia-kernel-source
  550.163.01-2, and a ``version``/``information`` pair read from a real 550.163.01 host).
* **Device nodes** (under ``dev_root/dev``): ``nvidiactl`` 195:255, ``nvidia<minor>``
  195:<minor>, ``nvidia-modeset`` 195:254, ``nvidia-uvm`` UVM:0, ``nvidia-uvm-tools`` UVM:1,
  ``nvidia-caps/nvidia-cap{1,2}`` (MIG config/monitor). With ``fabric=True`` also the
  fabric and I/O nodes (``FABRIC_NODES``: nvidia-fs, infiniband uverbs and rdma_cm,
  gdrdrv, nvswitch; no IMEX channel node, as the driver makes none by default), the
  majors their drivers register in ``/proc/devices``, and GDS's ``etc/cufile.json``
  and ``run/udev/data/`` under the driver root. They are real character devices
  (``os.mknod``) when running as root, else EMPTY REGULAR FILES with the same names: a
  test that needs ``S_ISCHR`` must check ``SimNode.real_device_nodes``.
  With ``drm=True`` (the default) also nvidia-drm's nodes: ``dri/card0`` is the BMC's VGA
  (an ASPEED at ``0000:02:00.0``, as on most servers), then ``dri/card<index + 1>`` (226,
  mode 0660) and ``dri/renderD<128 + index>`` (0666) per GPU, with udev's
  ``dri/by-path/pci-<bus>-card`` and ``-render`` links; so card and render numbers are
  neither the GPU's index nor its minor (``SimNode.drm_nodes``). Excluded GPUs get none.

GPU indexes are positions in bus-id order (what NVML shows); the device minors are a
fixed permutation that is NOT the bus order (DGX-like ``[2,3,0,1,6,7,4,5,...]``) so a
mix-up of index and minor shows. UUIDs are a hash of the bus id: stable across runs,
hence usable in golden files.

Packages (all ``550.163.01-2`` from trixie unless noted; amd64 unless noted):

* compute/utility: libcuda1, libcudadebugger1, libnvidia-ptxjitcompiler1, libnvidia-nvvm4,
  libnvidia-gpucomp, libnvidia-ml1, libnvidia-cfg1, libnvidia-api1, libnvidia-pkcs11-openssl3,
  nvidia-opencl-icd, nvidia-opencl-common, nvidia-smi, nvidia-cuda-mps,
  nvidia-persistenced (its own source package, ``550.163.01-1`` from contrib: same driver
  version)
* video: libnvcuvid1, libnvidia-encode1, libnvidia-opticalflow1, nvidia-vdpau-driver
* graphics: libnvidia-eglcore (+ glsi), libnvidia-glcore (+ tls), libglx-nvidia0,
  libegl-nvidia0, libgles-nvidia1, libgles-nvidia2, libnvidia-glvkspirv, libnvidia-rtcore,
  libnvoptix1, libnvidia-fbc1, libnvidia-allocator1, nvidia-vulkan-common (the Vulkan ICD and
  layer JSONs), nvidia-egl-common (the EGL vendor JSON); libnvidia-egl-gbm1 (``1.1.2.1-*``) and
  libnvidia-egl-wayland1 (``1:1.1.18-*``), from main, with their own library versions and
  external-platform JSONs. ``nvidia-vulkan-icd`` and ``nvidia-egl-icd`` are empty dependency
  packages; ``libnvidia-egl-xcb1``/``-xlib1`` (egl-x11) are not in trixie.
* display: xserver-xorg-video-nvidia (``nvidia_drv.so`` and ``libglxserver_nvidia.so.<ver>``
  in ``usr/lib/xorg/modules/{drivers,extensions}``, ``nvidia-drm-outputclass.conf`` in
  ``usr/share/X11/xorg.conf.d``, as the installer lays them out)
* ngx: libnvidia-ngx1
* firmware: firmware-nvidia-gsp
* i386: libcuda1, libnvidia-ml1, libnvidia-ptxjitcompiler1
* not NVIDIA: zlib1g (``1:1.3.dfsg+really1.3.1-*``, whichever build the suite has)

Not in Debian at this version, hence absent: ``nvidia-debugdump``, ``libnvidia-nscq``,
``nv-fabricmanager``, ``nvidia-imex``.

Caching: the packages come through ``debs.extract`` (one private apt config for all of
them). The assembled driver tree is kept under ``<cache>/gpunode/`` keyed by a hash of the
package list and of ``_LAYOUT_VERSION``, and each node gets HARD LINKS to it (a copy only
when the cache is on another filesystem), so a warm ``build_node`` takes milliseconds
and no disk. Consequence: never write INTO a driver file of a node (that would change the
cache); unlink it and create a new one instead. The small mutable files (``etc/ld.so.*``)
are real copies.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import functools
import hashlib
import json
import logging
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import debs, nvmlsim
from .cache import cache_dir, locked
from .nvmlsim import SimNvmlGpu, SimNvmlMig

__all__ = [
    "CAPS_MAJOR",
    "DRIVER_VERSION",
    "DRM_MAJOR",
    "FABRIC_NODES",
    "FIXTURE_DRIVER",
    "FIXTURE_NO_DRIVER",
    "FS_MAJOR",
    "GDRDRV_MAJOR",
    "IMEX_MAJOR",
    "MAX_GPUS",
    "NVIDIA_MAJOR",
    "NVSWITCH_MAJOR",
    "PACKAGES",
    "UVERBS_MAJOR",
    "UVM_MAJOR",
    "MigSpec",
    "SimGpu",
    "SimNode",
    "SimNvmlMig",
    "build_node",
    "cap_minor",
    "driver_tree",
    "elf_soname",
    "information_file",
    "ldconfig_binary",
    "ldconfig_version",
    "no_driver_tree",
    "reconfigure_mig",
    "run_ldconfig",
    "set_nvml_behaviour",
    "sim_mig_devices",
]

log = logging.getLogger(__name__)

DRIVER_VERSION = "550.163.01"
SUITE = "trixie"
# main for zlib; the driver is split over non-free (libraries), contrib (persistenced)
# and non-free-firmware (GSP).
COMPONENTS = ("main", "contrib", "non-free", "non-free-firmware")
# The 32-bit compat libraries (libcuda1:i386 ...) are all in non-free: they get their
# own apt lists with that component alone, so that a mirror caught mid-sync on another
# component's i386 index (seen: "File has unexpected size") cannot block the node.
COMPONENTS_I386 = ("non-free",)
_DEB = f"{DRIVER_VERSION}-2"
# A non-NVIDIA library every real ld.so.cache also lists (and all a driverless node has).
# A glob: Debian rebuilds zlib in point releases (-1+b1 became -1+deb13u1); any build will do.
_ZLIB = ("zlib1g", "1:1.3.dfsg+really1.3.1-*")

# (package, Debian version). Order only matters for readability.
PACKAGES: tuple[tuple[str, str], ...] = (
    # compute and utility
    ("libcuda1", _DEB),
    ("libcudadebugger1", _DEB),
    ("libnvidia-ptxjitcompiler1", _DEB),
    ("libnvidia-nvvm4", _DEB),
    ("libnvidia-gpucomp", _DEB),
    ("libnvidia-ml1", _DEB),
    ("libnvidia-cfg1", _DEB),
    ("libnvidia-api1", _DEB),
    ("libnvidia-pkcs11-openssl3", _DEB),
    ("nvidia-opencl-icd", _DEB),
    ("nvidia-opencl-common", _DEB),
    ("nvidia-smi", _DEB),
    ("nvidia-cuda-mps", _DEB),
    ("nvidia-persistenced", f"{DRIVER_VERSION}-1"),
    # video
    ("libnvcuvid1", _DEB),
    ("libnvidia-encode1", _DEB),
    ("libnvidia-opticalflow1", _DEB),
    ("nvidia-vdpau-driver", _DEB),
    # graphics
    ("libnvidia-eglcore", _DEB),
    ("libnvidia-glcore", _DEB),
    ("libglx-nvidia0", _DEB),
    ("libegl-nvidia0", _DEB),
    ("libgles-nvidia1", _DEB),
    ("libgles-nvidia2", _DEB),
    ("libnvidia-glvkspirv", _DEB),
    ("libnvidia-rtcore", _DEB),
    ("libnvoptix1", _DEB),
    ("libnvidia-fbc1", _DEB),
    ("libnvidia-allocator1", _DEB),
    ("nvidia-vulkan-common", _DEB),
    ("nvidia-egl-common", _DEB),
    # graphics with versions of their own (egl-gbm, egl-wayland: Debian main), and display
    ("libnvidia-egl-gbm1", "1.1.2.1-*"),
    ("libnvidia-egl-wayland1", "1:1.1.18-*"),
    ("xserver-xorg-video-nvidia", _DEB),
    # ngx
    ("libnvidia-ngx1", _DEB),
    # firmware
    ("firmware-nvidia-gsp", _DEB),
    # 32-bit compat (compat32): enough to exercise the i386 ld.so.cache entries
    ("libcuda1:i386", _DEB),
    ("libnvidia-ml1:i386", _DEB),
    ("libnvidia-ptxjitcompiler1:i386", _DEB),
    _ZLIB,
)

# Bump when the layout code changes: the cached trees are keyed by it.
_LAYOUT_VERSION = 2

LIB64 = "usr/lib/x86_64-linux-gnu"
LIB32 = "usr/lib/i386-linux-gnu"

# Character majors. 195 is fixed by the driver; the others are dynamic, so a node picks
# values a real one could have: nvidia-uvm in the extended dynamic range (> 255, the
# range Linux falls back to once 234-254 are taken), which also catches a makedev that
# only handles 8-bit majors.
NVIDIA_MAJOR = 195
UVM_MAJOR = 511
CAPS_MAJOR = 236
IMEX_MAJOR = 235
NVSWITCH_MAJOR = 237
# With fabric=True. nvidia-fs and gdrdrv take dynamic majors (here in the extended
# range, beside nvidia-uvm); ib_uverbs has the fixed 231 with minors from 192; rdma_cm
# is a misc device (10) with a dynamic misc minor.
FS_MAJOR = 509
GDRDRV_MAJOR = 508
UVERBS_MAJOR = 231
RDMA_CM_MINOR = 58
# (path under dev/, major, minor, mode, kind) of the fabric nodes; kind as DeviceKind's value.
FABRIC_NODES = (
    *((f"nvidia-fs{n}", FS_MAJOR, n, 0o666, "nvidia-fs") for n in range(16)),
    ("infiniband/rdma_cm", 10, RDMA_CM_MINOR, 0o666, "infiniband"),
    ("infiniband/uverbs0", UVERBS_MAJOR, 192, 0o666, "infiniband"),
    ("infiniband/uverbs1", UVERBS_MAJOR, 193, 0o666, "infiniband"),
    ("gdrdrv", GDRDRV_MAJOR, 0, 0o666, "gdrdrv"),
    ("nvidia-nvswitch0", NVSWITCH_MAJOR, 0, 0o666, "nvswitch"),
    ("nvidia-nvswitch1", NVSWITCH_MAJOR, 1, 0o666, "nvswitch"),
    ("nvidia-nvswitchctl", NVSWITCH_MAJOR, 255, 0o666, "nvswitch"),
)
_FABRIC_CHAR_DEVICES = ((UVERBS_MAJOR, "infiniband_verbs"), (GDRDRV_MAJOR, "gdrdrv"), (FS_MAJOR, "nvidia-fs"))
CUFILE_JSON = '{\n  "logging": {"dir": "/var/log", "level": "ERROR"}\n}\n'

# DGX A100 bus ids for up to 8 GPUs; a 16-GPU layout beyond that. Both ascending.
_BUS_IDS_8 = (
    "0000:07:00.0",
    "0000:0f:00.0",
    "0000:47:00.0",
    "0000:4e:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b7:00.0",
    "0000:bd:00.0",
)
_BUS_IDS_16 = (
    "0000:07:00.0",
    "0000:0f:00.0",
    "0000:1a:00.0",
    "0000:1c:00.0",
    "0000:47:00.0",
    "0000:4e:00.0",
    "0000:5a:00.0",
    "0000:5c:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:9a:00.0",
    "0000:9c:00.0",
    "0000:b7:00.0",
    "0000:bd:00.0",
    "0000:c8:00.0",
    "0000:ca:00.0",
)
MAX_GPUS = len(_BUS_IDS_16)

MARKER = ".nri-gpu-simulated-node"
# Driver roots of a few kilobytes, committed (tests/fixtures/node/make-driver): empty
# libraries with the real SONAMEs and a real ldconfig's cache of them; the other, a
# node without a driver. For unit tests that need a driver's layout, not its files:
# ``build_node(driver_files=...)``.
FIXTURE_DRIVER = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "node" / "driver"
FIXTURE_NO_DRIVER = FIXTURE_DRIVER.parent / "nodriver"


@dataclass(frozen=True)
class SimGpu:
    """One simulated GPU. ``index`` is the NVML index (bus order), ``minor`` the
    ``Device Minor`` (``/dev/nvidia<minor>``)."""

    index: int
    minor: int
    bus_id: str  # procfs form, 16-bit domain: 0000:07:00.0
    uuid: str  # GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
    model: str
    excluded: bool = False  # "GPU Excluded: Yes" (NVreg_ExcludedGpus)


@dataclass(frozen=True)
class SimNode:
    root: Path
    driver_root: Path
    dev_root: Path
    proc_root: Path
    driver_version: str | None  # None: a node without a driver
    gpus: tuple[SimGpu, ...]
    real_device_nodes: bool = True  # False: /dev entries are empty regular files
    # None: no MIG (the default node). Else GPU index -> its instances, as ``build_node`` took them.
    mig: dict[int, tuple[tuple[int, tuple[int, ...]], ...]] | None = None
    # With MIG: "sim" (the simulated NVML answers) or "real" (the real library, which fails).
    nvml: str | None = None
    # GPU instance ids whose /dev/nvidia-caps nodes (its own and its CIs') are not made
    # on the host, as when nvidia-modprobe has not run since they were created.
    without_cap_nodes: tuple[int, ...] = ()
    fabric: bool = False  # the fabric and I/O nodes (FABRIC_NODES) and GDS's files
    drm: bool = False  # nvidia-drm's /dev/dri nodes and by-path links (drm_nodes)

    def drm_nodes(self, gpu: SimGpu) -> tuple[tuple[str, int, int, int], ...]:
        """``gpu``'s DRM nodes as (path under dev/, major, minor, mode); () without DRM."""
        return _drm_nodes(gpu) if self.drm and not gpu.excluded else ()

    def mig_devices(self) -> dict[int, tuple[SimNvmlMig, ...]]:
        """What the simulated NVML lists: GPU index -> its MIG devices by raw index j."""
        return sim_mig_devices(self)

    def flags(self) -> list[str]:
        """The command-line flags that point an nri-gpu command at this node."""
        return [
            "--driver-root",
            str(self.driver_root),
            "--dev-root",
            str(self.dev_root),
            "--proc-root",
            str(self.proc_root),
        ]


# --------------------------------------------------------------------------- GPUs


def _minor_order(count: int) -> list[int]:
    """Minors by index: DGX-like ``[2,3,0,1]`` per group of four; a remainder of three
    is rotated, of two swapped. Only a lone last GPU keeps minor == index (so with
    ``count == 1``, 5 or 9 ...)."""
    minors: list[int] = []
    for base in range(0, count, 4):
        size = min(4, count - base)
        group = {4: [2, 3, 0, 1], 3: [1, 2, 0], 2: [1, 0], 1: [0]}[size]
        minors += [base + m for m in group]
    return minors


def _uuid(bus_id: str) -> str:
    # Derived from the bus id only: golden files stay stable whatever else changes.
    h = hashlib.sha256(f"nri-gpu simulated GPU {bus_id}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _make_gpus(count: int, model: str, in_bus_order: bool, excluded: Sequence[int]) -> tuple[SimGpu, ...]:
    if not 0 <= count <= MAX_GPUS:
        raise ValueError(f"gpus must be 0..{MAX_GPUS}, not {count}")
    bad = [i for i in excluded if not 0 <= i < count]
    if bad:
        raise ValueError(f"excluded GPU indexes {bad} out of range 0..{count - 1}")
    buses = (_BUS_IDS_8 if count <= len(_BUS_IDS_8) else _BUS_IDS_16)[:count]
    minors = list(range(count)) if in_bus_order else _minor_order(count)
    return tuple(
        SimGpu(index=i, minor=minors[i], bus_id=bus, uuid=_uuid(bus), model=model, excluded=i in excluded)
        for i, bus in enumerate(buses)
    )


# --------------------------------------------------------------------------- ELF


def elf_soname(path: Path) -> str | None:
    """DT_SONAME of an ELF shared object (32- or 64-bit, little-endian), None if it has
    none. Reads the section headers: SHT_DYNAMIC and the string table it links to."""
    with open(path, "rb") as fh:
        ident = fh.read(16)
        if ident[:4] != b"\x7fELF" or ident[5] != 1:
            raise ValueError(f"{path}: not a little-endian ELF file")
        is64 = ident[4] == 2
        fh.seek(0)
        header = fh.read(64 if is64 else 52)
        if is64:
            (shoff,) = struct.unpack_from("<Q", header, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
        else:
            (shoff,) = struct.unpack_from("<I", header, 0x20)
            shentsize, shnum = struct.unpack_from("<HH", header, 0x2E)
        fh.seek(shoff)
        table = fh.read(shentsize * shnum)
        sections = []
        for i in range(shnum):
            if is64:
                _, sh_type, _, _, off, size, link, _, _, entsize = struct.unpack_from(
                    "<IIQQQQIIQQ", table, i * shentsize
                )
            else:
                _, sh_type, _, _, off, size, link, _, _, entsize = struct.unpack_from(
                    "<IIIIIIIIII", table, i * shentsize
                )
            sections.append((sh_type, off, size, link, entsize))
        for sh_type, off, size, link, _ in sections:
            if sh_type != 6:  # SHT_DYNAMIC
                continue
            fh.seek(off)
            dynamic = fh.read(size)
            fmt, step = ("<qQ", 16) if is64 else ("<iI", 8)
            soname_off = None
            for pos in range(0, size - step + 1, step):
                tag, value = struct.unpack_from(fmt, dynamic, pos)
                if tag == 0:  # DT_NULL
                    break
                if tag == 14:  # DT_SONAME
                    soname_off = value
            if soname_off is None:
                return None
            _, str_off, str_size, _, _ = sections[link]
            fh.seek(str_off + soname_off)
            raw = fh.read(min(4096, str_size - soname_off))
            return raw.split(b"\0", 1)[0].decode()
    return None


# --------------------------------------------------------------------------- ldconfig


@functools.cache
def ldconfig_binary() -> str:
    """The host's glibc ldconfig (often not on a non-root PATH)."""
    found = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None
    )
    if not found:
        raise RuntimeError("ldconfig not found (glibc's ldconfig is needed to write ld.so.cache)")
    return found


def run_ldconfig(root: Path, *args: str) -> None:
    """``ldconfig -X -r root [args]``: the cache lands in ``root/etc/ld.so.cache`` with
    paths relative to root. -X: the links are the installer's, ldconfig must not touch
    them. ``-r`` chroots, so a non-root caller goes through a user namespace."""
    cmd = [ldconfig_binary(), "-X", "-r", str(root), *args]
    if os.geteuid() != 0:
        cmd = ["unshare", "--user", "--map-root-user", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr.strip()}")


def _write_ld_so_conf(root: Path, dirs: Sequence[str]) -> None:
    # Debian's form: ld.so.conf includes ld.so.conf.d, one file per multiarch triplet.
    etc = root / "etc"
    (etc / "ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (etc / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n\n")
    for d in dirs:
        triplet = d.rstrip("/").rsplit("/", 1)[-1]
        (etc / "ld.so.conf.d" / f"{triplet}.conf").write_text(f"# Multiarch support\n/{d}\n")


# --------------------------------------------------------------------------- driver tree


def _extract_all() -> dict[str, Path]:
    return {pkg: _extract(pkg, version) for pkg, version in PACKAGES}


def _extract(pkg: str, version: str) -> Path:
    components = COMPONENTS_I386 if pkg.endswith(":i386") else COMPONENTS
    return debs.extract(pkg, SUITE, version, components=components)


def _tree_key() -> str:
    blob = json.dumps([_LAYOUT_VERSION, PACKAGES, ldconfig_version()]).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


@functools.cache
def ldconfig_version() -> str:
    """First line of ``ldconfig --version``: part of every cache key, since a new glibc
    may write a different cache."""
    out = subprocess.run([ldconfig_binary(), "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0].strip() if out else "unknown"


# Where the installer puts what Debian puts elsewhere. Keys are paths in the .deb.
_SKIP_PREFIXES = (
    "usr/share/doc/",
    "usr/share/man/",
    "usr/share/lintian/",
    "usr/share/bug/",
    "etc/init.d/",
    "usr/lib/systemd/",
    "lib/systemd/",
)


# xserver-xorg-video-nvidia's files, where the installer puts them.
_XORG = {
    "usr/lib/nvidia/current/nvidia_drv.so": "usr/lib/xorg/modules/drivers/nvidia_drv.so",
    f"usr/lib/nvidia/current/libglxserver_nvidia.so.{DRIVER_VERSION}": f"usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{DRIVER_VERSION}",
    "etc/nvidia/current/nvidia-drm-outputclass.conf": "usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
}


def _relocate(rel: str) -> str | None:
    """Installer path of a file from a .deb (relative), or None to leave it out."""
    if rel.startswith(_SKIP_PREFIXES) or rel.endswith(".1.gz"):
        return None
    for libdir in (LIB64, LIB32):
        current = f"{libdir}/nvidia/current/"
        if rel.startswith(current):
            rest = rel[len(current) :]
            if rest == "nvoptix.bin":
                return "usr/share/nvidia/nvoptix.bin"
            if rest.startswith("nvidia/wine/"):
                return f"{libdir}/{rest}"  # nvidia/wine/nvngx.dll, as the installer has it
            if rest.startswith("libvdpau_nvidia."):
                return f"{libdir}/vdpau/{rest}"  # VDPAU drivers live in vdpau/, off the ld path
            if rest == "nvidia-drm_gbm.so":
                return None  # made below as gbm/nvidia-drm_gbm.so
            return f"{libdir}/{rest}"
    if rel in _XORG:
        return _XORG[rel]
    if rel == "usr/lib/nvidia/current/nvidia-smi":
        return "usr/bin/nvidia-smi"  # the ELF; Debian's /usr/bin/nvidia-smi is an alternative
    if rel.startswith("usr/lib/nvidia/"):
        return None
    if rel.startswith("usr/sbin/"):
        return "usr/bin/" + rel[len("usr/sbin/") :]  # nvidia-cuda-mps-server: /usr/bin in the installer
    if rel.startswith("usr/lib/firmware/"):
        return rel[len("usr/") :]  # /lib/firmware/nvidia/<ver>/gsp_*.bin
    if rel.startswith("usr/share/doc"):
        return None
    return rel


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard link ``src`` at ``dst`` (replacing it); copy when they are on different
    filesystems or linking is not allowed."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        dst.unlink()
    except FileNotFoundError:
        pass
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        _warn_copy_once(exc)
        shutil.copy2(src, dst)


_WARNED_COPY = False


def _warn_copy_once(exc: OSError) -> None:
    global _WARNED_COPY
    if not _WARNED_COPY:
        _WARNED_COPY = True
        log.warning(
            "cannot hard-link from the cache (%s): copying driver files instead, "
            "which is slow and uses ~1 GB per node; put $NRI_GPU_CACHE on the same "
            "filesystem as the nodes",
            exc.strerror,
        )


def _symlink(target: str, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(target, link)


def _assemble(tree: Path, extracted: dict[str, Path]) -> None:
    """Lay the extracted packages out at the installer's paths under ``tree``."""
    dev_links: set[tuple[str, str]] = set()  # (libdir, "libfoo.so") Debian ships
    for root in extracted.values():
        for dirpath, _dirnames, filenames in os.walk(root):
            for name in filenames:
                src = Path(dirpath) / name
                rel = src.relative_to(root).as_posix()
                dest = _relocate(rel)
                if dest is None:
                    continue
                if src.is_symlink():
                    # Debian's links are remade from the ELF SONAMEs below; only note
                    # which unversioned development links the runtime package carries.
                    if name.endswith(".so") and name.startswith("lib"):
                        dev_links.add((str(Path(dest).parent), name))
                    continue
                _link_or_copy(src, tree / dest)
                if dest.startswith("usr/bin/"):
                    os.chmod(tree / dest, 0o755)
    # SONAME links, as the installer creates them (libcuda.so.1 -> libcuda.so.550.163.01).
    sonames: dict[tuple[str, str], str] = {}
    for libdir in (LIB64, LIB32):
        for lib in sorted((tree / libdir).glob("lib*.so*")):
            if lib.is_symlink() or not lib.is_file():
                continue
            soname = elf_soname(lib)
            stem = lib.name.split(".so", 1)[0]
            if soname:
                sonames[libdir, stem] = soname
                if soname != lib.name:
                    _symlink(lib.name, tree / libdir / soname)
    for libdir, name in sorted(dev_links):
        soname = sonames.get((libdir, name[: -len(".so")]))
        if soname:
            _symlink(soname, tree / libdir / name)
    # The GBM backend link the installer makes (and the toolkit's graphics mounts expect).
    if (tree / LIB64 / "libnvidia-allocator.so.1").is_symlink():
        _symlink("../libnvidia-allocator.so.1", tree / LIB64 / "gbm/nvidia-drm_gbm.so")
    glx = f"usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{DRIVER_VERSION}"
    if (tree / glx).is_file():
        _symlink(Path(glx).name, tree / "usr/lib/xorg/modules/extensions/libglxserver_nvidia.so")
    _write_ld_so_conf(tree, [LIB64, LIB32])
    run_ldconfig(tree)


def driver_tree() -> Path:
    """The assembled driver tree in the cache, built on first use (downloads the
    packages if needed). Raises debs.DebUnavailable when offline with nothing cached."""
    base = cache_dir() / "gpunode"
    tree = base / f"driver-{DRIVER_VERSION}-{_tree_key()}"
    if tree.is_dir():
        return tree
    with locked(base / ".lock"):
        if tree.is_dir():
            return tree
        extracted = _extract_all()
        tmp = Path(tempfile.mkdtemp(dir=base, prefix=".driver-"))
        try:
            _assemble(tmp, extracted)
            os.chmod(tmp, 0o755)
            os.replace(tmp, tree)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("assembled driver tree %s", tree)
    return tree


def no_driver_tree() -> Path:
    """The driver root of a node without a driver: only zlib and an ld.so.cache."""
    base = cache_dir() / "gpunode"
    blob = json.dumps([_LAYOUT_VERSION, _ZLIB, ldconfig_version()]).encode()
    tree = base / f"nodriver-{hashlib.sha256(blob).hexdigest()[:12]}"
    if tree.is_dir():
        return tree
    with locked(base / ".lock"):
        if tree.is_dir():
            return tree
        pkg, version = _ZLIB
        zlib = _extract(pkg, version)
        tmp = Path(tempfile.mkdtemp(dir=base, prefix=".nodriver-"))
        try:
            _assemble(tmp, {pkg: zlib})
            os.chmod(tmp, 0o755)
            os.replace(tmp, tree)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return tree


# Copied, not linked, into each node: tests edit or delete them.
_PRIVATE = ("etc/ld.so.cache", "etc/ld.so.conf")


def _walk(tree: Path) -> Iterator[tuple[str, Path]]:
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            yield path.relative_to(tree).as_posix(), path


def _install_tree(tree: Path, dest: Path, *, copy: bool = False) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for rel, src in _walk(tree):
        target = dest / rel
        if src.is_symlink():
            _symlink(os.readlink(src), target)
        elif src.is_dir():
            target.mkdir(exist_ok=True)
        elif copy or rel in _PRIVATE or rel.startswith("etc/ld.so.conf.d/"):
            if target.exists() or target.is_symlink():
                target.unlink()
            shutil.copy2(src, target)
        else:
            _link_or_copy(src, target)


# --------------------------------------------------------------------------- procfs

# /proc/driver/nvidia/version of Debian trixie's 550.163.01 module (read on a real host).
_VERSION_FILE = (
    f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER_VERSION}  Tue Apr  8 12:41:17 UTC 2025\n"
    "GCC version:  gcc version 14.2.0 (Debian 14.2.0-19) \n"
)

# nv_parms[] of 550.163.01's nv-reg.h, in table order, with the driver's defaults;
# the string parameters follow, as nv_procfs_read_params prints them.
_PARAMS = (
    ("ResmanDebugLevel", 4294967295),
    ("RmLogonRC", 1),
    ("ModifyDeviceFiles", 1),
    ("DeviceFileUID", 0),
    ("DeviceFileGID", 0),
    ("DeviceFileMode", 438),
    ("InitializeSystemMemoryAllocations", 1),
    ("UsePageAttributeTable", 4294967295),
    ("EnableMSI", 1),
    ("EnablePCIeGen3", 0),
    ("MemoryPoolSize", 0),
    ("KMallocHeapMaxSize", 0),
    ("VMallocHeapMaxSize", 0),
    ("IgnoreMMIOCheck", 0),
    ("TCEBypassMode", 0),
    ("EnableStreamMemOPs", 0),
    ("EnableUserNUMAManagement", 1),
    ("NvLinkDisable", 0),
    ("RmProfilingAdminOnly", 1),
    ("PreserveVideoMemoryAllocations", 0),
    ("EnableS0ixPowerManagement", 0),
    ("S0ixPowerManagementVideoMemoryThreshold", 256),
    ("DynamicPowerManagement", 3),
    ("DynamicPowerManagementVideoMemoryThreshold", 200),
    ("RegisterPCIDriver", 1),
    ("EnablePCIERelaxedOrderingMode", 0),
    ("EnableResizableBar", 0),
    ("EnableGpuFirmware", 18),
    ("EnableGpuFirmwareLogs", 2),
    ("EnableDbgBreakpoint", 0),
    ("OpenRmEnableUnsupportedGpus", 1),
    ("DmaRemapPeerMmio", 1),
    ("ImexChannelCount", 2048),
)


def _params_file(excluded_uuids: Sequence[str]) -> str:
    lines = [f"{k}: {v}\n" for k, v in _PARAMS]
    strings = (
        ("RegistryDwords", ""),
        ("RegistryDwordsPerDevice", ""),
        ("RmMsg", ""),
        ("GpuBlacklist", ""),
        ("TemporaryFilePath", ""),
        ("ExcludedGpus", ",".join(excluded_uuids)),
    )
    lines += [f'{k}: "{v}"\n' for k, v in strings]
    return "".join(lines)


def information_file(gpu: SimGpu) -> str:
    """``/proc/driver/nvidia/gpus/<bus>/information`` exactly as 550.163.01's
    nv_procfs_read_gpu_info prints it (550 prints no ``GPU Firmware:`` line; later
    drivers add one between ``Device Minor`` and ``GPU Excluded``)."""
    return (
        f"Model: \t\t {gpu.model}\n"
        f"IRQ:   \t\t {_irq(gpu)}\n"
        f"GPU UUID: \t {gpu.uuid}\n"
        "Video BIOS: \t 92.00.45.00.06\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 47 bits\n"
        "DMA Mask: \t 0x7fffffffffff\n"
        f"Bus Location: \t {gpu.bus_id}\n"
        f"Device Minor: \t {gpu.minor}\n"
        f"GPU Excluded:\t {'Yes' if gpu.excluded else 'No'}\n"
    )


def _irq(gpu: SimGpu) -> int:
    return 160 + 17 * gpu.index  # any legacy INTx line; nothing reads it


_POWER_FILE = (
    "Runtime D3 status:          Not supported\n"
    "Video Memory:               Active\n\n"
    "GPU Hardware Support:\n"
    " Video Memory Self Refresh: Not supported\n"
    " Video Memory Off:          Not supported\n"
)

# /proc/devices of a Debian 12 GPU server. The dynamic majors are examples; the NVIDIA
# ones are the module constants above. Block device 254 (mdp) shares a number with a
# character device on purpose: only the "Character devices:" section counts.
_CHAR_DEVICES = (
    (1, "mem"),
    (4, "/dev/vc/0"),
    (4, "tty"),
    (4, "ttyS"),
    (5, "/dev/tty"),
    (5, "/dev/console"),
    (5, "/dev/ptmx"),
    (7, "vcs"),
    (10, "misc"),
    (13, "input"),
    (21, "sg"),
    (29, "fb"),
    (89, "i2c"),
    (99, "ppdev"),
    (108, "ppp"),
    (128, "ptm"),
    (136, "pts"),
    (180, "usb"),
    (189, "usb_device"),
    (202, "cpu/msr"),
    (203, "cpu/cpuid"),
    (226, "drm"),
    (234, "ipmidev"),
    (239, "aux"),
    (240, "cec"),
    (241, "lirc"),
    (242, "ptp"),
    (243, "pps"),
    (244, "rtc"),
    (245, "dma_heap"),
    (246, "dimmctl"),
    (247, "ndctl"),
    (248, "nvme-generic"),
    (249, "nvme"),
    (250, "hidraw"),
    (251, "wwan_port"),
    (252, "bsg"),
    (253, "tpm"),
    (254, "gpiochip"),
    (510, "tpmrm"),
)
_NVIDIA_CHAR_DEVICES = (
    (NVIDIA_MAJOR, "nvidia"),
    (NVIDIA_MAJOR, "nvidia-modeset"),
    (NVIDIA_MAJOR, "nvidiactl"),
    (IMEX_MAJOR, "nvidia-caps-imex-channels"),
    (CAPS_MAJOR, "nvidia-caps"),
    (NVSWITCH_MAJOR, "nvidia-nvswitch"),
    (238, "nvidia-nvlink"),
    (UVM_MAJOR, "nvidia-uvm"),
)
_BLOCK_DEVICES = (
    (7, "loop"),
    (8, "sd"),
    (9, "md"),
    (11, "sr"),
    (65, "sd"),
    (66, "sd"),
    (67, "sd"),
    (68, "sd"),
    (69, "sd"),
    (70, "sd"),
    (71, "sd"),
    (128, "sd"),
    (129, "sd"),
    (130, "sd"),
    (131, "sd"),
    (132, "sd"),
    (133, "sd"),
    (134, "sd"),
    (135, "sd"),
    (253, "device-mapper"),
    (254, "mdp"),
    (259, "blkext"),
)


def _devices_file(driver: bool, fabric: bool = False) -> str:
    chars = list(_CHAR_DEVICES) + (list(_NVIDIA_CHAR_DEVICES) if driver else [])
    chars += list(_FABRIC_CHAR_DEVICES) if fabric else []
    # The kernel lists by major; entries of one major keep registration (minor) order.
    chars.sort(key=lambda e: e[0])
    out = ["Character devices:\n"] + [f"{m:3d} {n}\n" for m, n in chars]
    out += ["\nBlock devices:\n"] + [f"{m:3d} {n}\n" for m, n in _BLOCK_DEVICES]
    return "".join(out)


def _mig_minors() -> str:
    # nv-caps.c: minors are handed out in table order: nvlink fabric-mgmt 0, MIG config 1
    # and monitor 2, then per GPU (32) per GI (15): the GI's access and its 8 CIs'.
    lines = ["config 1\n", "monitor 2\n"]
    minor = 3
    for gpu in range(32):
        for gi in range(15):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}\n")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}\n")
                minor += 1
    return "".join(lines)


_SYS_MINOR = 3 + 32 * 15 * 9  # fabric-imex-mgmt, the table after the MIG GPUs


def _write(path: Path, text: str, mode: int = 0o444) -> None:
    # The kernel's modes (0444, registry 0644). Root writes through 0444 anyway; another
    # user gets owner-write so tests can still edit the files as a changed driver would.
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode if os.geteuid() == 0 else mode | 0o200)


def _write_procfs(proc: Path, gpus: Sequence[SimGpu], driver: bool, fabric: bool = False) -> None:
    _write(proc / "devices", _devices_file(driver, fabric))
    if not driver:
        return
    nv = proc / "driver/nvidia"
    _write(nv / "version", _VERSION_FILE)
    _write(nv / "params", _params_file([g.uuid for g in gpus if g.excluded]))
    _write(nv / "registry", 'Binary: ""\n', 0o644)
    for gpu in gpus:
        d = nv / "gpus" / gpu.bus_id
        _write(d / "information", information_file(gpu))
        _write(d / "registry", 'Binary: ""\n', 0o644)
        _write(d / "power", _POWER_FILE)
    (nv / "gpus").mkdir(parents=True, exist_ok=True)
    # Capability files (nv-caps.c nv_cap_procfs_show); mode 256 = 0400, 292 = 0444.
    caps = nv / "capabilities"
    _write(caps / "mig/config", "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    _write(caps / "mig/monitor", "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    _write(caps / "fabric-imex-mgmt", f"DeviceFileMinor: {_SYS_MINOR}\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    nvcaps = proc / "driver/nvidia-caps"
    _write(nvcaps / "mig-minors", _mig_minors())
    _write(nvcaps / "nvlink-minors", "fabric-mgmt 0\n")
    _write(nvcaps / "sys-minors", f"fabric-imex-mgmt {_SYS_MINOR}\n")


# --------------------------------------------------------------------------- /dev


def _device_nodes(gpus: Sequence[SimGpu]) -> list[tuple[str, int, int, int]]:
    """(path under dev/, major, minor, mode) of every NVIDIA node."""
    nodes = [("nvidiactl", NVIDIA_MAJOR, 255, 0o666), ("nvidia-modeset", NVIDIA_MAJOR, 254, 0o666)]
    nodes += [(f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor, 0o666) for g in sorted(gpus, key=lambda g: g.minor)]
    nodes += [("nvidia-uvm", UVM_MAJOR, 0, 0o666), ("nvidia-uvm-tools", UVM_MAJOR, 1, 0o666)]
    # What nvidia-modprobe makes for MIG config/monitor (the capability files' modes).
    nodes += [("nvidia-caps/nvidia-cap1", CAPS_MAJOR, 1, 0o400), ("nvidia-caps/nvidia-cap2", CAPS_MAJOR, 2, 0o444)]
    return nodes


def _write_dev(dev: Path, gpus: Sequence[SimGpu], driver: bool, real: bool | None) -> bool:
    """Create the device nodes; returns whether they are real character devices."""
    dev.mkdir(parents=True, exist_ok=True)
    if not driver:
        return bool(real if real is not None else os.geteuid() == 0)
    (dev / "nvidia-caps").mkdir(exist_ok=True)
    use_mknod = os.geteuid() == 0 if real is None else real
    for rel, major, minor, mode in _device_nodes(gpus):
        use_mknod = _make_node(dev / rel, major, minor, mode, use_mknod, insist=bool(real))
    return use_mknod


def _make_node(path: Path, major: int, minor: int, mode: int, use_mknod: bool, *, insist: bool) -> bool:
    """One device node (an empty regular file without mknod); whether mknod is still used."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if use_mknod:
        try:
            os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
            os.chmod(path, mode)  # mknod is subject to the umask
            return True
        except PermissionError:
            if insist:  # asked for explicitly: say so rather than fake it
                raise
            log.warning("mknod not permitted (no CAP_MKNOD?): device nodes are regular files")
    path.touch()
    os.chmod(path, mode)
    return False


DRM_MAJOR = 226
BMC_VGA_BUS = "0000:02:00.0"


def _drm_nodes(gpu: SimGpu) -> tuple[tuple[str, int, int, int], ...]:
    card, render = gpu.index + 1, 128 + gpu.index
    return (f"dri/card{card}", DRM_MAJOR, card, 0o660), (f"dri/renderD{render}", DRM_MAJOR, render, 0o666)


def _write_drm(node: SimNode) -> None:
    """nvidia-drm's nodes and udev's by-path links, beside the BMC's card0."""
    dri = node.dev_root / "dev/dri"
    (dri / "by-path").mkdir(parents=True, exist_ok=True)
    use_mknod = _make_node(dri / "card0", DRM_MAJOR, 0, 0o660, node.real_device_nodes, insist=False)
    _symlink("../card0", dri / "by-path" / f"pci-{BMC_VGA_BUS}-card")
    for gpu in node.gpus:
        for rel, major, minor, mode in node.drm_nodes(gpu):
            use_mknod = _make_node(node.dev_root / "dev" / rel, major, minor, mode, use_mknod, insist=False)
            kind = "card" if "/card" in rel else "render"
            _symlink(f"../{rel.split('/')[-1]}", dri / "by-path" / f"pci-{gpu.bus_id}-{kind}")


def _write_fabric(node: SimNode) -> None:
    """The fabric nodes under dev/ and GDS's files under the driver root."""
    dev = node.dev_root / "dev"
    use_mknod = node.real_device_nodes
    for rel, major, minor, mode, _kind in FABRIC_NODES:
        (dev / rel).parent.mkdir(parents=True, exist_ok=True)
        use_mknod = _make_node(dev / rel, major, minor, mode, use_mknod, insist=False)
    _write(node.driver_root / "etc/cufile.json", CUFILE_JSON, 0o644)
    # udev's database entry of uverbs0 (c<major>:<minor>), as udevd writes it.
    _write(node.driver_root / f"run/udev/data/c{UVERBS_MAJOR}:192", "I:1\nE:ID_PATH=pci-0000:0c:00.0\n", 0o644)


# --------------------------------------------------------------------------- MIG

# GPU index -> its GPU instances, each (gi, compute instance ids). An index with no
# instances is a GPU in MIG mode with nothing carved out.
MigSpec = dict[int, Sequence[tuple[int, Sequence[int]]]]


def cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The nvidia-caps minor the driver gives an instance (the ``mig-minors`` table order)."""
    base = 3 + 135 * gpu_minor + 9 * gi
    return base if ci is None else base + 1 + ci


def _access_file(minor: int) -> str:
    # nv_cap_procfs_read; GPU and compute instance caps are created OS_RUGO (292 = 0444).
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"


def _normal_mig(gpus: Sequence[SimGpu], spec: MigSpec) -> dict[int, tuple[tuple[int, tuple[int, ...]], ...]]:
    """``spec`` checked against what the driver can make, sorted, as tuples."""
    out: dict[int, tuple[tuple[int, tuple[int, ...]], ...]] = {}
    for index, instances in spec.items():
        if not 0 <= index < len(gpus):
            raise ValueError(f"MIG GPU index {index} out of range 0..{len(gpus) - 1}")
        gis = sorted((gi, tuple(sorted(cis))) for gi, cis in instances)
        if gis and gpus[index].minor > 31:
            raise ValueError(
                f"GPU {index} has minor {gpus[index].minor}: the driver makes MIG caps for minors 0..31 only"
            )
        if len({gi for gi, _ in gis}) != len(gis) or any(len(set(cis)) != len(cis) for _, cis in gis):
            raise ValueError(f"GPU {index}: an instance is listed twice in {instances!r}")
        bad = [(gi, cis) for gi, cis in gis if not 0 <= gi <= 14 or any(not 0 <= c <= 7 for c in cis)]
        if bad:
            raise ValueError(f"GPU {index}: GPU instances are 0..14 and compute instances 0..7, not {bad}")
        out[index] = tuple(gis)
    return dict(sorted(out.items()))


def _mkdir_proc(path: Path) -> None:
    # The kernel's 0555 folders; another user keeps owner-write to reconfigure them.
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o555 if os.geteuid() == 0 else 0o755)


def _write_mig(node: SimNode) -> None:
    """Every GPU's ``capabilities/gpu<minor>/mig/`` (the driver makes it whether or not
    MIG is on), the instances of ``node.mig`` with their access files, and a
    ``/dev/nvidia-caps`` node for each instance cap, as nvidia-modprobe makes them."""
    caps = node.proc_root / "driver/nvidia/capabilities"
    for gpu in node.gpus:
        _mkdir_proc(caps / f"gpu{gpu.minor}")
        _mkdir_proc(caps / f"gpu{gpu.minor}" / "mig")
    use_mknod = node.real_device_nodes
    for index, instances in (node.mig or {}).items():
        minor = node.gpus[index].minor
        for gi, cis in instances:
            folder = caps / f"gpu{minor}" / "mig" / f"gi{gi}"
            _mkdir_proc(folder)
            _write(folder / "access", _access_file(cap_minor(minor, gi)))
            nodes = [cap_minor(minor, gi)]
            for ci in cis:
                _mkdir_proc(folder / f"ci{ci}")
                _write(folder / f"ci{ci}" / "access", _access_file(cap_minor(minor, gi, ci)))
                nodes.append(cap_minor(minor, gi, ci))
            if gi in node.without_cap_nodes:
                continue  # the driver makes no node: only nvidia-modprobe or the toolkit's CLI does
            for cap in nodes:
                path = node.dev_root / "dev/nvidia-caps" / f"nvidia-cap{cap}"
                use_mknod = _make_node(path, CAPS_MAJOR, cap, 0o444, use_mknod, insist=False)


def _remove_mig_instances(node: SimNode) -> None:
    """Destroy every instance: its procfs folders and its /dev/nvidia-caps node (as
    nvidia-modprobe's nodes would be cleaned up); config and monitor stay."""
    caps = node.proc_root / "driver/nvidia/capabilities"
    for gpu in node.gpus:
        mig = caps / f"gpu{gpu.minor}" / "mig"
        for gi_dir in sorted(mig.glob("gi*")) if mig.is_dir() else []:
            for path in [gi_dir, *gi_dir.rglob("*")]:
                if path.is_dir():
                    os.chmod(path, 0o755)
            shutil.rmtree(gi_dir)
    for path in sorted((node.dev_root / "dev/nvidia-caps").glob("nvidia-cap*")):
        if path.name not in ("nvidia-cap1", "nvidia-cap2"):
            path.unlink()


def _mig_uuid(gpu_uuid: str, gi: int, ci: int) -> str:
    h = hashlib.sha256(f"nri-gpu simulated MIG device {gpu_uuid} {gi} {ci}".encode()).hexdigest()
    return f"MIG-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _nvml_gpus(node: SimNode) -> list[SimNvmlGpu]:
    """The GPUs as NVML lists them: excluded GPUs are not there (so NVML's index is the
    inventory's); MIG mode on for every GPU ``node.mig`` names; MIG devices in
    ascending (gi, ci) order, their raw index with a gap: j=1 is skipped on a GPU
    with three or more."""
    out = []
    for gpu in (g for g in node.gpus if not g.excluded):
        placements = [(gi, ci) for gi, cis in (node.mig or {}).get(gpu.index, ()) for ci in cis]
        gap = len(placements) >= 3
        devices = tuple(
            SimNvmlMig(k + 1 if gap and k >= 1 else k, _mig_uuid(gpu.uuid, gi, ci), gi, ci)
            for k, (gi, ci) in enumerate(placements)
        )
        on = gpu.index in (node.mig or {})
        out.append(SimNvmlGpu(gpu.uuid, gpu.minor, (on, on), devices, max([7, *(d.index + 1 for d in devices)])))
    return out


def sim_mig_devices(node: SimNode) -> dict[int, tuple[SimNvmlMig, ...]]:
    """The MIG devices the simulated NVML lists, by NVML GPU index ``i`` (the inventory's
    index; only GPUs with MIG devices): ``{0: (SimNvmlMig(0, "MIG-...", 2, 0),
    SimNvmlMig(2, "MIG-...", 2, 1), ...)}``, ``index`` being ``j`` of ``i:j``. Also on a
    node with ``nvml="real"``: it is what NVML would say there."""
    return {i: g.mig_devices for i, g in enumerate(_nvml_gpus(node)) if g.mig_devices}


def _write_nvml(node: SimNode, **behaviour: int) -> None:
    """With the simulated NVML, (re)write its description; ``behaviour``: ``init_rc``,
    ``init_sleep_ms`` (``nvmlsim.description``)."""
    if node.nvml == "sim":
        path = node.driver_root / LIB64 / nvmlsim.DESCRIPTION
        path.write_text(nvmlsim.description(_nvml_gpus(node), **behaviour))


def _install_nvml(node: SimNode) -> None:
    """Put the simulated library where the real 64-bit one was. The node's file is a
    hard link into the cached driver tree: unlink it, never write into it."""
    lib = node.driver_root / LIB64 / f"libnvidia-ml.so.{DRIVER_VERSION}"
    lib.unlink()
    shutil.copyfile(nvmlsim.library(), lib)
    os.chmod(lib, 0o644)


def set_nvml_behaviour(node: SimNode, *, init_rc: int = 0, init_sleep_ms: int = 0) -> None:
    """Make the simulated NVML of ``node`` fail (``nvmlInit_v2`` returns ``init_rc``)
    or hang (sleeps ``init_sleep_ms`` first), for tests of the probe's failure paths."""
    if node.nvml != "sim":
        raise ValueError("the node has no simulated NVML (build_node(mig=..., nvml='sim'))")
    _write_nvml(node, init_rc=init_rc, init_sleep_ms=init_sleep_ms)


def reconfigure_mig(node: SimNode, mig: MigSpec) -> SimNode:
    """Change a MIG node's instances as an operator would (``nvidia-smi mig -dci -dgi``
    then ``-cgi -C``): the old instances vanish, the new ones appear. A GPU index left
    out of ``mig`` ends up with no instances. Returns the node as it now is."""
    if node.mig is None:
        raise ValueError("the node was built without MIG (build_node(mig=...))")
    new = dataclasses.replace(node, mig=_normal_mig(node.gpus, mig))
    _remove_mig_instances(node)
    _write_mig(new)
    _write_nvml(new)
    return new


# --------------------------------------------------------------------------- node


def build_node(
    root: Path,
    *,
    gpus: int = 4,
    driver: bool = True,
    driver_subdir: str = "",
    in_bus_order: bool = False,
    model: str = "NVIDIA A100-SXM4-80GB",
    real_device_nodes: bool | None = None,
    excluded: Sequence[int] = (),
    mig: MigSpec | None = None,
    nvml: str = "sim",
    without_cap_nodes: Sequence[int] = (),
    fabric: bool = False,
    drm: bool = True,
    driver_files: Path | None = None,
) -> SimNode:
    """Build a simulated GPU node in ``root`` (created if missing) and describe it.

    ``driver_subdir``: where the driver files go, relative to root: "" (a host install)
    or e.g. ``run/nvidia/driver`` (the GPU operator's driver container; /dev and /proc
    stay at root). ``driver=False``: no driver at all (no /proc/driver/nvidia, no NVIDIA
    majors or nodes, an ld.so.cache with zlib only); ``gpus`` is then ignored and the
    node has none. ``real_device_nodes``: None = character devices iff running as root
    (falling back to regular files if mknod is refused), True = insist, False = regular
    files. ``excluded``: GPU indexes the driver reports as ``GPU Excluded: Yes``.
    ``mig``: None = no per-GPU capability folders (the node as before MIG was
    simulated); else every GPU gets ``capabilities/gpu<minor>/mig/`` and the GPUs
    named (by index) get these GPU instances and compute instances, e.g.
    ``{1: [], 2: [(2, [0, 1, 2]), (3, [0])]}``: GPU 1 in MIG mode with no instances,
    GPU 2 with a 3g GI holding three CIs and a 2g GI with one (``reconfigure_mig``
    changes them later). ``nvml`` (with ``mig`` only): "sim" = the simulated
    ``libnvidia-ml`` listing those MIG devices (``SimNode.mig_devices``), "real" = keep
    NVIDIA's (which fails: Driver Not Loaded). ``without_cap_nodes``: GPU instance ids
    whose ``/dev/nvidia-caps`` nodes are not made on the host (the kernel makes none;
    nvidia-modprobe may not have run): nri-gpu must not need them. ``fabric``: also
    the fabric and I/O device nodes (``FABRIC_NODES``), their majors in
    ``/proc/devices`` and GDS's ``etc/cufile.json`` and ``run/udev/data/``. ``drm``:
    nvidia-drm's ``/dev/dri`` nodes and by-path links (``SimNode.drm_nodes``); False: a
    node where nvidia-drm is not loaded. ``driver_files``: the driver root to install
    (copied) instead of NVIDIA's packages, ``FIXTURE_DRIVER`` (or ``FIXTURE_NO_DRIVER``
    with ``driver=False``): nothing is downloaded (``mig`` with the simulated NVML
    still builds it with gcc).
    """
    if nvml not in ("sim", "real"):
        raise ValueError(f"nvml must be 'sim' or 'real', not {nvml!r}")
    sim_gpus = _make_gpus(gpus, model, in_bus_order, excluded) if driver else ()  # validates first
    mig_layout = _normal_mig(sim_gpus, mig) if mig is not None and driver else None
    root = Path(root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    driver_root = root / driver_subdir if driver_subdir else root
    if driver_files is not None:
        _install_tree(driver_files, driver_root, copy=True)
    else:
        _install_tree(driver_tree() if driver else no_driver_tree(), driver_root)
    proc = root / "proc"
    _write_procfs(proc, sim_gpus, driver, fabric and driver)
    real = _write_dev(root / "dev", sim_gpus, driver, real_device_nodes)
    node = SimNode(
        root=root,
        driver_root=driver_root,
        dev_root=root,
        proc_root=proc,
        driver_version=DRIVER_VERSION if driver else None,
        gpus=sim_gpus,
        real_device_nodes=real,
        mig=mig_layout,
        nvml=nvml if mig_layout is not None else None,
        without_cap_nodes=tuple(without_cap_nodes),
        fabric=fabric and driver,
        drm=drm and driver,
    )
    if node.fabric:
        _write_fabric(node)
    if node.drm:
        _write_drm(node)
    if mig_layout is not None:
        _write_mig(node)
        if nvml == "sim":
            _install_nvml(node)
            _write_nvml(node)
    (root / MARKER).write_text(
        json.dumps({"flags": node.flags(), "gpus": [g.__dict__ for g in sim_gpus]}, indent=1) + "\n"
    )
    return node


# --------------------------------------------------------------------------- CLI


def _summary(node: SimNode) -> str:
    rows = [("index", "minor", "bus id", "uuid", "")]
    rows += [(str(g.index), str(g.minor), g.bus_id, g.uuid, "excluded" if g.excluded else "") for g in node.gpus]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not node.driver_version:
        return f"simulated node {node.root}: no NVIDIA driver, no GPUs (ld.so.cache with zlib only)"
    nodes = "character devices" if node.real_device_nodes else "device nodes are regular files (not root)"
    head = f"simulated node {node.root}: driver {node.driver_version} at {node.driver_root}, {len(node.gpus)} GPU(s), {nodes}"
    return "\n".join([head, *lines])


def _parse_mig_args(values: Sequence[str]) -> MigSpec:
    """``["1", "2:2.0.1.2,3.0"]`` -> ``{1: [], 2: [(2, [0, 1, 2]), (3, [0])]}``."""
    spec: MigSpec = {}
    for value in values:
        index, _, rest = value.partition(":")
        try:
            gis = [part.split(".") for part in rest.split(",")] if rest else []
            spec[int(index)] = [(int(p[0]), [int(c) for c in p[1:]]) for p in gis]
        except ValueError:
            raise ValueError(f"--mig {value!r}: expected INDEX[:GI[.CI...][,GI...]], e.g. 2:2.0.1.2,3.0") from None
    return spec


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/simulate-gpu-node",
        description="Build a simulated GPU node (real NVIDIA 550.163.01 files from Debian, fake /proc and /dev).",
    )
    parser.add_argument("root", type=Path, help="directory to build the node in")
    parser.add_argument("--gpus", type=int, default=4, help=f"number of GPUs, 0..{MAX_GPUS} (default 4)")
    parser.add_argument(
        "--driver-root-subdir",
        default="",
        metavar="DIR",
        help="put the driver files under ROOT/DIR, e.g. run/nvidia/driver (GPU operator layout)",
    )
    parser.add_argument("--no-driver", action="store_true", help="a node without any NVIDIA driver")
    parser.add_argument("--in-bus-order", action="store_true", help="device minors equal to the indexes")
    parser.add_argument(
        "--exclude",
        type=int,
        action="append",
        default=[],
        metavar="INDEX",
        help="mark GPU INDEX 'GPU Excluded: Yes' (repeatable)",
    )
    parser.add_argument(
        "--mig",
        action="append",
        default=[],
        metavar="INDEX[:GI[.CI...][,GI...]]",
        help="put GPU INDEX in MIG mode with these GPU instances and their compute instances, "
        "e.g. '--mig 1 --mig 2:2.0.1.2,3.0' (repeatable; any --mig gives every GPU "
        "its capabilities/gpu<minor>/mig folder)",
    )
    parser.add_argument(
        "--nvml",
        choices=("sim", "real"),
        default="sim",
        help="with --mig: 'sim' (default) replaces the 64-bit libnvidia-ml by a simulated one "
        "that lists the MIG devices; 'real' keeps NVIDIA's (Driver Not Loaded)",
    )
    parser.add_argument(
        "--fabric",
        action="store_true",
        help="add fabric and I/O devices: nvidia-fs, infiniband, gdrdrv, nvswitch (and GDS's files)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace a node this tool built before (a ROOT holding anything else is never deleted)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")

    root: Path = args.root.absolute()
    if root.exists() and not root.is_dir():
        parser.error(f"{root} exists and is not a directory")
    if root.is_dir() and any(root.iterdir()):
        if not args.force:
            print(f"error: {root} is not empty; pass --force to replace the node built there", file=sys.stderr)
            return 2
        if root.resolve() == Path("/") or not (root / MARKER).is_file():
            print(
                f"error: {root} is not empty and holds no node built by this tool ({MARKER} missing): "
                "refusing to delete it, even with --force",
                file=sys.stderr,
            )
            return 2
        shutil.rmtree(root)
    start = time.monotonic()
    try:
        mig = _parse_mig_args(args.mig) if args.mig else None
        node = build_node(
            root,
            gpus=args.gpus,
            driver=not args.no_driver,
            driver_subdir=args.driver_root_subdir,
            in_bus_order=args.in_bus_order,
            excluded=args.exclude,
            mig=mig,
            nvml=args.nvml,
            fabric=args.fabric,
        )
    except (ValueError, debs.DebError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(_summary(node))
    for index, instances in (node.mig or {}).items():
        gpu = node.gpus[index]
        shown = " ".join(f"gi{gi}({','.join(f'ci{c}' for c in cis) or 'no CIs'})" for gi, cis in instances)
        print(f"MIG: GPU {index} (minor {gpu.minor}): {shown or 'MIG on, no instances'}")
    for index, devices in node.mig_devices().items():
        shown = " ".join(f"{index}:{d.index}=gi{d.gi}/ci{d.ci}" for d in devices)
        print(f"NVML ({node.nvml}): GPU {index}: {shown}")
    print(f"built in {time.monotonic() - start:.2f}s; flags for nri-gpu commands:")
    print(" ".join(node.flags()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
