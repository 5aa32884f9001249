"""Shared by the handler tests: nri-gpu's own handlers on a simulated node."""

from __future__ import annotations

from typing import Any

from engine.config import EngineConfig
from engine.discover import InventoryCache, discover
from plugin.handlers import GpuPlugin
from plugin.metrics import PluginMetrics
from tests.testbed.gpunode import SimNode


def gpu_plugin(node: SimNode, starter: Any, metrics: PluginMetrics | None = None) -> GpuPlugin:
    """GpuPlugin reading ``node``, with a fixed CUDA version (the real probe is tested
    in test_discover) and ``starter`` in place of the namespace work (tested on runc)."""
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    inventory = InventoryCache(config, take=lambda c: discover(c, cuda_version=lambda p: ("12.4", None)))
    return GpuPlugin(config, inventory, starter=starter, metrics=metrics)
