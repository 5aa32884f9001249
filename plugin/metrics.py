"""nri-gpu's metrics, kept and written by ``prometheus_client``.

``/metrics`` serves the text exposition format 0.0.4 from ``render()``::

    # HELP nri_gpu_events_total NRI requests dispatched by the stub, by event.
    # TYPE nri_gpu_events_total counter
    nri_gpu_events_total{event="CreateContainer"} 3.0
    # HELP nri_gpu_step_duration_seconds ...
    # TYPE nri_gpu_step_duration_seconds histogram
    nri_gpu_step_duration_seconds_bucket{le="0.0005",step="plan"} 1.0
    ...
    nri_gpu_step_duration_seconds_bucket{le="+Inf",step="plan"} 3.0
    nri_gpu_step_duration_seconds_count{step="plan"} 3.0
    nri_gpu_step_duration_seconds_sum{step="plan"} 0.0042
    # HELP process_resident_memory_bytes Resident memory size in bytes.
    ...

Each ``PluginMetrics`` has a registry of its own, never the library's global
one: tests make many, and a second set of the same names in one registry is
refused. The library's ``ProcessCollector`` on that registry adds the
``process_*`` metrics (resident and virtual memory, open and max fds, CPU
seconds, start time), read from ``/proc/self`` at scrape time.

The updates run on the event loop's thread, under 1 us each (``event()`` 0.3,
``step()`` 0.6 on a shared 2-core machine, each series' child kept; through
``labels()`` at each call they took 0.9 and 1.2): nothing next to the runtime's 2 s. ``render()`` runs there too, once
per scrape: 0.5 ms with 6 step series, 1 ms with the dozen a busy node has (same
machine), mostly ``generate_latest`` writing the histograms (each step series is
15 bucket lines); the ``/proc/self`` reads take about 40 us of it. Rendering on
the status thread instead would spare the loop only those reads: the formatting
holds the GIL on whichever thread runs it. A gauge may be given a function
instead of a value; it is read at scrape time and must be cheap (the stub's
``registered`` flag, not a discovery).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# What ``render()`` writes. The library's CONTENT_TYPE_LATEST says version=1.0.0,
# which only differs from 0.0.4 for names outside [a-zA-Z0-9_:] (ours are not);
# its own HTTP handler answers 0.0.4 unless the scraper asks for 1.0.0, and 0.0.4
# is what every Prometheus version reads without a scrape_protocols setting.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# ms-scale work: a CreateContainer plan is well under a millisecond, the start
# work a few to a few hundred; the runtime gives up on us after 2 s.
DEFAULT_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# Values of the ``kind`` label of nri_gpu_errors_total.
ERROR_REFUSED = "refused"  # a handler raised PluginError: the request was answered with a reason
ERROR_INTERNAL = "internal"  # any other handler exception: a bug
ERROR_START_FAILED = "start_failed"  # StartContainer's namespace work failed

# Values of the ``step`` label of nri_gpu_step_duration_seconds; the start engine's
# own steps appear as "start/<step>" (e.g. "start/procfs isolation", "start/total").
STEP_PLAN = "plan"
STEP_START = "start"


class _WithoutCreated(Collector):
    """The registry's metrics less their ``<name>_created`` samples.

    The library adds one per counter and histogram series (the time it was made),
    which the 0.0.4 text format can only write as an extra gauge: a second series
    per labelled one, read by nothing. ``disable_created_metrics()`` would drop them
    for every registry in the process; this drops them for ours only."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():
            created = metric.name + "_created"
            # Each collect() builds new Metric objects, so trimming them is ours to do.
            metric.samples = [s for s in metric.samples if s.name != created]
            yield metric


class PluginMetrics:
    """nri-gpu's metrics, on a registry of their own (one per process, or per test)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "nri_gpu_events_total", "NRI requests dispatched by the stub, by event.", ["event"], registry=r
        )
        self.errors = Counter(
            "nri_gpu_errors_total",
            "Failed NRI requests: refused (a reason was given), internal (a bug), start_failed (namespace work).",
            ["kind"],
            registry=r,
        )
        self.steps = Histogram(
            "nri_gpu_step_duration_seconds",
            "Time spent per step: plan (CreateContainer) and plan/<part>, start (StartContainer) and start/<part>.",
            ["step"],
            buckets=DEFAULT_BUCKETS,
            registry=r,
        )
        self.gpus_allocated = Counter(
            "nri_gpu_gpus_allocated_total",
            "GPUs and MIG devices given to containers at CreateContainer (one per device per container).",
            registry=r,
        )
        self.registered = Gauge("nri_gpu_registered", "1 while registered with the runtime, else 0.", registry=r)
        self.registrations = Counter(
            "nri_gpu_registrations_total",
            "Completed registrations with the runtime (more than one: reconnects).",
            registry=r,
        )
        self.inventory_gpus = Gauge(
            "nri_gpu_inventory_gpus", "GPUs in the node inventory at the last look.", registry=r
        )
        # The library writes a counter as <name>_total whether or not we name it so;
        # we do, so that a grep for the scraped name finds it here.
        ProcessCollector(registry=r)
        self._exposed = _WithoutCreated(r)
        # The children of the per-request series, by label: labels() takes a lock and
        # builds a key at each call (0.94 us per event(); a kept child's inc() 0.23).
        # Their labels are ours to bound (the stub's routes, Event names, step names).
        self._events: dict[str, Counter] = {}
        self._steps: dict[str, Histogram] = {}

    def event(self, event: str) -> None:
        child = self._events.get(event)
        if child is None:
            child = self._events[event] = self.events.labels(event)
        child.inc()

    def error(self, kind: str) -> None:
        self.errors.labels(kind).inc()

    def step(self, step: str, seconds: float) -> None:
        child = self._steps.get(step)
        if child is None:
            child = self._steps[step] = self.steps.labels(step)
        child.observe(seconds)

    def value(self, sample: str, **labels: str) -> float:
        """A sample's value as a scrape would read it (``nri_gpu_errors_total``,
        ``nri_gpu_step_duration_seconds_count`` ...); 0 for a series not yet made."""
        found = self.registry.get_sample_value(sample, labels)
        return 0.0 if found is None else found

    def render(self) -> str:
        """The whole ``/metrics`` body, in the format CONTENT_TYPE names."""
        return generate_latest(self._exposed).decode()
