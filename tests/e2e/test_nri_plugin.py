"""The plugin stub and ``nri-gpu run`` against real containerd 1.7.24 and 2.1.9.

Each test runs on both versions (the ``testbed`` fixture is parametrized).
"""

from __future__ import annotations

import json
import re
import stat
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.errors import PluginError
from testbed.cri import CriClient, CriError
from testbed.gpunode import SimNode, build_node
from testbed.plugins import ROOT, NriGpuProcess, PluginThread, wait_until

from .conftest import Testbed

LONG_RUNNING = ["sh", "-c", "sleep 3600"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("node"), gpus=4)


class EnvPlugin:
    """Adds TEST_PLUGIN=<pod annotation e2e/value> to containers of pods that carry it;
    refuses containers named "refuse-me"; records what CreateContainer saw."""

    def __init__(self, extra_env: int = 0) -> None:
        self.extra_env = extra_env
        self.created: list[tuple[str, dict[str, str], str]] = []
        self.lock = threading.Lock()

    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        with self.lock:
            self.created.append((pod.name, dict(pod.annotations), container.name))
        if container.name == "refuse-me":
            raise PluginError("refusing container refuse-me on purpose")
        value = pod.annotations.get("e2e/value")
        if value is None:
            return None
        env = [api.KeyValue(key="TEST_PLUGIN", value=value)]
        # Padding to push the reply past the 4096-byte first mux frame.
        env += [api.KeyValue(key=f"TEST_PAD_{i:03d}", value="x" * 40) for i in range(self.extra_env)]
        return api.ContainerAdjustment(env=env)


def env_of(cri: CriClient, cid: str) -> dict[str, str]:
    code, out, err = cri.exec_sync(cid, ["env"])
    assert code == 0, err
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_plugin_registers_and_sees_pod_annotations_and_adjusts_env(testbed: Testbed, cri: CriClient) -> None:
    plugin = EnvPlugin()
    with PluginThread(plugin, testbed.containerd.nri_socket) as runner:
        assert runner.stub is not None and runner.stub.runtime is not None
        assert runner.stub.runtime.name == "containerd"
        assert runner.stub.runtime.version.lstrip("v").startswith(testbed.version)
        wait_until(lambda: "e2e-test" in testbed.containerd.log_text(), what="containerd to log the plugin")

        pod = cri.run_pod("annotated", annotations={"e2e/value": "hello-from-nri"})
        cid = cri.run_container(pod, "main", LONG_RUNNING)

        assert ("annotated", "main") in [(p, c) for p, _, c in plugin.created]
        seen = next(a for p, a, c in plugin.created if p == "annotated")
        assert seen["e2e/value"] == "hello-from-nri"
        assert env_of(cri, cid)["TEST_PLUGIN"] == "hello-from-nri"


def test_adjustment_larger_than_one_mux_frame_is_applied(testbed: Testbed, cri: CriClient) -> None:
    # 150 env vars of ~55 bytes: a reply of ~9 KiB, which must travel as two mux
    # frames or containerd drops the plugin and starts the container unadjusted.
    plugin = EnvPlugin(extra_env=150)
    with PluginThread(plugin, testbed.containerd.nri_socket) as runner:
        pod = cri.run_pod("big", annotations={"e2e/value": "big"})
        cid = cri.run_container(pod, "main", LONG_RUNNING)
        env = env_of(cri, cid)
        assert env["TEST_PLUGIN"] == "big"
        assert sum(1 for k in env if k.startswith("TEST_PAD_")) == 150
        assert runner.registrations == 1  # still the same connection


def test_handler_error_fails_cri_create_with_our_message(testbed: Testbed, cri: CriClient) -> None:
    with PluginThread(EnvPlugin(), testbed.containerd.nri_socket) as runner:
        pod = cri.run_pod("refused")
        with pytest.raises(CriError) as err:
            cri.run_container(pod, "refuse-me", LONG_RUNNING)
        message = str(err.value)
        assert "refusing container refuse-me on purpose" in message
        assert 'container "refuse-me"' in message and 'pod "default/refused"' in message
        # The plugin is still connected and serving.
        ok = cri.run_container(pod, "fine", LONG_RUNNING)
        assert cri.container_status(ok).state == "CONTAINER_RUNNING"
        assert runner.registrations == 1


def test_plugin_reregisters_after_containerd_restart(testbed: Testbed, cri: CriClient) -> None:
    plugin = EnvPlugin()
    with PluginThread(plugin, testbed.containerd.nri_socket) as runner:
        testbed.containerd.restart()
        runner.wait_registered(2, timeout=10)
        pod = cri.run_pod("after-restart", annotations={"e2e/value": "again"})
        cid = cri.run_container(pod, "main", LONG_RUNNING)
        assert env_of(cri, cid)["TEST_PLUGIN"] == "again"


