"""The CDI path gives the same container as the NRI path, on real containerd 1.7.24 and 2.1.9.

``nri-gpu cdi generate`` writes the simulated node's spec into containerd's CDI
spec directory (``enable_cdi`` is on in the test bed's config); a container
asks for ``nvidia.com/gpu=0`` and ``=2`` with the ``cdi.k8s.io/`` annotation,
which containerd's own CDI code injects, running our ``createContainer`` hook
(the compiled ``nri-gpu-hook``) in runc. Beside it, a container asks ``nvidia.com/gpus: 0,2`` through the NRI
plugin (running on the same containerd). Both must show the same device nodes,
the same driver mounts, the same ``/proc/driver/nvidia`` view and the same
``ldconfig -p``; the CDI container's ``NVIDIA_VISIBLE_DEVICES=void`` keeps the
plugin from acting on it a second time. A spec written before the hook was
compiled (its hook ``nri-gpu hook start-container``) fails the container's start
with what to do, rather than start it without its start work.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from nri_gpu.engine.cdi import HOOK_TIMEOUT, HOOK_WORK_VERSION
from nri_gpu.plugin.cli.entry import OLD_SPEC_MESSAGE
from testbed.cri import CriClient, CriError
from testbed.gpunode import SimNode
from testbed.images import GLIBC
from testbed.plugins import NriGpuProcess

from .conftest import NRI_GPU, NRI_GPU_HOOK, Testbed, write_cdi_spec

SLEEP = ["sh", "-c", "sleep 3600"]


@pytest.fixture(scope="module")
def spec(containerd: Testbed, node: SimNode) -> Iterator[dict[str, Any]]:
    path = write_cdi_spec(containerd, node, "nri-gpu.json")
    loaded: dict[str, Any] = json.loads(path.read_text())
    yield loaded
    path.unlink(missing_ok=True)


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


def cdi_container(cri: CriClient, pod_name: str, devices: str) -> str:
    pod = cri.run_pod(pod_name)
    return cri.run_container(pod, "main", SLEEP, image=GLIBC, annotations={"cdi.k8s.io/nri-gpu-test": devices})


def nri_container(cri: CriClient, pod_name: str, gpus: str) -> str:
    pod = cri.run_pod(pod_name, annotations={"nvidia.com/gpus": gpus})
    return cri.run_container(pod, "main", SLEEP, image=GLIBC)


def view(cri: CriClient, cid: str) -> dict[str, Any]:
    """What a GPU container is, as seen from inside it and from its OCI spec."""
    spec = cri.container_status(cid, verbose=True).spec
    mounts = sorted(
        (m["destination"], m["source"], tuple(sorted(m.get("options", []))))
        for m in spec["mounts"]
        if "nvidia" in m["destination"] or "libcuda" in m["destination"]
    )
    env = dict(line.split("=", 1) for line in sh(cri, cid, "env").splitlines() if "=" in line)
    return {
        "devices": sh(cri, cid, "ls -l /dev/nvidia* | awk '{print $1, $5, $6, $NF}'"),
        "mounts": mounts,
        "proc": sh(cri, cid, "cd /proc/driver/nvidia && find . | sort && cat params version"),
        "gpu info": sh(cri, cid, "cat /proc/driver/nvidia/gpus/*/information"),
        "ld.so.cache": sh(cri, cid, "ldconfig -p"),
        "ld.so.conf": sh(cri, cid, "cat /etc/ld.so.conf.d/00-nri-gpu.conf"),
        "links": sh(cri, cid, "cd /usr/lib/x86_64-linux-gnu && ls -l *nvidia* *cuda* | awk '{print $1, $9, $10, $11}'"),
        "capabilities": env.get("NVIDIA_DRIVER_CAPABILITIES"),
    }


def test_spec_names_every_gpu_by_index_uuid_and_all(spec: dict[str, Any], node: SimNode) -> None:
    names = [d["name"] for d in spec["devices"]]
    assert names == [n for g in node.gpus for n in (str(g.index), g.uuid)] + ["all"]
    assert spec["kind"] == "nvidia.com/gpu"
    hook = spec["containerEdits"]["hooks"]
    # The compiled hook installed beside this nri-gpu, named by default.
    assert [h["hookName"] for h in hook] == ["createContainer"] and hook[0]["path"] == NRI_GPU_HOOK
    args = hook[0]["args"]
    assert args[:5] == [NRI_GPU_HOOK, "start-container", "--time-limit", "10", "--work"] and len(args) == 6, args
    # The work description holds the node's GPUs as the spec names them, by index.
    work = json.loads(args[5])
    assert work["version"] == HOOK_WORK_VERSION
    assert work["gpus"] == [[g.minor, g.bus_id] for g in node.gpus]
    assert work["proc_source"] == f"{node.proc_root}/driver/nvidia"
    # Nothing else reaches our hook (a PATH only); runc kills it if it hangs.
    assert [e.split("=")[0] for e in hook[0]["env"]] == ["PATH"]
    assert hook[0]["timeout"] == HOOK_TIMEOUT


def test_cdi_container_equals_nri_container(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, spec: dict[str, Any], node: SimNode
) -> None:
    cdi = cdi_container(cri, "cdi-0-2", "nvidia.com/gpu=0,nvidia.com/gpu=2")
    nri = nri_container(cri, "nri-0-2", "0,2")
    got, want = view(cri, cdi), view(cri, nri)
    assert got == want
    assert len(got["mounts"]) > 10 and "libcuda.so.1 -> libcuda.so.550.163.01" in got["links"], got
    # and it is the right container, not merely the same one twice
    assert sh(cri, cdi, "ls /proc/driver/nvidia/gpus").split() == sorted([node.gpus[0].bus_id, node.gpus[2].bus_id])
    assert f"/dev/nvidia{node.gpus[2].minor}" in got["devices"]
    assert "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1" in got["ld.so.cache"]
    env = sh(cri, cdi, "env")
    assert "NVIDIA_VISIBLE_DEVICES=void" in env
    # The plugin saw the CDI container and left it alone (void), so no annotation of ours.
    assert "nri-gpu.io/gpus" not in cri.container_status(cdi, verbose=True).spec.get("annotations", {})


def test_cdi_by_uuid_and_all(testbed: Testbed, cri: CriClient, spec: dict[str, Any], node: SimNode) -> None:
    one = cdi_container(cri, "cdi-uuid", f"nvidia.com/gpu={node.gpus[3].uuid}")
    assert sh(cri, one, "ls /proc/driver/nvidia/gpus").split() == [node.gpus[3].bus_id]
    every = cdi_container(cri, "cdi-all", "nvidia.com/gpu=all")
    assert sh(cri, every, "ls /proc/driver/nvidia/gpus").split() == sorted(g.bus_id for g in node.gpus)


def test_cdi_device_unknown_to_the_spec_fails_creation(testbed: Testbed, cri: CriClient, spec: dict[str, Any]) -> None:
    with pytest.raises(CriError) as err:
        cdi_container(cri, "cdi-unknown", "nvidia.com/gpu=9")
    assert "nvidia.com/gpu=9" in str(err.value)


def test_spec_of_the_python_hook_fails_the_start_loudly(testbed: Testbed, cri: CriClient, node: SimNode) -> None:
    """A spec written by an nri-gpu whose hook was Python (``nri-gpu hook
    start-container`` and its flags) still reaches ``nri-gpu hook``: the container
    is not started without its start work, and the error says to write the spec again."""
    path = write_cdi_spec(testbed, node, "nri-gpu-old.json")
    try:
        old = json.loads(path.read_text())
        old["kind"] = "nri-gpu-old.example/gpu"  # beside the module's spec, not naming its devices
        (hook,) = old["containerEdits"]["hooks"]
        flags = ["--driver-root", str(node.driver_root), "--ld-cache", "merge", "--capabilities", "compute,utility"]
        hook.update(path=NRI_GPU, args=[NRI_GPU, "hook", "start-container", *flags])
        hook["env"] += ["PYTHONSAFEPATH=1", "PYTHONNOUSERSITE=1"]
        path.write_text(json.dumps(old))
        with pytest.raises(CriError) as err:
            cdi_container(cri, "cdi-old-spec", "nri-gpu-old.example/gpu=0")
    finally:
        path.unlink(missing_ok=True)
    assert OLD_SPEC_MESSAGE.strip() in str(err.value), err.value
