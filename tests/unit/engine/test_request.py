"""Request parsing: the device-list grammar, where a request comes from, policy, capabilities, requirements."""

from __future__ import annotations

import doctest
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpu.engine import request as request_module
from nri_gpu.engine.config import Policy
from nri_gpu.engine.errors import RequestError
from nri_gpu.engine.model import ALL_CAPABILITIES, DEFAULT_CAPABILITIES, Capability
from nri_gpu.engine.request import (
    CONTAINER_ANNOTATION_PREFIX,
    MAX_LIST_ENTRIES,
    MAX_VALUE_LENGTH,
    POD_ANNOTATION,
    VOLUME_MARKER_DIR,
    ByBusId,
    ByIndex,
    ByMigIndex,
    ByMigPlacement,
    ByMigUuid,
    ByUuid,
    ContainerInfo,
    GpuRequest,
    RequestOutcome,
    Selection,
    parse_capabilities,
    parse_device_list,
    parse_request,
)
from nri_gpu.engine.requirements import MAX_VARIABLES

C = Capability
UUID = "GPU-8e9f1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b"
MIG_UUID = "MIG-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"
WHAT = 'env NVIDIA_VISIBLE_DEVICES="..."'


def outcome(
    env: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    policy: Policy | None = None,
    **kw: Any,
) -> RequestOutcome:
    info = ContainerInfo(name=kw.pop("name", "main"), pod_annotations=annotations or {}, env=env or {}, **kw)
    return parse_request(info, policy or Policy())


def request(*args: Any, **kw: Any) -> GpuRequest:
    result = outcome(*args, **kw)
    assert result.request is not None, result
    return result.request


def test_doctests() -> None:
    assert doctest.testmod(request_module).failed == 0


# -- the device-list grammar ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", None),
        ("   ", None),
        ("void", None),
        ("0,void", None),
        ("void,all", None),
        ("all", (Selection.ALL, ())),
        (" all ", (Selection.ALL, ())),
        ("0,all", (Selection.ALL, ())),
        ("all,not-a-device", (Selection.ALL, ())),
        ("none", (Selection.NONE, ())),
        ("1,none", (Selection.NONE, ())),
        ("none,all", (Selection.ALL, ())),
        ("0", (Selection.LIST, (ByIndex(0),))),
        ("12", (Selection.LIST, (ByIndex(12),))),
        ("007", (Selection.LIST, (ByIndex(7),))),
        (" 0 , 1 ", (Selection.LIST, (ByIndex(0), ByIndex(1)))),
        ("3,1", (Selection.LIST, (ByIndex(3), ByIndex(1)))),
        ("1,0,1", (Selection.LIST, (ByIndex(1), ByIndex(0)))),
        ("0-3", (Selection.LIST, tuple(ByIndex(i) for i in range(4)))),
        ("2-2", (Selection.LIST, (ByIndex(2),))),
        ("5,0-2,1", (Selection.LIST, (ByIndex(5), ByIndex(0), ByIndex(1), ByIndex(2)))),
        ("0-1023", (Selection.LIST, tuple(ByIndex(i) for i in range(1024)))),
        (UUID, (Selection.LIST, (ByUuid(UUID),))),
        (UUID.upper(), (Selection.LIST, (ByUuid(UUID),))),
        (UUID.upper().replace("GPU-", "gpu-"), (Selection.LIST, (ByUuid(UUID),))),
        (f"{UUID},{UUID.upper()}", (Selection.LIST, (ByUuid(UUID),))),
        ("0000:07:00.0", (Selection.LIST, (ByBusId("0000:07:00.0"),))),
        ("00000000:07:00.0", (Selection.LIST, (ByBusId("0000:07:00.0"),))),
        ("07:00.0", (Selection.LIST, (ByBusId("0000:07:00.0"),))),
        ("0000:AB:00.0", (Selection.LIST, (ByBusId("0000:ab:00.0"),))),
        ("07:00.0,0000:07:00.0", (Selection.LIST, (ByBusId("0000:07:00.0"),))),
        (f"1, {UUID} ,07:00.0", (Selection.LIST, (ByIndex(1), ByUuid(UUID), ByBusId("0000:07:00.0")))),
        # MIG: NVML's UUID (any case), i:j (as the toolkit reads "07:00" too), the legacy placement
        (MIG_UUID.upper(), (Selection.LIST, (ByMigUuid(MIG_UUID),))),
        ("0:1,1:0,0:1", (Selection.LIST, (ByMigIndex(0, 1), ByMigIndex(1, 0)))),
        ("07:00", (Selection.LIST, (ByMigIndex(7, 0),))),
        (f"MIG-{UUID.upper()}/14/7", (Selection.LIST, (ByMigPlacement(UUID, 14, 7),))),
        (
            f"0,MIG-{UUID}/2/0,{MIG_UUID}",
            (Selection.LIST, (ByIndex(0), ByMigPlacement(UUID, 2, 0), ByMigUuid(MIG_UUID))),
        ),
    ],
    ids=lambda v: repr(v) if isinstance(v, str) else "void" if v is None else v[0].value,
)
def test_valid_device_lists(value: str, expected: Any) -> None:
    assert parse_device_list(value, what=WHAT) == expected


