"""The decision of each handled request: its one log line, its timing, its counts.

Theory of operation
-------------------
A handler that decides about a container (CreateContainer, StartContainer,
ValidateContainerAdjustment) runs its logic inside ``Decisions.record``::

    if not may_request(pod, container, policy):
        decisions.nothing_asked(CREATE, pod, container)
        return None
    with decisions.record(CREATE, pod, container) as decision:
        ...                                  # the logic; may raise PluginError
        decision.allow(Outcome.ALLOCATED, "GPUs 0, ...", given=1, gpus=[0])
        return adjustment

and this module, not the handler, does the rest when the block ends, whichever
way it ends:

* times the block and records it under the event's step
  (``nri_gpu_step_duration_seconds{step="plan"}``), and each part the logic
  timed into ``decision.steps_ms`` under ``<step>/<part>``;
* counts the devices given (``nri_gpu_gpus_allocated_total``);
* writes one decision line: the words for people (the text format), the same
  decision as fields for tools (the JSON format, ``plugin.logfmt``): event,
  pod, namespace, container, container_id, ``decision`` (an ``Outcome``), what
  the handler added (GPUs, devices ...) or the ``reason`` of a refusal,
  ``duration_ms`` and ``steps_ms``.

A ``PluginError`` raised anywhere in the block is the event's refusal (a
refusal from building the adjustment as much as one from planning); any other
exception is a bug, logged here as an ``error`` decision (the stub adds its
traceback). Either is raised on unchanged. The stub keeps what belongs to the
protocol: it counts every request (``nri_gpu_events_total``) and every failed
one by kind (``nri_gpu_errors_total``), and turns the exception into the status
the runtime shows.

Levels: a grant (``allocated``, ``started``) is info, a refusal warning, a bug
error. A container that asks for nothing, or that asked but needs nothing of
ours, is debug: every container of the node passes through CreateContainer,
StartContainer and the validation, and at info those lines would bury the GPU
decisions an operator looks for. ``nothing_asked`` is not timed and costs, below
debug, one cached level check: it is the path of most containers, which must
pay no more for nri-gpu than they did.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.errors import PluginError, bounded
from nri_gpu.plugin.logfmt import EXTRA_KEY
from nri_gpu.plugin.metrics import STEP_PLAN, STEP_START, PluginMetrics
from nri_gpu.plugin.request import describe

__all__ = [
    "CREATE",
    "START",
    "VALIDATE",
    "Decision",
    "Decisions",
    "Handled",
    "Outcome",
    "subject_fields",
]


class Outcome(enum.Enum):
    """The ``decision`` field of a decision line."""

    ALLOCATED = "allocated"  # CreateContainer: the adjustment with the GPUs
    STARTED = "started"  # StartContainer: the namespace work done
    PASSED = "passed"  # ValidateContainerAdjustment: the merged adjustment is ours
    NOTHING_TO_ADD = "nothing_to_add"  # it may ask, but needs nothing of ours (asks for none, equipped by another)
    NOTHING_ASKED = "nothing_asked"  # the pre-filter: it cannot ask for GPUs
    REFUSED = "refused"  # CreateContainer raised PluginError
    START_REFUSED = "start_refused"  # StartContainer raised PluginError
    REJECTED = "rejected"  # ValidateContainerAdjustment raised PluginError
    ERROR = "error"  # any other exception: a bug


_LEVELS = {
    Outcome.ALLOCATED: logging.INFO,
    Outcome.STARTED: logging.INFO,
    Outcome.PASSED: logging.DEBUG,
    Outcome.NOTHING_TO_ADD: logging.DEBUG,
    Outcome.NOTHING_ASKED: logging.DEBUG,
    Outcome.REFUSED: logging.WARNING,
    Outcome.START_REFUSED: logging.WARNING,
    Outcome.REJECTED: logging.WARNING,
    Outcome.ERROR: logging.ERROR,
}


@dataclass(frozen=True, slots=True)
class Handled:
    """An event whose handler decides about a container."""

    event: str  # the RPC's name, as the stub and the runtime name it
    step: str | None  # the step its time is recorded under; None: not recorded
    refusal: Outcome  # what a PluginError from it is
    refused_words: str  # how its refusal line says so, before the reason


CREATE = Handled("CreateContainer", STEP_PLAN, Outcome.REFUSED, "refused")
START = Handled("StartContainer", STEP_START, Outcome.START_REFUSED, "start refused")
# Not timed into /metrics: a dict lookup, run for every container of the node.
VALIDATE = Handled("ValidateContainerAdjustment", None, Outcome.REJECTED, "rejected")


class Decision:
    """What one handler call decided, filled in by its logic (``Decisions.record``)."""

    __slots__ = ("fields", "given", "outcome", "steps_ms", "words")

    def __init__(self) -> None:
        # Until the logic says otherwise: it returned without adding anything.
        self.outcome = Outcome.NOTHING_TO_ADD
        self.words = "nothing to add"
        self.fields: dict[str, Any] = {}
        self.given = 0
        # The logic's own parts (ms): recorded under "<step>/<part>" and in the line.
        self.steps_ms: dict[str, float] = {}

    def allow(self, outcome: Outcome, words: str, *, given: int = 0, **fields: Any) -> None:
        """The handler grants: ``words`` for the text line, ``fields`` for the JSON one,
        ``given`` GPUs and MIG devices (``nri_gpu_gpus_allocated_total``)."""
        self.outcome, self.words, self.given, self.fields = outcome, words, given, fields


class _Recording:
    """The ``with`` block of one handler call; see the module's docstring."""

    __slots__ = ("_began", "_container", "_decision", "_decisions", "_handled", "_pod")

    def __init__(self, decisions: Decisions, handled: Handled, pod: api.PodSandbox, container: api.Container) -> None:
        self._decisions, self._handled, self._pod, self._container = decisions, handled, pod, container
        self._decision = Decision()
        self._began = 0.0

    def __enter__(self) -> Decision:
        self._began = time.perf_counter()
        return self._decision

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        seconds = time.perf_counter() - self._began
        decision, handled = self._decision, self._handled
        if isinstance(exc, PluginError):
            decision.outcome, decision.words = handled.refusal, f"{handled.refused_words}: {exc}"
            decision.fields, decision.given = {"reason": str(exc)}, 0
        elif isinstance(exc, Exception):
            reason = bounded(f"{type(exc).__name__}: {exc}")
            decision.outcome, decision.words = Outcome.ERROR, f"failed: {reason}"
            decision.fields, decision.given = {"reason": reason}, 0
        elif exc is not None:
            return  # cancelled (the connection went away): no decision was made
        self._decisions.write(handled, self._pod, self._container, decision, seconds)


