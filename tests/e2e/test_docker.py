"""The CDI path on Docker 28.5.2 (Debian sid) and 26.1.5 (trixie):
``docker run --device nvidia.com/gpu=…``.

Docker never reaches NRI (it is no CRI client): dockerd injects from
``nri-gpu cdi generate``'s spec itself and runc runs our ``createContainer`` hook
(the compiled ``nri-gpu-hook``).
CDI is on by default from 28.2; 25.0 to 28.1 need ``"features": {"cdi": true}``,
which the test bed sets for 26.1.5, and test_cdi_without_the_features_key checks
both sides of that line. dockerd runs from the test bed (hack/testbed/docker.py)
over a private containerd 2.1.9 and runc 1.1.5, with its own data and exec roots,
no network set-up, ``cgroupfs``, and ``cdi-spec-dirs`` naming a private folder: the
module's spec goes there, so nothing is written to ``/etc/cdi`` or ``/var/run/cdi``
and no lock is needed.

Each container is one ``docker run --rm --network none`` whose script prints what
the checks read (VIEW of tests/e2e/cdi_runtime_cases.py): the device nodes,
``/proc/driver/nvidia/gpus``, ``ldconfig -p``, the user and ``NVIDIA_VISIBLE_DEVICES``. The container must get
what the NRI path gives: exactly its GPU's ``/dev/nvidia<minor>`` and the control
nodes, that GPU's procfs entry only, libcuda in the ld.so cache.

``--gpus`` is no CDI request before Docker 29.2 (and there only with NVIDIA's
``nvidia-cdi-hook`` on dockerd's PATH, which nri-gpu does not ship): on 28.5 and
26.1 it fails with "could not select device driver", spec or not, which the module
checks so the README's advice (``--device``) stays true.

The hostile images and NVIDIA's CUDA runtime wheel run as on podman, through the same
checks (tests/e2e/cdi_runtime_cases.py); the test bed ``docker import``s each image's
one layer with its ``Env``, ``Cmd``, ``WorkingDir`` and ``User``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import debs, images
from testbed.docker import VERSIONS, Docker
from testbed.gpunode import SimNode
from testbed.images import GLIBC

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


def _started(workdir: Path, version: str, **options: Any) -> Docker:
    """A started private dockerd with the glibc image loaded (skips when it cannot be had)."""
    reason = _preflight()
    if reason:
        _cannot_run(reason)
    try:
        dk = Docker(workdir, version, **options)
    except debs.DebUnavailable as exc:
        _cannot_run(f"cannot download docker.io and docker-cli {version} and nothing is cached: {exc}")
    dk.start()
    try:
        dk.load(images.glibc_image())
    except BaseException:
        dk.stop()
        raise
    return dk


@pytest.fixture(scope="module", params=VERSIONS, ids=[f"docker-{v.rpartition('.')[0]}" for v in VERSIONS])
def docker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Docker]:
    dk = _started(tmp_path_factory.mktemp("docker"), request.param)
    yield dk
    dk.stop()


def _write_spec(docker: Docker, node: SimNode) -> dict[str, Any]:
    path = docker.cdi_dir / "nri-gpu.json"
    done = subprocess.run(
        [NRI_GPU, "cdi", "generate", *node.flags(), "--output", str(path), "--allow-untrusted-hook"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


@pytest.fixture(scope="module")
def spec(docker: Docker, node: SimNode) -> dict[str, Any]:
    """The node's spec in dockerd's private ``cdi-spec-dirs`` folder."""
    return _write_spec(docker, node)


@pytest.fixture
def engine(docker: Docker, spec: dict[str, Any]) -> Docker:
    """dockerd with the module's spec in place, for the shared tests."""
    return docker


def run_view(docker: Docker, device: str, *options: str) -> list[str]:
    return _run_view(docker.run, device, *options)


def test_daemon_reads_only_the_private_spec_dir(docker: Docker) -> None:
    info = json.loads(docker("info", "--format", "{{json .CDISpecDirs}}").stdout)
    assert info == [str(docker.cdi_dir)], info


