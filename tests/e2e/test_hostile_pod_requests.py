"""Hostile GPU requests from a pod's env, on real containerd 1.7.24 and 2.1.9, through
``nri-gpu run`` serving a simulated 4-GPU node with the policy deploy/configmap.yaml
ships (env requests off for unprivileged containers, the device plugin's volume-mount
markers on), narrowed to ``namespaces = ["ml"]``:

* a pod in another namespace whose env says ``NVIDIA_VISIBLE_DEVICES=all`` (as every
  nvidia/cuda image does) runs without GPUs, and the plugin's log says why; so does
  one in "ml" (env requests are off); GPUs come from the device plugin's markers,
  which reach the plugin through CRI and NRI as the kubelet sends them;
* a 3.6 MB ``NVIDIA_REQUIRE_CUDA`` of 400k alternatives (before the bounds: seconds on
  the plugin's event loop, past containerd's 2 s deadline, and a 4 MB error) is refused
  at once with a short message, and a GPU pod created right after gets its GPUs from
  the same registration (the runtime did not drop the plugin);
* an env name with a newline forges no line in the plugin's log nor in the CRI error.
"""

from __future__ import annotations

import json
import re
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.cri import CriClient, CriError
from testbed.gpunode import SimNode
from testbed.images import GLIBC
from testbed.plugins import NriGpuProcess, free_tcp_port

from .conftest import Testbed

SLEEP = ["sh", "-c", "sleep 3600"]
FORGED = "2026-01-01 00:00:00,000 INFO plugin.handlers: forged"
MARKERS = "/var/run/nvidia-container-devices"
CONFIGMAP = Path(__file__).parents[2] / "deploy" / "configmap.yaml"


def shipped_policy(**changes: object) -> str:
    """The [policy] table deploy/configmap.yaml ships, with ``changes``, as TOML."""
    config = tomllib.loads(yaml.safe_load(CONFIGMAP.read_text())["data"]["config.toml"])
    policy = {**config["policy"], **changes}
    assert policy["accept_env_unprivileged"] is False and policy["accept_volume_mounts"] is True
    return "[policy]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in policy.items())


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_tcp_port()


@pytest.fixture(scope="module")
def plugin(
    containerd: Testbed, node: SimNode, metrics_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NriGpuProcess]:
    """``nri-gpu run`` with the shipped policy, admitting GPUs in the namespace "ml" only."""
    workdir = tmp_path_factory.mktemp("nri-gpu-hostile-requests")
    config = workdir / "config.toml"
    config.write_text(shipped_policy(namespaces=["ml"]))
    proc = NriGpuProcess(
        containerd.containerd.nri_socket,
        workdir / "nri-gpu.log",
        "--config",
        str(config),
        *node.flags(),
        "--metrics-address",
        f"127.0.0.1:{metrics_port}",
    ).start()
    yield proc
    assert proc.stop() == 0, proc.log()


def gpu_nodes(cri: CriClient, cid: str) -> list[str]:
    code, out, err = cri.exec_sync(cid, ["ls", "/dev"])
    assert code == 0, err
    return sorted(name for name in out.split() if name.startswith("nvidia"))


def registrations(plugin: NriGpuProcess) -> int:
    return plugin.log().count("registered with")


def plan_seconds(port: int) -> tuple[float, int]:
    """(sum, count) of the plugin's own CreateContainer time, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found = dict(re.findall(r'^nri_gpu_step_duration_seconds_(sum|count)\{step="plan"\} (\S+)$', text, re.M))
    return float(found.get("sum", 0)), int(float(found.get("count", 0)))


def test_env_all_in_a_namespace_without_gpus_gets_nothing_and_the_log_says_why(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess
) -> None:
    pod = cri.run_pod("cuda-image", namespace="web")
    cid = cri.run_container(pod, "main", SLEEP, image=GLIBC, env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert gpu_nodes(cri, cid) == []
    assert "NVIDIA_VISIBLE_DEVICES" in cri.exec_sync(cid, ["env"])[1]  # untouched, as the image set it
    plugin.wait_for_log(
        'pod "web/cuda-image": env NVIDIA_VISIBLE_DEVICES ignored by policy: namespace "web" '
        "may not have GPUs (policy.namespaces: ml)"
    )
    # In the admitted namespace the env is not enough either: it may be the image's.
    env_only = cri.run_container(
        cri.run_pod("cuda-image", namespace="ml"), "main", SLEEP, image=GLIBC, env={"NVIDIA_VISIBLE_DEVICES": "all"}
    )
    assert gpu_nodes(cri, env_only) == []
    plugin.wait_for_log(
        'pod "ml/cuda-image": env NVIDIA_VISIBLE_DEVICES ignored by policy: the container is not '
        "privileged and policy.accept_env_unprivileged is off"
    )


def device_plugin_allocation(cri: CriClient, *gpu_ids: str) -> dict[str, Any]:
    """What the kubelet adds for NVIDIA's device plugin with DEVICE_LIST_STRATEGY=volume-mounts."""
    mounts = [cri.pb.Mount(container_path=f"{MARKERS}/{gpu}", host_path="/dev/null") for gpu in gpu_ids]
    return {"mounts": mounts, "env": {"NVIDIA_VISIBLE_DEVICES": MARKERS}}


