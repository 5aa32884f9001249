"""What the CDI path costs a container: ``run --rm`` through podman and Docker, and the hook alone.

podman and Docker never reach NRI: they inject from ``nri-gpu cdi generate``'s
spec and runc runs its ``createContainer`` hook, which the start waits for. So
the cost of a GPU is the whole ``run --rm`` of a container with ``--device
nvidia.com/gpu=0`` against the same run without it, measured side by side:

* the engines come from the test bed (``tests.testbed.podman``,
  ``tests.testbed.docker``), each where it can be set up here (a reason is
  recorded for one that cannot), with the glibc image and ``true``;
* the hook is installed as the README installs it (``pip install`` of this
  checkout and its dependencies into a fresh venv: files copied, ``.pyc``
  compiled), not the checkout's editable install, and the spec names it;
* every round runs each (engine, variant) once, plus the hook alone, in a
  shuffled order, so that other work on the machine falls on every variant
  alike;
* a third variant, ``gpu, no-op hook``, asks for ``nri-gpu-bench.example/gpu=0``:
  the same spec under another kind, whose hook is ``/bin/true``. It splits the
  GPU's cost into the engine's (CDI injection, device nodes, mounts, running a
  hook at all) and our hook's own. A fourth, ``gpu, Python floor hook``
  (``nri-gpu-floor.example/gpu=0``), runs as the hook our hook's interpreter
  importing only what any Python start work needs (``FLOOR_IMPORTS``) and doing
  nothing: what the least Python hook would cost;
* **the hook alone**: the spec's hook command (path, argv, its env only, the OCI
  state on stdin) on a bundle whose ``linux.devices`` hold GPU 0 and the
  control nodes, the whole start work done (procfs view, links, ld.so.conf and
  cache) in a fresh glibc root. Each run starts in a private mount namespace
  where the root is an overlay, as containerd's and podman's snapshotters make
  it: the glibc tree below, an empty upper folder of its own above (a copy of the
  tree made just before would be no container's root: creating entries in a
  folder that was just written costs ext4 ~0.6 ms each, 10 ms for the links),
  and the node's procfs bound at its ``/proc`` (runc gives a hook the
  container's namespaces); the same start with ``/bin/true``
  is measured beside it, so ``hook - /bin/true`` is the hook's own time. Two
  more commands split that time: the hook's interpreter (its ``#!`` line, with
  ``site`` as the script gets it) running nothing, and the same interpreter
  importing exactly the modules the hook's process holds at its end (listed by
  one run of the hook beforehand), in the order it imported them. So:
  interpreter - /bin/true is Python's start and exit, imports - interpreter the
  imports, hook - imports the work (arguments, discovery, plan, start work).
  With ``baseline`` (``--hook-baseline REV``), the hook as git revision REV
  installs it runs too, interleaved: a before/after on one machine state.

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
from pathlib import Path
from typing import Any

from plugin.hook_install import interpreter
from tests.testbed import debs, images, rust_toolchain
from tests.testbed.bundle import busybox_rootfs
from tests.testbed.docker import Docker, DockerError
from tests.testbed.gpunode import SimNode
from tests.testbed.images import GLIBC
from tests.testbed.plugin_image import _wheels as dependency_wheels
from tests.testbed.plugins import NRI_GPU
from tests.testbed.podman import Podman, SpecFolderTaken, shared_spec_path

from .stats import percentile

__all__ = ["HookAlone", "extra_specs", "generate_spec", "install_hook", "measure_cdi", "series"]

NOOP_KIND = "nri-gpu-bench.example/gpu"
FLOOR_KIND = "nri-gpu-floor.example/gpu"
# The standard library a Python hook doing the start work cannot do without.
FLOOR_IMPORTS = "import json, os, ctypes, struct, signal, stat, errno"
# The hook alone and the commands that split its time (HookAlone.commands).
HOOK_PARTS = ("/bin/true", "interpreter", "imports", "hook")
_BASELINE = "hook at the baseline revision"  # measure_cdi(baseline=REV)
# Run by the hook's interpreter in place of its script: the hook, then the modules it holds.
_LIST_MODULES = """
import json, sys
from plugin.entry import main
sys.argv[0] = "nri-gpu"
status = main()
print(json.dumps(list(sys.modules)))
sys.exit(status)
"""
_IMPORT_MODULES = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    if name not in sys.modules:
        importlib.import_module(name)
"""
VARIANTS = {
    "plain": [],
    "gpu": ["--device", "nvidia.com/gpu=0"],
    "gpu, no-op hook": ["--device", f"{NOOP_KIND}=0"],
    "gpu, Python floor hook": ["--device", f"{FLOOR_KIND}=0"],
}
# The specs generate_spec writes beside the real one, by kind: the file's suffix.
_EXTRA_SPECS = {NOOP_KIND: "noop", FLOOR_KIND: "floor"}
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