class Decisions:
    """Writes the decisions of one plugin's handlers to ``logger``, and ``metrics`` if any."""

    def __init__(self, logger: logging.Logger, metrics: PluginMetrics | None = None) -> None:
        self._logger = logger
        self._metrics = metrics

    def record(self, handled: Handled, pod: api.PodSandbox, container: api.Container) -> _Recording:
        """A ``with`` block around the logic of one call of ``handled``, giving its ``Decision``."""
        return _Recording(self, handled, pod, container)

    def nothing_asked(self, handled: Handled, pod: api.PodSandbox, container: api.Container) -> None:
        """The pre-filter's decision: the container cannot ask for GPUs. Debug only, untimed."""
        if self._logger.isEnabledFor(logging.DEBUG):
            fields = subject_fields(handled.event, pod, container, decision=Outcome.NOTHING_ASKED.value)
            self._logger.debug("%s: asks for nothing", describe(pod, container), extra={EXTRA_KEY: fields})

    def write(
        self, handled: Handled, pod: api.PodSandbox, container: api.Container, decision: Decision, seconds: float
    ) -> None:
        """Record ``decision``, which took ``seconds``: metrics first, then its line."""
        metrics = self._metrics
        if metrics is not None:
            if handled.step is not None:
                metrics.step(handled.step, seconds)
                for part, ms in decision.steps_ms.items():
                    metrics.step(f"{handled.step}/{part}", ms / 1000)
            if decision.given:
                metrics.gpus_allocated.inc(decision.given)
        level = _LEVELS[decision.outcome]
        if not self._logger.isEnabledFor(level):
            return
        ms = seconds * 1000
        fields = subject_fields(handled.event, pod, container, decision=decision.outcome.value, **decision.fields)
        fields["duration_ms"] = round(ms, 3)
        if decision.steps_ms:
            fields["steps_ms"] = {name: round(value, 3) for name, value in decision.steps_ms.items()}
        # A grant says its time in words too; a refusal ends with its reason, as the runtime shows it.
        timed = level < logging.WARNING
        self._logger.log(
            level,
            "%s: %s (%.2f ms)" if timed else "%s: %s",
            *((describe(pod, container), decision.words, ms) if timed else (describe(pod, container), decision.words)),
            extra={EXTRA_KEY: fields},
        )


def subject_fields(event: str, pod: api.PodSandbox, container: api.Container, **more: Any) -> dict[str, Any]:
    """The fields that name a decision's event and container, then ``more``."""
    return {
        "event": event,
        "pod": pod.name,
        "namespace": pod.namespace,
        "container": container.name,
        "container_id": container.id,
        **more,
    }
