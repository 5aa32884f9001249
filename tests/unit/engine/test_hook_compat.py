"""The CDI hook gets CUDA forward compatibility as the plugin's start work does: the
policy switch and the host driver's version, in the work the spec hands it
(``engine.cdi.hook_work``), which the compiled hook takes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nri_gpu.engine.cdi import cdi_spec
from nri_gpu.engine.config import EngineConfig, Policy
from nri_gpu.engine.discover import discover
from nri_gpu.engine.model import DEFAULT_CAPABILITIES, Inventory
from testbed.gpunode import FIXTURE_DRIVER, SimNode, build_node
from tests.unit.engine.test_cdi import HOOK, assert_the_hook_takes_its_work, spec_work


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimNode, EngineConfig, Inventory]:
    node = build_node(tmp_path_factory.mktemp("node"), gpus=1, driver_files=FIXTURE_DRIVER)
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    return node, config, discover(config, cuda_version=lambda path: ("12.4", None))


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_the_hooks_work_carries_the_switch_and_the_driver_version(
    sim: tuple[SimNode, EngineConfig, Inventory], tmp_path: Path, on: bool
) -> None:
    _, config, inventory = sim
    config = dataclasses.replace(config, policy=Policy(cuda_compat=on))
    spec = cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK)
    work = spec_work(spec)
    assert (work["cuda_compat"], work["driver_version"]) == (on, "550.163.01")
    assert_the_hook_takes_its_work(spec, tmp_path)