_CHECKOUT = Path(__file__).resolve().parents[3]
# What pip builds the package from (hook/: the compiled hook, from a revision that has it).
_INSTALLED = ("pyproject.toml", "README.md", "engine", "plugin", "hook")


def install_hook(workdir: Path, source: Path = _CHECKOUT) -> Path:
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
    """What ``install_hook`` needs, as git revision ``rev`` of this checkout has it, in ``out``
    (without hook/ where ``rev`` predates it)."""
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


def generate_spec(node: SimNode, hook: Path, output: Path) -> dict[str, Any]:
    """``nri-gpu cdi generate`` for ``node`` naming ``hook`` into ``output``, and
    beside it (``extra_specs``) the same spec as kind NOOP_KIND with the hook
    ``/bin/true`` and as FLOOR_KIND with the hook's interpreter running
    FLOOR_IMPORTS; the spec."""
    done = subprocess.run(
        [
            NRI_GPU,
            "cdi",
            "generate",
            *node.flags(),
            "--output",
            str(output),
            "--hook-path",
            str(hook),
            "--allow-untrusted-hook",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"nri-gpu cdi generate failed: {done.stderr}")
    spec: dict[str, Any] = json.loads(output.read_text())
    python = interpreter(str(hook)) or sys.executable
    hooks = {NOOP_KIND: ["/bin/true", "true"], FLOOR_KIND: [python, python, "-c", FLOOR_IMPORTS]}
    for kind, path in extra_specs(output).items():
        other = json.loads(output.read_text())
        other["kind"] = kind
        (hook_edit,) = other["containerEdits"]["hooks"]
        hook_edit.update(path=hooks[kind][0], args=hooks[kind][1:])
        path.write_text(json.dumps(other, indent=2))
    return spec


def extra_specs(output: Path) -> dict[str, Path]:
    """Where generate_spec writes the specs of the other kinds, beside ``output``."""
    return {kind: output.with_name(f"{output.stem}-{suffix}.json") for kind, suffix in _EXTRA_SPECS.items()}


class HookAlone:
    """The spec's hook run as runc runs it, on a bundle of its own (see the module docstring)."""

    def __init__(self, spec: dict[str, Any], node: SimNode, workdir: Path) -> None:
        (hook,) = spec["containerEdits"]["hooks"]
        self.argv: list[str] = hook["args"]
        self.path: str = hook["path"]
        self.env = dict(e.split("=", 1) for e in hook["env"])
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

    def commands(self) -> dict[str, list[str] | None]:
        """HOOK_PARTS: the argv of each (None: the hook itself)."""
        python = interpreter(self.path)
        if not python:
            raise RuntimeError(f"{self.path} is not a Python script")
        self.reset()
        listed = self._run([python, "-c", _LIST_MODULES, *self.argv[1:]], python)
        modules = [m for m in json.loads(listed) if m != "__main__"]
        return {
            "/bin/true": ["/bin/true"],
            "interpreter": [python, "-c", "pass"],
            "imports": [python, "-c", _IMPORT_MODULES, json.dumps(modules)],
            "hook": None,
        }

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

    def run(self, argv: list[str] | None = None) -> float:
        """ms from the start of the child to its exit: the hook, or ``argv`` in its place."""
        began = time.perf_counter()
        self._run(argv or self.argv, None if argv else self.path)
        return (time.perf_counter() - began) * 1000

    def _run(self, command: list[str], executable: str | None) -> str:
        """``command`` as the hook runs; its stdout. Raises RuntimeError if it fails."""
        done = subprocess.run(
            command,
            executable=executable,
            input=self.state,
            env=self.env,
            capture_output=True,
            preexec_fn=self._enter,
            cwd="/",
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
        return done.stdout.decode()


def _timed(run: Callable[..., subprocess.CompletedProcess[str]], options: list[str]) -> float:
    began = time.perf_counter()
    done = run(GLIBC, "true", options=options)
    took = (time.perf_counter() - began) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"run --rm {' '.join(options)} true exited {done.returncode}: {done.stderr}")
    return took


@contextlib.contextmanager
def _engines(
    node: SimNode,
    hook: Path,
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
            # One spec for every podman: they all read /var/run/cdi (see tests.testbed.podman).
            try:
                spec = stack.enter_context(shared_spec_path("bench-"))
                for extra in extra_specs(spec).values():
                    stack.callback(extra.unlink, missing_ok=True)
                generate_spec(node, hook, spec)
            except (SpecFolderTaken, RuntimeError, OSError) as exc:
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
                generate_spec(node, hook, docker.cdi_dir / "nri-gpu.json")
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
    ``baseline``: a git revision whose hook runs alone too, interleaved with this
    checkout's (same spec arguments): a before/after on one machine state."""
    workdir.mkdir(parents=True, exist_ok=True)
    say("CDI: installing the hook (pip install of the checkout into a fresh venv)")
    hook = install_hook(workdir / "install")
    alone = HookAlone(generate_spec(node, hook, workdir / "spec.json"), node, workdir)
    parts: dict[str, list[str] | None] = alone.commands()
    if baseline:
        say(f"CDI: installing the hook of {baseline}")
        old = install_hook(workdir / "baseline", revision_tree(baseline, workdir / "baseline-tree"))
        parts[_BASELINE] = [str(old), *alone.argv[1:]]
    times: dict[tuple[str, str], list[float]] = {}
    with _engines(node, hook, workdir, versions, say) as (runners, skipped):
        say(f"CDI: {runs} rounds of run --rm, plain and with a GPU, through {', '.join(runners) or 'no engine'}")
        for _ in range(runs):
            steps: list[tuple[str, str]] = [(e, v) for e in runners for v in VARIANTS]
            steps += [("hook alone", part) for part in parts]
            rng.shuffle(steps)
            for engine, variant in steps:
                if engine == "hook alone":
                    alone.reset()
                    took = alone.run(parts[variant])
                else:
                    took = _timed(runners[engine], VARIANTS[variant])
                times.setdefault((engine, variant), []).append(took)
    engines: dict[str, dict[str, Any]] = {}
    for engine in runners:
        plain, gpu, noop, floor = (times[engine, v] for v in VARIANTS)
        engines[engine] = {
            **{v: series(times[engine, v]) for v in VARIANTS},
            "over_p50": round(percentile(gpu, 50) - percentile(plain, 50), 2),
            "over_p90": round(percentile(gpu, 90) - percentile(plain, 90), 2),
            # The GPU's cost without our hook's own: the engine's injection and a hook run.
            "noop_hook_over_p50": round(percentile(noop, 50) - percentile(plain, 50), 2),
            # The least a Python hook costs (the engine's share included).
            "floor_hook_over_p50": round(percentile(floor, 50) - percentile(plain, 50), 2),
        }
    p50 = {part: percentile(times["hook alone", part], 50) for part in parts}
    compared = {}
    if baseline:
        compared = {
            "baseline": {"rev": baseline, **series(times["hook alone", _BASELINE])},
            "baseline_over_p50": round(p50[_BASELINE] - p50["hook"], 2),
        }
    return {
        "runs": runs,
        "hook_command": alone.argv[:3],
        "engines": engines,
        "skipped": skipped,
        "hook_alone": {
            **{part: series(times["hook alone", part]) for part in HOOK_PARTS},
            "over_p50": round(p50["hook"] - p50["/bin/true"], 2),
            # Differences of p50s (see the module docstring): where the hook's own time goes.
            "split_p50": {
                "interpreter start and exit": round(p50["interpreter"] - p50["/bin/true"], 2),
                "imports": round(p50["imports"] - p50["interpreter"], 2),
                "work (arguments, discovery, plan, start work)": round(p50["hook"] - p50["imports"], 2),
            },
            **compared,
        },
    }
