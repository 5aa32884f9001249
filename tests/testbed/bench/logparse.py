"""Read nri-gpu's own timings from its JSON log (``--log-format json --log-level debug``).  (pure)

Two kinds of lines carry them:

* decision lines (info), one per handled CreateContainer / StartContainer, with
  structured fields::

    {"level": "info", "event": "CreateContainer", "pod": "bench-gpu1-0-3",
     "container_id": "9f2c...", "decision": "allocated", "duration_ms": 0.412, ...}

  ``duration_ms`` of CreateContainer is the whole handler, and its ``steps_ms``
  splits it into ``request`` (parsing), ``plan`` and ``adjustment`` (encoding);
  of StartContainer, the whole handler: the fork of the worker, its work in the
  container's namespaces, and the reap, with the worker's steps in ``steps_ms``.
* the start engine's per-step report (debug), in the message text only (what
  plugins from before ``steps_ms`` logged; used when a decision has no steps)::

    {"level": "debug", "message": "container \\"main\\" in pod \\"default/bench-gpu1-0-3\\":
     start steps (ms) {'enter': 1.9, 'procfs isolation': 0.8, ..., 'total': 21.4}"}
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

__all__ = ["Decision", "PluginLog", "StartSteps", "parse_log"]

_STEPS_RE = re.compile(r'^container "(?P<container>[^"]*)" in pod "(?P<ns>[^/"]*)/(?P<pod>[^"]*)": '
                       r"start steps \(ms\) (?P<steps>\{.*\})$")


@dataclass(frozen=True)
class Decision:
    event: str          # CreateContainer or StartContainer
    pod: str
    container: str
    container_id: str
    decision: str       # allocated, started, refused, start_refused
    duration_ms: float
    steps_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StartSteps:
    pod: str
    container: str
    timings_ms: dict[str, float]


@dataclass(frozen=True)
class PluginLog:
    decisions: tuple[Decision, ...]
    start_steps: tuple[StartSteps, ...]
    errors: tuple[str, ...]  # messages of warning-or-worse lines

    def durations(self, event: str, pod_prefix: str) -> list[float]:
        return [d.duration_ms for d in self.decisions if d.event == event and d.pod.startswith(pod_prefix)]

    def steps(self, pod_prefix: str, event: str = "StartContainer") -> list[dict[str, float]]:
        """Per handled call of ``event``: its steps (ms), from the decision line, else
        (StartContainer of an older plugin) from the debug lines."""
        mine = [d.steps_ms for d in self.decisions if d.event == event and d.pod.startswith(pod_prefix)]
        if any(mine) or event != "StartContainer":
            return [s for s in mine if s]
        return [s.timings_ms for s in self.start_steps if s.pod.startswith(pod_prefix)]


def parse_log(text: str) -> PluginLog:
    """Every decision and start-step line of ``text``; other lines are skipped.

    >>> line = '{"level": "info", "message": "m", "event": "CreateContainer", "pod": "p", "container": "c",'
    >>> line += ' "container_id": "id", "decision": "allocated", "duration_ms": 0.5}'
    >>> parse_log(line).durations("CreateContainer", "p")
    [0.5]
    """
    decisions: list[Decision] = []
    steps: list[StartSteps] = []
    errors: list[str] = []
    for raw in text.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue  # a traceback or warning printed outside the formatter
        if not isinstance(entry, dict):
            continue
        message = str(entry.get("message", ""))
        if entry.get("level") in ("warning", "error", "critical"):
            errors.append(message)
        if "event" in entry and "duration_ms" in entry:
            decisions.append(Decision(
                event=str(entry["event"]), pod=str(entry.get("pod", "")), container=str(entry.get("container", "")),
                container_id=str(entry.get("container_id", "")), decision=str(entry.get("decision", "")),
                duration_ms=float(entry["duration_ms"]), steps_ms=_steps(entry.get("steps_ms")),
            ))
        elif (m := _STEPS_RE.match(message)) is not None:
            timings = ast.literal_eval(m["steps"])  # a dict repr of str -> float: literals only
            if isinstance(timings, dict):
                steps.append(StartSteps(m["pod"], m["container"], {str(k): float(v) for k, v in timings.items()}))
    return PluginLog(tuple(decisions), tuple(steps), tuple(errors))


def _steps(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, (int, float))}
