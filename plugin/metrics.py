"""A tiny Prometheus registry and nri-gpu's own metrics.  (pure)

Only what the plugin needs: counters and gauges with labels, histograms with
fixed buckets, and the text exposition format 0.0.4 that ``/metrics`` serves::

    # HELP nri_gpu_events_total NRI requests dispatched by the stub, by event.
    # TYPE nri_gpu_events_total counter
    nri_gpu_events_total{event="CreateContainer"} 3
    # HELP nri_gpu_step_duration_seconds ...
    # TYPE nri_gpu_step_duration_seconds histogram
    nri_gpu_step_duration_seconds_bucket{step="plan",le="0.0005"} 1
    ...
    nri_gpu_step_duration_seconds_bucket{step="plan",le="+Inf"} 3
    nri_gpu_step_duration_seconds_sum{step="plan"} 0.0042
    nri_gpu_step_duration_seconds_count{step="plan"} 3

Everything runs on the event loop's thread, so there is no locking. A gauge may
be given a function instead of a value; it is read at render time and must be
cheap (the stub's ``registered`` flag, not a discovery).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

# ms-scale work: a CreateContainer plan is well under a millisecond, the start
# work a few to a few hundred; the runtime gives up on us after 2 s.
DEFAULT_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

LabelValues = tuple[str, ...]


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it: ``+Inf``, ``NaN``, ``3``, ``0.25``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels_text(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{escape_label_value(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"bad metric name {name!r}")
        for label in labelnames:
            if not _LABEL_RE.fullmatch(label) or label.startswith("__") or label == "le":
                raise ValueError(f"bad label name {label!r} for {name}")
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)

    def _key(self, labels: Mapping[str, str]) -> LabelValues:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        raise NotImplementedError

    def render(self) -> list[str]:
        return self.header() + self.samples()


class Counter(_Metric):
    """Only goes up. Without labels the series exists (at 0) from the start."""

    kind = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[LabelValues, float] = {} if labelnames else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot decrease ({amount})")
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        return [
            f"{self.name}{_labels_text(self.labelnames, key)} {format_value(v)}"
            for key, v in sorted(self._values.items())
        ]


class Gauge(_Metric):
    """Goes up and down; or reads ``function()`` at render time (unlabelled only)."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[LabelValues, float] = {} if labelnames else {(): 0.0}
        self._function: Callable[[], float] | None = None

    def set(self, value: float, **labels: str) -> None:
        self._values[self._key(labels)] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def set_function(self, function: Callable[[], float]) -> None:
        if self.labelnames:
            raise ValueError(f"{self.name}: a function gauge takes no labels")
        self._function = function

    def value(self, **labels: str) -> float:
        if self._function is not None:
            return float(self._function())
        return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        if self._function is not None:
            return [f"{self.name} {format_value(self.value())}"]
        return [
            f"{self.name}{_labels_text(self.labelnames, key)} {format_value(v)}"
            for key, v in sorted(self._values.items())
        ]