@pytest.mark.parametrize(
    ("value", "entry", "why"),
    [
        ("x", '"x"', "unknown device"),
        ("0,x", '"x"', "unknown device"),
        ("0,,1", "empty entry", "stray comma"),
        ("0,", "empty entry", "stray comma"),
        (",0", "empty entry", "stray comma"),
        ("-1", '"-1"', "unknown device"),
        ("+1", '"+1"', "unknown device"),
        ("1.5", '"1.5"', "unknown device"),
        ("0 1", '"0 1"', "unknown device"),
        ("\u0663", '"\u0663"', "unknown device"),  # ARABIC-INDIC DIGIT THREE: int() would take it
        ("3-1", '"3-1"', "runs backwards"),
        ("0-", '"0-"', "unknown device"),
        ("0-1-2", '"0-1-2"', "unknown device"),
        ("1024", '"1024"', "out of range"),
        ("0-1024", '"0-1024"', "out of range"),
        ("9" * 5000, '"999', "out of range"),
        ("GPU-1234", '"GPU-1234"', "malformed GPU UUID"),
        (UUID + "0", f'"{UUID}0"', "malformed GPU UUID"),
        ("GPU-8e9f1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4g", '"GPU-8e9f1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4g"', "malformed"),
        ("MIG-8e9f1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4", '"MIG-8e9f1a2b', "malformed MIG device id"),
        ("MIG-1", '"MIG-1"', "malformed MIG device id"),
        (f"MIG-{UUID}/1", f'"MIG-{UUID}/1"', "malformed MIG device id"),
        (f"MIG-{UUID}/15/0", f'"MIG-{UUID}/15/0"', "GPU instances are 0-14"),
        (f"MIG-{UUID}/1/8", f'"MIG-{UUID}/1/8"', "compute instances 0-7"),
        (f"MIG-{UUID}/01/0", f'"MIG-{UUID}/01/0"', "GPU instances are 0-14"),
        (f"MIG-{UUID}/{'9' * 5000}/0", f'"MIG-{UUID}/', "GPU instances are 0-14"),
        ("0:1024", '"0:1024"', "out of range"),
        ("0:1:2", '"0:1:2"', "unknown device"),
        ("ALL", '"ALL"', "did you mean all?"),
        ("Void", '"Void"', "did you mean void?"),
        ("nvidia.com/gpu=0", '"nvidia.com/gpu=0"', "CDI device names are not supported"),
    ],
    ids=lambda v: repr(v[:40]) if isinstance(v, str) else None,
)
def test_invalid_device_lists_name_the_entry_and_the_source(value: str, entry: str, why: str) -> None:
    with pytest.raises(RequestError) as exc:
        parse_device_list(value, what=WHAT)
    message = str(exc.value)
    assert message.startswith(WHAT + ": "), message
    assert entry in message and why in message, message


def test_a_list_may_not_expand_past_the_cap() -> None:
    with pytest.raises(RequestError, match="names more than 1024 devices"):
        parse_device_list("0-1023,0", what=WHAT)


def test_env_errors_quote_the_whole_value() -> None:
    with pytest.raises(RequestError) as exc:
        outcome(env={"NVIDIA_VISIBLE_DEVICES": "0,x"})
    assert str(exc.value).startswith('env NVIDIA_VISIBLE_DEVICES="0,x": unknown device "x"')


def test_annotation_errors_name_the_key() -> None:
    with pytest.raises(RequestError) as exc:
        outcome(annotations={"nvidia.com/gpus.container.main": "0,,1"})
    assert str(exc.value).startswith('annotation "nvidia.com/gpus.container.main"="0,,1": empty entry')


# -- where the list comes from -------------------------------------------------------------------

MARKERS = (("/dev/null", f"{VOLUME_MARKER_DIR}/2"), ("/dev/null", f"{VOLUME_MARKER_DIR}/{UUID}"))
MOUNTS_ON = Policy(accept_volume_mounts=True)