def test_the_device_plugins_volume_mount_markers_reach_the_plugin_through_cri_and_nri(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    g2 = node.gpus[2]
    cid = cri.run_container(
        cri.run_pod("allocated", namespace="ml"), "main", SLEEP, image=GLIBC, **device_plugin_allocation(cri, g2.uuid)
    )
    assert [d for d in gpu_nodes(cri, cid) if d[6:].isdigit()] == [f"nvidia{g2.minor}"]
    # From a namespace without GPUs the same allocation is refused, with the reason.
    pod = cri.run_pod("allocated", namespace="web")
    with pytest.raises(CriError) as exc:
        cri.create_container(pod, None, "main", GLIBC, SLEEP, **device_plugin_allocation(cri, g2.uuid))
    assert 'volume mounts on pod "web/allocated": namespace "web" may not have GPUs' in exc.value.details


def test_an_annotation_from_a_namespace_without_gpus_is_refused(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess
) -> None:
    pod = cri.run_pod("annotated", namespace="web", annotations={"nvidia.com/gpus": "0"})
    with pytest.raises(CriError) as exc:
        cri.create_container(pod, None, "main", GLIBC, SLEEP)
    assert 'namespace "web" may not have GPUs (policy.namespaces: ml)' in exc.value.details


def test_a_requirement_bomb_is_refused_at_once_and_the_plugin_stays(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode, metrics_port: int
) -> None:
    before, (spent, plans) = registrations(plugin), plan_seconds(metrics_port)
    bomb = " ".join(["cuda>=99"] * 400_000)  # 3.6 MB: containerd sends NRI at most 4 MiB
    pod = cri.run_pod("bomb", namespace="ml", annotations={"nvidia.com/gpus": "all"})
    began = time.perf_counter()
    with pytest.raises(CriError) as exc:
        cri.create_container(pod, None, "main", GLIBC, SLEEP, env={"NVIDIA_REQUIRE_CUDA": bomb})
    refused_in = time.perf_counter() - began
    message = exc.value.details
    assert "NVIDIA_REQUIRE_CUDA" in message and "longer than 16384" in message, message[:500]
    assert len(message) < 4096 + 512, len(message)  # the plugin's text plus containerd's prefix
    # The plugin's own time, and the whole CRI call (3.6 MB through containerd and NRI).
    after, count = plan_seconds(metrics_port)
    assert count == plans + 1 and after - spent < 0.05, (after - spent, count - plans)
    assert refused_in < 1.0, f"{refused_in:.3f} s"
    print(
        f"\n{testbed.version}: requirement bomb refused in {(after - spent) * 1000:.2f} ms by the plugin, "
        f"{refused_in * 1000:.0f} ms for the CRI call"
    )

    # Right after: a GPU pod gets its GPUs from the same registration.
    gpu_pod = cri.run_pod("after-bomb", namespace="ml", annotations={"nvidia.com/gpus": "1"})
    cid = cri.run_container(gpu_pod, "main", SLEEP, image=GLIBC)
    assert f"nvidia{node.gpus[1].minor}" in gpu_nodes(cri, cid)
    assert registrations(plugin) == before, plugin.log()[-3000:]


def test_an_env_name_with_a_newline_forges_no_log_line_nor_error_line(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess
) -> None:
    name = f"NVIDIA_REQUIRE_X\n{FORGED}"
    pod = cri.run_pod("forger", namespace="ml", annotations={"nvidia.com/gpus": "0"})
    with pytest.raises(CriError) as exc:
        cri.create_container(pod, None, "main", GLIBC, SLEEP, env={name: "cuda>=99"})
    message = exc.value.details
    assert "\n" not in message and "NVIDIA_REQUIRE_X\\n2026-01-01" in message, message
    plugin.wait_for_log('pod "ml/forger": refused: ')
    lines = Path(plugin.log_path).read_text().splitlines()
    assert not [line for line in lines if line.startswith(FORGED)], "a forged line in the plugin's log"
    (refusal,) = [line for line in lines if 'pod "ml/forger": refused: ' in line]
    assert "NVIDIA_REQUIRE_X\\n2026-01-01" in refusal, refusal  # escaped: a backslash and an n
