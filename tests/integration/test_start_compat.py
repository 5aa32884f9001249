"""CUDA forward compatibility on real containers (runc-created, acted on, started).

The image is the glibc test image with NVIDIA's real ``libcuda.so.555.58.02``
(Debian experimental's) laid out as the cuda-compat package does under
``/usr/local/cuda -> cuda-12.5``; the node is the simulated 550.163.01 one. The
merged cache must be exactly what the trusted ldconfig's rebuild makes with the
compat conf file in place, and glibc's loader in the container must map the
compat ``libcuda.so.1``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_gpu.engine.ldcache import parse_ld_so_cache
from nri_gpu.engine.model import Plan
from nri_gpu.engine.start import StartWork
from testbed import debs
from testbed.bundle import RuncHost
from testbed.cudacompat import COMPAT_VERSION, build_probe, install_compat
from testbed.gpunode import run_ldconfig
from tests.integration.test_start import LIB, _cannot_run, gcc, node, plan, runc, start, work  # noqa: F401

COMPAT = "/usr/local/cuda/compat"


@pytest.fixture(scope="module")
def probe(gcc: str, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A program linked against libcuda.so.1 that prints which file it got."""
    return build_probe(gcc, tmp_path_factory.mktemp("probe"))


@pytest.fixture(scope="module")
def compat_work(work: StartWork) -> StartWork:  # noqa: F811
    return dataclasses.replace(work, cuda_compat=True, driver_version="550.163.01")


def _image(probe: Path) -> Callable[[Path], None]:
    def prepare(rootfs: Path) -> None:
        try:
            install_compat(rootfs)
        except debs.DebUnavailable as exc:
            _cannot_run(f"libcuda1 {COMPAT_VERSION} cannot be fetched: {exc}")
        (rootfs / "probe").write_bytes(probe.read_bytes())
        (rootfs / "probe").chmod(0o755)
        conf = rootfs / "etc/ld.so.conf.d"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "x86_64-linux-gnu.conf").write_text("/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
        run_ldconfig(rootfs)  # the image's own cache: the compat folder is in no conf file, as in nvidia/cuda

    return prepare


def test_merge_equals_a_rebuild_and_the_loader_takes_the_compat_libcuda(
    runc: RuncHost,  # noqa: F811
    plan: Plan,  # noqa: F811
    compat_work: StartWork,
    probe: Path,
) -> None:
    caches = {}
    for mode in ("merge", "rebuild"):
        how = dataclasses.replace(compat_work, ld_cache=mode)
        binds = [(m.source, m.destination) for m in plan.mounts]
        c = runc.create("gpu", ["/probe"], binds=binds, glibc=True, prepare=_image(probe))
        report = start(c.pid, how)
        assert report.ld_cache_written
        assert report.cuda_compat.startswith(f"libcuda.so.{COMPAT_VERSION} in {COMPAT} is used over the driver")
        assert "CUDA compat" in report.timings_ms
        caches[mode] = parse_ld_so_cache((c.rootfs / "etc/ld.so.cache").read_bytes())
        conf = (c.rootfs / "etc/ld.so.conf.d/00-compat-nri-gpu.conf").read_text()
        assert conf.splitlines()[1:] == [COMPAT]
        assert (c.rootfs / "etc/ld.so.conf.d/00-compat-nri-gpu.conf").stat().st_mode & 0o777 == 0o644
        out = c.run()
        assert out.splitlines()[0] == f"/usr/local/cuda-12.5/compat/libcuda.so.{COMPAT_VERSION}", (mode, out)
    assert caches["merge"] == caches["rebuild"]
    order = [e.path for e in caches["merge"] if e.name == "libcuda.so.1" and e.is_64bit]
    assert order == [f"{COMPAT}/libcuda.so.1", f"{LIB}/libcuda.so.1"]


def test_with_the_switch_off_the_driver_wins(
    runc: RuncHost,  # noqa: F811
    plan: Plan,  # noqa: F811
    work: StartWork,  # noqa: F811
    probe: Path,
) -> None:
    binds = [(m.source, m.destination) for m in plan.mounts]
    c = runc.create("gpu", ["/probe"], binds=binds, glibc=True, prepare=_image(probe))
    report = start(c.pid, dataclasses.replace(work, driver_version="550.163.01"))
    assert report.cuda_compat == "" and "CUDA compat" not in report.timings_ms
    assert not (c.rootfs / "etc/ld.so.conf.d/00-compat-nri-gpu.conf").exists()
    assert c.run().splitlines()[0] == f"{LIB}/libcuda.so.550.163.01"
