"""The checks of the CDI path that podman and Docker share (tests/e2e/test_podman.py,
tests/e2e/test_docker.py): one definition of what a container with ``--device
nvidia.com/gpu=…`` must show, of the hostile-image cases and their verdicts, and of
the CUDA runtime probe, so that the two runtimes are held to the same word.

A runtime is passed as its ``run(image, *command, options=[...])`` (the test bed's
``Podman.run`` or ``Docker.run``: ``<runtime> run --rm --network none``) and its
``load(image)``.

The tests both runtimes run, word for word, are defined here once (``test_*`` below,
over an ``engine`` fixture: the runtime with the module's spec in place); each
runtime's module imports them, so pytest collects them there, once per version.
"""

from __future__ import annotations

import contextlib
import fcntl
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import pytest

from testbed import cudart, hostile
from testbed.gpunode import SimNode
from testbed.images import GLIBC, Image

from .conftest import _cannot_run
from .test_hostile_images import BAIT, LIBCUDA_LINE, PROBLEM_WORDS, Bait

CONTROL = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
# One run prints every section the checks read, split by this line.
SEP = "==section=="
VIEW = "; ".join(
    f"echo {SEP}; {cmd}"
    for cmd in (
        "ls -d /dev/nvidia*",
        "ls /proc/driver/nvidia/gpus",
        "ldconfig -p",
        "id -u",
        "echo $NVIDIA_VISIBLE_DEVICES",
    )
)
# Cases whose refusal would be a regression: the link is nothing the hook needs.
MUST_RUN = ("ldcache", "compat", "preload", "soname")
# What a refusal of the others must name (or one of PROBLEM_WORDS): the linked path.
REFUSAL_NAMES = {
    "confdir": ("ld.so.conf.d",),
    "relconfdir": ("ld.so.conf.d",),
    "magicconf": ("ld.so.conf.d",),
    "confvolume": ("ld.so.conf.d",),
    "libdir": ("x86_64-linux-gnu",),
    "magiclib": ("x86_64-linux-gnu",),
    "magiccache": ("ld.so.cache",),
    "etc": ("/etc",),
}


class Run(Protocol):
    def __call__(
        self, image: str, *command: str, options: Sequence[str] = ..., check: bool = ..., timeout: float = ...
    ) -> subprocess.CompletedProcess[str]: ...


class Engine(Protocol):
    """What the shared tests use of the test bed's Podman or Docker."""

    version: str

    def load(self, image: Image) -> None: ...

    def run(
        self, image: str, *command: str, options: Sequence[str] = ..., check: bool = ..., timeout: float = ...
    ) -> subprocess.CompletedProcess[str]: ...


