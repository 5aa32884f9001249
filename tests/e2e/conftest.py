"""Fixtures for end-to-end tests against real containerd daemons (see hack/testbed).

* ``containerd`` (session, parametrized "containerd-1.7" / "containerd-2.1"): a started
  daemon with the test images imported, as a ``Testbed`` (``.containerd``, ``.cri``).
* ``testbed`` (function): the same object; after the test it restarts the daemon if the
  test stopped or killed it, then removes every pod and container.
* ``cri`` (function): ``testbed.cri``.
* ``testbed_factory`` (function): start extra daemons with other options (a
  pre-installed NRI plugin, other timeouts); all are stopped after the test.

Tests here are skipped, with the reason, only when they cannot run at all: not root, no
overlayfs, or the Debian mirror is unreachable and nothing is cached. Set
``NRI_GPU_E2E_REQUIRE=1`` (CI does) to turn those skips into failures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.plugin.cli.hook_install import check_hook
from testbed import debs, images, runtimes
from testbed.containerd import Containerd, reap_stale
from testbed.cri import CriClient
from testbed.gpunode import SimNode, build_node
from testbed.images import Image
from testbed.plugins import NRI_GPU, NRI_GPU_HOOK, NriGpuProcess

_IDS = {"1.7.24": "containerd-1.7", "2.1.9": "containerd-2.1"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@dataclass
class Testbed:
    """One running containerd and a CRI client connected to it."""

    __test__ = False  # not a test class, despite the name

    containerd: Containerd
    cri: CriClient

    @property
    def version(self) -> str:
        return self.containerd.version

    @property
    def workdir(self) -> Path:
        return self.containerd.workdir


def _cannot_run(reason: str) -> None:
    if os.environ.get("NRI_GPU_E2E_REQUIRE") == "1":
        pytest.fail(f"end-to-end tests required (NRI_GPU_E2E_REQUIRE=1) but: {reason}", pytrace=False)
    pytest.skip(reason)


_preflight_result: str | None = None


def _preflight() -> str:
    """'' if this machine can run the tests, else why not (checked once per session)."""
    global _preflight_result
    if _preflight_result is None:
        _preflight_result = _check_host()
    return _preflight_result


def _check_host() -> str:
    if os.geteuid() != 0:
        return "end-to-end tests need root (containerd, runc, mounts, cgroups)"
    with tempfile.TemporaryDirectory(prefix="nri-gpu-ovl-") as tmp:
        for sub in ("lower", "upper", "work", "merged"):
            os.mkdir(os.path.join(tmp, sub))
        opts = f"lowerdir={tmp}/lower,upperdir={tmp}/upper,workdir={tmp}/work"
        proc = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", opts, f"{tmp}/merged"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            return f"overlayfs cannot be mounted here: {proc.stderr.strip()}"
        subprocess.run(["umount", f"{tmp}/merged"], check=True)
    reap_stale()  # daemons a killed earlier run left behind
    return ""


def _start(version: str, workdir: Path, setup: Callable[[Containerd], None] | None = None, **options: Any) -> Testbed:
    reason = _preflight()
    if reason:
        _cannot_run(reason)
    try:
        ctrd = Containerd(version, workdir, **options)
        images.build_all()
    except debs.DebUnavailable as exc:
        _cannot_run(f"cannot download containerd {version} and nothing is cached: {exc}")
    ctrd.prepare()
    if setup is not None:
        setup(ctrd)
    ctrd.start()
    try:
        images.import_all(ctrd)
        cri = CriClient(ctrd.address, cgroup_parent=ctrd.cgroup_parent, log_root=workdir / "pod-logs")
    except BaseException:
        ctrd.stop()
        raise
    return Testbed(ctrd, cri)


def _finish(bed: Testbed) -> None:
    bed.cri.close()
    bed.containerd.stop()


@pytest.fixture(scope="session", params=runtimes.VERSIONS, ids=[_IDS[v] for v in runtimes.VERSIONS])
def containerd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    # Short workdir: socket paths must stay under 108 bytes.
    bed = _start(request.param, tmp_path_factory.mktemp(_IDS[request.param]))
    try:
        yield bed
    finally:
        _finish(bed)


@pytest.fixture
def testbed(containerd: Testbed) -> Iterator[Testbed]:
    yield containerd
    if not containerd.containerd.is_running:  # the test stopped or killed it
        containerd.containerd.start()
    containerd.cri.remove_all()


@pytest.fixture
def cri(testbed: Testbed) -> CriClient:
    return testbed.cri


@pytest.fixture
def testbed_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Testbed]]:
    """``make(version, setup=None, **Containerd options) -> Testbed``: a further daemon,
    stopped after the test. ``setup(containerd)`` runs after the workdir exists and
    before the start: the place to drop a pre-installed plugin into
    ``containerd.nri_plugin_dir`` or a CDI spec into ``containerd.cdi_dir``."""
    started: list[Testbed] = []

    def make(version: str, setup: Callable[[Containerd], None] | None = None, **options: Any) -> Testbed:
        bed = _start(version, tmp_path_factory.mktemp(_IDS[version] + "-x"), setup, **options)
        started.append(bed)
        return bed

    yield make
    for bed in reversed(started):
        _finish(bed)


# -- a simulated GPU node, nri-gpu serving it, its CDI spec ------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    """A 4-GPU simulated node (minors not in bus order), one per test module."""
    return build_node(tmp_path_factory.mktemp("gpu-node"), gpus=4)


@pytest.fixture(scope="module")
def plugin(containerd: Testbed, node: SimNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NriGpuProcess]:
    """``nri-gpu run`` serving ``node`` to the module's containerd; must exit 0."""
    log = tmp_path_factory.mktemp("nri-gpu-log") / "nri-gpu.log"
    proc = NriGpuProcess(containerd.containerd.nri_socket, log, *node.flags()).start()
    yield proc
    assert proc.stop() == 0, proc.log()


def probe_image(containerd: Testbed, build: Callable[[str], Image], what: str) -> Image:
    """An image with a probe compiled here (``build(gcc)``), imported into ``containerd``;
    a missing gcc or package is a skip, or a failure where e2e tests are required."""
    gcc = shutil.which("gcc")
    if gcc is None:
        _cannot_run(f"{what}: needs gcc to build the image's probe")
        raise AssertionError("unreachable")
    try:
        built = build(gcc)
    except debs.DebUnavailable as exc:
        _cannot_run(f"{what}: cannot be fetched: {exc}")
        raise AssertionError("unreachable") from exc
    images.import_image(containerd.containerd, built)
    return built


def write_cdi_spec(bed: Testbed, node: SimNode, name: str) -> Path:
    """``nri-gpu cdi generate`` for ``node`` into containerd's CDI spec directory.

    The caller removes it: containerd is shared by the session, and two specs of
    the same kind naming the same device make every injection of it fail.

    The hook is the one installed beside this checkout's nri-gpu (.venv/bin/nri-gpu-hook,
    what ``cdi generate`` names by default), which is root's alone here but may not be
    where CI clones: the override lets the tests run either way, and must then say
    so loudly (and say nothing when the hook is root's)."""
    path = bed.containerd.cdi_dir / name
    done = subprocess.run(
        [NRI_GPU, "cdi", "generate", *node.flags(), "--output", str(path), "--allow-untrusted-hook"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    # Loud exactly when the hook is not root's alone, silent when it is.
    untrusted = bool(check_hook(NRI_GPU_HOOK))
    assert ("WARNING: --allow-untrusted-hook" in done.stderr) == untrusted, done.stderr
    return path