def test_cdi_without_the_features_key(docker: Docker, node: SimNode, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Without ``"features": {"cdi": true}`` 28.2+ injects (CDI on by default) and
    earlier versions refuse ``--device nvidia.com/gpu=0`` (what the README says)."""
    plain = _started(tmp_path_factory.mktemp("docker-no-features"), docker.version, features={})
    try:
        _write_spec(plain, node)
        done = plain.run(GLIBC, "true", options=["--device", "nvidia.com/gpu=0"])
    finally:
        plain.stop()
    if docker.features:  # the test bed needs the key for this version
        assert done.returncode != 0 and 'could not select device driver "cdi"' in done.stderr, done
    else:
        assert done.returncode == 0, done.stderr


def test_gpus_flag_is_no_cdi_request_before_29_2(docker: Docker, spec: dict[str, Any]) -> None:
    """Docker before 29.2 has no NVIDIA ``--gpus`` driver without NVIDIA's binaries on its PATH."""
    done = docker.run(GLIBC, "true", options=["--gpus", "all"])
    assert done.returncode != 0 and "could not select device driver" in done.stderr, done


# --------------------------------------------------------------------------- nri-gpu install --runtime docker


def _setup(docker: Docker, node: SimNode, command: str, spec: Path) -> subprocess.CompletedProcess[str]:
    """``nri-gpu install|uninstall --runtime docker`` on the test bed's daemon.json, with
    the test bed's docker CLI first on PATH: install asks the running daemon its version."""
    env = {**docker.env(), "PATH": f"{docker.bin.docker.parent}:{docker.env()['PATH']}"}
    argv = [NRI_GPU, command, "--runtime", "docker", "--config", str(docker.config), "--cdi-spec", str(spec)]
    if command == "install":
        argv += [*node.flags(), "--hook-path", NRI_GPU_HOOK, "--allow-untrusted-hook", "--no-unit"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def test_install_for_docker_against_the_real_daemon(
    docker: Docker, node: SimNode, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``nri-gpu install --runtime docker`` on a daemon.json without ``features``: below
    28.2 it sets ``features.cdi`` (the daemon's own version asked), and after a restart of
    dockerd ``--device nvidia.com/gpu=0`` gives the GPU; a second install changes nothing;
    uninstall restores the bytes and, restarted, 26.1 refuses the request again. 28.2+
    gets the spec only: daemon.json is left as it was."""
    dk = _started(tmp_path_factory.mktemp("docker-install"), docker.version, features={})
    try:
        original = dk.config.read_bytes()
        spec = dk.cdi_dir / "nri-gpu.json"
        done = _setup(dk, node, "install", spec)
        assert done.returncode == 0, done.stderr
        assert f"Docker version {dk.version}" in done.stdout, done.stdout
        after = json.loads(dk.config.read_text())
        before = json.loads(original)
        if docker.features:  # this version needs the key
            assert after == {**before, "features": {"cdi": True}}, after
            assert "systemctl restart docker" in done.stdout, done.stdout
        else:
            assert dk.config.read_bytes() == original
        again = _setup(dk, node, "install", spec)
        assert again.returncode == 0 and "nothing to change" in again.stdout, again
        assert "systemctl restart docker" not in again.stdout, again.stdout
        dk.restart_daemon()
        assert_gpus(run_view(dk, "0"), [node.gpus[0]])

        undone = _setup(dk, node, "uninstall", spec)
        assert undone.returncode == 0, undone.stderr
        assert dk.config.read_bytes() == original and not spec.exists()
        dk.restart_daemon()
        refused = dk.run(GLIBC, "true", options=["--device", "nvidia.com/gpu=0"])
        expected = 'could not select device driver "cdi"' if docker.features else "nvidia.com/gpu=0"
        assert refused.returncode != 0 and expected in refused.stderr, refused
    finally:
        dk.stop()
