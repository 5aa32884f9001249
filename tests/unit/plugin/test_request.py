"""NRI messages -> ContainerInfo: the hot path stays cheap and the slow path reads a bounded amount."""

from __future__ import annotations

import pytest

from nri_gpu.engine.config import Policy
from nri_gpu.engine.errors import RequestError
from nri_gpu.engine.request import (
    MAX_DEVICE_NODES,
    MAX_LIST_ENTRIES,
    MAX_REQUEST_ENV,
    POD_ANNOTATION,
    VOLUME_MARKER_DIR,
)
from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.request import container_info, first_values, may_request


def _container(env: list[str], mounts: int = 0) -> api.Container:
    message = api.Container(name="main", env=env)
    for i in range(mounts):
        message.mounts.add(source="/dev/null", destination=f"/data/{i}")
    # Parsed back, as the stub hands it over (upb builds str objects on access).
    parsed = api.Container()
    parsed.ParseFromString(message.SerializeToString())
    return parsed


POD = api.PodSandbox(name="p", namespace="ml")


def test_asking_for_nothing_stays_cheap_with_a_large_env() -> None:
    # The kubelet's service links can give a pod thousands of variables: still no request.
    container = _container([f"SERVICE_{i}_PORT=tcp://10.0.0.1:80" for i in range(65536)])
    assert may_request(POD, container, Policy()) is False  # its cost: a benchmark's


@pytest.mark.parametrize("policy", [Policy(), Policy(accept_volume_mounts=True)], ids=["env", "mounts"])
def test_a_container_that_asks_for_nothing_is_never_refused_for_its_size(policy: Policy) -> None:
    # 800k entries fit in one 4 MiB NRI message (the most the runtime can send):
    # scanned, never copied, and not a reason to fail a container we do not serve.
    container = _container(["A=1"] * 800_000, mounts=70_000)
    assert may_request(POD, container, policy) is False


def test_a_request_among_a_huge_env_copies_only_the_request_env() -> None:
    container = _container(["A=1"] * 800_000 + ["NVIDIA_VISIBLE_DEVICES=all"])
    assert may_request(POD, container, Policy()) is True
    info = container_info(POD, container)
    assert dict(info.env) == {"NVIDIA_VISIBLE_DEVICES": "all"}


def test_too_many_nvidia_env_entries_are_refused_by_count() -> None:
    container = _container(["NVIDIA_VISIBLE_DEVICES=all"] + [f"NVIDIA_X{i}=1" for i in range(800_000)])
    with pytest.raises(RequestError) as exc:
        container_info(POD, container)
    assert str(exc.value) == f"the container has more than {MAX_REQUEST_ENV} NVIDIA_* and CUDA_VERSION env entries"


def test_too_many_volume_markers_are_refused_when_markers_count() -> None:
    container = _container([])
    for i in range(MAX_LIST_ENTRIES + 1):
        container.mounts.add(source="/dev/null", destination=f"{VOLUME_MARKER_DIR}/{i}")
    assert may_request(POD, container, Policy()) is False  # markers off: mounts are never read
    assert may_request(POD, container, Policy(accept_volume_mounts=True)) is True
    with pytest.raises(RequestError, match=f"more than {MAX_LIST_ENTRIES} entries"):
        container_info(POD, container)


def test_only_what_a_request_reads_is_copied() -> None:
    pod = api.PodSandbox(name="p", namespace="ml")
    for i in range(1000):
        pod.annotations[f"team/{i}"] = "x"
    pod.annotations[POD_ANNOTATION] = "0"
    container = _container(["PATH=/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12", "CUDA_VERSION=12.4", "NVIDIA_X=1", "HOME=/"])
    container.mounts.add(source="/dev/null", destination=f"{VOLUME_MARKER_DIR}/0")
    container.mounts.add(source="/data", destination="/data")
    info = container_info(pod, container)
    assert dict(info.pod_annotations) == {POD_ANNOTATION: "0"}
    assert dict(info.env) == {"NVIDIA_REQUIRE_CUDA": "cuda>=12", "CUDA_VERSION": "12.4", "NVIDIA_X": "1"}
    assert info.mounts == (("/dev/null", f"{VOLUME_MARKER_DIR}/0"),)
    assert (info.pod_namespace, info.pod_name) == ("ml", "p")


def test_first_values_reads_only_the_keys_asked_for_first_entry_wins() -> None:
    container = _container(["A=1", "NVIDIA_X=a", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_X=b", "NVIDIA_XY=c"])
    assert first_values(container, ("NVIDIA_X", "NVIDIA_DRIVER_CAPABILITIES")) == {"NVIDIA_X": "a"}
    assert first_values(container, ()) == {}


def test_the_containers_character_devices_are_passed_up_to_a_bound() -> None:
    """The device plugin's device specs (a MIG device's parent and cap nodes) reach the
    engine as (major, minor); block devices do not; a privileged container's hundreds
    of host devices past the bound are not read at all."""
    pod = api.PodSandbox(name="p", namespace="ml")
    ctr = api.Container(name="c", env=["NVIDIA_VISIBLE_DEVICES=0"])
    ctr.linux.devices.add(path="/dev/nvidia0", type="c", major=195, minor=0)
    ctr.linux.devices.add(path="/dev/nvidia-caps/nvidia-cap21", type="c", major=236, minor=21)
    ctr.linux.devices.add(path="/dev/sda", type="b", major=8, minor=0)
    assert container_info(pod, ctr).devices == ((195, 0), (236, 21))
    for minor in range(MAX_DEVICE_NODES):
        ctr.linux.devices.add(path=f"/dev/x{minor}", type="c", major=1, minor=minor)
    assert container_info(pod, ctr).devices == ()
