"""The Prometheus registry: exposition format 0.0.4, byte for byte."""

from __future__ import annotations

import math

import pytest

from plugin.metrics import (
    Counter,
    Gauge,
    Histogram,
    PluginMetrics,
    Registry,
    escape_label_value,
    format_value,
)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (3.0, "3"),
        (0.25, "0.25"),
        (1e-4, "0.0001"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
    ],
    ids=["zero", "integral-float", "fraction", "small", "inf", "minus-inf", "nan"],
)
def test_values_are_written_as_prometheus_reads_them(value: float, text: str) -> None:
    assert format_value(value) == text


def test_label_values_escape_backslash_quote_and_newline() -> None:
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


def test_counter_with_labels_renders_help_type_and_sorted_series() -> None:
    registry = Registry()
    events = registry.counter("nri_gpu_events_total", "Events.\nSecond line with \\.", ["event"])
    events.inc(event="StartContainer")
    events.inc(event="CreateContainer")
    events.inc(2, event="CreateContainer")
    events.inc(event='we"ird\\name\n')
    assert registry.render() == (
        "# HELP nri_gpu_events_total Events.\\nSecond line with \\\\.\n"
        "# TYPE nri_gpu_events_total counter\n"
        'nri_gpu_events_total{event="CreateContainer"} 3\n'
        'nri_gpu_events_total{event="StartContainer"} 1\n'
        'nri_gpu_events_total{event="we\\"ird\\\\name\\n"} 1\n'
    )


def test_unlabelled_metrics_exist_at_zero_from_the_start() -> None:
    registry = Registry()
    registry.counter("c_total", "A counter.")
    registry.gauge("g", "A gauge.")
    assert registry.render() == (
        "# HELP c_total A counter.\n# TYPE c_total counter\nc_total 0\n# HELP g A gauge.\n# TYPE g gauge\ng 0\n"
    )


def test_gauge_set_inc_and_function() -> None:
    g = Gauge("g", "A gauge.")
    g.set(4)
    g.inc(-1.5)
    assert g.samples() == ["g 2.5"]
    state = {"up": False}
    g.set_function(lambda: 1.0 if state["up"] else 0.0)
    assert g.samples() == ["g 0"]
    state["up"] = True
    assert g.samples() == ["g 1"]


def test_histogram_buckets_are_cumulative_with_inf_sum_and_count() -> None:
    h = Histogram("d_seconds", "Durations.", ["step"], buckets=(0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.005, 0.5):
        h.observe(value, step="plan")
    assert "\n".join(h.render()) == (
        "# HELP d_seconds Durations.\n"
        "# TYPE d_seconds histogram\n"
        'd_seconds_bucket{step="plan",le="0.001"} 2\n'
        'd_seconds_bucket{step="plan",le="0.01"} 3\n'
        'd_seconds_bucket{step="plan",le="0.1"} 3\n'
        'd_seconds_bucket{step="plan",le="+Inf"} 4\n'
        'd_seconds_sum{step="plan"} 0.5065\n'
        'd_seconds_count{step="plan"} 4'
    )
    assert h.count(step="plan") == 4 and h.count(step="start") == 0


def test_unlabelled_histogram_has_only_le() -> None:
    h = Histogram("h", "H.", buckets=(1,))
    h.observe(2)
    assert h.samples() == ['h_bucket{le="1"} 0', 'h_bucket{le="+Inf"} 1', "h_sum 2", "h_count 1"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: Counter("bad-name", "x"),
        lambda: Counter("c", "x", ["le"]),
        lambda: Counter("c", "x", ["__x"]),
        lambda: Histogram("h", "x", buckets=(0.1, 0.01)),
        lambda: Histogram("h", "x", buckets=()),
    ],
    ids=["metric-name", "le-label", "reserved-label", "unsorted-buckets", "no-buckets"],
)
def test_bad_definitions_are_refused(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_wrong_labels_and_negative_increments_are_refused() -> None:
    c = Counter("c_total", "x", ["kind"])
    with pytest.raises(ValueError):
        c.inc(other="x")
    with pytest.raises(ValueError):
        c.inc(-1, kind="x")
    registry = Registry()
    registry.register(c)
    with pytest.raises(ValueError):
        registry.register(Counter("c_total", "again"))


def test_plugin_metrics_names_and_start_timings() -> None:
    metrics = PluginMetrics()
    metrics.event("CreateContainer")
    metrics.error("refused")
    metrics.step("plan", 0.0003)
    metrics.start_timings({"procfs isolation": 1.5, "total": 4.0})
    text = metrics.render()
    for name in (
        "nri_gpu_events_total",
        "nri_gpu_errors_total",
        "nri_gpu_step_duration_seconds",
        "nri_gpu_gpus_allocated_total",
        "nri_gpu_registered",
        "nri_gpu_registrations_total",
        "nri_gpu_inventory_gpus",
    ):
        assert f"# TYPE {name} " in text
    assert 'nri_gpu_step_duration_seconds_bucket{step="plan",le="0.0005"} 1\n' in text
    assert 'nri_gpu_step_duration_seconds_bucket{step="start/procfs isolation",le="0.001"} 0\n' in text
    assert 'nri_gpu_step_duration_seconds_bucket{step="start/procfs isolation",le="0.0025"} 1\n' in text
    assert 'nri_gpu_step_duration_seconds_sum{step="start/total"} 0.004\n' in text
    assert text.endswith("\n") and "\n\n" not in text
