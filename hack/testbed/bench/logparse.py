"""Read nri-gpu's own timings from its JSON log (``--log-format json``).  (pure)

Only the decision lines carry them (``plugin/decisions.py``): one per handled
request, with structured fields::

    {"level": "info", "event": "CreateContainer", "pod": "bench-gpu1-0-3",
     "container_id": "9f2c...", "decision": "allocated", "duration_ms": 0.412,
     "steps_ms": {"request": 0.05, "plan": 0.3, "adjustment": 0.04}, ...}

``duration_ms`` of CreateContainer is the whole handler, and its ``steps_ms``
splits it into ``request`` (parsing), ``plan`` and ``adjustment`` (encoding);
of StartContainer, the whole handler: the fork of the worker, its work in the
container's namespaces, and the reap, with the worker's steps in ``steps_ms``.
Every other line (a message in words, a debug line) is read for its level only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

__all__ = ["Decision", "PluginLog", "parse_log"]


@dataclass(frozen=True)
class Decision:
    event: str  # CreateContainer, StartContainer, ValidateContainerAdjustment
    pod: str
    container: str
    container_id: str
    decision: str  # allocated, started, refused, start_refused, nothing_asked, ...
    duration_ms: float
    steps_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PluginLog:
    decisions: tuple[Decision, ...]
    errors: tuple[str, ...]  # messages of warning-or-worse lines

    def durations(self, event: str, pod_prefix: str) -> list[float]:
        return [d.duration_ms for d in self.decisions if d.event == event and d.pod.startswith(pod_prefix)]

    def steps(self, pod_prefix: str, event: str = "StartContainer") -> list[dict[str, float]]:
        """Per handled call of ``event`` that timed its steps: those steps (ms)."""
        return [d.steps_ms for d in self.decisions if d.event == event and d.pod.startswith(pod_prefix) and d.steps_ms]


def parse_log(text: str) -> PluginLog:
    """Every timed decision line of ``text``; other lines are skipped.

    >>> line = '{"level": "info", "message": "m", "event": "CreateContainer", "pod": "p", "container": "c",'
    >>> line += ' "container_id": "id", "decision": "allocated", "duration_ms": 0.5}'
    >>> parse_log(line).durations("CreateContainer", "p")
    [0.5]
    """
    decisions: list[Decision] = []
    errors: list[str] = []
    for raw in text.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue  # a traceback or warning printed outside the formatter
        if not isinstance(entry, dict):
            continue
        if entry.get("level") in ("warning", "error", "critical"):
            errors.append(str(entry.get("message", "")))
        if "event" in entry and "decision" in entry and "duration_ms" in entry:
            decisions.append(
                Decision(
                    event=str(entry["event"]),
                    pod=str(entry.get("pod", "")),
                    container=str(entry.get("container", "")),
                    container_id=str(entry.get("container_id", "")),
                    decision=str(entry["decision"]),
                    duration_ms=float(entry["duration_ms"]),
                    steps_ms=_steps(entry.get("steps_ms")),
                )
            )
    return PluginLog(tuple(decisions), tuple(errors))


def _steps(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, (int, float))}
