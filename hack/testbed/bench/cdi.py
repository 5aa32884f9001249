"""What the CDI path costs a container: ``run --rm`` through podman and Docker, and the hook alone.

podman and Docker never reach NRI: they inject from ``nri-gpu cdi generate``'s
spec and runc runs its ``createContainer`` hook, the compiled ``nri-gpu-hook``,
which the start waits for. So the cost of a GPU is the whole ``run --rm`` of a
container with ``--device nvidia.com/gpu=0`` against the same run without it,
measured side by side:

* the engines come from the test bed (``testbed.podman``,
  ``testbed.docker``), each where it can be set up here (a reason is
  recorded for one that cannot), with the glibc image and ``true``;
* nri-gpu is installed as the README installs it (``pip install`` of this
  checkout and its dependencies into a fresh venv: files copied, ``.pyc``
  compiled, the hook built by cargo beside ``nri-gpu``), not the checkout's
  editable install, and that install's ``cdi generate`` writes the spec, which
  names its hook;
* every round runs each (engine, variant) once, plus the hook alone, in a
  shuffled order, so that other work on the machine falls on every variant
  alike;
* a third variant, ``gpu, no-op hook``, asks for ``nri-gpu-bench.example/gpu=0``:
  the same spec under another kind, whose hook is ``/bin/true``. It splits the
  GPU's cost into the engine's (CDI injection, device nodes, mounts, running a
  hook at all) and our hook's own;
* **the hook alone**: the spec's hook command (path, argv with its ``--work``, its
  env only, the OCI state on stdin, runc's working directory: the bundle) on a
  bundle whose ``linux.devices`` hold GPU 0 and the control nodes, the whole
  start work done (procfs view, links, ld.so.conf and cache) in a fresh glibc
  root. Each run starts in a private mount namespace where the root is an
  overlay, as containerd's and podman's snapshotters make it: the glibc tree
  below, an empty upper folder of its own above (a copy of the tree made just
  before would be no container's root: creating entries in a folder that was
  just written costs ext4 ~0.6 ms each, 10 ms for the links), and the node's
  procfs bound at its ``/proc`` (runc gives a hook the container's namespaces);
  ``/bin/true`` is started the same way beside it, so ``hook - /bin/true`` is
  the hook's own time (a compiled hook has no interpreter start or imports to
  split it into).

With ``baseline`` (``--hook-baseline REV``), git revision REV is installed the
same way and its own ``cdi generate`` writes its spec, whose hook runs too,
interleaved: alone on the same bundle, and through each engine as a fourth
variant, ``gpu, baseline hook`` (``nri-gpu-baseline.example/gpu=0``: this spec
under another kind with the baseline spec's hook, its argv and env as that spec
has them). A revision before the compiled hook names ``nri-gpu hook
start-container`` (Python), a later one its ``nri-gpu-hook``: a before/after on
one machine state either way.

The target (issue 15): a GPU container's ``run --rm`` p50 at most 30 ms over a
plain one, through each engine.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import debs, images, rust_toolchain
from testbed.bundle import busybox_rootfs
from testbed.docker import Docker, DockerError
from testbed.gpunode import SimNode
from testbed.images import GLIBC
from testbed.plugin_image import _wheels as dependency_wheels
from testbed.podman import Podman, SpecFolderTaken, shared_spec_path

from .stats import percentile

__all__ = [
    "HookAlone",
    "HookRun",
    "Specs",
    "extra_specs",
    "generate_spec",
    "install_nri_gpu",
    "measure_cdi",
    "series",
    "spec_hook",
]

NOOP_KIND = "nri-gpu-bench.example/gpu"
BASELINE_KIND = "nri-gpu-baseline.example/gpu"
# The variants every engine runs (options of ``run --rm``); BASELINE_VARIANT too with a baseline.
VARIANTS = {
    "plain": [],
    "gpu": ["--device", "nvidia.com/gpu=0"],
    "gpu, no-op hook": ["--device", f"{NOOP_KIND}=0"],
}
BASELINE_VARIANT = "gpu, baseline hook"
_BASELINE_OPTIONS = ["--device", f"{BASELINE_KIND}=0"]
# What runs alone on the bundle (HookAlone): the reference, the hook, and with a baseline its hook.
TRUE, HOOK, BASELINE = "/bin/true", "hook", "baseline hook"
# The specs written beside the real one, by kind: the file's suffix.
_EXTRA_SPECS = {NOOP_KIND: "noop", BASELINE_KIND: "baseline"}
_MS_REC = 1 << 14
_MS_BIND = 1 << 12
_MS_PRIVATE = 1 << 18
_CLONE_NEWNS = 0x00020000


def series(values: list[float]) -> dict[str, float | int]:
    """The numbers reported for one variant (ms): p50 and p90 first (the issue's)."""
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 2),
        "p90": round(percentile(values, 90), 2),
        "mean": round(sum(values) / len(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def _over(values: list[float], reference: list[float]) -> dict[str, float]:
    """``values`` over ``reference`` at p50 and p90 (differences of percentiles, ms)."""
    return {f"p{q}": round(percentile(values, q) - percentile(reference, q), 2) for q in (50, 90)}


_CHECKOUT = Path(__file__).resolve().parents[3]
# What pip builds the package from (hook/: the compiled hook, from a revision that has it).
_INSTALLED = ("pyproject.toml", "README.md", "engine", "plugin", "hook")


def install_nri_gpu(workdir: Path, source: Path = _CHECKOUT) -> Path:
    """``pip install`` of ``source`` (default this checkout) with its dependencies
    (the plugin image's pinned wheels) into a fresh venv: the README's install, a
    copy with compiled ``.pyc`` and no editable finder, ``nri-gpu-hook`` beside
    ``nri-gpu`` where ``source`` has hook/. Its ``nri-gpu``. The sources are copied
    first so that the build writes nothing into ``source`` (cargo's target/ left out)."""
    src, venv, wheels = workdir / "src", workdir / "venv", workdir / "wheel"
    src.mkdir(parents=True)
    for name in _INSTALLED:
        if (source / name).is_dir():
            shutil.copytree(source / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "target"))
        elif (source / name).is_file():
            shutil.copy(source / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(src)],
        check=True,
        capture_output=True,
        env={**os.environ, "CARGO": rust_toolchain.cargo()},
    )
    (wheel,) = wheels.glob("*.whl")
    deps = [str(w) for w in dependency_wheels()]
    subprocess.run(
        [*pip, "--python", str(venv / "bin/python"), "install", "--no-deps", "--no-index", str(wheel), *deps],
        check=True,
        capture_output=True,
    )
    return venv / "bin/nri-gpu"