def test_container_annotation_beats_pod_annotation_beats_env() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "all"}
    both = {POD_ANNOTATION: "0", CONTAINER_ANNOTATION_PREFIX + "main": "1"}
    r = request(env=env, annotations=both, mounts=MARKERS, policy=MOUNTS_ON)
    assert (r.selection, r.ids, r.source) == (
        Selection.LIST,
        (ByIndex(1),),
        'annotation "nvidia.com/gpus.container.main"',
    )
    r = request(env=env, annotations={POD_ANNOTATION: "0"}, mounts=MARKERS, policy=MOUNTS_ON)
    assert (r.ids, r.source) == ((ByIndex(0),), 'annotation "nvidia.com/gpus"')


def test_another_containers_annotation_is_not_ours() -> None:
    r = request(annotations={POD_ANNOTATION: "0", CONTAINER_ANNOTATION_PREFIX + "sidecar": "1"}, name="train")
    assert r.ids == (ByIndex(0),)
    assert outcome(annotations={CONTAINER_ANNOTATION_PREFIX + "sidecar": "1"}, name="train") == RequestOutcome(None)


def test_volume_markers_beat_env() -> None:
    r = request(env={"NVIDIA_VISIBLE_DEVICES": "all"}, mounts=MARKERS, policy=MOUNTS_ON)
    assert (r.selection, r.ids, r.source) == (Selection.LIST, (ByIndex(2), ByUuid(UUID)), "volume mounts")


def test_the_first_source_decides_even_when_it_says_void() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "all"}
    assert outcome(env=env, annotations={CONTAINER_ANNOTATION_PREFIX + "main": "void"}) == RequestOutcome(None)
    assert outcome(env=env, annotations={POD_ANNOTATION: ""}) == RequestOutcome(None)


def test_annotation_none_gives_the_driver_without_gpus() -> None:
    r = request(env={"NVIDIA_VISIBLE_DEVICES": "all"}, annotations={POD_ANNOTATION: "none"})
    assert (r.selection, r.ids) == (Selection.NONE, ())


def test_markers_are_ignored_unless_policy_accepts_them() -> None:
    r = request(env={"NVIDIA_VISIBLE_DEVICES": "0"}, mounts=MARKERS)
    assert (r.ids, r.source) == ((ByIndex(0),), "env NVIDIA_VISIBLE_DEVICES")
    assert outcome(mounts=MARKERS) == RequestOutcome(None)


def test_only_dev_null_under_the_marker_dir_counts() -> None:
    mounts = (
        ("/host/file", f"{VOLUME_MARKER_DIR}/0"),
        ("/dev/null", "/var/run/nvidia-container-devices-other/1"),
        ("/dev/null", f"{VOLUME_MARKER_DIR}/3/"),
    )
    assert request(mounts=mounts, policy=MOUNTS_ON).ids == (ByIndex(3),)


def test_marker_all_and_bad_marker() -> None:
    assert request(mounts=(("/dev/null", f"{VOLUME_MARKER_DIR}/all"),), policy=MOUNTS_ON).selection is Selection.ALL
    with pytest.raises(RequestError) as exc:
        outcome(mounts=(*MARKERS, ("/dev/null", f"{VOLUME_MARKER_DIR}/cdi/x")), policy=MOUNTS_ON)
    assert "volume mounts under /var/run/nvidia-container-devices/" in str(exc.value)
    assert '"cdi/x": CDI device names are not supported' in str(exc.value)
    # An imex/<id> marker is an IMEX channel, never a GPU (tests/unit/engine/test_fabric.py).
    imex = request(mounts=(*MARKERS, ("/dev/null", f"{VOLUME_MARKER_DIR}/imex/0")), policy=MOUNTS_ON)
    assert imex.fabric.imex_channels == (0,) and len(imex.ids) == len(MARKERS)


def test_env_naming_the_marker_dir() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": VOLUME_MARKER_DIR}
    assert request(env=env, mounts=MARKERS, policy=MOUNTS_ON).source == "volume mounts"
    empty = outcome(env=env, policy=MOUNTS_ON)
    assert empty.request is None and "markers, but there are none" in empty.notes[0]
    with pytest.raises(RequestError, match=r"policy\.accept_volume_mounts is off"):
        outcome(env=env, mounts=MARKERS)


# -- policy ---------------------------------------------------------------------------------------


