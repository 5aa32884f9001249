"""NRI pod and container messages -> the engine's ``ContainerInfo``.  (pure)

``may_request`` is the hot path: CreateContainer and StartContainer run for
every container of the node, under the runtime's lock, and almost all of them
ask for nothing. It answers with two annotation lookups and one scan of the env
list for a prefix (plus the mount markers only when policy reads them), before
any conversion happens.
"""

from __future__ import annotations

from engine.config import Policy
from engine.request import CONTAINER_ANNOTATION_PREFIX, POD_ANNOTATION, VOLUME_MARKER_DIR, ContainerInfo
from plugin._proto import nri_pb2 as api

_ENV_PREFIX = "NVIDIA_VISIBLE_DEVICES="
_LEGACY_PREFIX = "CUDA_VERSION="
_MARKER_PREFIX = VOLUME_MARKER_DIR + "/"


def may_request(pod: api.PodSandbox, container: api.Container, policy: Policy) -> bool:
    """False only when the container certainly asks for no GPU (cheap; see module doc)."""
    annotations = pod.annotations
    if POD_ANNOTATION in annotations or CONTAINER_ANNOTATION_PREFIX + container.name in annotations:
        return True
    for entry in container.env:
        if entry.startswith(_ENV_PREFIX) or (policy.legacy_image_all_gpus and entry.startswith(_LEGACY_PREFIX)):
            return True
    return policy.accept_volume_mounts and any(m.destination.startswith(_MARKER_PREFIX) for m in container.mounts)


def env_map(container: api.Container) -> dict[str, str]:
    """The container's ``KEY=VALUE`` list as a dict; the first wins, as getenv(3) sees it."""
    env: dict[str, str] = {}
    for entry in container.env:
        key, _, value = entry.partition("=")
        env.setdefault(key, value)
    return env


def container_info(pod: api.PodSandbox, container: api.Container) -> ContainerInfo:
    env = env_map(container)
    return ContainerInfo(
        name=container.name,
        pod_name=pod.name,
        pod_namespace=pod.namespace,
        pod_annotations=dict(pod.annotations),
        env=env,
        mounts=tuple((m.source, m.destination) for m in container.mounts),
        # NRI does not tell whether a container is privileged; treating every
        # container as unprivileged is the safe reading of the env policy.
        privileged=False,
    )


def describe(pod: api.PodSandbox, container: api.Container) -> str:
    return f'container "{container.name}" in pod "{pod.namespace}/{pod.name}"'
