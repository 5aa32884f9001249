"""A driver upgrade under a running ``nri-gpu run`` that keeps the CDI spec (``[cdi] spec``).

The simulated node starts with driver 550.163.01; while the plugin serves
containerd, its user-space becomes Debian experimental's 555.58.02 (``libcuda1``,
``libnvidia-ml1``, ``libnvidia-ptxjitcompiler1``, the real files), every 550 file
goes, the driver root's ld.so.cache is rebuilt and ``/proc/driver/nvidia/version``
names the new module, as a package upgrade and a module reload leave a node. No
container is created meanwhile: the plugin's own check must notice. Then:

* the spec is rewritten and names only the new files;
* a container from the NRI path and one from the CDI path (containerd's own CDI
  support reading that spec, our hook at its start) get the 555 files;
* a container made before the upgrade keeps working: its bind mounts hold the old
  files, its ``/proc/driver/nvidia`` view and ld.so.cache are its own.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import debs
from testbed.cri import CriClient
from testbed.gpunode import SimNode, build_node, run_ldconfig
from testbed.images import GLIBC
from testbed.plugins import NriGpuProcess

from .conftest import NRI_GPU_HOOK, Testbed, _cannot_run

OLD, NEW = "550.163.01", "555.58.02"
NEW_PACKAGES = ("libcuda1", "libnvidia-ml1", "libnvidia-ptxjitcompiler1")
LIBDIR = "usr/lib/x86_64-linux-gnu"
SLEEP = ["sh", "-c", "sleep 3600"]


def new_driver_files() -> dict[str, Path]:
    """File name -> the real 555.58.02 file, from Debian experimental (cached by the test bed)."""
    files = {}
    for package in NEW_PACKAGES:
        try:
            tree = debs.extract(package, "experimental", f"{NEW}-*", components=("non-free",))
        except debs.DebError as exc:
            _cannot_run(f"{package} {NEW} unavailable: {exc}")
        for path in tree.rglob(f"*.so.{NEW}"):
            files[path.name] = path
    assert len(files) == len(NEW_PACKAGES), files
    return files


def upgrade(node: SimNode, files: dict[str, Path]) -> None:
    """Swap the node's driver user-space from OLD to NEW, then the module's version line."""
    root = node.driver_root
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            gone = OLD in name or (path.is_symlink() and OLD in os.readlink(path))
            if gone:
                path.unlink()  # the node's own link to the test bed's cached copy: that stays
    for name, source in files.items():
        shutil.copy(source, root / LIBDIR / name)
        soname = name.replace(f".so.{NEW}", ".so.1")
        (root / LIBDIR / soname).unlink(missing_ok=True)
        os.symlink(name, root / LIBDIR / soname)
    run_ldconfig(root)
    version = node.proc_root / "driver/nvidia/version"
    text = version.read_text().replace(OLD, NEW)
    temp = version.with_name(".version.tmp")
    temp.write_text(text)
    temp.replace(version)


@pytest.fixture
def upgradable(tmp_path: Path) -> SimNode:
    return build_node(tmp_path / "node", gpus=2)


@pytest.fixture
def keeping(testbed: Testbed, upgradable: SimNode, tmp_path: Path) -> Iterator[tuple[NriGpuProcess, Path]]:
    spec = testbed.containerd.cdi_dir / "nri-gpu-kept.json"
    config = tmp_path / "config.toml"
    # The hook is the one beside this checkout's nri-gpu, which may not be root's alone where CI clones.
    config.write_text(f'[cdi]\nspec = "{spec}"\nhook_path = "{NRI_GPU_HOOK}"\nallow_untrusted_hook = true\n')
    log = tmp_path / "nri-gpu.log"
    proc = NriGpuProcess(testbed.containerd.nri_socket, log, "--config", str(config), *upgradable.flags()).start()
    try:
        yield proc, spec
    finally:
        code = proc.stop()
        spec.unlink(missing_ok=True)  # containerd is shared: no spec of this node may outlive the test
        assert code == 0, proc.log()


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


def nri_container(cri: CriClient, name: str) -> str:
    pod = cri.run_pod(name, annotations={"nvidia.com/gpus": "0"})
    return cri.run_container(pod, "main", SLEEP, image=GLIBC)


def cdi_container(cri: CriClient, name: str) -> str:
    pod = cri.run_pod(name)
    return cri.run_container(
        pod, "main", SLEEP, image=GLIBC, annotations={"cdi.k8s.io/nri-gpu-kept": "nvidia.com/gpu=0"}
    )


def driver_of(cri: CriClient, cid: str) -> dict[str, object]:
    """What a GPU container's driver is, from inside it: the module's version line,
    where libcuda.so.1 leads, and that the library behind it is there to be read."""
    return {
        "version": sh(cri, cid, "head -1 /proc/driver/nvidia/version").split("  ")[1].split()[0],
        "libcuda": sh(cri, cid, f"readlink /{LIBDIR}/libcuda.so.1").strip(),
        "readable": int(sh(cri, cid, f"wc -c < /{LIBDIR}/libcuda.so.1")) > 0,
        "ld.so.cache": "libcuda.so.1 (libc6,x86-64)" in sh(cri, cid, "ldconfig -p"),
    }


def test_driver_upgrade_moves_the_spec_the_nri_path_and_the_start_work(
    cri: CriClient, keeping: tuple[NriGpuProcess, Path], upgradable: SimNode
) -> None:
    files = new_driver_files()
    plugin, spec_path = keeping
    plugin.wait_for_log(f"CDI spec {spec_path} written: driver {OLD}")
    before = spec_path.read_text()
    assert f"libcuda.so.{OLD}" in before and NEW not in before
    old_nri, old_cdi = nri_container(cri, "before-nri"), cdi_container(cri, "before-cdi")
    old_driver = {"version": OLD, "libcuda": f"libcuda.so.{OLD}", "readable": True, "ld.so.cache": True}
    assert driver_of(cri, old_nri) == old_driver
    assert driver_of(cri, old_cdi) == old_driver

    upgrade(upgradable, files)
    # No container is made meanwhile: the plugin's own check (every 10 s) notices.
    plugin.wait_for_log(f"CDI spec {spec_path} written: driver {NEW}", timeout=30)
    after = spec_path.read_text()
    assert OLD not in after, "the spec still names a file of the old driver"
    mounted = {m["hostPath"] for m in json.loads(after)["containerEdits"]["mounts"]}
    for name in files:
        assert str(upgradable.driver_root / LIBDIR / name) in mounted, name

    new_driver = {"version": NEW, "libcuda": f"libcuda.so.{NEW}", "readable": True, "ld.so.cache": True}
    assert driver_of(cri, nri_container(cri, "after-nri")) == new_driver
    assert driver_of(cri, cdi_container(cri, "after-cdi")) == new_driver
    # Made before the upgrade, still whole: the old files live on in its mounts.
    assert driver_of(cri, old_nri) == old_driver
    assert driver_of(cri, old_cdi) == old_driver
    assert "Traceback" not in plugin.log()