def test_annotations_from_a_namespace_not_allowed_fail_loudly() -> None:
    policy = Policy(annotation_namespaces=("ml",))
    assert request(annotations={POD_ANNOTATION: "0"}, pod_namespace="ml", policy=policy).ids == (ByIndex(0),)
    key = CONTAINER_ANNOTATION_PREFIX + "main"
    with pytest.raises(RequestError) as exc:
        outcome(annotations={key: "0"}, pod_namespace="web", pod_name="shop", policy=policy)
    assert (
        '"web"' in str(exc.value) and f'"{key}"' in str(exc.value) and "policy.annotation_namespaces" in str(exc.value)
    )
    with pytest.raises(RequestError, match='namespace "ml" may not'):
        outcome(annotations={POD_ANNOTATION: "0"}, pod_namespace="ml", policy=Policy(annotation_namespaces=()))


def test_namespace_policy_does_not_touch_env() -> None:
    policy = Policy(annotation_namespaces=("ml",))
    assert request(env={"NVIDIA_VISIBLE_DEVICES": "0"}, pod_namespace="web", policy=policy).ids == (ByIndex(0),)


def test_unprivileged_env_is_ignored_when_policy_says_so() -> None:
    policy = Policy(accept_env_unprivileged=False)
    env = {"NVIDIA_VISIBLE_DEVICES": "all"}
    ignored = outcome(env=env, policy=policy)
    assert ignored.request is None
    assert ignored.notes == (
        "env NVIDIA_VISIBLE_DEVICES ignored by policy: the container is not privileged "
        "and policy.accept_env_unprivileged is off",
    )
    assert request(env=env, policy=policy, privileged=True).selection is Selection.ALL
    assert request(env=env).selection is Selection.ALL  # the toolkit's default: accepted
    assert request(env=env, annotations={POD_ANNOTATION: "1"}, policy=policy).ids == (ByIndex(1),)
    assert request(mounts=MARKERS, policy=Policy(accept_env_unprivileged=False, accept_volume_mounts=True)).ids


IN_ML = Policy(namespaces=("ml",))


def test_env_from_a_namespace_not_allowed_gets_nothing_and_says_why() -> None:
    # An nvidia/cuda image carries NVIDIA_VISIBLE_DEVICES=all: in a namespace that
    # may not have GPUs it runs without them (a log line, not a failure).
    env = {"NVIDIA_VISIBLE_DEVICES": "all"}
    ignored = outcome(env=env, pod_namespace="web", pod_name="shop", policy=IN_ML)
    assert ignored.request is None
    assert ignored.notes == (
        'env NVIDIA_VISIBLE_DEVICES ignored by policy: namespace "web" may not have GPUs (policy.namespaces: ml)',
    )
    assert request(env=env, pod_namespace="ml", policy=IN_ML).selection is Selection.ALL
    assert request(env=env, pod_namespace="web").selection is Selection.ALL  # default "*": any namespace


def test_legacy_rule_obeys_the_namespace_policy() -> None:
    policy = Policy(namespaces=("ml",), legacy_image_all_gpus=True)
    ignored = outcome(env={"CUDA_VERSION": "12.4"}, pod_namespace="web", policy=policy)
    assert ignored.request is None and "legacy CUDA image rule" in ignored.notes[0]
    assert "policy.namespaces" in ignored.notes[0]


def test_a_refused_namespace_is_not_even_parsed() -> None:
    # Whatever else the env holds, a namespace without GPUs costs nothing and fails nothing.
    env = {"NVIDIA_VISIBLE_DEVICES": "x" * 100_000, "NVIDIA_REQUIRE_CUDA": "?", "NVIDIA_DRIVER_CAPABILITIES": "gpu"}
    assert outcome(env=env, pod_namespace="web", policy=IN_ML).request is None


@pytest.mark.parametrize(
    ("where", "kw"),
    [
        ("pod annotation", {"annotations": {POD_ANNOTATION: "0"}}),
        ("container annotation", {"annotations": {CONTAINER_ANNOTATION_PREFIX + "main": "0"}}),
        ("volume mounts", {"mounts": MARKERS}),
    ],
)
def test_explicit_requests_from_a_namespace_not_allowed_fail_loudly(where: str, kw: Any) -> None:
    # An annotation or a device plugin allocation is a deliberate ask: refused, not ignored.
    policy = Policy(namespaces=("ml",), accept_volume_mounts=True)
    with pytest.raises(RequestError) as exc:
        outcome(pod_namespace="web", pod_name="shop", policy=policy, **kw)
    assert 'namespace "web" may not have GPUs (policy.namespaces: ml)' in str(exc.value), exc.value
    assert request(pod_namespace="ml", policy=policy, **kw).ids


