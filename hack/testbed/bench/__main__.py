"""``python -m testbed.bench`` (``sudo hack/bench``): see the package docstring."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from testbed import docker, podman, runtimes
from testbed.containerd import reap_stale
from testbed.gpunode import build_node

from . import cdi, inprocess, limits, mig, report
from .session import RuntimeBench

_8_GPUS = {"nvidia.com/gpus": "0,1,2,3,4,5,6,7"}


def _versions(text: str) -> list[str]:
    """``1.7.24,2.1.9``; a prefix (``1.7``, ``2``) names the one version it matches."""
    out = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        found = [v for v in runtimes.VERSIONS if v == word or v.startswith(word + ".")]
        if len(found) != 1:
            raise argparse.ArgumentTypeError(f"{word!r}: expected one of {', '.join(runtimes.VERSIONS)}")
        out.append(found[0])
    if not out:
        raise argparse.ArgumentTypeError("no runtime named")
    return out


def _engine_versions(known: Sequence[str]) -> Callable[[str], list[str]]:
    """``V[,V]``, each one of ``known`` (the test bed's versions of an engine)."""

    def parse(text: str) -> list[str]:
        out = [w.strip() for w in text.split(",") if w.strip()]
        for word in out:
            if word not in known:
                raise argparse.ArgumentTypeError(f"{word!r}: expected one of {', '.join(known)}")
        return out

    return parse


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hack/bench", description="Benchmark nri-gpu on real containerd (needs root).")
    p.add_argument(
        "--runtimes",
        type=_versions,
        default=list(runtimes.VERSIONS),
        metavar="V[,V]",
        help=f"containerd versions, comma-separated (default {','.join(runtimes.VERSIONS)})",
    )
    p.add_argument("--pods", type=_positive, default=50, metavar="N", help="recorded pods per variant (default 50)")
    p.add_argument(
        "--churn",
        type=_positive,
        default=1000,
        metavar="N",
        help="GPU containers created, started, stopped, removed for the memory check (default 1000)",
    )
    p.add_argument("--burst", type=_positive, default=32, metavar="N", help="one-GPU pods started at once (default 32)")
    p.add_argument(
        "--profile-iterations",
        type=_positive,
        default=2000,
        metavar="N",
        help="in-process CreateContainer calls per variant for the split and the profile (default 2000)",
    )
    p.add_argument("--seed", type=int, help="seed of the variant order (default: random, recorded in the output)")
    p.add_argument(
        "--output",
        type=Path,
        default=Path("bench-results.json"),
        metavar="FILE",
        help="where the JSON results go (default bench-results.json)",
    )
    p.add_argument(
        "--mig-only", action="store_true", help="only the MIG benchmark (in process: no containerd, a minute or so)"
    )
    p.add_argument(
        "--cdi-runs",
        type=_positive,
        default=100,
        metavar="N",
        help="rounds of podman/docker run --rm, plain and with a GPU, and of the CDI hook alone (default 100)",
    )
    p.add_argument(
        "--podman",
        type=_engine_versions(podman.VERSIONS),
        default=[podman.VERSION],
        metavar="V[,V]",
        help=f"podman versions for the CDI part, of {','.join(podman.VERSIONS)} (default {podman.VERSION}; '' for none)",
    )
    p.add_argument(
        "--docker",
        type=_engine_versions(docker.VERSIONS),
        default=list(docker.VERSIONS),
        metavar="V[,V]",
        help=f"Docker versions for the CDI part (default {','.join(docker.VERSIONS)}; '' for none)",
    )
    p.add_argument(
        "--cdi-only",
        action="store_true",
        help="only the CDI part: podman and Docker run --rm with and without a GPU, the hook alone (minutes)",
    )
    p.add_argument(
        "--hook-baseline",
        metavar="REV",
        help="CDI part: also run the hook of the spec git revision REV writes (installed as the README does), "
        "alone and through each engine, interleaved with this checkout's",
    )
    p.add_argument(
        "--limits-only",
        action="store_true",
        help="only the costs at the input limits (in process: no containerd, no root, about 30 s)",
    )
    p.add_argument(
        "--limits-repeat",
        type=_positive,
        default=1000,
        metavar="N",
        help="limits part: repetitions per item at most (default 1000; fewer once an item's take a second)",
    )
    p.add_argument("--keep-workdir", action="store_true", help="keep the daemons' workdir and the plugin logs")
    return p


def _machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpu_model": model or platform.processor(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _note_load(results: dict[str, Any], when: str) -> None:
    """Record the load average: latency tails mean little on a machine busy with other work.
    Only the first reading tells of other work; later ones include the benchmark's own."""
    one, five, fifteen = os.getloadavg()
    results["load"].append({"when": when, "1m": round(one, 2), "5m": round(five, 2), "15m": round(fifteen, 2)})
    if not results["load"][:-1] and one > (os.cpu_count() or 1) / 2:
        _log(f"warning: load average {one:.2f} on {os.cpu_count()} CPUs {when}: other work will inflate the tails")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement; returns the results document."""
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    reap_stale()  # daemons a killed earlier run (of this or of the tests) left behind
    workdir = Path(tempfile.mkdtemp(prefix="nri-gpu-bench-"))
    results: dict[str, Any] = {
        "schema": 1,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": _machine(),
        "options": {
            "runtimes": args.runtimes,
            "pods": args.pods,
            "churn": args.churn,
            "burst": args.burst,
            "profile_iterations": args.profile_iterations,
            "cdi_runs": args.cdi_runs,
            "podman": args.podman,
            "docker": args.docker,
            "hook_baseline": args.hook_baseline,
            "limits_repeat": args.limits_repeat,
            "seed": seed,
        },
        "runtimes": {},
        "load": [],
    }
    _note_load(results, "at the start")
    try:
        if args.mig_only:
            _log("MIG: CreateContainer in process and the NVML probe")
            results["inprocess"] = {"mig": mig.measure_mig(workdir, args.profile_iterations)}
            results["targets"] = []
            return results
        if args.limits_only:
            results["limits"] = _limits(workdir, args)
            _note_load(results, "at the end")
            results["targets"] = [t.as_dict() for t in report.limits_targets(results["limits"])]
            return results
        node = build_node(workdir / "node", gpus=8)
        if args.cdi_only:
            results["cdi"] = _cdi(node, workdir, rng, args)
            _note_load(results, "at the end")
            results["targets"] = [t.as_dict() for t in report.cdi_targets(results["cdi"])]
            return results
        for version in args.runtimes:
            results["runtimes"][version] = _one_runtime(version, node, workdir / f"c-{version}", rng, args)
            _note_load(results, f"after containerd {version}")
        results["cdi"] = _cdi(node, workdir, rng, args)
        _note_load(results, "after the CDI part")
        _log("in-process split and profile of CreateContainer")
        results["inprocess"] = {
            "create_split": inprocess.measure_create_split(node, args.profile_iterations),
            "profile_8gpu": inprocess.profile_create(node, _8_GPUS, args.profile_iterations),
        }
        _log("MIG: CreateContainer in process and the NVML probe")
        results["inprocess"]["mig"] = mig.measure_mig(workdir, args.profile_iterations)
        results["limits"] = _limits(workdir, args)
        _note_load(results, "at the end")
    finally:
        if args.keep_workdir:
            _log(f"workdir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    results["targets"] = [t.as_dict() for v, r in results["runtimes"].items() for t in report.evaluate(v, r)]
    results["targets"] += [t.as_dict() for t in report.cdi_targets(results["cdi"])]
    results["targets"] += [t.as_dict() for t in report.limits_targets(results["limits"])]
    return results


def _limits(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    _log(f"costs at the input limits: at most {args.limits_repeat} repetitions per item, in process")
    # Two rounds of the calls that wait for a hung refresh (1.7 s each); one in a short run.
    rounds = 2 if args.limits_repeat >= 100 else 1
    return limits.measure_limits(workdir, args.limits_repeat, rounds=rounds, say=_log)


def _cdi(node: Any, workdir: Path, rng: random.Random, args: argparse.Namespace) -> dict[str, Any]:
    _log(
        f"CDI: podman {', '.join(args.podman) or 'none'}, Docker {', '.join(args.docker) or 'none'}, "
        f"{args.cdi_runs} rounds"
    )
    versions = {"podman": args.podman, "docker": args.docker}
    return cdi.measure_cdi(
        node, workdir / "cdi", args.cdi_runs, versions=versions, rng=rng, say=_log, baseline=args.hook_baseline
    )


def _one_runtime(
    version: str, node: Any, workdir: Path, rng: random.Random, args: argparse.Namespace
) -> dict[str, Any]:
    bench = RuntimeBench(version, node, workdir, rng, say=_log)
    _log(f"containerd {version}: starting")
    bench.open()
    try:
        _log(f"containerd {version}: latency, {args.pods} pods per variant")
        samples = bench.latency(args.pods)
        out: dict[str, Any] = {
            "latency": report.latency_dict(samples),
            "handler": report.handler_dict(bench.plugin_log()),
        }
        _log(f"containerd {version}: burst of {args.burst} pods")
        out["burst"] = report.burst_dict(bench.burst(args.burst))
        _log(f"containerd {version}: churn of {args.churn} containers")
        out["churn"] = report.churn_dict(bench.churn(args.churn))
        out["samples"] = [
            {
                "variant": s.variant,
                "pod": s.pod,
                "round": s.round,
                "create_ms": round(s.create_ms, 3),
                "start_ms": round(s.start_ms, 3),
            }
            for s in samples
        ]
        return out
    finally:
        bench.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if os.geteuid() != 0 and not args.limits_only:
        print("hack/bench: needs root (containerd, runc, mounts, cgroups); try: sudo hack/bench", file=sys.stderr)
        return 2
    results = run(args)
    args.output.write_text(json.dumps(results, indent=1) + "\n")
    sys.stdout.write(report.render(results))
    print(f"\nresults written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
