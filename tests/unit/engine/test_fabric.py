"""Fabric and I/O requests: NVIDIA_IMEX_CHANNELS and imex/<id> markers, NVIDIA_GDS/MOFED/GDRCOPY/NVSWITCH.

Parsing through ``parse_request`` (where they come from, policy, bounds), and
``plan_fabric`` against hand-made ``Fabric`` values (what the node lacks).
"""

from __future__ import annotations

import doctest
from collections.abc import Mapping
from typing import Any

import pytest

from nri_gpu.engine import fabric as fabric_module
from nri_gpu.engine.config import Policy
from nri_gpu.engine.errors import RequestError
from nri_gpu.engine.fabric import MAX_IMEX_CHANNEL, FabricRequest, plan_fabric
from nri_gpu.engine.model import DeviceKind, DeviceNode, Fabric, Feature
from nri_gpu.engine.request import (
    MAX_LIST_ENTRIES,
    MAX_VALUE_LENGTH,
    POD_ANNOTATION,
    VOLUME_MARKER_DIR,
    ContainerInfo,
    RequestOutcome,
    parse_request,
)

MOUNTS_ON = Policy(accept_volume_mounts=True)
STRICT = Policy(accept_env_unprivileged=False)


def outcome(env: Mapping[str, str], policy: Policy | None = None, **kw: Any) -> RequestOutcome:
    info = ContainerInfo(name="main", env={"NVIDIA_VISIBLE_DEVICES": "0", **env}, **kw)
    return parse_request(info, policy or Policy())


def fabric_of(env: Mapping[str, str], policy: Policy | None = None, **kw: Any) -> FabricRequest:
    result = outcome(env, policy, **kw)
    assert result.request is not None, result
    return result.request.fabric


def marker(name: str) -> tuple[str, str]:
    return ("/dev/null", f"{VOLUME_MARKER_DIR}/{name}")


def test_doctests() -> None:
    assert doctest.testmod(fabric_module).failed == 0


# -- IMEX channels: parsing -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "channels"),
    [
        pytest.param("0,5", (0, 5), id="two"),
        pytest.param(" 5 , 0 ,5", (5, 0), id="spaces-and-duplicates-keep-order"),
        pytest.param("007", (7,), id="leading-zeros"),
        pytest.param(str(MAX_IMEX_CHANNEL), (MAX_IMEX_CHANNEL,), id="largest"),
        pytest.param("", (), id="empty"),
        pytest.param("void", (), id="void"),
        pytest.param("none", (), id="none"),
    ],
)
def test_imex_channels_from_env(value: str, channels: tuple[int, ...]) -> None:
    got = fabric_of({"NVIDIA_IMEX_CHANNELS": value})
    assert got.imex_channels == channels
    assert got.imex_source == ("env NVIDIA_IMEX_CHANNELS" if channels else "")


@pytest.mark.parametrize(
    ("value", "entry"),
    [
        pytest.param("0,x", "x", id="word"),
        pytest.param(str(MAX_IMEX_CHANNEL + 1), str(MAX_IMEX_CHANNEL + 1), id="past-the-bound"),
        pytest.param("1" * 5000, "1" * 77 + "...", id="huge-number"),
        pytest.param("0-3", "0-3", id="no-ranges"),
        pytest.param("-1", "-1", id="negative"),
        pytest.param("0,,1", "", id="stray-comma"),
        pytest.param("0,all", "all", id="all-among-others"),
        pytest.param("channel0", "channel0", id="node-name"),
        pytest.param("\u0661", "\u0661", id="arabic-digit"),
    ],
)
def test_bad_channels_are_refused_naming_the_entry_and_the_source(value: str, entry: str) -> None:
    with pytest.raises(RequestError) as exc:
        outcome({"NVIDIA_IMEX_CHANNELS": value})
    message = str(exc.value)
    assert message.startswith("env NVIDIA_IMEX_CHANNELS=")
    assert f'IMEX channel "{entry}" is not a channel number' in message
    assert len(message) < 400


def test_all_is_ignored_with_a_note_as_the_toolkit_does() -> None:
    result = outcome({"NVIDIA_IMEX_CHANNELS": "all"})
    assert result.request is not None and result.request.fabric.imex_channels == ()
    assert any("NVIDIA_IMEX_CHANNELS=all ignored" in n for n in result.notes)


def test_channel_lists_and_values_are_bounded_before_parsing() -> None:
    # The messages are the bounds' own, which come before any entry is parsed.
    with pytest.raises(RequestError, match=f"more than {MAX_LIST_ENTRIES} entries"):
        outcome({"NVIDIA_IMEX_CHANNELS": ",".join(["1"] * (MAX_LIST_ENTRIES + 1))})
    with pytest.raises(RequestError, match=f"longer than {MAX_VALUE_LENGTH}"):
        outcome({"NVIDIA_IMEX_CHANNELS": "1," * 400_000})