class Histogram(_Metric):
    """Cumulative buckets (upper bounds, ``+Inf`` implied), a sum and a count per label set."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, labelnames: Sequence[str] = (), buckets: Iterable[float] = DEFAULT_BUCKETS
    ) -> None:
        super().__init__(name, help, labelnames)
        bounds = [float(b) for b in buckets if not math.isinf(b)]
        if not bounds or bounds != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets must be increasing and unique, got {list(buckets)}")
        self.buckets = (*bounds, math.inf)
        # Per label set: [count per bucket (not cumulative)..., sum]
        self._series: dict[LabelValues, tuple[list[int], list[float]]] = {} if labelnames else {(): self._new()}

    def _new(self) -> tuple[list[int], list[float]]:
        return [0] * len(self.buckets), [0.0]

    def observe(self, value: float, **labels: str) -> None:
        counts, total = self._series.setdefault(self._key(labels), self._new())
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
                break
        total[0] += value

    def count(self, **labels: str) -> int:
        series = self._series.get(self._key(labels))
        return sum(series[0]) if series else 0

    def samples(self) -> list[str]:
        lines = []
        for key, (counts, total) in sorted(self._series.items()):
            cumulative = 0
            for bound, n in zip(self.buckets, counts, strict=True):
                cumulative += n
                le = f'le="{format_value(bound)}"'
                lines.append(f"{self.name}_bucket{_labels_text(self.labelnames, key, le)} {cumulative}")
            labels = _labels_text(self.labelnames, key)
            lines.append(f"{self.name}_sum{labels} {format_value(total[0])}")
            lines.append(f"{self.name}_count{labels} {cumulative}")
        return lines


class Registry:
    """Metrics in registration order; ``render()`` is the whole ``/metrics`` body."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}

    def register(self, metric: _Metric) -> None:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} registered twice")
        self._metrics[metric.name] = metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        metric = Counter(name, help, labelnames)
        self.register(metric)
        return metric

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        metric = Gauge(name, help, labelnames)
        self.register(metric)
        return metric

    def histogram(
        self, name: str, help: str, labelnames: Sequence[str] = (), buckets: Iterable[float] = DEFAULT_BUCKETS
    ) -> Histogram:
        metric = Histogram(name, help, labelnames, buckets)
        self.register(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.extend(metric.render())
        return "\n".join(lines) + "\n" if lines else ""


# Values of the ``kind`` label of nri_gpu_errors_total.
ERROR_REFUSED = "refused"  # a handler raised PluginError: the request was answered with a reason
ERROR_INTERNAL = "internal"  # any other handler exception: a bug
ERROR_START_FAILED = "start_failed"  # StartContainer's namespace work failed

# Values of the ``step`` label of nri_gpu_step_duration_seconds; the start engine's
# own steps appear as "start/<step>" (e.g. "start/procfs isolation", "start/total").
STEP_PLAN = "plan"
STEP_START = "start"


class PluginMetrics:
    """nri-gpu's metrics, one registry per process (or per test)."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry if registry is not None else Registry()
        r = self.registry
        self.events = r.counter("nri_gpu_events_total", "NRI requests dispatched by the stub, by event.", ["event"])
        self.errors = r.counter(
            "nri_gpu_errors_total",
            "Failed NRI requests: refused (a reason was given), internal (a bug), start_failed (namespace work).",
            ["kind"],
        )
        self.steps = r.histogram(
            "nri_gpu_step_duration_seconds",
            "Time spent per step: plan (CreateContainer) and plan/<part>, start (StartContainer) and start/<part>.",
            ["step"],
        )
        self.gpus_allocated = r.counter(
            "nri_gpu_gpus_allocated_total", "GPUs and MIG devices given to containers at CreateContainer (one per device per container)."
        )
        self.registered = r.gauge("nri_gpu_registered", "1 while registered with the runtime, else 0.")
        self.registrations = r.counter(
            "nri_gpu_registrations_total", "Completed registrations with the runtime (more than one: reconnects)."
        )
        self.inventory_gpus = r.gauge("nri_gpu_inventory_gpus", "GPUs in the node inventory at the last look.")

    def event(self, event: str) -> None:
        self.events.inc(event=event)

    def error(self, kind: str) -> None:
        self.errors.inc(kind=kind)

    def step(self, step: str, seconds: float) -> None:
        self.steps.observe(seconds, step=step)

    def plan_timings(self, timings_ms: Mapping[str, float]) -> None:
        """CreateContainer's parts: ``request``, ``plan``, ``adjustment``."""
        for name, ms in timings_ms.items():
            self.steps.observe(ms / 1000, step=f"{STEP_PLAN}/{name}")

    def start_timings(self, timings_ms: Mapping[str, float]) -> None:
        """The start engine's ``StartReport.timings_ms``."""
        for name, ms in timings_ms.items():
            self.steps.observe(ms / 1000, step=f"{STEP_START}/{name}")

    def render(self) -> str:
        return self.registry.render()
