"""nri-gpu's metrics as a scraper reads them: ``render()`` parsed by
prometheus_client's own parser of the text format 0.0.4, never matched as strings."""

from __future__ import annotations

import math
import os
import sys

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from nri_gpu.plugin.metrics import CONTENT_TYPE, DEFAULT_BUCKETS, PluginMetrics

# Family name (the parser drops a counter's _total), type, and its label names.
NRI_GPU = {
    "nri_gpu_events": ("counter", {"event"}),
    "nri_gpu_errors": ("counter", {"kind"}),
    "nri_gpu_step_duration_seconds": ("histogram", {"step"}),
    "nri_gpu_gpus_allocated": ("counter", set()),
    "nri_gpu_registered": ("gauge", set()),
    "nri_gpu_registrations": ("counter", set()),
    "nri_gpu_inventory_gpus": ("gauge", set()),
}
PROCESS = (
    "process_virtual_memory_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_cpu_seconds",
    "process_open_fds",
    "process_max_fds",
)


def scrape(metrics: PluginMetrics) -> dict[str, tuple[str, list[Sample]]]:
    """Family name -> (type, samples), as a Prometheus server would read /metrics."""
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(metrics.render())}


def value(metrics: PluginMetrics, sample: str, **labels: str) -> float | None:
    """A sample's value in the scraped text; None when the series is not there."""
    for _, samples in scrape(metrics).values():
        for s in samples:
            if s.name == sample and s.labels == labels:
                return s.value
    return None


def steps(metrics: PluginMetrics, step: str) -> tuple[list[tuple[float, float]], float, float]:
    """(cumulative buckets as (upper bound, count), sum, count) of one step's histogram."""
    _, samples = scrape(metrics)["nri_gpu_step_duration_seconds"]
    mine = [s for s in samples if s.labels.get("step") == step]
    buckets = [(float(s.labels["le"]), s.value) for s in mine if s.name.endswith("_bucket")]
    total = next(s.value for s in mine if s.name.endswith("_sum"))
    count = next(s.value for s in mine if s.name.endswith("_count"))
    return buckets, total, count


def test_the_content_type_is_the_text_format_0_0_4() -> None:
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_every_metric_is_there_with_its_type_and_labels_from_the_start() -> None:
    families = scrape(PluginMetrics())
    for name, (kind, _) in NRI_GPU.items():
        assert families[name][0] == kind, name
    # Unlabelled series exist at 0 before anything happens; labelled ones appear
    # with their first label value (no event has a series before it is seen).
    for name in ("nri_gpu_gpus_allocated_total", "nri_gpu_registrations_total"):
        assert value(PluginMetrics(), name) == 0.0
    assert value(PluginMetrics(), "nri_gpu_registered") == 0.0
    assert value(PluginMetrics(), "nri_gpu_inventory_gpus") == 0.0
    assert families["nri_gpu_events"][1] == families["nri_gpu_errors"][1] == []
    assert families["nri_gpu_step_duration_seconds"][1] == []


def test_samples_carry_only_their_declared_labels() -> None:
    metrics = PluginMetrics()
    metrics.event("CreateContainer")
    metrics.error("refused")
    metrics.step("plan", 0.001)
    for name, (_, labelnames) in NRI_GPU.items():
        for s in scrape(metrics)[name][1]:
            assert set(s.labels) - {"le"} == labelnames, (name, s)


def test_events_and_errors_count_per_label_value() -> None:
    metrics = PluginMetrics()
    for event in ("CreateContainer", "CreateContainer", "StartContainer", "CreateContainer"):
        metrics.event(event)
    metrics.error("refused")
    metrics.error("internal")
    metrics.error("refused")
    assert value(metrics, "nri_gpu_events_total", event="CreateContainer") == 3
    assert value(metrics, "nri_gpu_events_total", event="StartContainer") == 1
    assert value(metrics, "nri_gpu_errors_total", kind="refused") == 2
    assert value(metrics, "nri_gpu_errors_total", kind="internal") == 1
    assert value(metrics, "nri_gpu_errors_total", kind="start_failed") is None


