"""NRI pod and container messages -> the engine's ``ContainerInfo``.  (pure)

``may_request`` is the hot path: CreateContainer and StartContainer run for
every container of the node, under the runtime's lock, and almost all of them
ask for nothing. It hands the message's fields, unconverted, to the engine's
pre-filter (``engine.request.may_request``, beside the precedence rules it
mirrors), and adds the one case that is no request: a container CDI already
gave GPUs, under ``policy.equipped_containers = "complete"``.

Both paths read a bounded amount. The NRI message is at most 4 MiB (the ttrpc
frame limit): 800k env entries at most, 58 ms to scan. A container that asks for
nothing (no GPU annotation, no ``NVIDIA_VISIBLE_DEVICES``, no marker) is never
refused for its size (it gets nothing and pays only the scan);
``container_info`` copies only what a request reads (the two annotations, the
``NVIDIA_*`` and ``CUDA_VERSION`` env, the volume markers) and refuses a container
with more than ``MAX_REQUEST_ENV`` such env entries or ``MAX_LIST_ENTRIES``
markers as soon as it counts past the bound, before building anything bigger.
"""

from __future__ import annotations

from nri_gpu.engine import (
    CONTAINER_ANNOTATION_PREFIX,
    MAX_DEVICE_NODES,
    MAX_LIST_ENTRIES,
    MAX_REQUEST_ENV,
    POD_ANNOTATION,
    VOLUME_MARKER_DIR,
    ContainerInfo,
    Policy,
    RequestError,
)
from nri_gpu.engine import may_request as _may_request
from nri_gpu.plugin._proto import nri_pb2 as api

_MARKER_PREFIX = VOLUME_MARKER_DIR + "/"
_REQUEST_ENV = ("NVIDIA_", "CUDA_VERSION=")  # every name engine.request reads starts so


def may_request(pod: api.PodSandbox, container: api.Container, policy: Policy) -> bool:
    """False only when the container certainly asks for no GPU (cheap; see module doc)."""
    # The mounts only where policy reads them: even an unread generator costs most
    # containers (default policy) a tenth of the pre-filter.
    destinations = (m.destination for m in container.mounts) if policy.accept_volume_mounts else ()
    if _may_request(pod.annotations, container.name, container.env, destinations, policy):
        return True
    # A container CDI already gave GPUs is completed without a request of ours.
    return policy.equipped_containers == "complete" and any(
        d.path.startswith("/dev/nvidia") for d in container.linux.devices
    )


def first_values(container: api.Container, keys: tuple[str, ...]) -> dict[str, str]:
    """The values of ``keys`` in the container's env as getenv(3) sees them (the
    first entry wins); one scan that copies nothing else (the env can hold
    hundreds of thousands of entries within one NRI message)."""
    found: dict[str, str] = {}
    if not keys:
        return found
    prefixes = tuple(f"{key}=" for key in keys)
    for entry in container.env:
        if entry.startswith(prefixes):
            key, _, value = entry.partition("=")
            found.setdefault(key, value)
            if len(found) == len(keys):
                break
    return found


def _request_env(container: api.Container) -> dict[str, str]:
    """The entries a request reads, first wins as getenv(3) sees it; refuses more than ``MAX_REQUEST_ENV`` of them."""
    env: dict[str, str] = {}
    count = 0
    for entry in container.env:
        if entry.startswith(_REQUEST_ENV):
            count += 1
            if count > MAX_REQUEST_ENV:
                raise RequestError(
                    f"the container has more than {MAX_REQUEST_ENV} NVIDIA_* and CUDA_VERSION env entries"
                )
            key, _, value = entry.partition("=")
            env.setdefault(key, value)
    return env


def _markers(container: api.Container) -> tuple[tuple[str, str], ...]:
    found: list[tuple[str, str]] = []
    for m in container.mounts:
        if m.destination.startswith(_MARKER_PREFIX):
            if len(found) == MAX_LIST_ENTRIES:
                raise RequestError(f"volume mounts under {VOLUME_MARKER_DIR}: more than {MAX_LIST_ENTRIES} entries")
            found.append((m.source, m.destination))
    return tuple(found)


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
        devices=_char_devices(container),
    )


def _char_devices(container: api.Container) -> tuple[tuple[int, int], ...]:
    devices = container.linux.devices
    if len(devices) > MAX_DEVICE_NODES:
        return ()
    return tuple((d.major, d.minor) for d in devices if d.type == "c")


def describe(pod: api.PodSandbox, container: api.Container) -> str:
    return f'container "{container.name}" in pod "{pod.namespace}/{pod.name}"'