def test_imex_env_in_an_unprivileged_container_follows_the_env_policy() -> None:
    # GPUs by annotation (allowed), channels by env: the env policy still decides.
    annotations = {POD_ANNOTATION: "0"}
    env = {"NVIDIA_IMEX_CHANNELS": "3"}
    strict = parse_request(ContainerInfo(name="main", pod_annotations=annotations, env=env), STRICT)
    assert strict.request is not None and strict.request.fabric.imex_channels == ()
    assert any("NVIDIA_IMEX_CHANNELS ignored by policy" in n for n in strict.notes)
    privileged = ContainerInfo(name="main", pod_annotations=annotations, env=env, privileged=True)
    assert parse_request(privileged, STRICT).request.fabric.imex_channels == (3,)  # type: ignore[union-attr]
    default = parse_request(ContainerInfo(name="main", pod_annotations=annotations, env=env), Policy())
    assert default.request is not None and default.request.fabric.imex_channels == (3,)


def test_imex_without_a_gpu_request_asks_for_nothing() -> None:
    info = ContainerInfo(name="main", env={"NVIDIA_IMEX_CHANNELS": "0", "NVIDIA_GDS": "enabled"})
    assert parse_request(info, Policy()).request is None
    void = outcome({"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_IMEX_CHANNELS": "x"})
    assert void.request is None  # the device list decides first: nothing is read after void


# -- IMEX channels: volume markers -------------------------------------------------------------


def test_imex_markers_are_channels_not_gpus() -> None:
    mounts = (marker("0"), marker("imex/5"), marker("imex/2"))
    request = outcome({}, MOUNTS_ON, mounts=mounts).request
    assert request is not None and request.source == "volume mounts"
    assert request.fabric.imex_channels == (5, 2) and request.fabric.imex_source == "volume mounts"
    assert len(request.ids) == 1


def test_imex_markers_beat_the_env() -> None:
    mounts = (marker("0"), marker("imex/5"))
    assert fabric_of({"NVIDIA_IMEX_CHANNELS": "1"}, MOUNTS_ON, mounts=mounts).imex_channels == (5,)
    # Without markers the env is read, as the toolkit does.
    assert fabric_of({"NVIDIA_IMEX_CHANNELS": "1"}, MOUNTS_ON, mounts=(marker("0"),)).imex_channels == (1,)


def test_imex_markers_alone_are_not_a_gpu_request() -> None:
    # GPUs from the env, channels from the markers.
    request = outcome({}, MOUNTS_ON, mounts=(marker("imex/4"),)).request
    assert request is not None and request.source == "env NVIDIA_VISIBLE_DEVICES"
    assert request.fabric.imex_channels == (4,)
    info = ContainerInfo(name="main", mounts=(marker("imex/4"),))
    assert parse_request(info, MOUNTS_ON).request is None


def test_imex_markers_with_gpus_by_annotation() -> None:
    info = ContainerInfo(name="main", pod_annotations={POD_ANNOTATION: "0"}, mounts=(marker("imex/9"),))
    assert parse_request(info, MOUNTS_ON).request.fabric.imex_channels == (9,)  # type: ignore[union-attr]
    assert parse_request(info, Policy()).request.fabric.imex_channels == ()  # type: ignore[union-attr]


def test_imex_markers_are_ignored_unless_policy_reads_markers() -> None:
    assert fabric_of({}, mounts=(marker("imex/5"),)).imex_channels == ()


def test_a_bad_imex_marker_is_refused_naming_it() -> None:
    with pytest.raises(RequestError) as exc:
        outcome({}, MOUNTS_ON, mounts=(marker("0"), marker("imex/x7")))
    assert 'volume mounts under /var/run/nvidia-container-devices/imex/: IMEX channel "x7"' in str(exc.value)


def test_imex_in_a_device_list_says_where_channels_go() -> None:
    with pytest.raises(RequestError, match=r'"imex/0": IMEX channels are asked for with NVIDIA_IMEX_CHANNELS'):
        outcome({"NVIDIA_VISIBLE_DEVICES": "0,imex/0"})


# -- the gated four ---------------------------------------------------------------------------


@pytest.mark.parametrize("feature", list(Feature), ids=lambda f: f.env)
def test_exactly_enabled_turns_a_feature_on(feature: Feature) -> None:
    assert fabric_of({feature.env: "enabled"}).features == {feature}
    result = outcome({feature.env: "true"})
    assert result.request is not None and result.request.fabric.features == frozenset()
    assert any(f'env {feature.env}="true" ignored: only enabled' in n for n in result.notes)
    assert fabric_of({feature.env: ""}).features == frozenset()