def test_label_values_survive_quotes_backslashes_and_newlines() -> None:
    metrics = PluginMetrics()
    weird = 'we"ird\\name\nsecond line'
    metrics.event(weird)
    assert value(metrics, "nri_gpu_events_total", event=weird) == 1


def test_a_step_histogram_has_the_buckets_cumulative_with_inf_sum_and_count() -> None:
    metrics = PluginMetrics()
    for seconds in (0.0003, 0.0005, 0.004, 3.0):
        metrics.step("plan", seconds)
    buckets, total, count = steps(metrics, "plan")
    assert [le for le, _ in buckets] == [*DEFAULT_BUCKETS, math.inf]
    expected = [sum(1 for s in (0.0003, 0.0005, 0.004, 3.0) if s <= le) for le, _ in buckets]
    assert [n for _, n in buckets] == expected
    assert expected[0] == 2 and expected[-2] == 3 and expected[-1] == 4  # 0.0005 is "<= le"; 3 s only in +Inf
    assert count == 4 and total == pytest.approx(3.0048)


def test_counters_and_gauges_the_stub_and_handlers_drive() -> None:
    metrics = PluginMetrics()
    metrics.gpus_allocated.inc(2)
    metrics.registrations.inc()
    metrics.inventory_gpus.set(8)
    assert value(metrics, "nri_gpu_gpus_allocated_total") == 2
    assert value(metrics, "nri_gpu_registrations_total") == 1
    assert value(metrics, "nri_gpu_inventory_gpus") == 8


def test_the_registered_gauge_reads_its_function_at_scrape_time() -> None:
    metrics = PluginMetrics()
    state = {"up": False}
    metrics.registered.set_function(lambda: 1.0 if state["up"] else 0.0)
    assert value(metrics, "nri_gpu_registered") == 0
    state["up"] = True
    assert value(metrics, "nri_gpu_registered") == 1


def test_no_created_series_are_written_and_other_registries_keep_theirs() -> None:
    """The library's <name>_created samples are dropped for our registry only; the
    process-wide switch (disable_created_metrics) is left as it was."""
    metrics = PluginMetrics()
    metrics.event("CreateContainer")
    metrics.step("plan", 0.001)
    text = metrics.render()
    assert "_created" not in text
    other = CollectorRegistry()
    Counter("other_total", "Another registry's counter.", registry=other)
    assert other.get_sample_value("other_created") is not None


def test_each_plugin_metrics_has_a_registry_of_its_own() -> None:
    one, two = PluginMetrics(), PluginMetrics()
    one.event("CreateContainer")
    assert one.registry is not two.registry
    assert value(one, "nri_gpu_events_total", event="CreateContainer") == 1
    assert value(two, "nri_gpu_events_total", event="CreateContainer") is None


def test_value_reads_a_sample_and_is_zero_for_a_series_not_yet_made() -> None:
    metrics = PluginMetrics()
    metrics.error("start_failed")
    metrics.step("start", 0.01)
    assert metrics.value("nri_gpu_errors_total", kind="start_failed") == 1
    assert metrics.value("nri_gpu_errors_total", kind="refused") == 0
    assert metrics.value("nri_gpu_step_duration_seconds_count", step="start") == 1
    assert metrics.value("nri_gpu_step_duration_seconds_count", step="plan") == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process_* are read from /proc")
def test_process_metrics_are_this_process_read_at_scrape_time() -> None:
    metrics = PluginMetrics()
    families = scrape(metrics)
    for name in PROCESS:
        assert families[name][1], name
    assert value(metrics, "process_resident_memory_bytes") > 1 << 20  # type: ignore[operator]
    before = value(metrics, "process_open_fds")
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(20)]
    try:
        during = value(metrics, "process_open_fds")
    finally:
        for fd in held:
            os.close(fd)
    assert before is not None and during is not None
    assert 20 <= during - before <= 22  # ours, give or take one the test runner opened
