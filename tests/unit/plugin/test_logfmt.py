"""Log formats, and the structured decision lines and metrics of the handlers."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from nri_gpu.engine.start.work import StartReport, StartWork
from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.events import Event
from nri_gpu.plugin.logfmt import TEXT_FORMAT, JsonFormatter, make_formatter
from nri_gpu.plugin.metrics import PluginMetrics
from nri_gpu.plugin.stub import Stub
from nri_gpu.plugin.ttrpc import StatusError
from testbed.gpunode import FIXTURE_DRIVER, SimNode, build_node
from tests.fake_runtime import FakeRuntime, connected, container, pod
from tests.unit.plugin.support import gpu_plugin


def record(msg: str = "hello %s", args: tuple[Any, ...] = ("world",), **extra: Any) -> logging.LogRecord:
    rec = logging.LogRecord("nri_gpu.plugin.handlers", logging.WARNING, __file__, 1, msg, args, None)
    rec.created, rec.msecs = 1767323045.678, 678.0
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_json_line_has_time_level_logger_message_and_the_fields() -> None:
    line = JsonFormatter().format(record(nri_gpu={"pod": "p", "gpus": [0, 1], "message": "clash"}))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2026-01-02T03:04:05.678Z",
        "level": "warning",
        "logger": "nri_gpu.plugin.handlers",
        "message": "hello world",
        "pod": "p",
        "gpus": [0, 1],
        "field_message": "clash",
    }


def test_json_line_carries_the_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = record(exc_info=sys.exc_info())
    doc = json.loads(JsonFormatter().format(rec))
    assert "ValueError: boom" in doc["exception"]


def test_text_format_is_unchanged_and_ignores_the_fields() -> None:
    formatter = make_formatter("text")
    assert formatter._fmt == TEXT_FORMAT  # type: ignore[attr-defined]
    assert formatter.format(record(nri_gpu={"pod": "p"})).endswith(" WARNING nri_gpu.plugin.handlers: hello world")
    with pytest.raises(ValueError):
        make_formatter("yaml")


FORGED = "\n2026-01-02 03:04:05,678 INFO nri_gpu.plugin.handlers: forged"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (FORGED, "\\n2026-01-02 03:04:05,678 INFO nri_gpu.plugin.handlers: forged"),
        ("a\rb", "a\\rb"),
        ("bell\x07 esc\x1b[2J nul\x00 del\x7f", "bell\\x07 esc\\x1b[2J nul\\x00 del\\x7f"),
        ("nel\x85 ls\u2028 ps\u2029", "nel\\x85 ls\\u2028 ps\\u2029"),
        ("tab\there", "tab\\there"),
        ("back\\slash and ünïcode", "back\\slash and ünïcode"),
    ],
    ids=["newline", "cr", "c0-and-del", "c1-and-separators", "tab", "printable-unchanged"],
)
def test_text_format_escapes_control_characters_so_nothing_forges_a_line(text: str, shown: str) -> None:
    # An env name or value that reaches a message must not start a line of its own.
    line = make_formatter("text").format(record("refused: %s", (text,)))
    assert line.endswith(f" WARNING nri_gpu.plugin.handlers: refused: {shown}"), line
    assert line.count("\n") == 0 and all(c.isprintable() for c in line)


def test_text_format_indents_every_line_of_a_traceback() -> None:
    try:
        raise ValueError(f"boom{FORGED}")
    except ValueError:
        import sys

        rec = record(exc_info=sys.exc_info())
    first, *rest = make_formatter("text").format(rec).split("\n")
    assert first.endswith("WARNING nri_gpu.plugin.handlers: hello world")
    assert rest and all(line.startswith("  ") for line in rest), rest
    assert "  2026-01-02 03:04:05,678 INFO nri_gpu.plugin.handlers: forged" in rest


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("node"), gpus=2, driver_files=FIXTURE_DRIVER)


def steps(metrics: PluginMetrics, step: str) -> float:
    """How many times ``step`` was timed, as /metrics says."""
    return metrics.value("nri_gpu_step_duration_seconds_count", step=step)


def test_decisions_are_structured_and_measured(node: SimNode, caplog: pytest.LogCaptureFixture) -> None:
    metrics = PluginMetrics()

    async def starter(pid: int, work: StartWork, *, ldconfig: str, on_report: Any, **kw: Any) -> None:
        on_report(StartReport(timings_ms={"procfs isolation": 1.5, "total": 3.0}, procfs="", ld_cache_written=False))

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod("train", "ml", annotations={"nvidia.com/gpus": "1"}), container("main")
        await rt.create_container(p, c)
        c.pid = 42
        await rt.state_change(Event.START_CONTAINER, p, c)
        with pytest.raises(StatusError):
            await rt.create_container(pod("bad", "ml", annotations={"nvidia.com/gpus": "7"}), container("x"))

    with caplog.at_level(logging.DEBUG, logger="nri_gpu.plugin.handlers"):
        asyncio.run(connected(gpu_plugin(node, starter, metrics), body, metrics=metrics))
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if hasattr(r, "nri_gpu")]
    allocated, started, refused = lines
    # The start engine's steps are the started line's fields, not a line of their own in words.
    assert not [r for r in caplog.records if "start steps" in r.getMessage()]
    assert allocated["message"].startswith('container "main" in pod "ml/train": GPUs 1, capabilities ')
    assert {k: allocated[k] for k in ("event", "pod", "namespace", "container", "decision", "gpus")} == {
        "event": "CreateContainer",
        "pod": "train",
        "namespace": "ml",
        "container": "main",
        "decision": "allocated",
        "gpus": [1],
    }
    assert allocated["capabilities"] and allocated["duration_ms"] >= 0 and allocated["level"] == "info"
    assert set(allocated["steps_ms"]) == {"request", "plan", "adjustment"}
    assert started["decision"] == "started" and started["gpus"] == [node.gpus[1].bus_id]
    assert started["steps_ms"] == {"procfs isolation": 1.5, "total": 3.0}
    assert refused["decision"] == "refused" and refused["level"] == "warning" and "7" in refused["reason"]
    assert refused["pod"] == "bad" and refused["duration_ms"] >= 0

    text = metrics.render()
    assert "nri_gpu_gpus_allocated_total 1.0\n" in text
    assert "nri_gpu_inventory_gpus 2.0\n" in text
    assert 'nri_gpu_errors_total{kind="refused"} 1.0\n' in text
    assert 'nri_gpu_events_total{event="StartContainer"} 1.0\n' in text
    assert steps(metrics, "plan") == 2
    assert steps(metrics, "start") == 1
    assert steps(metrics, "start/procfs isolation") == 1
    assert steps(metrics, "plan/request") == steps(metrics, "plan/adjustment") == 1


def test_a_failed_start_counts_as_start_failed(node: SimNode) -> None:
    from nri_gpu.engine.errors import StartError

    metrics = PluginMetrics()

    async def starter(pid: int, work: StartWork, **kw: Any) -> None:
        raise StartError(work.container, "enter", "no such process")

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod(annotations={"nvidia.com/gpus": "0"}), container("main")
        await rt.create_container(p, c)
        c.pid = 7
        with pytest.raises(StatusError, match="enter: no such process"):
            await rt.state_change(Event.START_CONTAINER, p, c)

    asyncio.run(connected(gpu_plugin(node, starter, metrics), body, metrics=metrics))
    assert metrics.value("nri_gpu_errors_total", kind="start_failed") == 1
    assert metrics.value("nri_gpu_errors_total", kind="refused") == 0
    assert steps(metrics, "start") == 1


def test_json_line_has_no_raw_line_separator_of_any_kind() -> None:
    """JSON allows U+2028, U+2029 and U+0085 raw in a string, and log shippers that
    split on Unicode line boundaries would cut a record there: escaped like the rest."""
    sneaky = "a\u2028b\u2029c\x85d\re"
    line = JsonFormatter().format(record(nri_gpu={"pod": sneaky}))
    assert not any(ch in line for ch in "\u2028\u2029\x85\r\n")
    assert json.loads(line)["pod"] == sneaky


def test_json_line_has_no_raw_control_character() -> None:
    """DEL and the C1 controls (U+009B is a terminal's CSI) reach a terminal that
    shows the log as they are; JSON lets them stand raw, the text format escapes
    them: the JSON format escapes them too."""
    sneaky = "del\x7f csi\x9b2J st\x9c"
    line = JsonFormatter().format(record("refused: %s", (sneaky,), nri_gpu={"pod": sneaky}))
    assert line.isprintable(), line
    assert json.loads(line)["pod"] == sneaky and json.loads(line)["message"] == f"refused: {sneaky}"


def test_a_refusal_while_building_the_adjustment_is_logged_and_timed(
    node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: the adjustment's own refusal (a driver file's place already
    mounted from elsewhere) reached the runtime with no decision line and no
    ``plan`` timing, unlike a refusal from planning."""
    metrics = PluginMetrics()
    taken: list[str] = []

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        reply = await rt.create_container(pod("first", "ml", annotations={"nvidia.com/gpus": "0"}), container("a"))
        taken.append(reply.adjust.mounts[0].destination)
        clash = container("b")
        clash.mounts.add(destination=taken[0], source="/somewhere/else", type="bind")
        with pytest.raises(StatusError, match="already mounts /somewhere/else"):
            await rt.create_container(pod("clash", "ml", annotations={"nvidia.com/gpus": "0"}), clash)

    with caplog.at_level(logging.INFO, logger="nri_gpu.plugin.handlers"):
        asyncio.run(connected(gpu_plugin(node, None, metrics), body, metrics=metrics))
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if hasattr(r, "nri_gpu")]
    assert [(line["pod"], line["decision"]) for line in lines] == [("first", "allocated"), ("clash", "refused")]
    refused = lines[1]
    assert refused["level"] == "warning" and refused["container"] == "b" and refused["duration_ms"] >= 0
    assert f"already mounts /somewhere/else at {taken[0]}" in refused["reason"]
    assert refused["message"].startswith('container "b" in pod "ml/clash": refused: the container already mounts')
    assert steps(metrics, "plan") == 2
    assert metrics.value("nri_gpu_errors_total", kind="refused") == 1
    assert metrics.value("nri_gpu_gpus_allocated_total") == 1


