"""nri-gpu's event handlers: glue between NRI messages and the engine.

CreateContainer: request -> plan -> adjustment (devices, read-only mounts, env,
an annotation). StartContainer: the part a spec edit cannot do, in the
container's mount namespace (see ``engine.start``). A container that asks for
nothing is turned away by ``may_request`` before any work; an engine refusal
becomes a PluginError whose message the runtime shows in the failed CRI call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from engine.config import EngineConfig
from engine.discover import InventoryCache
from engine.errors import EngineError, StartError
from engine.model import Plan
from engine.plan import plan as make_plan
from engine.request import parse_request
from engine.start.runner import find_init_pid, run_start_async
from engine.start.work import start_work
from plugin._proto import nri_pb2 as api
from plugin.adjustment import to_adjustment
from plugin.errors import PluginError
from plugin.request import container_info, describe, may_request

logger = logging.getLogger(__name__)

Starter = Callable[..., Awaitable[None]]


class GpuPlugin:
    """Event handlers of nri-gpu; the stub subscribes to exactly the methods defined here."""

    def __init__(
        self,
        config: EngineConfig,
        inventory: InventoryCache | None = None,
        *,
        starter: Starter = run_start_async,
    ) -> None:
        self._config = config
        self._inventory = inventory if inventory is not None else InventoryCache(config)
        self._starter = starter
        # Plans made at CreateContainer, used at StartContainer; a miss (the plugin
        # restarted in between) is planned again from the same inputs.
        self._pending: dict[str, Plan] = {}

    def _plan(self, pod: api.PodSandbox, container: api.Container) -> Plan | None:
        try:
            outcome = parse_request(container_info(pod, container), self._config.policy)
            for note in outcome.notes:
                logger.info("%s: %s", describe(pod, container), note)
            if outcome.request is None:
                return None
            result = make_plan(outcome.request, self._inventory.get(), self._config)
        except EngineError as exc:
            raise PluginError(str(exc)) from exc
        for note in result.notes:
            logger.info("%s: %s", describe(pod, container), note)
        return result

    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        if not may_request(pod, container, self._config.policy):
            return None
        began = time.perf_counter()
        try:
            plan = self._plan(pod, container)
        except PluginError as exc:
            logger.warning("%s: refused: %s", describe(pod, container), exc)
            raise
        if plan is None:
            return None
        adjustment = to_adjustment(plan, container)
        self._pending[container.id] = plan
        gpus = ",".join(str(g.index) for g in plan.gpus) or "none"
        logger.info(
            "%s: GPUs %s, capabilities %s, %d devices, %d mounts (%.2f ms)",
            describe(pod, container),
            gpus,
            ",".join(sorted(c.value for c in plan.capabilities)),
            len(adjustment.linux.devices),
            len(adjustment.mounts),
            (time.perf_counter() - began) * 1000,
        )
        return adjustment

    async def start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        """Finish a GPU container in its own mount namespace before its process runs."""
        if not may_request(pod, container, self._config.policy):
            return
        began = time.perf_counter()
        plan = self._pending.pop(container.id, None) or self._plan(pod, container)
        if plan is None:
            return
        who = describe(pod, container)
        try:
            pid = container.pid or find_init_pid(container.linux.cgroups_path, container=who)
            await self._starter(
                pid,
                start_work(plan, who, self._config.proc_root),
                ldconfig=self._config.ldconfig,
                on_report=lambda report: logger.debug("%s: start steps (ms) %s", who, report.timings_ms),
            )
        except EngineError as exc:
            logger.warning("%s: start refused: %s", who, exc)
            # The stub already names the container and pod; keep the step and cause.
            reason = f"{exc.step}: {exc.error}" if isinstance(exc, StartError) else str(exc)
            raise PluginError(reason) from exc
        logger.info(
            "%s: started with GPUs %s (%.1f ms)",
            who,
            ",".join(g.bus_id for g in plan.gpus) or "none",
            (time.perf_counter() - began) * 1000,
        )

    async def remove_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self._pending.pop(container.id, None)
