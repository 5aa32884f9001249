"""Turn the measurements into the results document, the targets and the printed tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .logparse import PluginLog
from .session import NEAR_DEADLINE_MS, VARIANTS, BurstResult, ChurnResult, Sample
from .stats import grows, percentile, summarize

__all__ = [
    "CREATE_STEPS",
    "START_STEPS",
    "Target",
    "cdi_lines",
    "cdi_targets",
    "churn_dict",
    "evaluate",
    "handler_dict",
    "latency_dict",
    "limits_lines",
    "limits_targets",
    "render",
]

# The start engine's steps (engine/start/work.py StartReport), in the order they run.
START_STEPS = (
    "enter",
    "root copy",
    "procfs isolation",
    "symlinks",
    "ld.so.conf",
    "ld.so.cache",
    "ldconfig",
    "ldconfig process",
    "total",
)
# CreateContainer's steps (plugin/handlers.py, the decision line's steps_ms).
CREATE_STEPS = ("request", "plan", "adjustment")
_MIB = 1024.0
_RSS_LIMIT_MB = 50.0
_GROWTH_TOLERANCE_KIB = 1024  # RSS may wander this much between the first and last quarter of the churn
_BASE = "no-plugin"
CDI_TARGET_MS = 30.0


def latency_dict(samples: Sequence[Sample]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in VARIANTS:
        mine = [s for s in samples if s.variant == v.name]
        if not mine:
            continue
        out[v.name] = {
            "label": v.label,
            "pods": len(mine),
            "create": summarize([s.create_ms for s in mine]).as_dict(),
            "start": summarize([s.start_ms for s in mine]).as_dict(),
            "create+start": summarize([s.total_ms for s in mine]).as_dict(),
        }
    return out


def handler_dict(log: PluginLog) -> dict[str, Any]:
    """Per GPU variant: the plugin's own timings (ms) of its recorded pods, by step."""
    out: dict[str, Any] = {}
    for v in VARIANTS:
        if not (v.plugin or "").startswith("nri-gpu") or not v.annotations:
            continue
        prefix = f"bench-{v.name}-"
        series: dict[str, list[float]] = {
            "CreateContainer: parse+plan+encode": log.durations("CreateContainer", prefix),
            "StartContainer: whole handler": log.durations("StartContainer", prefix),
        }
        creates = log.steps(prefix, "CreateContainer")
        for name in CREATE_STEPS:
            series[f"create/{name}"] = [t[name] for t in creates if name in t]
        starts = log.steps(prefix)
        for name in START_STEPS:
            series[f"start/{name}"] = [t[name] for t in starts if name in t]
        handler = [d for d in log.decisions if d.event == "StartContainer" and d.pod.startswith(prefix)]
        series["start: fork, pipe, reap (handler - total)"] = [
            d.duration_ms - d.steps_ms["total"] for d in handler if "total" in d.steps_ms
        ]
        out[v.name] = {name: summarize(values).as_dict() for name, values in series.items() if values}
    return out


def burst_dict(burst: BurstResult) -> dict[str, Any]:
    handler = burst.handler_create_ms + burst.handler_start_ms
    return {
        "pods": burst.pods,
        "errors": burst.errors,
        "cri_create": summarize(burst.cri_create_ms).as_dict() if burst.cri_create_ms else None,
        "cri_start": summarize(burst.cri_start_ms).as_dict() if burst.cri_start_ms else None,
        "handler_create": summarize(burst.handler_create_ms).as_dict() if burst.handler_create_ms else None,
        "handler_start": summarize(burst.handler_start_ms).as_dict() if burst.handler_start_ms else None,
        "slowest_handler_ms": round(max(handler), 3) if handler else None,
        "handler_calls": len(handler),
        "calls_within_500ms_of_deadline": sum(1 for ms in handler if ms >= NEAR_DEADLINE_MS),
        "runtime_nri_timeouts": burst.runtime_nri_complaints,
    }