def test_annotations_need_both_namespace_lists() -> None:
    annotations = {POD_ANNOTATION: "0"}
    policy = Policy(namespaces=("ml", "research"), annotation_namespaces=("research", "web"))
    assert request(annotations=annotations, pod_namespace="research", policy=policy).ids == (ByIndex(0),)
    with pytest.raises(RequestError, match=r"policy\.annotation_namespaces"):
        outcome(annotations=annotations, pod_namespace="ml", policy=policy)
    with pytest.raises(RequestError, match=r"policy\.namespaces"):
        outcome(annotations=annotations, pod_namespace="web", policy=policy)


def test_a_pod_without_a_namespace_passes_only_the_wildcard() -> None:
    # Pods made straight through CRI may leave the namespace empty: only "*" admits them.
    env = {"NVIDIA_VISIBLE_DEVICES": "0"}
    assert outcome(env=env, pod_namespace="", policy=IN_ML).request is None
    assert request(env=env, pod_namespace="").ids == (ByIndex(0),)


# -- legacy CUDA images -------------------------------------------------------------------------

LEGACY = {"CUDA_VERSION": "12.4.1"}


def test_legacy_image_gets_no_gpus_by_default() -> None:
    assert outcome(env=LEGACY) == RequestOutcome(None)


def test_legacy_image_gets_all_gpus_when_policy_says_so() -> None:
    r = request(env=LEGACY, policy=Policy(legacy_image_all_gpus=True))
    assert r.selection is Selection.ALL
    assert r.source.startswith("legacy CUDA image rule")
    assert r.capabilities == ALL_CAPABILITIES
    assert r.requirements == (("CUDA_VERSION", "cuda>=12.4"),)


