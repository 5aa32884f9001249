"""The CDI hook hands CUDA forward compatibility to its start work as the plugin
does: the policy switch and the host driver's version (``engine.hook.run_hook``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from engine import hook
from engine.config import EngineConfig, Policy
from engine.discover import discover
from engine.model import DEFAULT_CAPABILITIES, Inventory
from engine.start import actions
from engine.start.work import StartReport, StartWork
from tests.testbed.gpunode import FIXTURE_DRIVER, SimNode, build_node


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimNode, EngineConfig, Inventory]:
    node = build_node(tmp_path_factory.mktemp("node"), gpus=1, driver_files=FIXTURE_DRIVER)
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    return node, config, discover(config, cuda_version=lambda path: ("12.4", None))


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_the_hooks_work_carries_the_switch_and_the_driver_version(
    sim: tuple[SimNode, EngineConfig, Inventory], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on: bool
) -> None:
    node, config, inventory = sim
    config = dataclasses.replace(config, policy=Policy(cuda_compat=on))
    gpu = node.gpus[0]
    bundle: dict[str, Any] = {
        "root": {"path": "rootfs"},
        "linux": {"devices": [{"path": f"/dev/nvidia{gpu.minor}", "type": "c", "major": 195, "minor": gpu.minor}]},
    }
    (tmp_path / "config.json").write_text(json.dumps(bundle))
    seen: list[StartWork] = []

    def perform_in_bundle(rootfs: str, work: StartWork, **kw: object) -> StartReport:
        seen.append(work)
        return StartReport()

    monkeypatch.setattr(actions, "perform_in_bundle", perform_in_bundle)
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "bundle": str(tmp_path)}).encode()
    hook.run_hook(state, config, DEFAULT_CAPABILITIES, lambda: inventory)
    assert [(w.cuda_compat, w.driver_version) for w in seen] == [(on, "550.163.01")]