def churn_dict(churn: ChurnResult) -> dict[str, Any]:
    first, last = churn.points[0][1], churn.points[-1][1]
    # Flatness is judged after the first tenth: the first containers fill caches once.
    warm = [u for done, u in churn.points if done >= churn.containers // 10 and done > 0] or [last]
    rss = [float(u.rss_kib) for u in warm]
    return {
        "containers": churn.containers,
        "seconds": round(churn.seconds, 1),
        "rss_mib_start": round(first.rss_kib / _MIB, 2),
        "rss_mib_after_warmup": round(warm[0].rss_kib / _MIB, 2),
        "rss_mib_end": round(last.rss_kib / _MIB, 2),
        "rss_mib_peak": round(last.hwm_kib / _MIB, 2),
        "rss_growth_mib_after_warmup": round((warm[-1].rss_kib - warm[0].rss_kib) / _MIB, 2),
        "rss_flat": not grows(rss, tolerance=_GROWTH_TOLERANCE_KIB),
        "fds_start": first.fds,
        "fds_after_warmup": warm[0].fds,
        "fds_end": last.fds,
        "fds_flat": last.fds <= warm[0].fds,
        "points": [
            {"containers": done, "rss_kib": u.rss_kib, "hwm_kib": u.hwm_kib, "fds": u.fds} for done, u in churn.points
        ],
        "errors": churn.errors,
    }


@dataclass(frozen=True)
class Target:
    runtime: str
    name: str
    value: float
    limit: float
    unit: str
    met: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "target": self.name,
            "value": round(self.value, 3),
            "limit": self.limit,
            "unit": self.unit,
            "met": self.met,
        }


def evaluate(version: str, result: dict[str, Any]) -> list[Target]:
    """The targets of the issue, for one runtime's results (those it has data for)."""
    out: list[Target] = []
    lat = result.get("latency", {})
    base = lat.get(_BASE, {}).get("create+start", {}).get("p50")
    if base:
        none = lat.get("nri-gpu-none", {}).get("create+start", {}).get("p50")
        if none is not None:
            pct = (none / base - 1) * 100
            out.append(Target(version, "asks-for-nothing p50 within 5% of no plugin", pct, 5.0, "%", pct <= 5.0))
        for name, label in (("nri-gpu-1gpu", "1 GPU"), ("nri-gpu-8gpu", "8 GPUs")):
            p50 = lat.get(name, {}).get("create+start", {}).get("p50")
            if p50 is not None:
                delta = p50 - base
                out.append(
                    Target(
                        version, f"{label} create+start p50 within 30 ms of no plugin", delta, 30.0, "ms", delta <= 30.0
                    )
                )
    plans = [
        h["CreateContainer: parse+plan+encode"]["p99"]
        for h in result.get("handler", {}).values()
        if "CreateContainer: parse+plan+encode" in h
    ]
    if plans:
        worst = max(plans)
        out.append(Target(version, "planning (parse+plan+encode) p99 under 2 ms", worst, 2.0, "ms", worst < 2.0))
    churn = result.get("churn")
    if churn:
        peak_mb = churn["rss_mib_peak"] * _MIB * 1024 / 1e6
        out.append(
            Target(version, "RSS under 50 MB (peak, VmHWM)", peak_mb, _RSS_LIMIT_MB, "MB", peak_mb < _RSS_LIMIT_MB)
        )
        growth = churn["rss_growth_mib_after_warmup"]
        flat = bool(churn["rss_flat"] and churn["fds_flat"])
        out.append(
            Target(
                version,
                f"RSS and fds flat over {churn['containers']} containers (RSS growth)",
                growth,
                round(_GROWTH_TOLERANCE_KIB / _MIB, 2),
                "MiB",
                flat,
            )
        )
    burst = result.get("burst")
    if burst:
        near = float(burst["calls_within_500ms_of_deadline"])
        ok = near == 0 and not burst["errors"] and not burst["runtime_nri_timeouts"]
        out.append(
            Target(
                version,
                f"burst of {burst['pods']}: handler calls within 0.5 s of the 2 s deadline",
                near,
                0.0,
                "calls",
                ok,
            )
        )
    return out


def cdi_targets(cdi: dict[str, Any]) -> list[Target]:
    """The CDI path's target, per engine: a GPU's ``run --rm`` p50 within 30 ms of a plain one."""
    return [
        Target(
            engine,
            "GPU run --rm p50 within 30 ms of a plain one",
            r["over_p50"],
            CDI_TARGET_MS,
            "ms",
            r["over_p50"] <= CDI_TARGET_MS,
        )
        for engine, r in cdi.get("engines", {}).items()
    ]