def sections(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The sections a VIEW script printed (after the first SEP)."""
    return done.stdout.split(SEP + "\n")[1:]


def run_view(run: Run, device: str, *options: str, image: str = GLIBC) -> list[str]:
    """The sections of VIEW, from a container with ``--device nvidia.com/gpu=<device>``."""
    done = run(image, "sh", "-c", VIEW, options=["--device", f"nvidia.com/gpu={device}", *options])
    assert done.returncode == 0, done.stderr
    return sections(done)


def assert_gpus(found: list[str], gpus: list[Any]) -> None:
    """Exactly what the NRI path gives for ``gpus``: their device nodes and the control
    nodes, their procfs entries only, libcuda in the ld.so cache."""
    devices, proc, cache = found[0].split(), found[1].split(), found[2]
    assert set(devices) == {f"/dev/nvidia{g.minor}" for g in gpus} | CONTROL, devices
    assert proc == sorted(g.bus_id for g in gpus), proc
    assert LIBCUDA_LINE in cache, cache


# --------------------------------------------------------------------------- hostile images


@contextlib.contextmanager
def planted_bait(node: SimNode) -> Iterator[Bait]:
    """The host bait tree, fresh; the same fixed path as test_hostile_images' (baked
    into the cached images), so under the same lock."""
    with open(f"{BAIT}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        bait = Bait(BAIT, secrets.token_hex(8), node, "cdi")
        bait.plant()
        try:
            yield bait
        finally:
            shutil.rmtree(BAIT, ignore_errors=True)


def _scan(token: str) -> str:
    """What a hostile link could show of the bait, read inside the container."""
    return (
        f"echo {SEP}; cat /proc/self/mountinfo; echo {SEP};"
        " find /etc/ /tmp/ /usr/local/ /lib/ /opt/ /data/ -type f -size -64k 2>/dev/null"
        f" | xargs grep -l {token} 2>/dev/null;"
        " cat /etc/ld.so.cache /etc/ld.so.conf.d/* /usr/local/cuda/compat/* 2>/dev/null;"
        " ls -a /usr/lib/x86_64-linux-gnu/ /usr/local/cuda/compat/ /etc/ld.so.conf.d/ 2>/dev/null; true"
    )


def check_hostile_image(load: Callable[[Image], None], run: Run, node: SimNode, bait: Bait, case: str) -> str:
    """Run the hostile image of ``case`` with GPU 0: the host's bait must be untouched and
    the container either runs with its GPU and sees no bait, or is refused with a message
    naming the problem (never a traceback or a panic). Returns the outcome, for the log."""
    if hostile.needs_gcc(case) and shutil.which("gcc") is None:
        pytest.skip(f"the {case} image needs gcc, which this machine lacks")
    load(hostile.hostile_image(case))
    options = ["--device", "nvidia.com/gpu=0"]
    if case in ("soname", "confvolume"):  # nobody, with a root-owned host folder it cannot write
        options += ["--volume", f"{bait.root}/volume:{hostile.VOLUME}"]
    done = run(hostile.image_name(case), "sh", "-c", VIEW + "; " + _scan(bait.token), options=options)
    outcome = "runs" if done.returncode == 0 else "refused: " + done.stderr.strip()
    print(f"OUTCOME {case}: {outcome}")
    bait.assert_untouched(f"by the {case} container")
    if done.returncode != 0:
        assert case not in MUST_RUN, f"{case} must not stop a GPU container: {done.stderr}"
        assert "Traceback" not in done.stderr and 'File "' not in done.stderr, done.stderr
        assert "panicked" not in done.stderr, done.stderr
        named = REFUSAL_NAMES.get(case, ())
        assert any(n in done.stderr for n in named) or any(w in done.stderr.lower() for w in PROBLEM_WORDS), (
            f"the refusal names neither {named} nor the problem: {done.stderr}"
        )
        return outcome
    found = sections(done)
    assert_gpus(found, [node.gpus[0]])
    if case in ("soname", "confvolume"):  # the image's User came through (Docker imports the layer)
        assert found[3].strip() == "65534", found[3]
    assert "/evil" not in found[2] and "/usr/local/cuda/compat" not in found[2], found[2]
    for line in found[5].splitlines():
        source_root = line.split()[3]
        assert source_root == f"{bait.root}/volume" or not source_root.startswith(str(bait.root)), line
    seen = found[6]
    assert bait.token not in seen and "libbait" not in seen and "host.conf" not in seen, seen
    assert not (bait.root / "volume/planted").exists()
    return outcome


# --------------------------------------------------------------------------- CUDA runtime, start time


def check_cuda_runtime(load: Callable[[Image], None], run: Run) -> None:
    """NVIDIA's libcudart (the nvidia-cuda-runtime-cu12 wheel) finds libcuda.so.1 through
    the container's ld.so cache: ``cudaDriverGetVersion`` gives 550's 12040, not 0."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("the CUDA runtime probe needs gcc, which this machine lacks")
    try:
        image = cudart.cudart_image(gcc)
    except subprocess.CalledProcessError as exc:  # offline, nothing cached
        _cannot_run(f"cannot get the nvidia-cuda-runtime-cu12 wheel or build the probe: {exc}")
    load(image)
    done = run(cudart.IMAGE, "/probe", options=["--device", "nvidia.com/gpu=0"])
    assert done.returncode == 0, done
    assert done.stdout.split()[:2] == ["driver", str(cudart.DRIVER_API)], done.stdout
    plain = run(cudart.IMAGE, "/probe")  # the control: without the GPU no driver is found
    assert plain.stdout.split()[:2] == ["driver", "0"], plain.stdout
    print(f"with the GPU: {done.stdout.strip()}; without: {plain.stdout.strip()}")


