"""The GPU engine: node discovery, request parsing, planning and in-namespace actions.

Independent of NRI and of ``plugin`` (never imports it): the plugin turns NRI
messages into engine calls and engine plans into NRI adjustments.

This package is the engine's one front door: ``plugin`` imports every name it
uses from ``nri_gpu.engine`` (``from nri_gpu.engine import parse_request``), never from a
submodule (``tests/test_layering.py`` holds it to that); the engine's own
modules import each other directly. The names are loaded on first use
(PEP 562): a command imports what it uses and no more (``nri-gpu cdi
generate`` needs no NRI runner, the NRI path no CDI spec builder, neither the
CUDA and NVML probes until discovery asks). ``import nri_gpu.engine`` alone
imports no submodule.

Five names differ from their module's (``make_plan`` is ``plan.plan``,
``discover_inventory`` is ``discover.discover``, ``find_equipped`` is
``equipped.equipped``, ``config_from_tables`` is ``config.from_tables``,
``elf_interpreter`` is ``start.elf.interpreter``): once a submodule is imported,
Python binds its name on the package, which would shadow an export of the same
name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as the type checker sees them; loaded lazily below
    from nri_gpu.engine.cdi import HookCommand, cdi_spec, hook_command, spec_warnings
    from nri_gpu.engine.config import LD_CACHE_MODES, EngineConfig, EngineConfigError, Policy
    from nri_gpu.engine.config import from_tables as config_from_tables
    from nri_gpu.engine.discover import InventoryCache, current_ipc
    from nri_gpu.engine.discover import discover as discover_inventory
    from nri_gpu.engine.equipped import Source, cdi_names, completion, conflict, nvidia_nri_annotation
    from nri_gpu.engine.equipped import equipped as find_equipped
    from nri_gpu.engine.errors import EngineError, RequestError, StartError, UnknownDeviceError
    from nri_gpu.engine.model import Capability, DriverFile, Inventory, Plan
    from nri_gpu.engine.plan import ipc_in_mounts
    from nri_gpu.engine.plan import plan as make_plan
    from nri_gpu.engine.report import inventory_text, inventory_to_dict, plan_text, plan_to_dict
    from nri_gpu.engine.request import (
        CONTAINER_ANNOTATION_PREFIX,
        DRIVER_CAPABILITIES,
        MAX_DEVICE_NODES,
        MAX_LIST_ENTRIES,
        MAX_REQUEST_ENV,
        POD_ANNOTATION,
        VOLUME_MARKER_DIR,
        ContainerInfo,
        GpuRequest,
        may_request,
        parse_capabilities,
        parse_request,
    )
    from nri_gpu.engine.selection import UnknownMigDeviceError
    from nri_gpu.engine.start.actions import identity_blind_spots
    from nri_gpu.engine.start.elf import interpreter as elf_interpreter
    from nri_gpu.engine.start.runner import find_init_pid, run_start_async, shows_driver_view
    from nri_gpu.engine.start.syscalls import open_in_root
    from nri_gpu.engine.start.work import start_work


def _names(module: str, *names: str) -> dict[str, tuple[str, str]]:
    return {name: (module, name) for name in names}


# Exported name -> (module, name there).
_EXPORTS: dict[str, tuple[str, str]] = {
    # Configuration: the config file's [engine] and [policy] tables, validated.
    **_names("nri_gpu.engine.config", "EngineConfig", "EngineConfigError", "Policy", "LD_CACHE_MODES"),
    "config_from_tables": ("nri_gpu.engine.config", "from_tables"),
    # Errors: the plugin maps EngineError to the runtime's error status.
    **_names("nri_gpu.engine.errors", "EngineError", "RequestError", "StartError", "UnknownDeviceError"),
    "UnknownMigDeviceError": ("nri_gpu.engine.selection", "UnknownMigDeviceError"),
    # The node's inventory, and the cache that takes it again when the node changes.
    "discover_inventory": ("nri_gpu.engine.discover", "discover"),
    **_names("nri_gpu.engine.discover", "InventoryCache", "current_ipc"),
    **_names("nri_gpu.engine.model", "Capability", "DriverFile", "Inventory", "Plan"),
    # The request parser, its pre-filter and the request's wire names (the
    # plugin reads only the annotations and env the parser would).
    **_names(
        "nri_gpu.engine.request",
        "ContainerInfo",
        "GpuRequest",
        "parse_request",
        "parse_capabilities",
        "may_request",
        "CONTAINER_ANNOTATION_PREFIX",
        "DRIVER_CAPABILITIES",
        "MAX_DEVICE_NODES",
        "MAX_LIST_ENTRIES",
        "MAX_REQUEST_ENV",
        "POD_ANNOTATION",
        "VOLUME_MARKER_DIR",
    ),
    # The planner, and what a container already has from another source.
    "make_plan": ("nri_gpu.engine.plan", "plan"),
    "ipc_in_mounts": ("nri_gpu.engine.plan", "ipc_in_mounts"),
    "find_equipped": ("nri_gpu.engine.equipped", "equipped"),
    **_names("nri_gpu.engine.equipped", "Source", "cdi_names", "completion", "conflict", "nvidia_nri_annotation"),
    # `nri-gpu inventory` and `nri-gpu plan`'s text and JSON.
    **_names("nri_gpu.engine.report", "inventory_text", "inventory_to_dict", "plan_text", "plan_to_dict"),
    # The start work and its runner (NRI StartContainer).
    "start_work": ("nri_gpu.engine.start.work", "start_work"),
    **_names("nri_gpu.engine.start.runner", "find_init_pid", "run_start_async", "shows_driver_view"),
    "identity_blind_spots": ("nri_gpu.engine.start.actions", "identity_blind_spots"),
    # The CDI spec builder, and the compiled hook's command line the spec runs.
    **_names("nri_gpu.engine.cdi", "HookCommand", "cdi_spec", "hook_command", "spec_warnings"),
    # Whether the compiled hook a spec names is linked statically (nri_gpu.plugin.cli.hook_install).
    "elf_interpreter": ("nri_gpu.engine.start.elf", "interpreter"),
    # node-setup looks up the host's paths as the start work does the
    # container's: openat2 confined to a root.
    "open_in_root": ("nri_gpu.engine.start.syscalls", "open_in_root"),
}

__all__ = [
    "CONTAINER_ANNOTATION_PREFIX",
    "DRIVER_CAPABILITIES",
    "LD_CACHE_MODES",
    "MAX_DEVICE_NODES",
    "MAX_LIST_ENTRIES",
    "MAX_REQUEST_ENV",
    "POD_ANNOTATION",
    "VOLUME_MARKER_DIR",
    "Capability",
    "ContainerInfo",
    "DriverFile",
    "EngineConfig",
    "EngineConfigError",
    "EngineError",
    "GpuRequest",
    "HookCommand",
    "Inventory",
    "InventoryCache",
    "Plan",
    "Policy",
    "RequestError",
    "Source",
    "StartError",
    "UnknownDeviceError",
    "UnknownMigDeviceError",
    "cdi_names",
    "cdi_spec",
    "completion",
    "config_from_tables",
    "conflict",
    "current_ipc",
    "discover_inventory",
    "elf_interpreter",
    "find_equipped",
    "find_init_pid",
    "hook_command",
    "identity_blind_spots",
    "inventory_text",
    "inventory_to_dict",
    "ipc_in_mounts",
    "make_plan",
    "may_request",
    "nvidia_nri_annotation",
    "open_in_root",
    "parse_capabilities",
    "parse_request",
    "plan_text",
    "plan_to_dict",
    "run_start_async",
    "shows_driver_view",
    "spec_warnings",
    "start_work",
]


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'nri_gpu.engine' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), attribute)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