def _normalized_spec(cri: CriClient, pod: str, cid: str) -> dict[str, Any]:
    """The container's OCI spec with this run's ids replaced, so two runs compare equal."""
    text = json.dumps(cri.container_status(cid, verbose=True).spec, sort_keys=True)
    uid = cri.pod_status(pod)[0].metadata.uid
    for value, placeholder in [(pod, "<pod>"), (cid, "<ctr>"), (uid, "<uid>"), (uid.replace("-", ""), "<uid>")]:
        text = text.replace(value, placeholder)
    # The sandbox's namespaces are named by its pid.
    return dict(json.loads(re.sub(r"/proc/[0-9]+/", "/proc/<pid>/", text)))


def test_nri_gpu_run_serves_gpu_requests_and_leaves_other_pods_alone(
    testbed: Testbed, cri: CriClient, tmp_path: Path, node: SimNode
) -> None:
    # Reference: the spec of a plain container without any plugin.
    pod = cri.run_pod("plain")
    cid = cri.run_container(pod, "main", LONG_RUNNING)
    without = _normalized_spec(cri, pod, cid)
    cri.remove_all()

    proc = NriGpuProcess(testbed.containerd.nri_socket, tmp_path / "nri-gpu.log", *node.flags()).start()
    try:
        assert "registered with containerd" in proc.log()

        pod = cri.run_pod("plain")
        cid = cri.run_container(pod, "main", LONG_RUNNING)
        assert _normalized_spec(cri, pod, cid) == without, "a pod that asks for nothing was changed"
        assert "NVIDIA_VISIBLE_DEVICES" not in env_of(cri, cid)

        gpu_pod = cri.run_pod("gpu", annotations={"nvidia.com/gpus": "0,1", "nvidia.com/gpus.container.second": "2"})
        first = cri.run_container(gpu_pod, "first", LONG_RUNNING)
        second = cri.run_container(gpu_pod, "second", LONG_RUNNING)
        uuids = [g.uuid for g in node.gpus]
        assert env_of(cri, first)["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[0]},{uuids[1]}"
        assert env_of(cri, second)["NVIDIA_VISIBLE_DEVICES"] == uuids[2]  # container-scoped wins
    finally:
        code = proc.stop()
    assert code == 0, proc.log()
    assert "nri-gpu stopped" in proc.log()


def test_nri_gpu_run_reconnects_after_containerd_restart(
    testbed: Testbed, cri: CriClient, tmp_path: Path, node: SimNode
) -> None:
    proc = NriGpuProcess(testbed.containerd.nri_socket, tmp_path / "nri-gpu.log", *node.flags()).start()
    try:
        testbed.containerd.restart()
        proc.wait_for_log("registered with", count=2)
        pod = cri.run_pod("gpu", annotations={"nvidia.com/gpus": "all"})
        cid = cri.run_container(pod, "main", LONG_RUNNING)
        assert env_of(cri, cid)["NVIDIA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in node.gpus)
    finally:
        assert proc.stop() == 0, proc.log()


def test_runtime_launched_plugin_from_the_plugin_directory(
    testbed_factory: Any, testbed: Testbed, node: SimNode
) -> None:
    """containerd starts ``NN-name`` executables itself with a pre-connected socket."""
    log = testbed.workdir / "launched-nri-gpu.log"

    def install(ctrd: Any) -> None:
        # What an operator installs: a tiny wrapper named NN-name. The runtime gives
        # it an empty environment and no stdout, so the wrapper names the interpreter
        # and sends the log to a file.
        wrapper = Path(ctrd.nri_plugin_dir) / "10-nri-gpu"
        flags = " ".join(node.flags())
        wrapper.write_text(
            f"#!/bin/sh\ncd {ROOT}\nexec {sys.executable} -m nri_gpu.plugin.cli run {flags} >>{log} 2>&1\n"
        )
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    bed = testbed_factory(testbed.version, setup=install)
    wait_until(lambda: log.exists() and "registered with" in log.read_text(), what="the launched plugin to register")
    assert "starting on fd 3" in log.read_text()
    pod = bed.cri.run_pod("launched", annotations={"nvidia.com/gpus": "0"})
    cid = bed.cri.run_container(pod, "main", LONG_RUNNING)
    assert env_of(bed.cri, cid)["NVIDIA_VISIBLE_DEVICES"] == node.gpus[0].uuid
