"""The CDI path on podman 4.3.1 (Debian bookworm): ``podman run --device nvidia.com/gpu=…``.

podman never reaches NRI: it injects from ``nri-gpu cdi generate``'s spec itself
(CDI library 0.5.x: ``cdiVersion`` up to 0.5.0, unknown fields refused) and runc
runs our ``createContainer`` hook. podman runs from the test bed
(tests/testbed/podman.py) with a private root and configuration, runc 1.1.5,
``cgroupfs``, ``--network none`` and explicit ulimits.

podman 4.3 reads specs only from ``/etc/cdi`` and ``/var/run/cdi``, so the module
writes its spec to ``/var/run/cdi/nri-gpu-test-<pid>.json`` and removes it after.
Two specs in one directory naming the same device cancel each other (both are
dropped), so sessions are serialized by a lock, and a foreign ``nvidia.com/gpu``
spec already in ``/var/run/cdi`` (NVIDIA's ``nvidia-cdi-refresh``) makes the module
skip, saying so (a failure with ``NRI_GPU_E2E_REQUIRE=1``).

Each container is one ``podman run --rm`` whose script prints what the test checks:
the device nodes, ``/proc/driver/nvidia/gpus``, ``ldconfig -p``. The hostile images
(tests/testbed/hostile.py) run the same way; the host's bait tree must be untouched
and each container either runs with its GPU, or is refused with a message naming
the problem (never a traceback).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.testbed import cudart, debs, hostile, images
from tests.testbed.gpunode import SimNode
from tests.testbed.images import GLIBC
from tests.testbed.podman import Podman, SpecFolderTaken, shared_spec_path

from .conftest import NRI_GPU, _cannot_run, _preflight
from .test_hostile_images import BAIT, LIBCUDA_LINE, PROBLEM_WORDS, Bait

CONTROL = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
# One podman run prints every section the checks read, split by this line.
SEP = "==section=="
VIEW = "; ".join(f"echo {SEP}; {cmd}" for cmd in (
    "ls -d /dev/nvidia*",
    "ls /proc/driver/nvidia/gpus",
    "ldconfig -p",
    "id -u",
    "echo $NVIDIA_VISIBLE_DEVICES",
))


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    """podman with the glibc image loaded."""
    reason = _preflight()
    if reason:
        _cannot_run(reason)
    try:
        pm = Podman(tmp_path_factory.mktemp("podman"))
    except debs.DebUnavailable as exc:
        _cannot_run(f"cannot download podman and nothing is cached: {exc}")
    pm.load(images.glibc_image())
    yield pm
    pm.cleanup()


@pytest.fixture(scope="module")
def spec(podman: Podman, node: SimNode) -> Iterator[dict[str, Any]]:
    """The node's spec in /var/run/cdi for the module's lifetime (sessions serialized)."""
    with contextlib.ExitStack() as stack:
        try:
            path = stack.enter_context(shared_spec_path())
        except SpecFolderTaken as exc:
            _cannot_run(str(exc))
            raise
        done = subprocess.run([NRI_GPU, "cdi", "generate", *node.flags(), "--output", str(path),
                               "--allow-untrusted-hook"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        yield json.loads(path.read_text())


def run_view(podman: Podman, device: str, *options: str, image: str = GLIBC) -> list[str]:
    """The sections of VIEW, from a container with ``--device nvidia.com/gpu=<device>``."""
    done = podman.run(image, "sh", "-c", VIEW, options=["--device", f"nvidia.com/gpu={device}", *options])
    assert done.returncode == 0, done.stderr
    return done.stdout.split(SEP + "\n")[1:]


def assert_gpus(sections: list[str], gpus: list[Any]) -> None:
    devices, proc, cache = sections[0].split(), sections[1].split(), sections[2]
    assert set(devices) == {f"/dev/nvidia{g.minor}" for g in gpus} | CONTROL, devices
    assert proc == sorted(g.bus_id for g in gpus), proc
    assert LIBCUDA_LINE in cache, cache


def test_spec_is_one_podman_4_3_reads(spec: dict[str, Any]) -> None:
    """CDI 0.5.x (podman 4.3) knows cdiVersion up to 0.5.0 and refuses unknown fields."""
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "nvidia.com/gpu"


@pytest.mark.parametrize("index", [0, 3])
def test_gpu_by_index(podman: Podman, spec: dict[str, Any], node: SimNode, index: int) -> None:
    sections = run_view(podman, str(index))
    assert_gpus(sections, [node.gpus[index]])
    assert sections[4].strip() == "void"  # an nri-gpu plugin leaves the container alone


def test_gpu_by_uuid(podman: Podman, spec: dict[str, Any], node: SimNode) -> None:
    assert_gpus(run_view(podman, node.gpus[1].uuid), [node.gpus[1]])


def test_all_gpus(podman: Podman, spec: dict[str, Any], node: SimNode) -> None:
    assert_gpus(run_view(podman, "all"), list(node.gpus))


def test_read_only_root(podman: Podman, spec: dict[str, Any], node: SimNode) -> None:
    """``--read-only``: runc makes the root read-only after the createContainer hook,
    which does its work; the container still cannot write its root."""
    sections = run_view(podman, "0", "--read-only")
    assert_gpus(sections, [node.gpus[0]])
    done = podman.run(GLIBC, "sh", "-c", "touch /etc/x", options=["--read-only", "--device", "nvidia.com/gpu=0"])
    assert done.returncode != 0 and "Read-only file system" in done.stderr + done.stdout, done


def test_non_root_user(podman: Podman, spec: dict[str, Any], node: SimNode) -> None:
    sections = run_view(podman, "0", "--user", "1000:1000")
    assert_gpus(sections, [node.gpus[0]])
    assert sections[3].strip() == "1000"


def test_unknown_device_refused(podman: Podman, spec: dict[str, Any]) -> None:
    done = podman.run(GLIBC, "true", options=["--device", "nvidia.com/gpu=99"])
    assert done.returncode != 0 and "nvidia.com/gpu=99" in done.stderr, done


# --------------------------------------------------------------------------- hostile images

# Cases whose refusal would be a regression: the link is nothing the hook needs.
MUST_RUN = ("ldcache", "compat", "preload", "soname")
# What a refusal of the others must name (or one of PROBLEM_WORDS): the linked path.
REFUSAL_NAMES = {
    "confdir": ("ld.so.conf.d",), "relconfdir": ("ld.so.conf.d",), "magicconf": ("ld.so.conf.d",),
    "confvolume": ("ld.so.conf.d",), "libdir": ("x86_64-linux-gnu",), "magiclib": ("x86_64-linux-gnu",),
    "magiccache": ("ld.so.cache",), "etc": ("/etc",),
}


@pytest.fixture
def bait(node: SimNode) -> Iterator[Bait]:
    # The same fixed bait tree as test_hostile_images (baked into the images): same lock.
    with open(f"{BAIT}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        b = Bait(BAIT, secrets.token_hex(8), node, "cdi")
        b.plant()
        yield b
        shutil.rmtree(BAIT, ignore_errors=True)


def _scan(token: str) -> str:
    """What a hostile link could show of the bait, read inside the container."""
    return (f"echo {SEP}; cat /proc/self/mountinfo; echo {SEP};"
            " find /etc/ /tmp/ /usr/local/ /lib/ /opt/ /data/ -type f -size -64k 2>/dev/null"
            f" | xargs grep -l {token} 2>/dev/null;"
            " cat /etc/ld.so.cache /etc/ld.so.conf.d/* /usr/local/cuda/compat/* 2>/dev/null;"
            " ls -a /usr/lib/x86_64-linux-gnu/ /usr/local/cuda/compat/ /etc/ld.so.conf.d/ 2>/dev/null; true")


@pytest.mark.parametrize("case", hostile.CASES)
def test_hostile_image(podman: Podman, spec: dict[str, Any], node: SimNode, bait: Bait, case: str) -> None:
    if hostile.needs_gcc(case) and shutil.which("gcc") is None:
        pytest.skip(f"the {case} image needs gcc, which this machine lacks")
    podman.load(hostile.hostile_image(case))
    options = ["--device", "nvidia.com/gpu=0"]
    if case in ("soname", "confvolume"):  # nobody, with a root-owned host folder it cannot write
        options += ["--volume", f"{bait.root}/volume:{hostile.VOLUME}"]
    done = podman.run(hostile.image_name(case), "sh", "-c", VIEW + "; " + _scan(bait.token), options=options)
    print(f"OUTCOME {case}: {'runs' if done.returncode == 0 else 'refused: ' + done.stderr}")
    bait.assert_untouched(f"by the {case} container")
    if done.returncode != 0:
        assert case not in MUST_RUN, f"{case} must not stop a GPU container: {done.stderr}"
        assert "Traceback" not in done.stderr and 'File "' not in done.stderr, done.stderr
        named = REFUSAL_NAMES.get(case, ())
        assert any(n in done.stderr for n in named) or any(w in done.stderr.lower() for w in PROBLEM_WORDS), (
            f"the refusal names neither {named} nor the problem: {done.stderr}")
        return
    sections = done.stdout.split(SEP + "\n")[1:]
    assert_gpus(sections, [node.gpus[0]])
    assert "/evil" not in sections[2] and "/usr/local/cuda/compat" not in sections[2], sections[2]
    for line in sections[5].splitlines():
        source_root = line.split()[3]
        assert source_root == f"{bait.root}/volume" or not source_root.startswith(str(bait.root)), line
    seen = sections[6]
    assert bait.token not in seen and "libbait" not in seen and "host.conf" not in seen, seen
    assert not (bait.root / "volume/planted").exists()


# --------------------------------------------------------------------------- start time


def start_p50(run: Any, label: str) -> None:
    """p50 of ``<runtime> run --rm`` (``run(image, *cmd, options=...)``) without and with
    ``--device nvidia.com/gpu=0``, printed (``-s``) for the README; a loose bound catches
    a hook that hangs (speed itself is hack/bench's to measure)."""
    p50 = {}
    for kind, options in (("plain", []), ("gpu", ["--device", "nvidia.com/gpu=0"])):
        runs = []
        for _ in range(10):
            start = time.monotonic()
            assert run(GLIBC, "true", options=options).returncode == 0
            runs.append(time.monotonic() - start)
        p50[kind] = sorted(runs)[len(runs) // 2]
    print(f"{label} run --rm p50: plain {p50['plain'] * 1000:.0f} ms, --device nvidia.com/gpu=0 {p50['gpu'] * 1000:.0f} ms")
    assert p50["gpu"] < 10, p50


def test_start_time_with_and_without_a_gpu(podman: Podman, spec: dict[str, Any]) -> None:
    start_p50(podman.run, f"podman {podman.version}")


def test_cuda_runtime_wheel_finds_the_driver(podman: Podman, spec: dict[str, Any]) -> None:
    """NVIDIA's libcudart (the nvidia-cuda-runtime-cu12 wheel) finds libcuda.so.1 through
    the container's ld.so cache: ``cudaDriverGetVersion`` gives 550's 12040, not 0."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("the CUDA runtime probe needs gcc, which this machine lacks")
    try:
        image = cudart.cudart_image(gcc)
    except subprocess.CalledProcessError as exc:  # offline, nothing cached
        _cannot_run(f"cannot get the nvidia-cuda-runtime-cu12 wheel or build the probe: {exc}")
    podman.load(image)
    done = podman.run(cudart.IMAGE, "/probe", options=["--device", "nvidia.com/gpu=0"])
    assert done.returncode == 0, done
    assert done.stdout.split()[:2] == ["driver", str(cudart.DRIVER_API)], done.stdout
    plain = podman.run(cudart.IMAGE, "/probe")  # the control: without the GPU no driver is found
    assert plain.stdout.split()[:2] == ["driver", "0"], plain.stdout
    print(f"with the GPU: {done.stdout.strip()}; without: {plain.stdout.strip()}")
