"""The CDI path on podman 4.3.1, 5.4.2 and 5.8.6 (Debian bookworm, trixie, sid):
``podman run --device nvidia.com/gpu=…``, every test on each version.

podman never reaches NRI: it injects from ``nri-gpu cdi generate``'s spec itself
(CDI library 0.5.x: ``cdiVersion`` up to 0.5.0, unknown fields refused) and runc
runs our ``createContainer`` hook (the compiled ``nri-gpu-hook``). podman runs from the test bed
(hack/testbed/podman.py) with a private root and configuration, runc 1.1.5,
``cgroupfs``, ``--network none`` and explicit ulimits.

podman 4.3 reads specs only from ``/etc/cdi`` and ``/var/run/cdi``, so the module
writes its spec to ``/var/run/cdi/nri-gpu-test-<pid>.json`` and removes it after.
Two specs in one directory naming the same device cancel each other (both are
dropped), so sessions are serialized by a lock, and a foreign ``nvidia.com/gpu``
spec already in ``/var/run/cdi`` (NVIDIA's ``nvidia-cdi-refresh``) makes the module
skip, saying so (a failure with ``NRI_GPU_E2E_REQUIRE=1``).

Each container is one ``podman run --rm`` whose script prints what the test checks:
the device nodes, ``/proc/driver/nvidia/gpus``, ``ldconfig -p``. The hostile images
(hack/testbed/hostile.py) run the same way; the host's bait tree must be untouched
and each container either runs with its GPU, or is refused with a message naming
the problem (never a traceback). The checks, the hostile cases' verdicts and the CUDA
runtime probe are tests/e2e/cdi_runtime_cases.py's, shared with Docker's module.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import debs, images
from testbed.gpunode import SimNode
from testbed.images import GLIBC
from testbed.podman import VERSIONS, Podman, SpecFolderTaken, shared_spec_path

from .cdi_runtime_cases import (  # noqa: F401  (the shared tests, collected here once per version)
    assert_gpus,
    bait,
    test_all_gpus,
    test_cuda_runtime_wheel_finds_the_driver,
    test_gpu_by_index,
    test_gpu_by_uuid,
    test_hostile_image,
    test_no_device_no_gpu,
    test_non_root_user,
    test_read_only_root,
    test_start_time_with_and_without_a_gpu,
    test_unknown_device_refused,
)
from .cdi_runtime_cases import run_view as _run_view
from .conftest import NRI_GPU, NRI_GPU_HOOK, _cannot_run, _preflight


@pytest.fixture(scope="module", params=VERSIONS, ids=[f"podman-{v.rpartition('.')[0]}" for v in VERSIONS])
def podman(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    """podman of each version with the glibc image loaded."""
    reason = _preflight()
    if reason:
        _cannot_run(reason)
    try:
        pm = Podman(tmp_path_factory.mktemp("podman"), version=request.param)
    except debs.DebUnavailable as exc:
        _cannot_run(f"cannot download podman {request.param} and nothing is cached: {exc}")
    assert f"podman version {request.param}" in pm("--version").stdout
    pm.load(images.glibc_image())
    yield pm
    pm.cleanup()


@pytest.fixture(scope="module")
def spec_path(podman: Podman) -> Iterator[Path]:
    """Our path in /var/run/cdi, held for the module's lifetime (sessions serialized)."""
    with contextlib.ExitStack() as stack:
        try:
            path = stack.enter_context(shared_spec_path())
        except SpecFolderTaken as exc:
            _cannot_run(str(exc))
            raise
        yield path


@pytest.fixture(scope="module")
def spec(spec_path: Path, node: SimNode) -> dict[str, Any]:
    """The node's spec at ``spec_path``, for the module's lifetime."""
    done = subprocess.run(
        [NRI_GPU, "cdi", "generate", *node.flags(), "--output", str(spec_path), "--allow-untrusted-hook"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    value: dict[str, Any] = json.loads(spec_path.read_text())
    return value


@pytest.fixture
def engine(podman: Podman, spec: dict[str, Any]) -> Podman:
    """podman with the module's spec in place, for the shared tests."""
    return podman


def run_view(podman: Podman, device: str, *options: str) -> list[str]:
    return _run_view(podman.run, device, *options)


def test_spec_is_one_podman_4_3_reads(spec: dict[str, Any]) -> None:
    """CDI 0.5.x (podman 4.3) knows cdiVersion up to 0.5.0 and refuses unknown fields."""
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "nvidia.com/gpu"


def test_install_for_podman_writes_the_spec_podman_reads(
    podman: Podman, spec: dict[str, Any], spec_path: Path, node: SimNode
) -> None:
    """``nri-gpu install --runtime podman --cdi-spec`` our path in /var/run/cdi: podman
    injects from it; a second install changes nothing; after uninstall the spec is gone
    and podman refuses the request (the module's spec is put back after)."""
    kept = spec_path.read_bytes()
    spec_path.unlink()
    argv = [
        NRI_GPU,
        "install",
        "--runtime",
        "podman",
        "--cdi-spec",
        str(spec_path),
        *node.flags(),
        "--hook-path",
        NRI_GPU_HOOK,
        "--allow-untrusted-hook",
        "--no-unit",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode == 0 and "CDI spec written" in done.stdout, done
        assert json.loads(spec_path.read_text()) == spec  # what cdi generate writes
        again = subprocess.run(argv, capture_output=True, text=True)
        assert again.returncode == 0 and "nothing to change" in again.stdout, again
        assert_gpus(run_view(podman, "0"), [node.gpus[0]])
        undone = subprocess.run(
            [NRI_GPU, "uninstall", "--runtime", "podman", "--cdi-spec", str(spec_path)], capture_output=True, text=True
        )
        assert undone.returncode == 0 and not spec_path.exists(), undone
        refused = podman.run(GLIBC, "true", options=["--device", "nvidia.com/gpu=0"])
        assert refused.returncode != 0 and "nvidia.com/gpu=0" in refused.stderr, refused
    finally:
        spec_path.write_bytes(kept)
