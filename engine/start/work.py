"""What container start has to do inside the container, and what it reports.  (pure)

The plan (computed at CreateContainer) decides *what*; ``StartWork`` carries the
part of it that can only be done once the container's mount namespace exists
(NRI StartContainer): hide the GPUs it did not get under ``/proc/driver/nvidia``
(and the MIG capability files of instances it did not get), create the library
symlinks, and make the dynamic loader find the libraries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nri_gpu.engine.catalogue import IPC_TYPES
from nri_gpu.engine.config import LD_CACHE_MODES, LdCache
from nri_gpu.engine.migfs import compute_instance_id, gpu_dir_minor, gpu_instance_id
from nri_gpu.engine.model import LdCacheEntry, Plan, Symlink

__all__ = ["PROC", "StartReport", "StartWork", "WorkError", "is_cap_path", "start_work"]

PROC = "/proc"


class WorkError(Exception):
    """A start step cannot be done; the message names the path or value at fault.

    Raised inside the worker process only; the runner turns it into a
    ``StartError`` naming the container and the step.
    """


@dataclass(frozen=True)
class StartWork:
    """Everything the in-namespace worker needs, as plain values.

    ``proc_source``: None on a real node, whose procfs is global: the
    container's own ``/proc/driver/nvidia`` shows every GPU and is the source
    of the restricted view. A host directory (a simulated node's
    ``<proc_root>/driver/nvidia``) when the container's procfs has no driver:
    that tree is carried into the container and restricted the same way.
    """

    container: str  # for messages: 'container "x" in pod "ns/p"'
    visible_bus_ids: tuple[str, ...]
    symlinks: tuple[Symlink, ...]
    ldconfig_folders: tuple[str, ...]
    proc_source: str | None = None
    ld_cache_entries: tuple[LdCacheEntry, ...] = ()  # inserted into the image's cache ("merge")
    ld_cache: LdCache = LdCache.MERGE  # or REBUILD: the trusted ldconfig rebuilds the cache
    # The runtime's linux.cgroupsPath of the container: its pid must be in that
    # cgroup ("" when not known: not checked).
    cgroups_path: str = ""
    # The IPC endpoints the container got (catalogue paths, at the same path in the
    # container as under ``ipc_root``, the driver root as the plugin sees it). A
    # local user may have replaced one since it was checked (``ln -s / /tmp/nvidia-mps``
    # once root's folder is gone), and runc follows links in bind sources: each
    # mount must be the inode the host path holds now, and that one root's alone.
    ipc: tuple[str, ...] = ()
    ipc_root: str = "/"
    # MIG: the capability files the view shows, relative to
    # ``/proc/driver/nvidia/capabilities/`` ("gpu2/mig/gi2/access", "mig/monitor");
    # ``proc_caps_all``: the whole ``capabilities/`` folder, live, instead (a MIG
    # config grant). Only names the driver makes (``is_cap_path``): each becomes
    # a path opened in the source tree and a mount point made in the view.
    proc_caps: tuple[str, ...] = ()
    proc_caps_all: bool = False
    # CUDA forward compatibility (``policy.cuda_compat``): the image's
    # /usr/local/cuda/compat goes before the driver's libraries when it is newer
    # than ``driver_version``, the host driver's (``engine.cudacompat``).
    cuda_compat: bool = False
    driver_version: str = ""
    # Graphics on some GPUs: the application profile's text (``engine.graphics``),
    # written at ``APP_PROFILE_PATH``; "" writes nothing.
    app_profile: str = ""

    def __post_init__(self) -> None:
        if self.ld_cache not in LD_CACHE_MODES:
            raise ValueError(f"ld_cache {self.ld_cache!r}: expected one of {LD_CACHE_MODES}")
        object.__setattr__(self, "ld_cache", LdCache(self.ld_cache))
        for bus in self.visible_bus_ids:
            # Used as one path component under gpus/: anything else is a bug upstream.
            if not bus or "/" in bus or bus in (".", "..") or "\0" in bus:
                raise ValueError(f"bad bus id {bus!r}")
        for path in (
            *(s.path for s in self.symlinks),
            *self.ldconfig_folders,
            *(e.path for e in self.ld_cache_entries),
        ):
            if not is_clean_absolute(path):
                raise ValueError(f"{path!r} is not a clean absolute path")
        if self.proc_source is not None and not is_clean_absolute(self.proc_source):
            raise ValueError(f"proc_source {self.proc_source!r} is not a clean absolute path")
        if len(set(self.ipc)) != len(self.ipc) or any(path not in IPC_TYPES for path in self.ipc):
            raise ValueError(f"ipc {self.ipc[:8]!r}: expected distinct endpoints of {sorted(IPC_TYPES)}")
        if not is_clean_absolute(self.ipc_root):
            raise ValueError(f"ipc_root {self.ipc_root!r} is not a clean absolute path")
        if "\0" in self.cgroups_path or "\n" in self.cgroups_path or len(self.cgroups_path) > 4096:
            raise ValueError(f"bad cgroups path {self.cgroups_path[:200]!r}")
        for cap in self.proc_caps:
            if not is_cap_path(cap):
                raise ValueError(f"proc cap {cap[:200]!r}: not a capability file the driver makes")
        if len(set(self.proc_caps)) != len(self.proc_caps):
            raise ValueError(f"proc caps {self.proc_caps[:8]!r}: listed twice")
        if len(self.driver_version) > 64 or not self.driver_version.isprintable():
            raise ValueError(f"bad driver version {self.driver_version[:64]!r}")
        if len(self.app_profile) > 4096 or "\0" in self.app_profile:
            raise ValueError(f"bad application profile {self.app_profile[:64]!r}")


def is_cap_path(path: str) -> bool:
    """Whether ``path`` names a capability file the driver makes under
    ``/proc/driver/nvidia/capabilities/``: ``mig/config``, ``mig/monitor``,
    ``gpu<M>/mig/gi<G>/access`` or ``gpu<M>/mig/gi<G>/ci<C>/access`` (M 0..31,
    G 0..14, C 0..7, no leading zeros).

    >>> [is_cap_path(p) for p in ("mig/monitor", "gpu2/mig/gi2/ci0/access", "gpu32/mig/gi0/access", "mig/../x")]
    [True, True, False, False]
    """
    if path in ("mig/config", "mig/monitor"):
        return True
    parts = path.split("/")
    if len(parts) not in (4, 5) or parts[1] != "mig" or parts[-1] != "access":
        return False
    if gpu_dir_minor(parts[0]) is None or gpu_instance_id(parts[2]) is None:
        return False
    return len(parts) == 4 or compute_instance_id(parts[3]) is not None


def is_clean_absolute(path: str) -> bool:
    """``/a/b``: absolute, no empty, ``.`` or ``..`` component, no NUL or newline."""
    if not path.startswith("/") or "\0" in path or "\n" in path:
        return False
    parts = path.split("/")[1:]
    return path == "/" or all(p not in ("", ".", "..") for p in parts)


def start_work(
    plan: Plan,
    container: str,
    proc_root: str,
    ld_cache: LdCache = LdCache.MERGE,
    cgroups_path: str = "",
    *,
    driver_root: str = "/",
    ipc: tuple[str, ...] | None = None,
    cuda_compat: bool = False,
    driver_version: str = "",
) -> StartWork:
    """The start-time part of ``plan``; ``proc_root`` is the engine's procfs root,
    ``ld_cache`` the ``engine.ld_cache`` mode, ``cgroups_path`` the container's
    ``linux.cgroupsPath`` as the runtime sent it, ``driver_root`` the engine's,
    ``ipc`` the IPC endpoints to check when they are not the plan's (a
    container the plugin found already equipped: those its mounts hold), ``cuda_compat`` the policy switch and
    ``driver_version`` the host driver's (``Inventory.driver_version``).

    >>> start_work(Plan(visible_bus_ids=("0000:07:00.0",)), 'container "c"', "/proc").proc_source is None
    True
    >>> start_work(Plan(), 'container "c"', "/sim/proc").proc_source
    '/sim/proc/driver/nvidia'
    """
    root = proc_root.rstrip("/") or "/"
    return StartWork(
        container=container,
        visible_bus_ids=plan.visible_bus_ids,
        symlinks=plan.symlinks,
        ldconfig_folders=plan.ldconfig_folders,
        proc_source=None if root == PROC else f"{root}/driver/nvidia",
        ld_cache_entries=plan.ld_cache_entries,
        ld_cache=ld_cache,
        cgroups_path=cgroups_path,
        ipc=plan.ipc if ipc is None else ipc,
        ipc_root=driver_root.rstrip("/") or "/",
        proc_caps=plan.proc_caps,
        proc_caps_all=plan.proc_caps_all,
        cuda_compat=cuda_compat,
        driver_version=driver_version,
        app_profile=plan.app_profile,
    )


@dataclass(frozen=True)
class StartReport:
    """What a successful start did, and what was skipped as already done.

    ``timings_ms``: milliseconds per step as measured in the worker (fork and
    reap excluded): ``enter`` (includes the host-side part of the next steps,
    also counted under their own names), ``IPC endpoints`` (with any: the host
    paths walked again, the mounts compared), ``root copy`` (the detached clone the
    files are read and written through), ``procfs isolation``, ``symlinks``, ``ld.so.conf``, then ``ld.so.cache`` (the merge: read,
    insert, write) or, rebuilding, ``ldconfig`` (the check, and the run if any)
    and ``ldconfig process`` (the ldconfig process alone, fork to reap, when it
    ran), and ``total``. ``ld_cache_written``: the container's ld.so.cache was
    written (not already as wanted). ``cuda_compat``: the CUDA forward-compatibility
    decision in one line ("" when the image has no ``libcuda.so.*.*`` in
    ``/usr/local/cuda/compat`` or the policy turned the check off); its cost is
    the ``CUDA compat`` timing.
    """

    timings_ms: dict[str, float] = field(default_factory=dict)
    procfs: str = "skipped"  # "created", "kept" (an identical view was there) or "skipped" (nothing to hide)
    ld_cache_written: bool = False
    cuda_compat: str = ""
