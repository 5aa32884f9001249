"""What MIG costs: CreateContainer for a MIG request, in this process, and the NVML probe.

The node is an 8-GPU simulated one with four GPUs carved into seven 1g instances
each (28 MIG devices, the most an A100/H100 node of that size holds), the
simulated NVML beside the real 550 user-space. Measured, each ``iterations`` times:

* ``GpuPlugin.create_container`` (request, plan, adjustment, JSON log line to
  /dev/null) for one MIG device by each form, for ``all`` with the monitor grant,
  and for one whole GPU on the same node as the reference;
* the NVML probe (``engine.nvml.read_nvml``: a child interpreter loading the
  library), and the whole discovery with and without it.

The probe runs against the simulated library: it measures our side (the child,
ctypes, the parse); a real driver adds NVML's own start (``nvmlInit`` opens the
GPUs, slow without persistence mode), which only a real MIG node can show.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import InventoryCache, discover
from nri_gpu.engine.nvml import read_nvml
from nri_gpu.engine.selection import mig_devices
from nri_gpu.plugin.handlers import GpuPlugin
from testbed.gpunode import MigSpec, build_node

from .inprocess import _drive, _json_log_to_devnull, _messages, _no_start
from .stats import summarize

__all__ = ["MIG_LAYOUT", "measure_mig"]

# 1g GPU instances of an A100-40GB/H100 are swizzIds 7..14; seven fit.
MIG_LAYOUT: MigSpec = {i: [(gi, [0]) for gi in range(7, 14)] for i in range(4)}


def measure_mig(workdir: Path, iterations: int, probe_runs: int = 20) -> dict[str, Any]:
    node = build_node(workdir / "mig-node", gpus=8, mig=MIG_LAYOUT)
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    inventory = discover(config)
    devices = mig_devices(inventory)
    if inventory.mig.nvml is None or not devices:
        raise RuntimeError(f"the MIG benchmark node has no NVML view: {inventory.mig.nvml_error}")
    one = devices[len(devices) // 2]
    requests = {
        "whole GPU (reference)": {"NVIDIA_VISIBLE_DEVICES": "7"},
        "MIG-<uuid>": {"NVIDIA_VISIBLE_DEVICES": str(one.uuid)},
        "i:j": {"NVIDIA_VISIBLE_DEVICES": str(one.index)},
        "MIG-GPU-<uuid>/<gi>/<ci>": {
            "NVIDIA_VISIBLE_DEVICES": f"MIG-{one.parent.uuid}/{one.gpu_instance.gi}/{one.compute_instance.ci}"
        },
        "all + monitor (28 MIG devices)": {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_MIG_MONITOR_DEVICES": "all"},
    }
    plugin = GpuPlugin(config, InventoryCache(config), starter=_no_start)
    undo = _json_log_to_devnull()
    handler: dict[str, Any] = {}
    try:
        for name, env in requests.items():
            pod, ctr = _messages({})
            pod.namespace = "kube-system"
            ctr.env.extend(f"{k}={v}" for k, v in env.items())
            times = []
            for _ in range(iterations):
                began = time.perf_counter()
                adjustment = _drive(plugin.create_container(pod, ctr))
                times.append((time.perf_counter() - began) * 1000)
            assert adjustment is not None, name
            handler[name] = summarize(times).as_dict(4)
    finally:
        undo()
    libnvml = next(lib for lib in inventory.libraries if lib.soname == "libnvidia-ml.so.1" and lib.is_64bit)
    host_lib = str(node.driver_root) + libnvml.path
    probe, with_probe, without = [], [], []
    for _ in range(probe_runs):
        began = time.perf_counter()
        snapshot, error = read_nvml(host_lib)
        probe.append((time.perf_counter() - began) * 1000)
        assert snapshot is not None, error
        began = time.perf_counter()
        discover(config)
        with_probe.append((time.perf_counter() - began) * 1000)
        quiet = logging.getLogger("nri_gpu.engine.discover")
        quiet.disabled = True  # its warning that NVML was not asked, 20 times over
        try:
            began = time.perf_counter()
            discover(config, nvml=lambda path: (None, "not asked"))
            without.append((time.perf_counter() - began) * 1000)
        finally:
            quiet.disabled = False
    return {
        "mig_devices": len(devices),
        "create_container_ms": handler,
        "nvml_probe_ms": summarize(probe).as_dict(3),
        "discovery_ms": {"with NVML probe": summarize(with_probe).as_dict(3), "without": summarize(without).as_dict(3)},
    }
