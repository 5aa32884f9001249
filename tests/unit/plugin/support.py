"""Shared by the handler tests: nri-gpu's own handlers on a simulated node."""

from __future__ import annotations

from typing import Any

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import InventoryCache, discover
from nri_gpu.plugin.handlers import GpuPlugin
from nri_gpu.plugin.metrics import PluginMetrics
from testbed.gpunode import SimNode


def gpu_plugin(node: SimNode, starter: Any, metrics: PluginMetrics | None = None, view_check: Any = None) -> GpuPlugin:
    """GpuPlugin reading ``node``, with a fixed CUDA version (the real probe is tested
    in test_discover) and ``starter`` in place of the namespace work (tested on runc);
    ``view_check`` (pid -> bool | None) in place of reading the pid's mountinfo."""
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    inventory = InventoryCache(config, take=lambda c: discover(c, cuda_version=lambda p: ("12.4", None)))
    if view_check is None:
        return GpuPlugin(config, inventory, starter=starter, metrics=metrics)
    return GpuPlugin(config, inventory, starter=starter, metrics=metrics, view_check=view_check)
