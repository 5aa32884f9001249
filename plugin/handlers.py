"""The nri-gpu plugin's event handlers: glue between NRI messages and the engine.

Until the engine lands (request parsing, discovery, planning), the plugin does
the one thing the protocol layer needs proven end to end: a container whose pod
asks for GPUs with the ``nvidia.com/gpus`` annotation (or the container-scoped
``nvidia.com/gpus.container.<name>``) gets ``NVIDIA_VISIBLE_DEVICES`` set to the
request; every other container gets an empty adjustment, at the cost of two
dictionary lookups.
"""

from __future__ import annotations

import logging

from plugin._proto import nri_pb2 as api

logger = logging.getLogger(__name__)

POD_ANNOTATION = "nvidia.com/gpus"
CONTAINER_ANNOTATION_PREFIX = "nvidia.com/gpus.container."


def requested_gpus(pod: api.PodSandbox, container: api.Container) -> str | None:
    """The GPU request of ``container``: the container-scoped annotation wins over the pod's."""
    annotations = pod.annotations
    scoped = annotations.get(CONTAINER_ANNOTATION_PREFIX + container.name)
    if scoped is not None:
        return scoped
    return annotations.get(POD_ANNOTATION)


class GpuPlugin:
    """Event handlers of nri-gpu; the stub subscribes to exactly the methods defined here."""

    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        request = requested_gpus(pod, container)
        if request is None:
            return None
        logger.info('pod "%s/%s" container "%s": GPUs %r requested', pod.namespace, pod.name, container.name, request)
        return api.ContainerAdjustment(env=[api.KeyValue(key="NVIDIA_VISIBLE_DEVICES", value=request)])
