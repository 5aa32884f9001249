"""Engine settings: where the node's files are, and the policy for requests.  (pure)

The config file's ``[engine]`` table holds the roots and ``[policy]`` the
request policy; ``__main__`` builds an ``EngineConfig`` from it and from flags.
Every value is validated here and a bad one is reported with its key.
"""

from __future__ import annotations

import dataclasses
import enum
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from nri_gpu.engine.errors import EngineError
from nri_gpu.engine.model import ALL_CAPABILITIES, Capability


class EngineConfigError(EngineError, ValueError):
    """A setting is unknown or has a bad value; the message names the key.

    ``key`` (``engine.driver_root``, or empty where no one key is at fault) and
    ``problem`` (the rest of the message) are kept apart, so that a command line
    can name its own flag for the same problem without rewriting the text."""

    def __init__(self, message: str, *, key: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.problem = problem or message

    @classmethod
    def of(cls, key: str, problem: str) -> EngineConfigError:
        return cls(f"{key}: {problem}", key=key, problem=problem)

    def flag_message(self) -> str:
        """The message as a command line says it: the key named by its flag
        (``engine.driver_root`` is ``--driver-root``); as is without a key."""
        if not self.key:
            return str(self)
        return f"--{self.key.removeprefix('engine.').replace('_', '-')}: {self.problem}"


_ROOT_KEYS = ("driver_root", "dev_root", "proc_root", "ldconfig", "host_root")


class LdCache(enum.StrEnum):
    """``engine.ld_cache``: how a GPU container's ld.so.cache gets the driver libraries."""

    MERGE = "merge"  # inserted into the image's own cache; no process runs
    REBUILD = "rebuild"  # the trusted ldconfig rebuilds it, as the toolkit does


LD_CACHE_MODES = tuple(mode.value for mode in LdCache)  # the names a file or flag may give
EQUIPPED_MODES = ("stand-aside", "complete")  # policy.equipped_containers


@dataclasses.dataclass(frozen=True)
class Policy:
    """Who may ask for GPUs, and how.

    ``accept_env_unprivileged``: honour ``NVIDIA_VISIBLE_DEVICES`` in containers
    that are not privileged (the toolkit's default, yes). Security: an image that
    bakes in ``NVIDIA_VISIBLE_DEVICES=all`` then gets every GPU on the node,
    around the scheduler; set false on shared clusters and use the annotation.

    ``accept_volume_mounts``: read the device plugin's ``/dev/null`` markers under
    ``/var/run/nvidia-container-devices/`` (off by default, as the toolkit).

    ``namespaces``: Kubernetes namespaces whose pods may get GPUs at all, by any
    source (annotation, volume markers, env); None allows every namespace. The
    namespace is the pod's, as CRI gives it; a pod made without one (straight
    through CRI) has "" and passes only None.

    ``annotation_namespaces``: Kubernetes namespaces whose pods may use the
    ``nvidia.com/gpus`` annotations; None allows every namespace. A namespace
    must pass ``namespaces`` too.

    ``capabilities``: upper bound on ``NVIDIA_DRIVER_CAPABILITIES``; a request
    beyond it is capped (and the plan notes it).

    ``require_checks``: evaluate ``NVIDIA_REQUIRE_*``; off skips them all.

    ``legacy_image_all_gpus``: the toolkit gives a legacy CUDA image (``CUDA_VERSION``
    set, ``NVIDIA_REQUIRE_CUDA`` unset) every GPU when it names none. That made
    sense for a runtime chosen per container; we see every container of the
    node, so it is off: such an image gets GPUs only when it asks.

    ``mig_monitor_namespaces`` / ``mig_config_namespaces``: namespaces whose pods
    may ask for ``NVIDIA_MIG_MONITOR_DEVICES=all`` (the device plugin, GPU feature
    discovery, DCGM: aggregate information about every MIG device of their GPUs)
    and ``NVIDIA_MIG_CONFIG_DEVICES=all`` (creating and destroying MIG instances:
    other tenants' too). The toolkit grants them only to containers with
    CAP_SYS_ADMIN, which NRI does not tell a plugin; a namespace is the nearest
    word an operator controls. A request from elsewhere is refused.

    ``refuse_mig_mode_gpus``: refuse a whole-GPU request for a GPU in MIG mode
    (CUDA sees no device in it) instead of serving it with a note.

    ``equipped_containers``: what becomes of a container that CDI already gave
    GPUs (``engine.equipped``): ``"stand-aside"`` (nothing added) or
    ``"complete"`` (only the procfs view and the ld.so.cache entries).

    ``cuda_compat``: CUDA forward compatibility, as the toolkit's default: an
    image whose ``/usr/local/cuda/compat`` holds one ``libcuda.so.<version>``
    newer than the host driver (``engine.cudacompat``) gets those libraries
    before the driver's. Security: the folder is image data, read by
    descriptor in the container's root, bounded; off leaves it unread.
    """

    accept_env_unprivileged: bool = True
    accept_volume_mounts: bool = False
    namespaces: tuple[str, ...] | None = None
    annotation_namespaces: tuple[str, ...] | None = None
    capabilities: frozenset[Capability] = ALL_CAPABILITIES
    require_checks: bool = True
    legacy_image_all_gpus: bool = False
    mig_monitor_namespaces: tuple[str, ...] | None = ("kube-system", "gpu-operator")
    mig_config_namespaces: tuple[str, ...] | None = ()
    refuse_mig_mode_gpus: bool = False
    equipped_containers: str = "stand-aside"
    cuda_compat: bool = True

    def __post_init__(self) -> None:
        if self.equipped_containers not in EQUIPPED_MODES:
            modes = ", ".join(repr(m) for m in EQUIPPED_MODES)
            raise EngineConfigError(f"policy.equipped_containers: {self.equipped_containers!r} is not one of {modes}")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """``driver_root``: where the driver's files live (``/``, or ``/run/nvidia/driver``
    with the GPU operator); ``dev_root``: under which ``dev/nvidia*`` are found;
    ``proc_root``: the procfs to read (``/proc``); ``ldconfig``: the trusted ldconfig
    (ours, never the image's) that rebuilds a GPU container's ld.so cache;
    ``host_root``: where the host's ``/`` appears to us. ``/`` on the host itself;
    in a DaemonSet that mounts the host at ``/host``, the roots above are given as
    ``/host/...`` (that is where we read) and every mount source we hand the
    runtime is translated back to the host's own path (that is where runc binds
    from). ``ld_cache``: how a GPU container's ld.so.cache gets the driver
    libraries: ``"merge"`` inserts them into the image's own cache (no process
    runs; see ``engine.ldcache_merge``), ``"rebuild"`` runs ``ldconfig`` over the
    container as the toolkit does (also lists libraries the image left out of
    its cache; 7-11 ms more per container start, docs/performance.md). ``mps``:
    give compute containers the MPS pipe folder ``/tmp/nvidia-mps``; off, because
    ``/tmp`` is every local account's (discovery takes the folder only when it and
    ``/tmp`` are root's and writable by no one else, see ``engine.discover``)."""

    driver_root: str = "/"
    dev_root: str = "/"
    proc_root: str = "/proc"
    ldconfig: str = "/sbin/ldconfig"
    host_root: str = "/"
    ld_cache: LdCache = LdCache.MERGE
    mps: bool = False
    policy: Policy = dataclasses.field(default_factory=Policy)

    def __post_init__(self) -> None:
        for key in _ROOT_KEYS:
            value = getattr(self, key)
            if not isinstance(value, str) or not value.startswith("/"):
                raise EngineConfigError.of(f"engine.{key}", f"{_shown(value)} must be an absolute path")
            if ".." in value.split("/"):
                # Lexical ".." and the kernel's differ below a link: refuse rather than guess.
                raise EngineConfigError.of(f"engine.{key}", f"{_shown(value)} must not contain '..'")
            # Mount sources are built from these: "/host/" and "/host" must compare equal.
            object.__setattr__(self, key, "/" + posixpath.normpath(value).lstrip("/"))
        if not isinstance(self.mps, bool):
            raise EngineConfigError(f"engine.mps: expected true or false, got {_shown(self.mps)}")
        if self.ld_cache not in LD_CACHE_MODES:
            raise EngineConfigError(
                f"engine.ld_cache: {_shown(self.ld_cache)} is not one of {', '.join(repr(m) for m in LD_CACHE_MODES)}"
            )
        # A file or a flag gives the name; everything after compares the member.
        object.__setattr__(self, "ld_cache", LdCache(self.ld_cache))

    def to_host_path(self, path: str) -> str:
        """``path`` as seen by us -> the same file as the runtime on the host sees it.

        Only a clean absolute path is taken (no ``.``, ``..`` or empty component):
        runc resolves a mount source itself, and a ``..`` after a link would lead it
        somewhere else than what we checked. Then whole components are matched
        (``/host`` never matches ``/hostile``). Raises EngineConfigError, naming the
        path, for an unclean path or one outside ``host_root``: planning must refuse
        rather than emit a wrong source.
        """
        if not is_clean_absolute(path):
            raise EngineConfigError(
                f"mount source {_shown(path)} is not a clean absolute path (no '.', '..' or empty component);"
                " the runtime cannot be given it"
            )
        if self.host_root == "/":
            return path
        root = self.host_root.split("/")
        parts = path.split("/")
        if parts[: len(root)] != root:
            raise EngineConfigError(
                f"mount source {_shown(path)} is outside engine.host_root {self.host_root}; the runtime cannot mount it"
            )
        return "/" + "/".join(parts[len(root) :])

    def with_roots(self, **roots: str | None) -> EngineConfig:
        changes: dict[str, Any] = {k: v for k, v in roots.items() if v is not None}
        return dataclasses.replace(self, **changes)


def is_clean_absolute(path: str) -> bool:
    """``/a/b``, not ``a/b``, ``/a/../b``, ``/a/./b``, ``/a//b`` or ``/a/``; ``/`` is clean."""
    return path == "/" or (path.startswith("/") and all(p not in ("", ".", "..") for p in path[1:].split("/")))


def _shown(value: object, limit: int = 256) -> str:
    """repr() of a value for a message, cut to ``limit`` characters: paths can be long."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


_BOOL_POLICY = (
    "accept_env_unprivileged",
    "accept_volume_mounts",
    "require_checks",
    "legacy_image_all_gpus",
    "refuse_mig_mode_gpus",
    "cuda_compat",
)
_NAMESPACE_POLICY = ("namespaces", "annotation_namespaces", "mig_monitor_namespaces", "mig_config_namespaces")
# A Kubernetes namespace name: an RFC 1123 label (a typo such as "ML" would never match).
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)


def _namespaces(key: str, value: Any) -> tuple[str, ...] | None:
    """``"*"`` or ``["*"]``: any namespace (None); else a list of namespace names."""
    if value == "*" or value == ["*"]:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EngineConfigError(f'policy.{key}: expected a list of namespace names or "*", got {value!r}')
    for name in value:
        if name == "*":
            raise EngineConfigError(f'policy.{key}: "*" stands alone; it already allows every namespace')
        if not _NAMESPACE.fullmatch(name):
            raise EngineConfigError(
                f"policy.{key}: {name!r} is not a Kubernetes namespace name (lower-case letters, digits and -)"
            )
    return tuple(value)


def _capabilities(value: Any) -> frozenset[Capability]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EngineConfigError(f"policy.capabilities: expected a list of strings, got {value!r}")
    known = {c.value: c for c in Capability}
    caps = set()
    for name in value:
        if name == "all":
            return ALL_CAPABILITIES
        if name not in known:
            raise EngineConfigError(
                f"policy.capabilities: unknown capability {name!r} (known: {', '.join(sorted(known))}, all)"
            )
        caps.add(known[name])
    return frozenset(caps)


def policy_from_mapping(table: Mapping[str, Any]) -> Policy:
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in _BOOL_POLICY:
            if not isinstance(value, bool):
                raise EngineConfigError(f"policy.{key}: expected true or false, got {value!r}")
            values[key] = value
        elif key in _NAMESPACE_POLICY:
            values[key] = _namespaces(key, value)
        elif key == "capabilities":
            values[key] = _capabilities(value)
        elif key == "equipped_containers":
            values[key] = value  # checked by Policy
        else:
            known = sorted((*_BOOL_POLICY, *_NAMESPACE_POLICY, "capabilities", "equipped_containers"))
            raise EngineConfigError(f"policy.{key}: unknown setting (known: {', '.join(known)})")
    return Policy(**values)


def from_tables(engine: Mapping[str, Any], policy: Mapping[str, Any]) -> EngineConfig:
    """Build from the config file's ``[engine]`` and ``[policy]`` tables."""
    roots: dict[str, Any] = {}
    known = (*_ROOT_KEYS, "ld_cache", "mps")
    for key, value in engine.items():
        if key not in known:
            raise EngineConfigError(f"engine.{key}: unknown setting (known: {', '.join(known)})")
        if key != "mps" and not isinstance(value, str):  # mps: EngineConfig checks it
            what = "a path string" if key in _ROOT_KEYS else "a string"
            raise EngineConfigError(f"engine.{key}: expected {what}, got {value!r}")
        roots[key] = value
    return EngineConfig(policy=policy_from_mapping(policy), **roots)
