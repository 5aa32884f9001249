"""NRI glue: the cheap pre-filter, NRI -> ContainerInfo, plan -> adjustment."""

from __future__ import annotations

import pytest

from nri_gpu.engine.config import Policy
from nri_gpu.engine.model import DeviceKind, DeviceNode, Gpu, Mount, Plan
from nri_gpu.plugin.adjustment import GPUS_ANNOTATION, to_adjustment
from nri_gpu.plugin.errors import PluginError
from nri_gpu.plugin.request import container_info, may_request
from tests.fake_runtime import container, pod


@pytest.mark.parametrize(
    ("annotations", "env", "policy", "expected"),
    [
        ({}, ["PATH=/bin"], Policy(), False),
        ({"nvidia.com/gpus": "0"}, [], Policy(), True),
        ({"nvidia.com/gpus.container.ctr": "0"}, [], Policy(), True),
        ({"nvidia.com/gpus.container.other": "0"}, [], Policy(), False),
        ({}, ["NVIDIA_VISIBLE_DEVICES=all"], Policy(), True),
        ({}, ["CUDA_VERSION=12.4"], Policy(), False),
        ({}, ["CUDA_VERSION=12.4"], Policy(legacy_image_all_gpus=True), True),
    ],
    ids=["nothing", "pod-annotation", "container-annotation", "other-container", "env", "legacy-off", "legacy-on"],
)
def test_may_request(annotations: dict[str, str], env: list[str], policy: Policy, expected: bool) -> None:
    assert may_request(pod(annotations=annotations), container("ctr", env=env), policy) is expected


def test_volume_markers_only_when_policy_reads_them() -> None:
    ctr = container("ctr")
    ctr.mounts.add(destination="/var/run/nvidia-container-devices/GPU-x", source="/dev/null")
    assert not may_request(pod(), ctr, Policy())
    assert may_request(pod(), ctr, Policy(accept_volume_mounts=True))


def test_container_info_first_env_entry_wins() -> None:
    # Only the entries a request reads (NVIDIA_*, CUDA_VERSION) are kept.
    info = container_info(pod("p", "ns"), container("ctr", env=["NVIDIA_A=1", "NVIDIA_A=2", "NVIDIA_B=x=y", "C=1"]))
    assert info.env == {"NVIDIA_A": "1", "NVIDIA_B": "x=y"} and info.pod_namespace == "ns" and not info.privileged


GPU = Gpu(0, 2, "0000:07:00.0", "GPU-1", "A100")
PLAN = Plan(
    gpus=(GPU,),
    devices=(
        DeviceNode("/dev/nvidiactl", 195, 255, kind=DeviceKind.CONTROL),
        DeviceNode("/dev/nvidia2", 195, 2),
    ),
    mounts=(Mount("/drv/usr/lib/libcuda.so.1.2", "/usr/lib/libcuda.so.1.2"),),
    env=(("NVIDIA_VISIBLE_DEVICES", "GPU-1"),),
)


def test_adjustment_carries_devices_mounts_env_and_annotation() -> None:
    adjust = to_adjustment(PLAN, container())
    assert [(d.path, d.major, d.minor, d.file_mode.value) for d in adjust.linux.devices] == [
        ("/dev/nvidiactl", 195, 255, 0o666),
        ("/dev/nvidia2", 195, 2, 0o666),
    ]
    assert [(m.destination, m.type, m.source, list(m.options)) for m in adjust.mounts] == [
        (
            "/usr/lib/libcuda.so.1.2",
            "bind",
            "/drv/usr/lib/libcuda.so.1.2",
            ["ro", "nosuid", "nodev", "rbind", "rprivate"],
        )
    ]
    assert [(e.key, e.value) for e in adjust.env] == [("NVIDIA_VISIBLE_DEVICES", "GPU-1")]
    assert adjust.annotations[GPUS_ANNOTATION] == "GPU-1"


def test_what_the_container_already_has_is_not_sent_again() -> None:
    ctr = container(env=["NVIDIA_VISIBLE_DEVICES=GPU-1"])
    ctr.linux.devices.add(path="/dev/nvidia2", type="c", major=195, minor=2)  # the device plugin's
    ctr.mounts.add(destination="/usr/lib/libcuda.so.1.2", source="/drv/usr/lib/libcuda.so.1.2")
    adjust = to_adjustment(PLAN, ctr)
    assert [d.path for d in adjust.linux.devices] == ["/dev/nvidiactl"]
    assert list(adjust.mounts) == [] and list(adjust.env) == []


def test_a_different_mount_at_our_destination_is_refused() -> None:
    ctr = container()
    ctr.mounts.add(destination="/usr/lib/libcuda.so.1.2", source="/somewhere/else")
    with pytest.raises(PluginError, match=r"already mounts /somewhere/else at /usr/lib/libcuda\.so\.1\.2"):
        to_adjustment(PLAN, ctr)


def test_driver_only_plan_is_annotated_none() -> None:
    assert (
        to_adjustment(Plan(env=(("NVIDIA_VISIBLE_DEVICES", "none"),)), container()).annotations[GPUS_ANNOTATION]
        == "none"
    )


def test_env_already_set_is_judged_as_the_process_sees_it() -> None:
    # getenv(3) returns the first entry: a later duplicate does not make ours redundant.
    ctr = container(env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=GPU-1"])
    assert [(e.key, e.value) for e in to_adjustment(PLAN, ctr).env] == [("NVIDIA_VISIBLE_DEVICES", "GPU-1")]