def limits_targets(limits: dict[str, Any]) -> list[Target]:
    """The limits part's items (``testbed.bench.limits``), each p99 against its target;
    in microseconds where the target is at most a millisecond, else in milliseconds.
    An item with no target (a property shown, not a cost) is no target here."""
    out = []
    for item in limits["items"]:
        if item["target_us"] is None:
            continue
        scale, unit = (1000.0, "ms") if item["target_us"] > 1000 else (1.0, "µs")
        out.append(
            Target(
                "in process",
                f"{item['group']}: {item['item']}: p99",
                item["p99_us"] / scale,
                item["target_us"] / scale,
                unit,
                bool(item["met"]),
            )
        )
    return out


# ---------------------------------------------------------------------------- text


def _f(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1, text: Sequence[int] = ()) -> list[str]:
    """A Markdown table; the first ``left`` columns and those in ``text`` are text, the others numbers."""
    cells = [list(header)] + [[_f(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    texts = {*range(left), *text}
    lines = [
        "| "
        + " | ".join(c.ljust(w) if i in texts else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        + " |"
        for r in cells
    ]
    rule = ["-" * (w + 2) if i in texts else "-" * (w + 1) + ":" for i, w in enumerate(widths)]
    lines.insert(1, "|" + "|".join(rule) + "|")
    return lines


def _latency_lines(result: dict[str, Any]) -> list[str]:
    lat = result["latency"]
    base = lat.get(_BASE, {}).get("create+start", {}).get("p50")
    rows = []
    for v in lat.values():
        t = v["create+start"]
        delta = t["p50"] - base if base is not None else None
        rows.append(
            [
                v["label"],
                v["pods"],
                v["create"]["p50"],
                v["start"]["p50"],
                t["mean"],
                t["p50"],
                t["p95"],
                t["p99"],
                t["max"],
                delta,
            ]
        )
    return _table(
        ["variant", "pods", "create p50", "start p50", "mean", "p50", "p95", "p99", "max", "p50 - no plugin"], rows
    )


def _round_lines(result: dict[str, Any]) -> list[str]:
    """p50 of create+start per variant and round: drift over the run shows here, not in the totals."""
    by: dict[tuple[str, int], list[float]] = {}
    for s in result.get("samples", []):
        by.setdefault((s["variant"], s["round"]), []).append(s["create_ms"] + s["start_ms"])
    rounds = sorted({r for _, r in by})
    rows = []
    for v in VARIANTS:
        if any((v.name, r) in by for r in rounds):
            rows.append([v.label, *(percentile(by[v.name, r], 50) if (v.name, r) in by else None for r in rounds)])
    return _table(["variant", *(f"round {r + 1}" for r in rounds)], rows)


def _handler_lines(result: dict[str, Any]) -> list[str]:
    rows = []
    for variant, steps in result.get("handler", {}).items():
        label = next(v.label for v in VARIANTS if v.name == variant).removeprefix("nri-gpu, ")
        for step, s in steps.items():
            rows.append([f"{label}: {step}", s["n"], s["mean"], s["p50"], s["p95"], s["p99"], s["max"]])
    return _table(["step (ms, from the plugin's log)", "n", "mean", "p50", "p95", "p99", "max"], rows)


def render(results: dict[str, Any]) -> str:
    out: list[str] = []
    for version, result in results["runtimes"].items():
        opts = results["options"]
        out += [
            f"## containerd {version}",
            "",
            f"CRI CreateContainer + StartContainer of one container in an already running pod, ms "
            f"({opts['pods']} pods per variant, interleaved):",
            "",
        ]
        out += [*_latency_lines(result), ""]
        if result.get("samples"):
            out += [
                "The same, p50 by round (each round: every variant's pods, interleaved):",
                "",
                *_round_lines(result),
                "",
            ]
        if result.get("handler"):
            out += ["Time inside nri-gpu's handlers, by step:", "", *_handler_lines(result), ""]
        if burst := result.get("burst"):
            out.append(
                f"Burst of {burst['pods']} one-GPU pods at once: slowest handler call "
                f"{_f(burst['slowest_handler_ms'])} ms of {burst['handler_calls']}; "
                f"{burst['calls_within_500ms_of_deadline']} within 0.5 s of the 2 s deadline; "
                f"CRI create p99 {_f((burst['cri_create'] or {}).get('p99'))} ms, "
                f"start p99 {_f((burst['cri_start'] or {}).get('p99'))} ms; errors: {len(burst['errors'])}."
            )
        if churn := result.get("churn"):
            out.append(
                f"Churn of {churn['containers']} GPU containers ({churn['seconds']} s): RSS "
                f"{churn['rss_mib_start']} MiB at start, {churn['rss_mib_after_warmup']} after warm-up, "
                f"{churn['rss_mib_end']} at the end (peak {churn['rss_mib_peak']}); descriptors "
                f"{churn['fds_start']} / {churn['fds_after_warmup']} / {churn['fds_end']}: "
                f"{'flat' if churn['rss_flat'] and churn['fds_flat'] else 'NOT flat'}."
            )
        out.append("")
    if split := results.get("inprocess", {}).get("create_split"):
        out += ["## CreateContainer path in-process (same code, same node), ms", ""]
        rows = []
        for variant, steps in split.items():
            for step, s in steps.items():
                rows.append([f"{variant}: {step}", s["n"], s["p50"], s["p95"], s["p99"], s["max"]])
        out += [*_table(["step", "n", "p50", "p95", "p99", "max"], rows), ""]
    if cdi := results.get("cdi"):
        out += ["## CDI: run --rm with and without a GPU", "", *cdi_lines(cdi), ""]
    if mig := results.get("inprocess", {}).get("mig"):
        out += ["## MIG", "", *mig_lines(mig), ""]
    if limits := results.get("limits"):
        out += ["## Costs at the input limits", "", *limits_lines(limits), ""]
    if load := results.get("load"):
        cpus = results.get("machine", {}).get("cpus") or 1
        points = ", ".join(f"{entry['1m']:.2f} {entry['when']}" for entry in load)
        verdict = "quiet" if load[0]["1m"] <= cpus / 2 else "BUSY with other work: tails (p95, p99, max) are inflated"
        out += [
            f"Load average (1 min) on {cpus} CPUs: {points} (after the start, the benchmark's own load); "
            f"before the run the machine was {verdict}.",
            "",
        ]
    if not results["targets"]:
        return "\n".join(out) + "\n"
    out += ["## Targets", ""]
    rows = [
        [
            t["runtime"],
            t["target"],
            f"{t['value']:.2f} {t['unit']}",
            f"{t['limit']:g} {t['unit']}",
            "met" if t["met"] else "MISSED",
        ]
        for t in results["targets"]
    ]
    out += _table(["runtime", "target", "measured", "limit", ""], rows, left=2)
    return "\n".join(out) + "\n"


def mig_lines(result: dict[str, Any]) -> list[str]:
    """The MIG benchmark (``testbed.bench.mig``) as text."""
    lines = [f"CreateContainer in process, {result['mig_devices']} MIG devices on the node (simulated NVML), ms:", ""]
    rows = [[name, s["n"], s["p50"], s["p95"], s["p99"], s["max"]] for name, s in result["create_container_ms"].items()]
    lines += [*_table(["request", "n", "p50", "p95", "p99", "max"], rows), ""]
    p, d = result["nvml_probe_ms"], result["discovery_ms"]
    lines.append(
        f"NVML probe (child interpreter, library, parse): p50 {_f(p['p50'])} ms, p99 {_f(p['p99'])} ms, "
        f"max {_f(p['max'])} ms ({p['n']} runs); discovery p50 {_f(d['with NVML probe']['p50'])} ms with it, "
        f"{_f(d['without']['p50'])} ms without."
    )
    return lines


def cdi_lines(result: dict[str, Any]) -> list[str]:
    """The CDI part (``testbed.bench.cdi``) as text."""
    h = result["hook_alone"]
    base = h.get("baseline")
    variants = ["plain", "gpu", "gpu, no-op hook", *(["gpu, baseline hook"] if base else [])]
    lines = [
        f"`run --rm IMAGE true`, plain and with `--device nvidia.com/gpu=0`, {result['runs']} rounds "
        "(each round every engine and variant once, shuffled), ms; `gpu, no-op hook`: the same spec "
        "with `/bin/true` as its hook (the engine's share of a GPU's cost)"
        + (
            f"; `gpu, baseline hook`: with the hook of {base['rev']}'s spec (`{' '.join(base['command'])}`)"
            if base
            else ""
        )
        + ":",
        "",
    ]
    rows = []
    for engine, r in result["engines"].items():
        plain = r["plain"]["p50"]
        for variant in variants:
            s = r[variant]
            over = s["p50"] - plain if variant != "plain" else None
            rows.append([engine, variant, s["n"], s["p50"], s["p90"], s["min"], s["max"], over])
    lines += [*_table(["engine", "variant", "n", "p50", "p90", "min", "max", "p50 over plain"], rows, left=2), ""]
    if result["engines"]:
        header = ["engine", "gpu over plain p50", "p90", "no-op hook over plain p50", "p90", "our hook's share p50"]
        if base:
            header += ["baseline hook over plain p50", "p90"]
        rows = []
        for engine, r in result["engines"].items():
            row = [engine, r["over_p50"], r["over_p90"], r["noop_hook_over_p50"], r["noop_hook_over_p90"]]
            row.append(round(r["over_p50"] - r["noop_hook_over_p50"], 2))
            if base:
                row += [r["baseline_over_p50"], r["baseline_over_p90"]]
            rows.append(row)
        lines += [
            "What a GPU adds to `run --rm` (differences of percentiles, ms; our hook's share: gpu less no-op hook):",
            "",
            *_table(header, rows),
            "",
        ]
    true = h["/bin/true"]
    lines.append(
        f"The hook alone (`{' '.join(result['hook_command'][1:])}` as the spec runs it, its env only, the OCI state "
        f"on stdin, the whole start work, on a fresh overlay root): p50 {_f(h['hook']['p50'])} ms, "
        f"p90 {_f(h['hook']['p90'])} ms ({h['hook']['n']} runs); /bin/true started the same way "
        f"p50 {_f(true['p50'])} ms, p90 {_f(true['p90'])} ms: the hook's own time {_f(h['over_p50'])} ms at p50, "
        f"{_f(h['over_p90'])} ms at p90."
    )
    if base:
        lines.append(
            f"The hook of {base['rev']}'s spec (`{' '.join(base['command'])}`), interleaved with it: "
            f"p50 {_f(base['p50'])} ms, p90 {_f(base['p90'])} ms ({base['n']} runs), its own time "
            f"{_f(base['own_p50'])} ms at p50, {_f(base['own_p90'])} ms at p90: {_f(h['baseline_over_p50'])} ms "
            "over this checkout's at p50."
        )
    for engine, reason in result.get("skipped", {}).items():
        lines.append(f"{engine}: not measured ({reason}).")
    return lines


def _duration(us: float) -> str:
    """Microseconds in the unit that reads best: ``0.71 µs``, ``340.2 µs``, ``4.74 ms``, ``1.704 s``."""
    if us < 10:
        return f"{us:.2f} µs"
    if us < 1000:
        return f"{us:.1f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.2f} ms"
    return f"{us / 1_000_000:.3f} s"


def limits_lines(result: dict[str, Any]) -> list[str]:
    """The limits part (``testbed.bench.limits``) as text."""
    lines = [
        f"Each call timed alone, after {result['warmup']} warm-up calls: n repetitions (at most "
        f"{result['repeat']}, fewer once an item's took {result['budget_s']:g} s but not under {result['min_n']}; "
        f"the inventory's waiting calls: {result['rounds']} rounds); the p99 is held to the target "
        f"(clock overhead {result['clock_overhead_us']:.2f} µs a reading; {result['seconds']} s in all):",
        "",
    ]
    rows = [
        [
            item["group"],
            item["item"],
            item["n"],
            _duration(item["p50_us"]),
            _duration(item["p99_us"]),
            _duration(item["max_us"]),
            "none" if item["target_us"] is None else _duration(item["target_us"]),
            "" if item["met"] is None else "met" if item["met"] else "MISSED",
            item["outcome"] if len(item["outcome"]) <= 72 else item["outcome"][:71] + "…",
        ]
        for item in result["items"]
    ]
    header = ["part", "input", "n", "p50", "p99", "max", "target", "", "outcome"]
    return [*lines, *_table(header, rows, left=2, text=(7, 8))]