def test_features_need_no_privilege_as_in_the_toolkit() -> None:
    info = ContainerInfo(name="main", pod_annotations={POD_ANNOTATION: "0"}, env={"NVIDIA_GDS": "enabled"})
    assert parse_request(info, STRICT).request.fabric.features == {Feature.GDS}  # type: ignore[union-attr]


def test_a_huge_feature_value_makes_a_short_note() -> None:
    result = outcome({"NVIDIA_MOFED": "x" * 1_000_000})
    assert all(len(n) < 200 for n in result.notes)


# -- plan_fabric ---------------------------------------------------------------------------


def node(path: str, major: int, minor: int, kind: DeviceKind) -> DeviceNode:
    return DeviceNode(path, major, minor, "c", 0o666, kind)


FS = node("/dev/nvidia-fs0", 240, 0, DeviceKind.NVIDIA_FS)
UVERBS = node("/dev/infiniband/uverbs0", 231, 192, DeviceKind.INFINIBAND)
FULL = Fabric(235, 2048, (FS, UVERBS), (("/etc/cufile.json", "/etc/cufile.json"),))


def test_channels_become_nodes_from_numbers_in_channel_order() -> None:
    got = plan_fabric(FabricRequest((5, 0), "env NVIDIA_IMEX_CHANNELS"), FULL, with_gpus=True)
    assert [(d.path, d.major, d.minor, d.mode) for d in got.devices] == [
        ("/dev/nvidia-caps-imex-channels/channel0", 235, 0, 0o666),
        ("/dev/nvidia-caps-imex-channels/channel5", 235, 5, 0o666),
    ]
    assert got.imex_channels == (5, 0)


@pytest.mark.parametrize(
    ("fabric", "channels", "message"),
    [
        pytest.param(FULL, (0, 2048), "asks for IMEX channel 2048, but this node has channels 0-2047", id="past-count"),
        pytest.param(
            Fabric(235, 4), (4,), "channels 0-3 (ImexChannelCount 4 in /proc/driver/nvidia/params)", id="four"
        ),
        pytest.param(Fabric(235, 0), (0,), "this node has no channels (ImexChannelCount 0", id="zero"),
        pytest.param(Fabric(None, 2048), (1,), "/proc/devices lists no nvidia-caps-imex-channels major", id="no-major"),
        pytest.param(
            Fabric(235, None), (1,), "ImexChannelCount (/proc/driver/nvidia/params) could not be read", id="no-count"
        ),
    ],
)
def test_channels_the_node_cannot_have_are_refused(fabric: Fabric, channels: tuple[int, ...], message: str) -> None:
    with pytest.raises(RequestError) as exc:
        plan_fabric(FabricRequest(channels, "env NVIDIA_IMEX_CHANNELS"), fabric, with_gpus=True)
    assert str(exc.value).startswith("env NVIDIA_IMEX_CHANNELS asks for IMEX channel")
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("feature", "missing"),
    [
        (Feature.GDRCOPY, "/dev/gdrdrv"),
        (Feature.NVSWITCH, "/dev/nvidia-nvswitchctl or /dev/nvidia-nvswitch*"),
    ],
)
def test_an_enabled_feature_without_nodes_is_refused_naming_them(feature: Feature, missing: str) -> None:
    with pytest.raises(RequestError) as exc:
        plan_fabric(FabricRequest(features=frozenset({Feature.GDS, feature})), FULL, with_gpus=True)
    assert str(exc.value).startswith(f"env {feature.env}=enabled: this node has no {missing} character device")


def test_features_give_their_nodes_and_gds_its_files() -> None:
    got = plan_fabric(
        FabricRequest(features=frozenset(Feature) - {Feature.GDRCOPY, Feature.NVSWITCH}), FULL, with_gpus=True
    )
    assert got.devices == (FS, UVERBS) and got.features == (Feature.GDS, Feature.MOFED)
    assert got.mounts == (("/etc/cufile.json", "/etc/cufile.json"),)
    mofed = plan_fabric(FabricRequest(features=frozenset({Feature.MOFED})), FULL, with_gpus=True)
    assert mofed.devices == (UVERBS,) and mofed.mounts == ()


def test_without_gpus_nothing_is_given_and_nothing_refused() -> None:
    request = FabricRequest((9999,), "env NVIDIA_IMEX_CHANNELS", frozenset({Feature.GDRCOPY}))
    got = plan_fabric(request, Fabric(), with_gpus=False)
    assert got.devices == () and got.mounts == ()
    assert got.notes == (
        "IMEX channels from env NVIDIA_IMEX_CHANNELS, NVIDIA_GDRCOPY=enabled ignored: "
        "they come only with GPUs, and none was selected",
    )