def start_p50(run: Run, label: str) -> None:
    """p50 of ``<runtime> run --rm`` without and with ``--device nvidia.com/gpu=0``,
    printed (``-s``) for the README; a loose bound catches a hook that hangs (speed
    itself is hack/bench's to measure)."""
    p50 = {}
    for kind, options in (("plain", []), ("gpu", ["--device", "nvidia.com/gpu=0"])):
        runs = []
        for _ in range(10):
            start = time.monotonic()
            assert run(GLIBC, "true", options=options).returncode == 0
            runs.append(time.monotonic() - start)
        p50[kind] = sorted(runs)[len(runs) // 2]
    print(
        f"{label} run --rm p50: plain {p50['plain'] * 1000:.0f} ms, --device nvidia.com/gpu=0 {p50['gpu'] * 1000:.0f} ms"
    )
    assert p50["gpu"] < 10, p50


# --------------------------------------------------------------------------- the shared tests


@pytest.fixture
def bait(node: SimNode) -> Iterator[Bait]:
    with planted_bait(node) as planted:
        yield planted


@pytest.mark.parametrize("index", [0, 3])
def test_gpu_by_index(engine: Engine, node: SimNode, index: int) -> None:
    found = run_view(engine.run, str(index))
    assert_gpus(found, [node.gpus[index]])
    assert found[4].strip() == "void"  # an nri-gpu plugin leaves the container alone


def test_gpu_by_uuid(engine: Engine, node: SimNode) -> None:
    assert_gpus(run_view(engine.run, node.gpus[1].uuid), [node.gpus[1]])


def test_all_gpus(engine: Engine, node: SimNode) -> None:
    assert_gpus(run_view(engine.run, "all"), list(node.gpus))


def test_no_device_no_gpu(engine: Engine) -> None:
    done = engine.run(GLIBC, "sh", "-c", VIEW)
    found = sections(done)
    assert found[0].split() == [] and found[1].split() == [], done.stdout
    assert "libcuda" not in found[2], found[2]


def test_read_only_root(engine: Engine, node: SimNode) -> None:
    """``--read-only``: the hook does its work before runc makes the root read-only;
    the container still cannot write its root."""
    assert_gpus(run_view(engine.run, "0", "--read-only"), [node.gpus[0]])
    done = engine.run(GLIBC, "sh", "-c", "touch /etc/x", options=["--read-only", "--device", "nvidia.com/gpu=0"])
    assert done.returncode != 0 and "Read-only file system" in done.stderr + done.stdout, done


def test_non_root_user(engine: Engine, node: SimNode) -> None:
    found = run_view(engine.run, "0", "--user", "1000:1000")
    assert_gpus(found, [node.gpus[0]])
    assert found[3].strip() == "1000"


def test_unknown_device_refused(engine: Engine) -> None:
    done = engine.run(GLIBC, "true", options=["--device", "nvidia.com/gpu=99"])
    assert done.returncode != 0 and "nvidia.com/gpu=99" in done.stderr, done


@pytest.mark.parametrize("case", hostile.CASES)
def test_hostile_image(engine: Engine, node: SimNode, bait: Bait, case: str) -> None:
    check_hostile_image(engine.load, engine.run, node, bait, case)


def test_start_time_with_and_without_a_gpu(engine: Engine) -> None:
    start_p50(engine.run, f"{type(engine).__name__.lower()} {engine.version}")


def test_cuda_runtime_wheel_finds_the_driver(engine: Engine) -> None:
    check_cuda_runtime(engine.load, engine.run)
