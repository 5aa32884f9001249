"""``equipped_containers = "complete"`` on real containerd 1.7.24 and 2.1.9: a container
another producer's CDI spec equipped (no hook of ours in it) gets from nri-gpu only
what CDI cannot give: the ``/proc/driver/nvidia`` view of its GPU, and the
ld.so.cache entry and links of the driver library it mounts; no device, mount or env."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.cri import CriClient
from testbed.gpunode import SimNode
from testbed.plugins import NriGpuProcess

from .conftest import Testbed
from .equipped_support import run, sh, write_other_spec


@pytest.fixture(scope="module")
def plugin(containerd: Testbed, node: SimNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NriGpuProcess]:
    workdir = tmp_path_factory.mktemp("nri-gpu-complete")
    config = workdir / "config.toml"
    config.write_text('[policy]\nequipped_containers = "complete"\n')
    proc = NriGpuProcess(
        containerd.containerd.nri_socket, workdir / "nri-gpu.log", "--config", str(config), *node.flags()
    )
    proc.start()
    yield proc
    assert proc.stop() == 0, proc.log()


def test_complete_gives_a_cdi_equipped_container_the_view_and_the_cache_entry_only(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    path = write_other_spec(testbed.containerd.cdi_dir, node)
    try:
        cid = run(cri, "complete", cdi="2")  # asks nri-gpu for nothing
        spec = cri.container_status(cid, verbose=True).spec
        assert spec["annotations"]["nri-gpu.io/gpus"] == node.gpus[2].uuid
        assert [d["path"] for d in spec["linux"]["devices"] if d["path"].startswith("/dev/nvidia")] == [
            f"/dev/nvidia{node.gpus[2].minor}"
        ]
        assert len([m for m in spec["mounts"] if "libnvidia" in m["destination"] or "libcuda" in m["destination"]]) == 1
        assert sh(cri, cid, "ls /proc/driver/nvidia/gpus").split() == [node.gpus[2].bus_id]
        cache = sh(cri, cid, "ldconfig -p")
        assert "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1" in cache, cache
        assert "libnvidia-ml" not in cache  # not mounted by the spec: not ours to list
        # The entry's path leads to the mounted file.
        assert (
            sh(cri, cid, "readlink -f /usr/lib/x86_64-linux-gnu/libcuda.so.1").strip().endswith("libcuda.so.550.163.01")
        )
    finally:
        path.unlink(missing_ok=True)
