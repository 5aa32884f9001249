"""Shared by the plugin's tests: nri-gpu's own handlers on a simulated node, and
this venv's programs where root alone can change them (all a spec or unit may name)."""

from __future__ import annotations

from typing import Any

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import InventoryCache, discover
from nri_gpu.plugin.cli.hook_install import check_hook, check_install
from nri_gpu.plugin.handlers import GpuPlugin
from nri_gpu.plugin.metrics import PluginMetrics
from testbed.gpunode import SimNode
from testbed.plugins import NRI_GPU, NRI_GPU_HOOK
from tests.integration.hookrun import cannot_run


def gpu_plugin(node: SimNode, starter: Any, metrics: PluginMetrics | None = None, view_check: Any = None) -> GpuPlugin:
    """GpuPlugin reading ``node``, with a fixed CUDA version (the real probe is tested
    in test_discover) and ``starter`` in place of the namespace work (tested on runc);
    ``view_check`` (pid -> bool | None) in place of reading the pid's mountinfo."""
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    inventory = InventoryCache(config, take=lambda c: discover(c, cuda_version=lambda p: ("12.4", None)))
    if view_check is None:
        return GpuPlugin(config, inventory, starter=starter, metrics=metrics)
    return GpuPlugin(config, inventory, starter=starter, metrics=metrics, view_check=view_check)


def trusted_hook() -> str:
    """This venv's compiled hook, where root alone can change it (the only kind a spec
    names); else skip, or fail under ``NRI_GPU_E2E_REQUIRE=1`` (CI), saying why."""
    problems = check_hook(NRI_GPU_HOOK)
    if problems:
        cannot_run(f"{NRI_GPU_HOOK} is not root's alone, so no spec may name it: {problems[0]}")
    return NRI_GPU_HOOK


def trusted_nri_gpu() -> str:
    """This venv's nri-gpu, where root alone can change it (a unit runs no other); else
    skip, or fail under ``NRI_GPU_E2E_REQUIRE=1`` (CI), saying why."""
    problems = check_install(NRI_GPU)
    if problems:
        cannot_run(f"{NRI_GPU} is not root's alone, so no unit may run it: {problems[0]}")
    return NRI_GPU