def test_a_handler_bug_is_an_error_decision_timed_and_counted(
    node: SimNode, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = PluginMetrics()

    def broken(*args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr("nri_gpu.plugin.handlers.to_adjustment", broken)

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        with pytest.raises(StatusError, match="RuntimeError: boom"):
            await rt.create_container(pod("bug", "ml", annotations={"nvidia.com/gpus": "0"}), container("main"))

    with caplog.at_level(logging.INFO):
        asyncio.run(connected(gpu_plugin(node, None, metrics), body, metrics=metrics))
    (line,) = [json.loads(JsonFormatter().format(r)) for r in caplog.records if hasattr(r, "nri_gpu")]
    assert (line["decision"], line["level"], line["reason"]) == ("error", "error", "RuntimeError: boom")
    assert line["message"] == 'container "main" in pod "ml/bug": failed: RuntimeError: boom'
    assert steps(metrics, "plan") == 1 and metrics.value("nri_gpu_errors_total", kind="internal") == 1
    # The traceback is the stub's, once.
    assert [r.name for r in caplog.records if r.exc_info] == ["nri_gpu.plugin.stub"]


def test_a_container_that_asks_for_nothing_is_one_debug_line_untimed(
    node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = PluginMetrics()

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod("web"), container("plain")
        assert not (await rt.create_container(p, c)).HasField("adjust")
        c.pid = 1
        await rt.state_change(Event.START_CONTAINER, p, c)

    with caplog.at_level(logging.DEBUG, logger="nri_gpu.plugin.handlers"):
        asyncio.run(connected(gpu_plugin(node, None, metrics), body, metrics=metrics))
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if hasattr(r, "nri_gpu")]
    assert [(line["event"], line["decision"], line["level"]) for line in lines] == [
        ("CreateContainer", "nothing_asked", "debug"),
        ("StartContainer", "nothing_asked", "debug"),
    ]
    assert lines[0]["message"] == 'container "plain" in pod "default/web": asks for nothing'
    assert "duration_ms" not in lines[0]
    assert steps(metrics, "plan") == steps(metrics, "start") == 0


def test_a_refusal_is_one_warning_line(node: SimNode, caplog: pytest.LogCaptureFixture) -> None:
    """The decision line says it; the stub, which answers the runtime, does not say it again."""

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        with pytest.raises(StatusError, match="GPU 7 does not exist"):
            await rt.create_container(pod("bad", "ml", annotations={"nvidia.com/gpus": "7"}), container("x"))

    with caplog.at_level(logging.INFO):
        asyncio.run(connected(gpu_plugin(node, None), body))
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith('container "x" in pod "ml/bad": refused: annotation ')


def test_validation_decisions_are_timed_lines(node: SimNode, caplog: pytest.LogCaptureFixture) -> None:
    """A pass is debug, a rejection warning with its reason; both timed, neither under a /metrics step."""
    metrics = PluginMetrics()

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p = pod("train", "ml", annotations={"nvidia.com/gpus": "1"})
        _, verdict = await rt.create_and_validate(p, container("ok"))
        assert verdict is not None and not verdict.reject
        verdict = await rt.validate(p, container("unasked"), api.ContainerAdjustment())
        assert verdict.reject

    with caplog.at_level(logging.DEBUG, logger="nri_gpu.plugin.handlers"):
        asyncio.run(connected(gpu_plugin(node, None, metrics), body, metrics=metrics, runtime_version="2.2.0"))
    lines = [
        json.loads(JsonFormatter().format(r))
        for r in caplog.records
        if hasattr(r, "nri_gpu") and r.nri_gpu["event"] == "ValidateContainerAdjustment"
    ]
    assert [(line["container"], line["decision"], line["level"]) for line in lines] == [
        ("ok", "passed", "debug"),
        ("unasked", "rejected", "warning"),
    ]
    assert all(line["duration_ms"] >= 0 for line in lines)
    assert lines[1]["reason"].startswith("it may ask for GPUs but nri-gpu was not asked for its CreateContainer")
    assert lines[1]["message"] == f'container "unasked" in pod "ml/train": rejected: {lines[1]["reason"]}'
    assert metrics.value("nri_gpu_errors_total", kind="refused") == 1