def revision_tree(rev: str, out: Path) -> Path:
    """What ``install_nri_gpu`` needs, as git revision ``rev`` of this checkout has it, in
    ``out`` (without hook/ where ``rev`` predates it)."""
    listed = subprocess.run(
        ["git", "-C", str(_CHECKOUT), "ls-tree", "--name-only", rev, *_INSTALLED], capture_output=True, check=False
    )
    present = listed.stdout.decode().split() if listed.returncode == 0 else list(_INSTALLED)  # hook/ came later
    done = subprocess.run(["git", "-C", str(_CHECKOUT), "archive", rev, *present], capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git archive {rev}: {done.stderr.decode(errors='replace')}")
    out.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(out, filter="data")
    return out


@dataclass(frozen=True)
class HookRun:
    """One command as runc runs a hook: its executable, its argv (argv[0] included)
    and the whole of its environment."""

    path: str
    args: list[str]
    env: dict[str, str]

    def shown(self) -> list[str]:
        """The argv as reported: the work description's JSON (one long word) named by its size."""
        return [a if not a.startswith("{") else f"<{len(a)} bytes of JSON>" for a in self.args]


def spec_hook(spec: dict[str, Any]) -> HookRun:
    """The ``createContainer`` hook a spec of ``cdi generate`` names (it names one)."""
    (hook,) = spec["containerEdits"]["hooks"]
    return HookRun(hook["path"], list(hook["args"]), dict(e.split("=", 1) for e in hook.get("env", [])))


@dataclass(frozen=True)
class Specs:
    """The spec of this checkout's install and, with a baseline, the spec its install writes."""

    spec: dict[str, Any]
    baseline: dict[str, Any] | None = None


def generate_spec(nri_gpu: Path, node: SimNode, output: Path) -> dict[str, Any]:
    """``nri-gpu cdi generate`` of the install ``nri_gpu`` for ``node`` into ``output``:
    its spec, naming the hook that install has by default (``nri-gpu-hook`` beside it,
    or ``nri-gpu hook`` itself before the compiled hook)."""
    done = subprocess.run(
        [str(nri_gpu), "cdi", "generate", *node.flags(), "--output", str(output), "--allow-untrusted-hook"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{nri_gpu} cdi generate failed: {done.stderr}")
    spec: dict[str, Any] = json.loads(output.read_text())
    return spec


def write_specs(specs: Specs, output: Path) -> None:
    """``specs.spec`` at ``output`` and beside it (``extra_specs``) the same spec as kind
    NOOP_KIND with the hook ``/bin/true`` and, with a baseline, as BASELINE_KIND with
    the baseline spec's hook."""
    output.write_text(json.dumps(specs.spec, indent=2))
    hooks: dict[str, dict[str, Any]] = {NOOP_KIND: {"path": "/bin/true", "args": ["true"]}}
    if specs.baseline is not None:
        (hooks[BASELINE_KIND],) = specs.baseline["containerEdits"]["hooks"]
    for kind, path in extra_specs(output).items():
        if kind not in hooks:
            continue
        other = json.loads(json.dumps(specs.spec))
        other["kind"] = kind
        (hook_edit,) = other["containerEdits"]["hooks"]
        hook_edit.update({k: v for k, v in hooks[kind].items() if k != "hookName"})
        path.write_text(json.dumps(other, indent=2))


def extra_specs(output: Path) -> dict[str, Path]:
    """Where write_specs writes the specs of the other kinds, beside ``output``."""
    return {kind: output.with_name(f"{output.stem}-{suffix}.json") for kind, suffix in _EXTRA_SPECS.items()}


class HookAlone:
    """Hooks run as runc runs them, on a bundle of their own (see the module docstring)."""

    def __init__(self, spec: dict[str, Any], node: SimNode, workdir: Path) -> None:
        self.bundle = workdir / "bundle"
        self.root = self.bundle / "rootfs"
        self.upper, self.work = workdir / "upper", workdir / "overlay-work"
        self.pristine = busybox_rootfs(glibc=True)
        self.proc = str(node.proc_root)
        gpu0 = next(d for d in spec["devices"] if d["name"] == "0")
        nodes = gpu0["containerEdits"]["deviceNodes"] + spec["containerEdits"].get("deviceNodes", [])
        config = {
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "mounts": [
                {
                    "destination": m["containerPath"],
                    "source": m["hostPath"],
                    "type": "bind",
                    "options": m.get("options", []),
                }
                for m in spec["containerEdits"].get("mounts", [])
            ],
            "linux": {
                "devices": [
                    {"path": n["path"], "type": "c", "major": n["major"], "minor": n["minor"]}
                    for n in nodes
                    if "major" in n
                ]
            },
        }
        self.root.mkdir(parents=True)
        (self.bundle / "config.json").write_text(json.dumps(config))
        self.state = json.dumps(
            {"ociVersion": "1.0.2", "id": "bench", "status": "creating", "bundle": str(self.bundle)}
        ).encode()

    def reset(self) -> None:
        """A root as the image gives it: empty upper and work folders for the next run's overlay."""
        for folder in (self.upper, self.work):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()

    def _enter(self) -> None:
        """In the child before exec: a private mount namespace, the root an overlay of
        the glibc tree, the node's procfs at its /proc (as runc's, where the hook
        finds the container's /proc)."""
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
        layers = f"lowerdir={self.pristine},upperdir={self.upper},workdir={self.work}".encode()
        if libc.mount(b"overlay", str(self.root).encode(), b"overlay", 0, layers) != 0:
            raise OSError(ctypes.get_errno(), "mount -t overlay")
        if libc.mount(self.proc.encode(), str(self.root / "proc").encode(), None, _MS_BIND, None) != 0:
            raise OSError(ctypes.get_errno(), "mount --bind procfs")

    def run(self, hook: HookRun) -> float:
        """ms from the start of the child to its exit, on a fresh root. Raises
        RuntimeError if it fails."""
        self.reset()
        began = time.perf_counter()
        done = subprocess.run(
            hook.args,
            executable=hook.path,
            input=self.state,
            env=hook.env,
            capture_output=True,
            preexec_fn=self._enter,
            cwd=self.bundle,
            check=False,
        )
        took = (time.perf_counter() - began) * 1000
        if done.returncode != 0:
            raise RuntimeError(f"{hook.path} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
        return took


def _timed(run: Callable[..., subprocess.CompletedProcess[str]], options: list[str]) -> float:
    began = time.perf_counter()
    done = run(GLIBC, "true", options=options)
    took = (time.perf_counter() - began) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"run --rm {' '.join(options)} true exited {done.returncode}: {done.stderr}")
    return took


@contextlib.contextmanager
def _engines(
    specs: Specs,
    workdir: Path,
    versions: dict[str, list[str]],
    say: Callable[[str], None],
) -> Iterator[tuple[dict[str, Callable[..., Any]], dict[str, str]]]:
    """The engines of ``versions`` (``{"podman": [...], "docker": [...]}``) that could be
    set up, by label (their ``run``), and why the others could not."""
    runners: dict[str, Callable[..., Any]] = {}
    skipped: dict[str, str] = {}

    def failed(label: str, exc: Exception) -> None:
        skipped[label] = str(exc)[:300]
        say(f"CDI: {label} skipped: {skipped[label]}")

    with contextlib.ExitStack() as stack:
        if versions["podman"]:
            # One spec for every podman: they all read /var/run/cdi (see testbed.podman).
            try:
                spec = stack.enter_context(shared_spec_path("bench-"))
                for extra in extra_specs(spec).values():
                    stack.callback(extra.unlink, missing_ok=True)
                write_specs(specs, spec)
            except (SpecFolderTaken, OSError) as exc:
                for version in versions["podman"]:
                    failed(f"podman {version}", exc)
                versions = {**versions, "podman": []}
        for version in versions["podman"]:
            try:
                podman = Podman(workdir / f"podman-{version}", version=version)
                stack.callback(podman.cleanup)
                podman.load(images.glibc_image())
                runners[f"podman {version}"] = podman.run
            except (debs.DebError, RuntimeError, OSError) as exc:
                failed(f"podman {version}", exc)
        for version in versions["docker"]:
            try:
                docker = Docker(workdir / f"docker-{version}", version)
                docker.start()
                stack.callback(docker.stop)
                docker.load(images.glibc_image())
                write_specs(specs, docker.cdi_dir / "nri-gpu.json")
                runners[f"docker {version}"] = docker.run
            except (debs.DebError, DockerError, RuntimeError, OSError) as exc:
                failed(f"docker {version}", exc)
        yield runners, skipped


def measure_cdi(
    node: SimNode,
    workdir: Path,
    runs: int,
    *,
    versions: dict[str, list[str]],
    rng: random.Random,
    say: Callable[[str], None],
    baseline: str | None = None,
) -> dict[str, Any]:
    """Every CDI measurement, ``runs`` rounds, through the podman and Docker ``versions``
    (``{"podman": [...], "docker": [...]}``); the results document's ``cdi`` part.
    ``baseline``: a git revision whose hook runs too, alone and through each engine,
    interleaved with this checkout's: a before/after on one machine state."""
    workdir.mkdir(parents=True, exist_ok=True)
    say("CDI: installing nri-gpu and its hook (pip install of the checkout into a fresh venv)")
    specs = Specs(generate_spec(install_nri_gpu(workdir / "install"), node, workdir / "spec.json"))
    if baseline:
        say(f"CDI: installing nri-gpu as {baseline} has it")
        old = install_nri_gpu(workdir / "baseline", revision_tree(baseline, workdir / "baseline-tree"))
        specs = Specs(specs.spec, generate_spec(old, node, workdir / "baseline-spec.json"))
    alone = HookAlone(specs.spec, node, workdir)
    hook = spec_hook(specs.spec)
    parts = {TRUE: HookRun(TRUE, [TRUE], hook.env), HOOK: hook}
    if specs.baseline is not None:
        parts[BASELINE] = spec_hook(specs.baseline)
    for part in parts.values():  # each works, before any is timed (and the page cache holds it)
        alone.run(part)
    variants = {**VARIANTS, **({BASELINE_VARIANT: _BASELINE_OPTIONS} if baseline else {})}
    times: dict[tuple[str, str], list[float]] = {}
    with _engines(specs, workdir, versions, say) as (runners, skipped):
        say(f"CDI: {runs} rounds of run --rm, plain and with a GPU, through {', '.join(runners) or 'no engine'}")
        for _ in range(runs):
            steps: list[tuple[str, str]] = [(e, v) for e in runners for v in variants]
            steps += [("hook alone", part) for part in parts]
            rng.shuffle(steps)
            for engine, variant in steps:
                if engine == "hook alone":
                    took = alone.run(parts[variant])
                else:
                    took = _timed(runners[engine], variants[variant])
                times.setdefault((engine, variant), []).append(took)
    engines: dict[str, dict[str, Any]] = {}
    for engine in runners:
        plain = times[engine, "plain"]
        over = {v: _over(times[engine, v], plain) for v in variants if v != "plain"}
        engines[engine] = {
            **{v: series(times[engine, v]) for v in variants},
            "over_p50": over["gpu"]["p50"],
            "over_p90": over["gpu"]["p90"],
            # The GPU's cost without our hook's own: the engine's injection and a hook run.
            "noop_hook_over_p50": over["gpu, no-op hook"]["p50"],
            "noop_hook_over_p90": over["gpu, no-op hook"]["p90"],
            **(
                {"baseline_over_p50": over[BASELINE_VARIANT]["p50"], "baseline_over_p90": over[BASELINE_VARIANT]["p90"]}
                if baseline
                else {}
            ),
        }
    own = _over(times["hook alone", HOOK], times["hook alone", TRUE])
    compared: dict[str, Any] = {}
    if specs.baseline is not None:
        base_own = _over(times["hook alone", BASELINE], times["hook alone", TRUE])
        compared = {
            "baseline": {
                "rev": baseline,
                # Its executable's name and action: ``nri-gpu hook start-container`` for a Python hook.
                "command": [Path(parts[BASELINE].path).name, *parts[BASELINE].shown()[1:3]],
                **series(times["hook alone", BASELINE]),
                "own_p50": base_own["p50"],
                "own_p90": base_own["p90"],
            },
            "baseline_over_p50": round(base_own["p50"] - own["p50"], 2),
        }
    return {
        "runs": runs,
        "hook_command": hook.shown(),
        "engines": engines,
        "skipped": skipped,
        "hook_alone": {
            TRUE: series(times["hook alone", TRUE]),
            HOOK: series(times["hook alone", HOOK]),
            # The hook's own time: over /bin/true started the same way.
            "over_p50": own["p50"],
            "over_p90": own["p90"],
            **compared,
        },
    }