@pytest.mark.parametrize(
    ("env", "privileged", "policy"),
    [
        ({**LEGACY, "NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}, False, Policy(legacy_image_all_gpus=True)),
        ({**LEGACY, "NVIDIA_VISIBLE_DEVICES": ""}, False, Policy(legacy_image_all_gpus=True)),
        ({**LEGACY, "NVIDIA_VISIBLE_DEVICES": "void"}, False, Policy(legacy_image_all_gpus=True)),
        ({"CUDA_VERSION": ""}, False, Policy(legacy_image_all_gpus=True)),
    ],
    ids=["not-legacy-with-require-cuda", "env-set-but-empty", "env-void", "empty-cuda-version"],
)
def test_legacy_rule_applies_only_when_nothing_names_devices(
    env: dict[str, str], privileged: bool, policy: Policy
) -> None:
    assert outcome(env=env, privileged=privileged, policy=policy) == RequestOutcome(None)


def test_legacy_rule_is_env_and_obeys_the_unprivileged_policy() -> None:
    ignored = outcome(env=LEGACY, policy=Policy(legacy_image_all_gpus=True, accept_env_unprivileged=False))
    assert ignored.request is None and "legacy CUDA image rule" in ignored.notes[0]
    assert "ignored by policy" in ignored.notes[0]


def test_legacy_image_naming_devices_gets_all_capabilities_and_implied_cuda() -> None:
    r = request(env={"CUDA_VERSION": "11.8.0", "NVIDIA_VISIBLE_DEVICES": "0"})
    assert r.capabilities == ALL_CAPABILITIES
    assert r.requirements == (("CUDA_VERSION", "cuda>=11.8"),)
    r = request(env={"CUDA_VERSION": "11.8", "NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "utility"})
    assert r.capabilities == {C.UTILITY}


@pytest.mark.parametrize("version", ["twelve", "12", "12.", ".4", "v12.4"])
def test_bad_cuda_version_of_a_legacy_image(version: str) -> None:
    with pytest.raises(RequestError) as exc:
        outcome(env={"CUDA_VERSION": version, "NVIDIA_VISIBLE_DEVICES": "0"})
    assert f'CUDA_VERSION="{version}"' in str(exc.value)


# -- capabilities ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "legacy", "expected"),
    [
        (None, False, DEFAULT_CAPABILITIES),
        ("", False, DEFAULT_CAPABILITIES),
        ("  ", False, DEFAULT_CAPABILITIES),
        (None, True, ALL_CAPABILITIES),
        ("", True, ALL_CAPABILITIES),
        ("all", False, ALL_CAPABILITIES),
        ("compute,all", False, ALL_CAPABILITIES),
        ("utility", False, {C.UTILITY}),
        ("utility", True, {C.UTILITY}),
        (" Compute , VIDEO ", False, {C.COMPUTE, C.VIDEO}),
        ("compute,,utility,", False, {C.COMPUTE, C.UTILITY}),
        (",", False, DEFAULT_CAPABILITIES),
        ("compat32,compute,display,graphics,ngx,utility,video", False, ALL_CAPABILITIES),
    ],
)
def test_capabilities(value: str | None, legacy: bool, expected: frozenset[C]) -> None:
    assert parse_capabilities(value, legacy_image=legacy) == expected


@pytest.mark.parametrize(("value", "bad"), [("compute,gpu", "gpu"), ("Compute, Gpu ", "Gpu"), ("all,cuda", "cuda")])
def test_unknown_capability_is_named_with_the_known_ones(value: str, bad: str) -> None:
    with pytest.raises(RequestError) as exc:
        parse_capabilities(value, legacy_image=False)
    message = str(exc.value)
    assert f'unknown capability "{bad}"' in message
    assert "known: compat32, compute, display, graphics, ngx, utility, video, all" in message
    assert f'NVIDIA_DRIVER_CAPABILITIES="{value}"' in message


def test_capabilities_are_capped_by_policy_with_a_note() -> None:
    policy = Policy(capabilities=frozenset({C.UTILITY, C.COMPUTE}))
    result = outcome(
        env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute,video,display"}, policy=policy
    )
    assert result.request is not None and result.request.capabilities == {C.COMPUTE}
    assert result.notes == ("capabilities capped by policy.capabilities: display, video dropped",)
    uncapped = outcome(env={"NVIDIA_VISIBLE_DEVICES": "0"}, policy=policy)
    assert uncapped.notes == ()


# -- requirements ---------------------------------------------------------------------------------

REQ = {
    "NVIDIA_VISIBLE_DEVICES": "0",
    "NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470,driver<471",
    "NVIDIA_REQUIRE_ARCH": "arch>=8.0",
    "NVIDIA_REQUIRE_JETPACK": "csv-mounts=all",
    "NVIDIA_REQUIRE_EMPTY": " ",
}


def test_requirements_are_collected_sorted_without_jetpack_or_empty_ones() -> None:
    assert request(env=REQ).requirements == (
        ("NVIDIA_REQUIRE_ARCH", "arch>=8.0"),
        ("NVIDIA_REQUIRE_CUDA", "cuda>=12.4 brand=tesla,driver>=470,driver<471"),
    )


@pytest.mark.parametrize("value", ["1", "t", "T", "TRUE", "true", "True"])
def test_disable_require_true_drops_them_with_a_note(value: str) -> None:
    result = outcome(env={**REQ, "NVIDIA_DISABLE_REQUIRE": value})
    assert result.request is not None and result.request.requirements == ()
    assert result.notes == (f"NVIDIA_REQUIRE_* not checked: the container sets NVIDIA_DISABLE_REQUIRE={value}",)


@pytest.mark.parametrize("value", ["0", "f", "F", "FALSE", "false", "False", ""])
def test_disable_require_false_keeps_them(value: str) -> None:
    result = outcome(env={**REQ, "NVIDIA_DISABLE_REQUIRE": value})
    assert result.request is not None and len(result.request.requirements) == 2 and result.notes == ()


@pytest.mark.parametrize("value", ["yes", "no", "2", "tRUE", " true", "on"])
def test_disable_require_must_be_a_go_boolean(value: str) -> None:
    with pytest.raises(RequestError) as exc:
        outcome(env={**REQ, "NVIDIA_DISABLE_REQUIRE": value})
    assert f'NVIDIA_DISABLE_REQUIRE="{value}"' in str(exc.value)


def test_policy_can_turn_requirement_checks_off() -> None:
    result = outcome(env={**REQ, "NVIDIA_DISABLE_REQUIRE": "bogus"}, policy=Policy(require_checks=False))
    assert result.request is not None and result.request.requirements == ()
    assert result.notes == ("NVIDIA_REQUIRE_* not checked: policy.require_checks is off",)
    assert outcome(env={"NVIDIA_VISIBLE_DEVICES": "0"}, policy=Policy(require_checks=False)).notes == ()


def test_disabled_legacy_requirement() -> None:
    r = request(env={"CUDA_VERSION": "12.4", "NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DISABLE_REQUIRE": "true"})
    assert r.requirements == ()


# -- the common case is cheap ---------------------------------------------------------------------


class Watched(Mapping[str, str]):
    """A mapping that records lookups and refuses to be walked."""

    def __init__(self, data: dict[str, str]) -> None:
        self.data = data
        self.looked_up: list[str] = []

    def __getitem__(self, key: str) -> str:
        self.looked_up.append(key)
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the no-request path must not walk the mapping")

    def __len__(self) -> int:
        raise AssertionError("the no-request path must not size the mapping")


def test_a_container_that_asks_for_nothing_costs_a_few_lookups() -> None:
    env = Watched({f"VAR_{i}": "x" for i in range(100)} | {"CUDA_VERSION": "12.4"})
    annotations = Watched({"team": "ml"})
    info = ContainerInfo(name="main", env=env, pod_annotations=annotations)
    assert parse_request(info, Policy()) == RequestOutcome(None)
    assert annotations.looked_up == [CONTAINER_ANNOTATION_PREFIX + "main", POD_ANNOTATION]
    assert env.looked_up == ["NVIDIA_VISIBLE_DEVICES"]


# -- hostile sizes -----------------------------------------------------------------------------------

BOMB = "1" * (4 << 20)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"env": {"NVIDIA_VISIBLE_DEVICES": BOMB}}, "env NVIDIA_VISIBLE_DEVICES"),
        (
            {"env": {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": BOMB}},
            "env NVIDIA_DRIVER_CAPABILITIES",
        ),
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=" + BOMB}}, "env NVIDIA_REQUIRE_CUDA"),
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DISABLE_REQUIRE": BOMB}}, "env NVIDIA_DISABLE_REQUIRE"),
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_VERSION": BOMB}}, "env CUDA_VERSION"),
        ({"annotations": {POD_ANNOTATION: BOMB}}, f'annotation "{POD_ANNOTATION}"'),
        ({"mounts": (("/dev/null", f"{VOLUME_MARKER_DIR}/{BOMB}"),), "policy": MOUNTS_ON}, "volume mount"),
    ],
    ids=["visible", "capabilities", "require", "disable-require", "cuda-version", "annotation", "marker"],
)
def test_a_4_mib_value_is_refused_at_once_with_a_short_message(kw: Any, named: str) -> None:
    with pytest.raises(RequestError) as exc:
        outcome(**kw)
    message = str(exc.value)  # the length bound's own message: it comes before any parsing
    assert named in message and f"longer than {MAX_VALUE_LENGTH}" in message, message[:300]
    assert len(message) < 1024


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "0," * MAX_LIST_ENTRIES + "0"}}, "env NVIDIA_VISIBLE_DEVICES"),
        ({"annotations": {POD_ANNOTATION: ",".join(["1"] * (MAX_LIST_ENTRIES + 1))}}, "annotation"),
        (
            {"env": {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute," * MAX_LIST_ENTRIES}},
            "env NVIDIA_DRIVER_CAPABILITIES",
        ),
        (
            {
                "mounts": tuple(("/dev/null", f"{VOLUME_MARKER_DIR}/{i % 4}") for i in range(MAX_LIST_ENTRIES + 1)),
                "policy": MOUNTS_ON,
            },
            "volume mounts",
        ),
    ],
    ids=["env", "annotation", "capabilities", "markers"],
)
def test_lists_with_too_many_entries_are_refused(kw: Any, named: str) -> None:
    with pytest.raises(RequestError) as exc:
        outcome(**kw)
    message = str(exc.value)
    assert named in message and f"more than {MAX_LIST_ENTRIES} entries" in message, message
    assert len(message) < 1024


