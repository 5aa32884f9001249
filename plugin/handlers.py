"""nri-gpu's event handlers: glue between NRI messages and the engine.

CreateContainer: request -> plan -> adjustment (devices, read-only mounts, env,
an annotation). StartContainer: the part a spec edit cannot do, in the
container's mount namespace (see ``engine.start``). A container that asks for
nothing is turned away by ``may_request`` before any work; an engine refusal
becomes a PluginError whose message the runtime shows in the failed CRI call.
The handlers hold the logic only: each runs inside ``plugin.decisions``, which
times it, counts it and writes its one decision line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from nri_gpu.engine import (
    DRIVER_CAPABILITIES,
    ContainerInfo,
    DriverFile,
    EngineConfig,
    EngineError,
    GpuRequest,
    Inventory,
    InventoryCache,
    Plan,
    Source,
    StartError,
    UnknownDeviceError,
    UnknownMigDeviceError,
    cdi_names,
    completion,
    conflict,
    current_ipc,
    find_equipped,
    find_init_pid,
    ipc_in_mounts,
    make_plan,
    nvidia_nri_annotation,
    parse_capabilities,
    parse_request,
    run_start_async,
    shows_driver_view,
    start_work,
)
from nri_gpu.plugin import budget
from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.adjustment import GPUS_ANNOTATION, to_adjustment
from nri_gpu.plugin.decisions import CREATE, START, VALIDATE, Decisions, Outcome, subject_fields
from nri_gpu.plugin.errors import PluginError
from nri_gpu.plugin.inventory import LiveInventory
from nri_gpu.plugin.logfmt import EXTRA_KEY
from nri_gpu.plugin.metrics import PluginMetrics
from nri_gpu.plugin.offloop import map_until
from nri_gpu.plugin.request import container_info, describe, may_request

logger = logging.getLogger(__name__)

Starter = Callable[..., Awaitable[None]]
ViewCheck = Callable[[int], bool | None]  # pid -> shows our /proc view (None: cannot tell)


class GpuPlugin:
    """Event handlers of nri-gpu; the stub subscribes to exactly the methods defined here."""

    def __init__(
        self,
        config: EngineConfig,
        inventory: InventoryCache | None = None,
        *,
        starter: Starter = run_start_async,
        view_check: ViewCheck = shows_driver_view,
        metrics: PluginMetrics | None = None,
    ) -> None:
        self._config = config
        # Taken here, before the plugin connects: the first request must not pay for it.
        self._inventory = LiveInventory(inventory if inventory is not None else InventoryCache(config))
        self._starter = starter
        self._view_check = view_check
        self._metrics = metrics
        # Times, counts and logs each handler's decision; the handlers keep the logic.
        self._decisions = Decisions(logger, metrics)
        if metrics is not None:
            metrics.inventory_gpus.set(len(self._inventory.current().gpus))
        # Plans made at CreateContainer, used at StartContainer; a miss is
        # planned again or refused (``_replan``).
        self._pending: dict[str, Plan] = {}
        # The IPC endpoints handed out, and why others were not, as last logged.
        self._ipc_state: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        # CreateContainer's answer per container that may ask for GPUs, for its
        # ValidateContainerAdjustment: the value of our annotation in the adjustment,
        # or None for "nothing to add". Bounded (``_remember``).
        self._answered: dict[str, str | None] = {}

    async def _plan(
        self,
        pod: api.PodSandbox,
        container: api.Container,
        steps: dict[str, float] | None = None,
        share: float = 1.0,
        *,
        ours: bool = False,
    ) -> Plan | None:
        """Request -> plan; ``steps`` gets the milliseconds of ``request`` and ``plan``.

        A GPU the inventory lacks may be one a refresh in flight (new driver,
        hot plug) is about to add: that waits for it, at most ``share`` of the
        time the runtime still gives the request, then plans again or refuses.
        The request is parsed and the IPC endpoints walked once either way.
        """
        try:
            began = time.perf_counter()
            info = container_info(pod, container)
            outcome = parse_request(info, self._config.policy)
            parsed = time.perf_counter()
            for note in outcome.notes:
                logger.info("%s: %s", describe(pod, container), note)
            if outcome.request is None:
                return self._equipped(pod, container, info, None, "", ours=ours)
            request, ipc = outcome.request, self._ipc_now()
            inventory = self._inventory.current()
            waited = 0.0
            try:
                result = self._plan_on(request, inventory, ipc)
            except UnknownDeviceError as missing:
                waiting = time.perf_counter()
                # NVML's snapshot lacking a MIG UUID may be older than the instance
                # (made again under the same ids): take it again even if procfs looks the same.
                stale = isinstance(missing, UnknownMigDeviceError)
                newer = await self._inventory.newer(budget.left() * share, force=stale)
                waited = time.perf_counter() - waiting
                if steps is not None:
                    steps["inventory_wait"] = waited * 1000
                if newer is None:
                    raise PluginError(
                        f"{missing}; the node's inventory is being taken again (the driver state changed) and was "
                        "not ready in time; try again"
                    ) from missing
                if newer is inventory:
                    raise
                result = self._plan_on(request, newer, ipc)
            if steps is not None:
                steps["request"] = (parsed - began) * 1000
                steps["plan"] = (time.perf_counter() - parsed - waited) * 1000
            final = self._equipped(pod, container, info, result, request.source, ours=ours)
        except EngineError as exc:
            raise PluginError(str(exc)) from exc
        for note in final.notes if final is not None else ():
            logger.info("%s: %s", describe(pod, container), note)
        return final

    def _equipped(
        self,
        pod: api.PodSandbox,
        container: api.Container,
        info: ContainerInfo,
        planned: Plan | None,
        source: str,
        *,
        ours: bool = False,
    ) -> Plan | None:
        """``planned`` (what the container's own request from ``source`` gives, None without one),
        held against what the container already has (``engine.equipped``): the plan
        to apply, None to leave the container alone. Raises PluginError naming both
        sets when they differ, and EngineError (planning the completion)."""
        policy = self._config.policy
        who = describe(pod, container)
        other = nvidia_nri_annotation(pod.annotations)
        if other is not None and planned is not None:
            if source.startswith("env "):
                logger.info("%s: %s ignored: NVIDIA's NRI plugin equips this pod (annotation %s)", who, source, other)
                return None
            raise PluginError(
                f"its pod asks NVIDIA's NRI plugin for GPUs (annotation {other}) and {source} asks nri-gpu: "
                "two producers would inject two sets; use one"
            )
        # ``ours``: planned again at StartContainer (after a restart of this process)
        # for a container our CreateContainer equipped from its request: its devices and
        # mounts are ours, not another producer's. Only then: at CreateContainer our
        # annotation cannot be there yet, so one that is was not written by us. (One we
        # completed without a request of its own goes through the rules again.)
        if not info.devices or (ours and planned is not None):
            return planned
        inventory = self._inventory.current()
        names = cdi_names({**pod.annotations, **container.annotations}, (d.name for d in container.CDI_devices))
        mounted = {m.destination for m in container.mounts}
        have = find_equipped(info.devices, mounted, names, inventory)
        if have is None:
            return planned
        if planned is not None:
            why = conflict(have, planned, source)
            if why is not None:
                raise PluginError(why)
        if have.source is not Source.CDI:
            return planned  # device nodes only (passDeviceSpecs): the driver files are ours to give
        if policy.equipped_containers == "stand-aside":
            logger.info("%s: already has %s (%s); nri-gpu stands aside", who, have.describe(), have.evidence)
            return None
        caps = (
            planned.capabilities
            if planned is not None
            else parse_capabilities(info.env.get(DRIVER_CAPABILITIES), legacy_image=False)
        )
        return completion(have, inventory, self._config, caps, mounted)

    def _plan_on(self, request: GpuRequest, inventory: Inventory, ipc: tuple[DriverFile, ...]) -> Plan:
        if self._metrics is not None:
            self._metrics.inventory_gpus.set(len(inventory.gpus))
        return make_plan(request, inventory, self._config, ipc=ipc)

    def _ipc_now(self) -> tuple[DriverFile, ...]:
        """The IPC endpoints as they are now (``current_ipc``, tens of microseconds);
        a change since the last look is logged once, not at every container."""
        files, warnings = current_ipc(self._config)
        state = (tuple(f.path for f in files), warnings)
        if state != self._ipc_state:
            for warning in warnings:
                logger.warning("%s; GPU containers created from now on do not get it", warning)
            logger.info("host IPC mounts for GPU containers from now on: %s", ", ".join(state[0]) or "none")
            self._ipc_state = state
        return files

    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        if not may_request(pod, container, self._config.policy):
            self._decisions.nothing_asked(CREATE, pod, container)
            return None
        with self._decisions.record(CREATE, pod, container) as decision:
            plan = await self._plan(pod, container, decision.steps_ms)
            if plan is None:
                self._remember(container.id, None)
                return None
            encoding = time.perf_counter()
            adjustment = to_adjustment(plan, container)
            decision.steps_ms["adjustment"] = (time.perf_counter() - encoding) * 1000
            self._remember(container.id, adjustment.annotations[GPUS_ANNOTATION])
            self._pending[container.id] = plan
            capabilities = sorted(c.value for c in plan.capabilities)
            named = [*(str(g.index) for g in plan.gpus), *(m.index or m.name for m in plan.mig_devices)]
            decision.allow(
                Outcome.ALLOCATED,
                f"GPUs {','.join(named) or 'none'}, capabilities {','.join(capabilities)}, "
                f"{len(adjustment.linux.devices)} devices, {len(adjustment.mounts)} mounts",
                given=len(plan.gpus) + len(plan.mig_devices),
                gpus=[g.index for g in plan.gpus],
                gpu_uuids=[g.uuid for g in plan.gpus],
                **({"mig_devices": [m.name for m in plan.mig_devices]} if plan.mig_devices else {}),
                capabilities=capabilities,
                devices=len(adjustment.linux.devices),
                mounts=len(adjustment.mounts),
            )
            return adjustment

    def _on_start_report(
        self, who: str, into: dict[str, float], timings_ms: dict[str, float], cuda_compat: str
    ) -> None:
        if cuda_compat:
            logger.info("%s: CUDA forward compatibility: %s", who, cuda_compat)
        into.update(timings_ms)

    async def start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        """Finish a GPU container in its own mount namespace before its process runs."""
        if not may_request(pod, container, self._config.policy):
            self._decisions.nothing_asked(START, pod, container)
            return
        with self._decisions.record(START, pod, container) as decision:
            who = describe(pod, container)
            kept = self._pending.pop(container.id, None)
            try:
                plan = kept or await self._replan(pod, container)
                if plan is None:
                    return
                # The IPC endpoints to compare with the host's: what the container was
                # given. A plan made again now may list others (a daemon gone or started
                # since its creation); the container's own mounts say what it got.
                mounted = ipc_in_mounts(((m.source, m.destination) for m in container.mounts), self._config)
            except EngineError as exc:  # a mount source outside engine.host_root
                raise PluginError(str(exc)) from exc
            ipc = mounted if kept is None else tuple(sorted({*plan.ipc, *mounted}))
            try:
                pid = container.pid or find_init_pid(container.linux.cgroups_path, container=who)
                await self._starter(
                    pid,
                    start_work(
                        plan,
                        who,
                        self._config.proc_root,
                        self._config.ld_cache,
                        container.linux.cgroups_path,
                        driver_root=self._config.driver_root,
                        ipc=ipc,
                        cuda_compat=self._config.policy.cuda_compat,
                        driver_version=self._inventory.current().driver_version or "",
                    ),
                    ldconfig=self._config.ldconfig,
                    # What the runtime still gives this request: the worker is killed in
                    # time for the refusal to reach it (budget.REPLY_MARGIN).
                    timeout=budget.left(),
                    # The engine's steps go into the decision line and under "start/<step>".
                    on_report=lambda report: self._on_start_report(
                        who, decision.steps_ms, report.timings_ms, report.cuda_compat
                    ),
                )
            except EngineError as exc:
                # The decision line and the stub already name the container and pod; keep the step and cause.
                raise PluginError(f"{exc.step}: {exc.error}" if isinstance(exc, StartError) else str(exc)) from exc
            bus_ids = list(plan.visible_bus_ids)
            decision.allow(Outcome.STARTED, f"started with GPUs {','.join(bus_ids) or 'none'}", gpus=bus_ids)

    async def _replan(self, pod: api.PodSandbox, container: api.Container) -> Plan | None:
        """The plan of a container created without this process's knowledge.

        Either an earlier run of the plugin created it (it carries our
        annotation: plan again from the same inputs, which must give the same
        GPUs), or it was created while no plugin was connected (it asks for GPUs
        but has none of their devices or files): fail closed, never start a GPU
        container half-equipped.
        """
        # The rest of the time is the start work's. Carrying our annotation, it is ours.
        plan = await self._plan(pod, container, share=0.5, ours=GPUS_ANNOTATION in container.annotations)
        if plan is None:
            return None
        given = container.annotations.get(GPUS_ANNOTATION)
        if given is None:
            raise PluginError(
                "it asks for GPUs but was created while nri-gpu was not connected, so it has none of their "
                "devices or driver files; delete it and create it again"
            )
        planned = ",".join(plan.device_names) or "none"
        if given != planned:
            raise PluginError(f"it was created with GPUs {given}, but its request now selects {planned}")
        return plan

    async def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        """Name the running GPU containers that did not get all of our work.

        The runtime serves CRI before an external plugin is back (after a
        runtime restart, or ours), and drops a plugin whose connection breaks
        mid-request. So two kinds of container can be running that no plugin
        can stop any more: one created *and* started while we were away (it
        asked for GPUs and has none), and one whose StartContainer was in
        flight when the plugin died (it has CreateContainer's devices and
        files but not the start work: no /proc view, links or ld.so cache).
        Say so once, loudly, for each, so an operator can recreate it.
        """
        began = time.perf_counter()
        # Registered again: a plan kept from the old connection may be one whose
        # reply never reached the runtime, which then created the container without
        # it. Such a container is planned again at its start (``_replan``), and
        # fails closed unless it carries our annotation.
        self._pending.clear()
        by_id = {pod.id: pod for pod in pods}
        equipped: list[tuple[api.PodSandbox, api.Container]] = []
        for container in containers:
            pod = by_id.get(container.pod_sandbox_id)
            if (
                pod is None
                or container.state != api.CONTAINER_RUNNING
                or not may_request(pod, container, self._config.policy)
            ):
                continue
            given = container.annotations.get(GPUS_ANNOTATION)
            if given is None:
                self._name_if_unequipped(pod, container)
            elif given != "none" and container.pid > 0:
                equipped.append((pod, container))
        # A look into each container's root: a few syscalls each, but the container
        # owns what they walk through (a hung FUSE mount would stop them), so in a
        # thread, and only as long as the runtime's deadline allows.
        shown = await map_until(self._view_check, [c.pid for _, c in equipped], budget.left(), "nri-gpu-views")
        for (pod, container), view in zip(equipped, shown, strict=False):  # shorter when time ran out
            if view is False:
                _name_running(
                    pod,
                    container,
                    "half_equipped",
                    "half equipped",
                    "it has its GPUs' devices and driver files but not its start work (no /proc/driver view, "
                    "library links or ld.so cache): nri-gpu stopped, or the runtime dropped it, while it was starting",
                )
        ms = (time.perf_counter() - began) * 1000
        if len(shown) < len(equipped):
            logger.warning(
                "Synchronize: %d of %d running GPU containers not checked for their start work: out of time (%.0f ms)",
                len(equipped) - len(shown),
                len(equipped),
                ms,
            )
        logger.debug("Synchronize: %d containers, %d views checked (%.1f ms)", len(containers), len(shown), ms)

    def _name_if_unequipped(self, pod: api.PodSandbox, container: api.Container) -> None:
        try:
            asked = parse_request(container_info(pod, container), self._config.policy).request is not None
        except EngineError:
            asked = True  # a request we would have refused: it runs without GPUs all the same
        if asked:
            _name_running(
                pod,
                container,
                "unequipped",
                "without its GPUs",
                "it asked for GPUs but was created and started while nri-gpu was not connected",
            )

    async def remove_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self._pending.pop(container.id, None)
        self._answered.pop(container.id, None)

    def _remember(self, container_id: str, mark: str | None) -> None:
        """Keep CreateContainer's answer for the validation that follows it. A
        creation that fails after our answer (another plugin refused it) is never
        validated nor removed: the oldest answers go past ``_ANSWERED_MAX``."""
        self._answered[container_id] = mark
        while len(self._answered) > _ANSWERED_MAX:
            del self._answered[next(iter(self._answered))]

    async def validate_container_adjustment(self, request: api.ValidateContainerAdjustmentRequest) -> None:
        """Refuse a GPU container that is about to be created without our adjustment.

        Subscribed only where the runtime offers validation (NRI v0.10: containerd
        >= 2.2, CRI-O >= 1.34; ``plugin.events``). The runtime calls every validator
        after all plugins answered CreateContainer, with the merged adjustment it is
        about to apply, and fails the creation when one rejects. That closes the
        holes ``required_plugins`` leaves: our CreateContainer timed out (the
        runtime counts us present and applies nothing of ours) or was never sent
        to us (we registered in the middle of the creation). A container that may
        ask for GPUs (``may_request``, the same pre-filter as CreateContainer) must
        have been answered by this process, and when that answer was an adjustment,
        the merged adjustment must carry our annotation with the value we gave it
        (only plugins' edits are in ``request.adjust``, so a container that came
        with the annotation does not pass for one we equipped). An answer of
        "nothing to add" (a request for no GPU, a container NVIDIA's plugin or CDI
        equips) passes.

        Runs under the runtime's deadline for every container of the node: a
        dict lookup and the pre-filter, no I/O. Raises PluginError to reject.
        """
        pod, container = request.pod, request.container
        if not may_request(pod, container, self._config.policy):
            self._decisions.nothing_asked(VALIDATE, pod, container)
            return
        with self._decisions.record(VALIDATE, pod, container) as decision:
            answered = self._answered.pop(container.id, _UNANSWERED)
            if answered is None:
                return
            if answered is _UNANSWERED:
                raise PluginError(
                    "it may ask for GPUs but nri-gpu was not asked for its CreateContainer (nri-gpu registered while "
                    "it was being created, or restarted since): refusing to create it without its GPUs; try again"
                )
            got = request.adjust.annotations.get(GPUS_ANNOTATION)
            if got == answered:
                decision.allow(Outcome.PASSED, f"passed ({GPUS_ANNOTATION} {got})")
                return
            why = (
                "nri-gpu's CreateContainer reply did not reach the runtime in time; try again"
                if got is None
                else "another plugin changed it"
            )
            raise PluginError(
                f"it asks for GPUs but the adjustment the runtime is about to apply is not nri-gpu's "
                f"({GPUS_ANNOTATION} is {'missing' if got is None else repr(got)}, nri-gpu answered {answered!r}): "
                f"{why}"
            )


# At most this many CreateContainer answers wait for their validation; far more
# than a node creates within one runtime request timeout.
_ANSWERED_MAX = 4096
_UNANSWERED = "\0unanswered"  # not a value of our annotation (``Plan.device_names`` joined)


def _name_running(pod: api.PodSandbox, container: api.Container, decision: str, state: str, reason: str) -> None:
    """One loud line for a running container that Synchronize found short of our work."""
    fields = subject_fields("Synchronize", pod, container, decision=decision, reason=reason)
    logger.warning(
        "%s runs %s: %s; delete it and create it again",
        describe(pod, container),
        state,
        reason,
        extra={EXTRA_KEY: fields},
    )
