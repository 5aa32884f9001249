"""NRI pod and container messages -> the engine's ``ContainerInfo``.  (pure)

``may_request`` is the hot path: CreateContainer and StartContainer run for
every container of the node, under the runtime's lock, and almost all of them
ask for nothing. It answers with two annotation lookups and one scan of the env
list for a prefix (plus the mount markers only when policy reads them), before
any conversion happens.

Both paths read a bounded amount. A 4 MiB NRI message can carry 800k env
entries (58 ms to scan, 283 ms to turn into a dict); a container with more than
``MAX_ENV_ENTRIES`` env entries (or mounts, where markers count) is not scanned
at all: ``may_request`` says it may ask, and ``container_info`` refuses it by its
count. ``container_info`` copies only what a request reads: the two annotations,
the ``NVIDIA_*`` and ``CUDA_VERSION`` env, the volume markers.
"""

from __future__ import annotations

from engine.config import Policy
from engine.errors import RequestError
from engine.request import (
    CONTAINER_ANNOTATION_PREFIX,
    MAX_ENV_ENTRIES,
    POD_ANNOTATION,
    VOLUME_MARKER_DIR,
    ContainerInfo,
)
from plugin._proto import nri_pb2 as api

_ENV_PREFIX = "NVIDIA_VISIBLE_DEVICES="
_LEGACY_PREFIX = "CUDA_VERSION="
_MARKER_PREFIX = VOLUME_MARKER_DIR + "/"
_REQUEST_ENV = ("NVIDIA_", _LEGACY_PREFIX)  # every name engine.request reads starts so


def may_request(pod: api.PodSandbox, container: api.Container, policy: Policy) -> bool:
    """False only when the container certainly asks for no GPU (cheap; see module doc)."""
    annotations = pod.annotations
    if POD_ANNOTATION in annotations or CONTAINER_ANNOTATION_PREFIX + container.name in annotations:
        return True
    env = container.env
    if len(env) > MAX_ENV_ENTRIES:
        return True  # too many to look through: container_info refuses it
    for entry in env:
        if entry.startswith(_ENV_PREFIX) or (policy.legacy_image_all_gpus and entry.startswith(_LEGACY_PREFIX)):
            return True
    if not policy.accept_volume_mounts:
        return False
    mounts = container.mounts
    return len(mounts) > MAX_ENV_ENTRIES or any(m.destination.startswith(_MARKER_PREFIX) for m in mounts)


def env_map(container: api.Container) -> dict[str, str]:
    """The container's ``KEY=VALUE`` list as a dict; the first wins, as getenv(3) sees it."""
    env: dict[str, str] = {}
    for entry in container.env:
        key, _, value = entry.partition("=")
        env.setdefault(key, value)
    return env


def _request_env(container: api.Container) -> dict[str, str]:
    """``env_map`` of only the entries a request reads; refuses an env past the bound unread."""
    if len(container.env) > MAX_ENV_ENTRIES:
        raise RequestError(
            f"the container has {len(container.env)} env entries; nri-gpu reads at most {MAX_ENV_ENTRIES}"
        )
    env: dict[str, str] = {}
    for entry in container.env:
        if entry.startswith(_REQUEST_ENV):
            key, _, value = entry.partition("=")
            env.setdefault(key, value)
    return env


def _markers(container: api.Container) -> tuple[tuple[str, str], ...]:
    if len(container.mounts) > MAX_ENV_ENTRIES:
        raise RequestError(f"the container has {len(container.mounts)} mounts; nri-gpu reads at most {MAX_ENV_ENTRIES}")
    return tuple((m.source, m.destination) for m in container.mounts if m.destination.startswith(_MARKER_PREFIX))


def container_info(pod: api.PodSandbox, container: api.Container) -> ContainerInfo:
    """What a request is made of; raises RequestError for a container past the bounds (module doc)."""
    annotations = pod.annotations
    wanted = (CONTAINER_ANNOTATION_PREFIX + container.name, POD_ANNOTATION)
    return ContainerInfo(
        name=container.name,
        pod_name=pod.name,
        pod_namespace=pod.namespace,
        pod_annotations={key: annotations[key] for key in wanted if key in annotations},
        env=_request_env(container),
        mounts=_markers(container),
        # NRI does not tell whether a container is privileged; treating every
        # container as unprivileged is the safe reading of the env policy.
        privileged=False,
    )


def describe(pod: api.PodSandbox, container: api.Container) -> str:
    return f'container "{container.name}" in pod "{pod.namespace}/{pod.name}"'