def test_too_many_require_variables_are_refused() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "0"} | {f"NVIDIA_REQUIRE_V{i}": "cuda>=1" for i in range(MAX_VARIABLES + 1)}
    with pytest.raises(RequestError, match=f"more than {MAX_VARIABLES} NVIDIA_REQUIRE_"):
        outcome(env=env)
    del env["NVIDIA_REQUIRE_V0"]
    assert len(request(env=env).requirements) == MAX_VARIABLES


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("NVIDIA_REQUIRE_X\n2026-01-01 00:00:00,000 INFO plugin.handlers: forged", "\\n2026-01-01"),
        ("NVIDIA_REQUIRE_cuda", '"NVIDIA_REQUIRE_cuda"'),
        ("NVIDIA_REQUIRE_\x1b[2J", "\\x1b[2J"),
        ("NVIDIA_REQUIRE_" + "A" * 5000, "..."),
    ],
    ids=["newline", "lower-case", "escape", "long"],
)
def test_require_variable_names_outside_a_z_0_9_are_refused_and_quoted(name: str, shown: str) -> None:
    # The toolkit evaluates any name with the prefix; one with a newline would forge
    # a log line and a line of the CRI error, so it is refused, printed escaped.
    with pytest.raises(RequestError) as exc:
        outcome(env={"NVIDIA_VISIBLE_DEVICES": "0", name: "cuda>=1"})
    message = str(exc.value)
    assert shown in message and "A-Z, 0-9 and _" in message, message
    assert all(c.isprintable() for c in message) and len(message) < 1024


