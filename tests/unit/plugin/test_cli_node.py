"""``nri-gpu info`` and ``nri-gpu plan`` on simulated nodes, as an operator runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nri_gpu.plugin.cli.__main__ import main
from testbed.gpunode import FIXTURE_DRIVER, FIXTURE_NO_DRIVER, SimNode, build_node


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("cli-node"), gpus=4, driver_files=FIXTURE_DRIVER)


def test_info_table_lists_gpus_in_bus_order_with_their_minors(
    node: SimNode, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", *node.flags()], {}) == 0
    out = capsys.readouterr().out
    assert out.startswith("Driver 550.163.01, CUDA 12.4, 4 GPU(s)")
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [(int(r[0]), int(r[1]), r[2], r[3]) for r in rows] == [
        (g.index, g.minor, g.bus_id, g.uuid) for g in node.gpus
    ]
    assert "Libraries per capability: compute" in out


def test_info_json(node: SimNode, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--json", *node.flags()], {}) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["driver_version"] == "550.163.01" and len(data["gpus"]) == 4
    assert data["libraries_per_capability"]["utility"] >= 2


def test_info_on_a_node_without_driver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bare = build_node(tmp_path, driver=False, driver_files=FIXTURE_NO_DRIVER)
    assert main(["info", *bare.flags()], {}) == 0
    assert capsys.readouterr().out.startswith("No NVIDIA driver on this node: no GPUs.")


def test_plan_prints_the_edits(node: SimNode, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", *node.flags(), "--annotation", "nvidia.com/gpus=1", "--json"], {})
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    gpu1 = node.gpus[1]
    assert [g["uuid"] for g in data["gpus"]] == [gpu1.uuid]
    assert f"/dev/nvidia{gpu1.minor}" in [d["path"] for d in data["devices"]]
    assert data["start"]["visible_bus_ids"] == [gpu1.bus_id]


def test_plan_for_a_container_that_asks_for_nothing(node: SimNode, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *node.flags(), "--env", "PATH=/bin"], {}) == 0
    assert "the container gets nothing" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--annotation", "nvidia.com/gpus=7"], "GPU 7 does not exist; this node has 4 GPUs"),
        (["--env", "NVIDIA_VISIBLE_DEVICES=0,,1"], '"0,,1"'),
        (["--env", "NVIDIA_VISIBLE_DEVICES=0", "--env", "NVIDIA_DRIVER_CAPABILITIES=compute,gpu"], '"gpu"'),
        (["--env", "NVIDIA_VISIBLE_DEVICES=0", "--env", "NVIDIA_REQUIRE_CUDA=cuda>=13.0"], "cuda>=13.0"),
    ],
    ids=["gpu-7-of-4", "malformed-list", "unknown-capability", "unmet-requirement"],
)
def test_plan_refusals_exit_1_naming_the_value(
    node: SimNode, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["plan", *node.flags(), *args], {}) == 1
    err = capsys.readouterr().err
    assert err.startswith("nri-gpu: refused:") and message in err


def test_plan_bad_flag_syntax(node: SimNode, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *node.flags(), "--env", "NOEQUALS"], {}) == 2
    assert "--env 'NOEQUALS': expected KEY=VALUE" in capsys.readouterr().err


def test_info_shows_the_mig_layout_and_plan_explains_a_mig_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mig = build_node(
        tmp_path, gpus=2, mig={0: [(2, [0, 1]), (9, [])], 1: []}, driver_files=FIXTURE_DRIVER
    )  # GPU 0 has minor 1
    assert main(["info", *mig.flags()], {}) == 0
    out = capsys.readouterr().out
    assert "MIG instances of GPU minor 1: gi2(ci0,ci1) gi9(no CIs)\n" in out
    assert main(["info", "--json", *mig.flags()], {}) == 0
    data = json.loads(capsys.readouterr().out)["mig"]
    assert data["caps_major"] == 236 and data["monitor"]["minor"] == 2 and data["config"]["mode"] == "0400"
    gi2 = data["gpu_instances"][0]
    assert (gi2["gpu_minor"], gi2["gi"], gi2["access"]["minor"], gi2["access"]["mode"]) == (1, 2, 156, "0444")
    assert [c["access"]["minor"] for c in gi2["compute_instances"]] == [157, 158]
    assert [g["gi"] for g in data["gpu_instances"]] == [2, 9] and data["gpu_instances"][1]["compute_instances"] == []
    placement = f"MIG-{mig.gpus[0].uuid}/2/1"
    assert main(["plan", "--json", *mig.flags(), "--env", f"NVIDIA_VISIBLE_DEVICES={placement}"], {}) == 0
    planned = json.loads(capsys.readouterr().out)
    (device,) = planned["mig_devices"]
    assert (device["parent_index"], device["gi"], device["ci"], device["cap_minors"]) == (0, 2, 1, [156, 158])
    assert planned["start"]["proc_caps"] == ["gpu1/mig/gi2/access", "gpu1/mig/gi2/ci1/access"]
    assert main(["plan", *mig.flags(), "--env", "NVIDIA_VISIBLE_DEVICES=0:7"], {}) == 1
    assert "no MIG device 0:7" in capsys.readouterr().err


def test_info_json_has_no_mig_key_without_instances(node: SimNode, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--json", *node.flags()], {}) == 0
    assert "mig" not in json.loads(capsys.readouterr().out)