def test_names_and_values_within_the_bounds_still_work() -> None:
    ok = request(
        env={"NVIDIA_VISIBLE_DEVICES": ",".join(["0"] * MAX_LIST_ENTRIES), "NVIDIA_REQUIRE_CUDA_12": "cuda>=1"}
    )
    assert ok.ids == (ByIndex(0),) and ok.requirements == (("NVIDIA_REQUIRE_CUDA_12", "cuda>=1"),)
    assert request(annotations={POD_ANNOTATION: "0" + " " * (MAX_VALUE_LENGTH - 1)}).ids == (ByIndex(0),)


# -- arbitrary input -------------------------------------------------------------------------------

_GRAMMAR = st.text(alphabet="0123456789abcdefABCDEF-,:. GPUMIvoidalnex/=+", max_size=60)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=80), _GRAMMAR))
def test_any_text_parses_or_raises_request_error(value: str) -> None:
    try:
        parsed = parse_device_list(value, what=WHAT)
    except RequestError as exc:
        assert str(exc).startswith(WHAT)
        return
    if parsed is not None:
        selection, ids = parsed
        assert (selection is Selection.LIST) == bool(ids)
        assert len(ids) == len(set(ids)) <= 1024


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=40), st.text(alphabet="computilyvdeagrhsx32nAL, ", max_size=40)))
def test_any_capability_text_parses_or_raises_request_error(value: str) -> None:
    try:
        caps = parse_capabilities(value, legacy_image=False)
    except RequestError:
        return
    assert caps and caps <= ALL_CAPABILITIES


# -- MIG monitor and config grants ---------------------------------------------------------------


def test_mig_monitor_is_granted_only_to_the_namespaces_policy_lists() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_MIG_MONITOR_DEVICES": "all"}
    assert request(env, pod_namespace="kube-system").mig_monitor  # the default list
    assert not request({"NVIDIA_VISIBLE_DEVICES": "all"}, pod_namespace="kube-system").mig_monitor
    with pytest.raises(RequestError) as exc:
        outcome(env, pod_namespace="ml", pod_name="p")
    message = str(exc.value)
    assert "NVIDIA_MIG_MONITOR_DEVICES=all" in message and '"ml/p"' in message, message
    assert "policy.mig_monitor_namespaces: kube-system, gpu-operator" in message, message
    assert request(env, pod_namespace="ml", policy=Policy(mig_monitor_namespaces=None)).mig_monitor


def test_mig_config_is_refused_by_default_and_never_with_specific_mig_devices() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_MIG_CONFIG_DEVICES": "all"}
    with pytest.raises(RequestError, match=r"policy.mig_config_namespaces: none"):
        outcome(env, pod_namespace="kube-system")
    allowed = Policy(mig_config_namespaces=("mig",))
    assert request(env, pod_namespace="mig", policy=allowed).mig_config
    assert request({**env, "NVIDIA_VISIBLE_DEVICES": "0,1"}, pod_namespace="mig", policy=allowed).mig_config
    for device in (MIG_UUID, "0:1", f"MIG-{UUID}/1/0"):
        with pytest.raises(RequestError, match="would expose their sibling MIG instances"):
            outcome({**env, "NVIDIA_VISIBLE_DEVICES": f"0,{device}"}, pod_namespace="mig", policy=allowed)


@pytest.mark.parametrize("value", ["0", "none", "ALL", "all,0", "x" * 20000])
def test_mig_grants_know_only_all(value: str) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_MIG_MONITOR_DEVICES": value}
    with pytest.raises(RequestError, match=r"NVIDIA_MIG_MONITOR_DEVICES=.*only all is supported") as exc:
        outcome(env, pod_namespace="kube-system")
    assert len(str(exc.value)) < 400


def test_mig_grants_without_a_device_request_give_nothing() -> None:
    env = {"NVIDIA_MIG_MONITOR_DEVICES": "all", "NVIDIA_MIG_CONFIG_DEVICES": "all"}
    assert outcome(env, pod_namespace="ml").request is None


def test_volume_markers_carry_mig_devices_in_each_form() -> None:
    """The device plugin's volume-mounts strategy names a MIG device by its id, and
    the legacy placement has slashes in it: the marker path goes deeper."""
    mounts = tuple(("/dev/null", f"{VOLUME_MARKER_DIR}/{device}") for device in (MIG_UUID, f"MIG-{UUID}/2/0", "1:3"))
    env = {"NVIDIA_VISIBLE_DEVICES": VOLUME_MARKER_DIR}
    got = request(env, mounts=mounts, policy=Policy(accept_volume_mounts=True))
    assert got.ids == (ByMigUuid(MIG_UUID), ByMigPlacement(UUID, 2, 0), ByMigIndex(1, 3))
    assert got.source == "volume mounts"
