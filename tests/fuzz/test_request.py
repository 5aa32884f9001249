"""Fuzzing what a container asks for: ``engine.request`` (and the NRI messages that feed it).

Device lists, capabilities, the ``NVIDIA_*`` env and the annotations come from
whoever writes the pod spec or the image. For any of them, under any policy,
``parse_request`` returns an outcome or raises ``RequestError``; an outcome never
names more than ``MAX_DEVICES`` devices, never an index past the limit, never a
device twice, and never a capability the policy does not allow.

Bounds, checked on every case: the request, and the requirement check the plan
then runs on 8 GPUs, finish within ``CASE_SECONDS`` (this is the plugin's event
loop, under the runtime's 2 s deadline), and every message and note is one
printable line of at most ``MAX_MESSAGE`` characters. Hostile sizes are drawn on
purpose: values of megabytes, lists and expressions of 400k entries, dozens of
``NVIDIA_REQUIRE_*`` variables and names with control characters.
"""

from __future__ import annotations

import time
from typing import Any

from google.protobuf.message import DecodeError
from hypothesis import example, given
from hypothesis import strategies as st

from nri_gpu.engine.config import Policy
from nri_gpu.engine.errors import RequestError, RequirementError
from nri_gpu.engine.fabric import FEATURE_KINDS, MAX_IMEX_CHANNEL, plan_fabric
from nri_gpu.engine.model import Capability, DeviceNode, Fabric, Feature, Gpu
from nri_gpu.engine.request import (
    CONTAINER_ANNOTATION_PREFIX,
    MAX_DEVICES,
    POD_ANNOTATION,
    VOLUME_MARKER_DIR,
    ByIndex,
    ContainerInfo,
    RequestOutcome,
    parse_capabilities,
    parse_device_list,
    parse_request,
)
from nri_gpu.engine.request import may_request as engine_may_request
from nri_gpu.engine.requirements import MAX_MESSAGE, MAX_NOTES, NodeFacts, check
from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.request import container_info, may_request
from tests.fuzz.support import fuzz, mutated, mutated_text, typed

ENTRIES = st.one_of(
    st.sampled_from(["0", "1", "007", "1023", "1024", "all", "none", "void", "ALL", "MIG-1", "0:1", "cdi/x", "a=b"]),
    st.sampled_from(["GPU-8e9f1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b", "gpu-8E9F1A2B-3C4D-5E6F-7A8B-9C0D1E2F3A4B", "GPU-1"]),
    st.sampled_from(["0000:07:00.0", "07:00.0", "00010000:b1:1f.7", "0000:07:20.0", "imex/channel0", ""]),
    st.sampled_from(["imex/5", "imex/0", "imex/1048576", "imex/", "imex/x", "imex/2048", "imex/ 7"]),
    st.sampled_from(["MIG-8e9f1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b", "MIG-GPU-8e9f1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b/2/0"]),
    st.tuples(st.integers(0, 20), st.integers(0, 9)).map(
        lambda r: f"MIG-GPU-8e9f1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b/{r[0]}/{r[1]}"
    ),
    st.tuples(st.integers(0, 1100), st.integers(0, 1100)).map(lambda r: f"{r[0]}:{r[1]}"),
    st.tuples(st.integers(0, 1100), st.integers(0, 1100)).map(lambda r: f"{r[0]}-{r[1]}"),
    st.integers(0, 2000).map(str),
)
LISTS = st.lists(ENTRIES, max_size=6).map(lambda e: ",".join(e))
DEVICE_LISTS = st.one_of(LISTS, mutated_text(LISTS), st.text(max_size=40))
CHANNEL_LISTS = st.lists(
    st.one_of(
        st.sampled_from(["0", "5", "2047", "2048", "1048575", "1048576", "all", "none", "void", "", "0-3", "x"]),
        st.integers(0, 1 << 21).map(str),
    ),
    max_size=5,
).map(",".join)
CAPABILITIES = st.lists(
    st.one_of(st.sampled_from([c.value for c in Capability]), st.sampled_from(["all", "ALL", " compute ", "", "gpu"])),
    max_size=4,
).map(",".join)
BOOLS = st.sampled_from(["1", "t", "True", "false", "0", "yes", ""])
VERSIONS = st.sampled_from(["12.4", "12.4.1", "11", "x", "", " 9.0 ", "1" * 4400 + ".0", "0" * 5000 + "1.2"])
REQUIRES = st.sampled_from(["cuda>=12.0", "brand=tesla,driver>=470 arch>=8.0", "cuda>", "", "brand<x"])
ENV_VALUES = {
    "NVIDIA_VISIBLE_DEVICES": st.one_of(DEVICE_LISTS, st.just(VOLUME_MARKER_DIR)),
    "NVIDIA_DRIVER_CAPABILITIES": st.one_of(CAPABILITIES, mutated_text(CAPABILITIES)),
    "NVIDIA_DISABLE_REQUIRE": st.one_of(BOOLS, mutated_text(BOOLS)),
    "CUDA_VERSION": st.one_of(VERSIONS, mutated_text(VERSIONS)),
    "NVIDIA_REQUIRE_CUDA": REQUIRES,
    "NVIDIA_REQUIRE_ARCH": REQUIRES,
    "NVIDIA_REQUIRE_JETPACK": REQUIRES,
    "NVIDIA_MIG_MONITOR_DEVICES": st.one_of(
        st.sampled_from(["all", "", " all ", "none"]), mutated_text(st.just("all"))
    ),
    "NVIDIA_MIG_CONFIG_DEVICES": st.one_of(st.sampled_from(["all", "", "0"]), mutated_text(st.just("all"))),
    "NVIDIA_IMEX_CHANNELS": st.one_of(CHANNEL_LISTS, mutated_text(CHANNEL_LISTS)),
    **{
        f.env: st.one_of(st.sampled_from(["enabled", "", "true", "ENABLED"]), mutated_text(st.just("enabled")))
        for f in Feature
    },
}
# Up to 4 MB (what one NRI message can carry) and 180k entries, built by repetition (cheap to draw).
PIECES = [
    "0,",
    "all,",
    "1-1023,",
    ",",
    " ",
    "x",
    "cuda>=1 ",
    "cuda>=1,",
    "brand=tesla,driver>=1 ",
    "compute,",
    "\n",
    "é",
]
BOMBS = st.tuples(st.sampled_from(PIECES), st.sampled_from([300, 5000, 20_000, 180_000])).map(lambda t: t[0] * t[1])
NAMES = st.one_of(
    st.sampled_from(["NVIDIA_REQUIRE_X\n2026-01-01 INFO forged", "NVIDIA_REQUIRE_cuda", "NVIDIA_REQUIRE_\x1b[2J"]),
    st.text(max_size=12).map(lambda t: "NVIDIA_REQUIRE_" + t),
)


@st.composite
def hostile_envs(draw: st.DrawFn) -> dict[str, str]:
    env = draw(
        st.fixed_dictionaries({}, optional={name: st.one_of(values, BOMBS) for name, values in ENV_VALUES.items()})
    )
    for i in range(draw(st.sampled_from([0, 1, 17, 40]))):
        env[f"NVIDIA_REQUIRE_V{i}"] = draw(st.one_of(REQUIRES, BOMBS))
    env.update(draw(st.dictionaries(NAMES, st.one_of(REQUIRES, BOMBS), max_size=2)))
    return env


PLAIN_ENVS = st.fixed_dictionaries({}, optional=ENV_VALUES)
ENVS = st.one_of(PLAIN_ENVS, hostile_envs())
POLICIES = st.builds(
    Policy,
    accept_env_unprivileged=st.booleans(),
    accept_volume_mounts=st.booleans(),
    annotation_namespaces=st.one_of(st.none(), st.lists(st.sampled_from(["ml", "default", ""]), max_size=2).map(tuple)),
    capabilities=st.frozensets(st.sampled_from(list(Capability))),
    require_checks=st.booleans(),
    legacy_image_all_gpus=st.booleans(),
    mig_monitor_namespaces=st.one_of(
        st.none(), st.lists(st.sampled_from(["ml", "default", ""]), max_size=2).map(tuple)
    ),
    mig_config_namespaces=st.one_of(st.none(), st.lists(st.sampled_from(["ml", "default"]), max_size=2).map(tuple)),
    refuse_mig_mode_gpus=st.booleans(),
)
MARKERS = st.lists(
    st.tuples(
        st.sampled_from(["/dev/null", "/dev/zero"]),
        st.one_of(ENTRIES, st.text(max_size=8)).map(lambda e: f"{VOLUME_MARKER_DIR}/{e}"),
    ),
    max_size=3,
).map(tuple)
INFOS = st.builds(
    ContainerInfo,
    name=st.sampled_from(["main", "", "c"]),
    pod_name=st.text(max_size=8),
    pod_namespace=st.sampled_from(["ml", "default", ""]),
    pod_annotations=st.fixed_dictionaries(
        {},
        optional={
            POD_ANNOTATION: st.one_of(DEVICE_LISTS, BOMBS),
            CONTAINER_ANNOTATION_PREFIX + "main": DEVICE_LISTS,
        },
    ),
    env=ENVS,
    mounts=MARKERS,
    privileged=st.booleans(),
)


CASE_SECONDS = 0.25  # a refused bomb and a real request alike; the runtime's deadline is 2 s
EIGHT = [Gpu(index=i, minor=i, bus_id=f"0000:0{i}:00.0", uuid=f"GPU-{i}", model="A100", arch="8.0") for i in range(8)]
NODE = NodeFacts(cuda="12.4", driver="550.163.01")
# A node with every fabric kind and the driver's default 2048 IMEX channels.
FABRIC = Fabric(
    235,
    2048,
    tuple(DeviceNode(f"/dev/{k.value}0", 240 + i, 0, kind=k) for i, k in enumerate(FEATURE_KINDS.values())),
    (("/etc/cufile.json", "/etc/cufile.json"),),
)


def short_line(message: str) -> None:
    assert len(message) <= MAX_MESSAGE and message.isprintable(), f"{len(message)} characters: {message[:200]!r}"


def bounded(call: Any, *args: Any) -> RequestOutcome | RequestError:
    """``parse_request`` and the check the plan runs after it, timed; messages bounded."""
    began = time.perf_counter()
    got = typed(RequestError, call, *args)
    if isinstance(got, RequestOutcome) and got.request is not None:
        planned = typed(RequestError, plan_fabric, got.request.fabric, FABRIC, with_gpus=True)
        if isinstance(planned, RequestError):
            short_line(str(planned))
        else:
            assert len(planned.devices) <= len(got.request.fabric.imex_channels) + len(FABRIC.nodes)
        checked = typed(RequirementError, check, got.request.requirements, NODE, EIGHT)
        if isinstance(checked, RequirementError):
            short_line(str(checked))
        else:
            assert len(checked) <= MAX_NOTES
            for note in checked:
                short_line(note)
    seconds = time.perf_counter() - began
    assert seconds < CASE_SECONDS, f"{seconds:.3f} s"
    if isinstance(got, RequestError):
        short_line(str(got))
    else:
        for note in got.notes:
            short_line(note)
    return got


def check_outcome(outcome: RequestOutcome | RequestError, policy: Policy) -> None:
    if isinstance(outcome, RequestError):
        return
    assert all(isinstance(note, str) for note in outcome.notes)
    request = outcome.request
    if request is None:
        return
    assert len(request.ids) <= MAX_DEVICES
    assert len(set(request.ids)) == len(request.ids), "a device named twice"
    assert all(0 <= d.index < MAX_DEVICES for d in request.ids if isinstance(d, ByIndex))
    assert request.capabilities <= policy.capabilities
    channels = request.fabric.imex_channels
    assert len(set(channels)) == len(channels) <= 256, "a channel named twice, or too many"
    assert all(0 <= c <= MAX_IMEX_CHANNEL for c in channels)
    assert bool(channels) == bool(request.fabric.imex_source)


@fuzz(200)
@given(value=DEVICE_LISTS)
@example(value="0-1023,1023-1023")
@example(value="0-1024")
@example(value="1" * 5000)
@example(value="0" * 5000 + "1-2")
def test_device_lists(value: str) -> None:
    began = time.perf_counter()
    got = typed(RequestError, parse_device_list, value, what="env")
    assert time.perf_counter() - began < CASE_SECONDS
    if isinstance(got, RequestError):
        short_line(str(got))
    if got is not None and not isinstance(got, RequestError):
        assert len(got[1]) <= MAX_DEVICES


@fuzz(150)
@given(value=st.one_of(st.none(), CAPABILITIES, mutated_text(CAPABILITIES), st.text(max_size=20)), legacy=st.booleans())
def test_capabilities(value: str | None, legacy: bool) -> None:
    got = typed(RequestError, parse_capabilities, value, legacy_image=legacy)
    assert isinstance(got, RequestError | frozenset)


@fuzz(200)
@given(info=INFOS, policy=POLICIES)
# Found by this test: int() of a CUDA_VERSION over 4300 digits raised ValueError.
@example(
    info=ContainerInfo(name="main", pod_annotations={POD_ANNOTATION: "0"}, env={"CUDA_VERSION": "1" * 4400 + ".0"}),
    policy=Policy(),
)
@example(
    info=ContainerInfo(
        name="main", env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=99.0 " * 400_000}
    ),
    policy=Policy(),
)
@example(
    info=ContainerInfo(name="main", env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_X\nINFO forged": "cuda>=1"}),
    policy=Policy(),
)
def test_parse_request(info: ContainerInfo, policy: Policy) -> None:
    check_outcome(bounded(parse_request, info, policy), policy)


@fuzz(300)
@given(
    info=INFOS,
    policy=POLICIES,
    noise=st.lists(
        st.sampled_from(["PATH=/bin", "NVIDIA_VISIBLE_DEVICESX=0", "nvidia_visible_devices=0", "CUDA_VERSIONS=1"]),
        max_size=2,
    ),
)
@example(
    info=ContainerInfo(name="main", env={"CUDA_VERSION": "12.4"}), policy=Policy(legacy_image_all_gpus=True), noise=[]
)
@example(
    info=ContainerInfo(name="main", mounts=(("/dev/null", f"{VOLUME_MARKER_DIR}/0"),)),
    policy=Policy(accept_volume_mounts=True),
    noise=[],
)
def test_the_pre_filter_never_hides_a_request(info: ContainerInfo, policy: Policy, noise: list[str]) -> None:
    """Whenever the hot path's pre-filter says no, the parser finds nothing: no
    request, no note, no error. (A drift between the two would silently drop GPU
    requests: the pre-filter runs first and skips the parser.)"""
    env = [*noise, *(f"{key}={value}" for key, value in info.env.items())]
    destinations = ["/etc/hosts", *(destination for _, destination in info.mounts)]
    if engine_may_request(info.pod_annotations, info.name, env, destinations, policy):
        return
    assert bounded(parse_request, info, policy) == RequestOutcome(None)


@st.composite
def create_requests(draw: st.DrawFn, envs: st.SearchStrategy[dict[str, str]] = ENVS) -> bytes:
    env = draw(envs)
    pod = api.PodSandbox(name="p", namespace=draw(st.sampled_from(["ml", "default"])))
    for key, value in draw(st.fixed_dictionaries({}, optional={POD_ANNOTATION: DEVICE_LISTS})).items():
        pod.annotations[key] = value
    container = api.Container(name="main", env=[f"{k}={v}" for k, v in env.items()])
    for source, destination in draw(MARKERS):
        container.mounts.add(source=source, destination=destination)
    return api.CreateContainerRequest(pod=pod, container=container).SerializeToString()


@fuzz(200)
# Byte mutations of megabyte payloads cost seconds: they mutate plain ones.
@given(payload=st.one_of(create_requests(), mutated(create_requests(PLAIN_ENVS))), policy=POLICIES)
def test_nri_create_container_to_request(payload: bytes, policy: Policy) -> None:
    message = api.CreateContainerRequest()
    try:
        message.ParseFromString(payload)
    except DecodeError:
        return  # the stub answers INVALID_ARGUMENT (tests/fuzz/test_stub.py)
    began = time.perf_counter()
    try:
        info = container_info(message.pod, message.container)
    except RequestError as exc:
        short_line(str(exc))
        return
    check_outcome(bounded(parse_request, info, policy), policy)
    assert time.perf_counter() - began < CASE_SECONDS


@fuzz(20)
@given(
    count=st.sampled_from([0, 1000, 65_536, 65_537, 800_000]),
    where=st.sampled_from(["first", "last", "nowhere"]),
    policy=POLICIES,
)
def test_a_huge_env_list_is_bounded(count: int, where: str, policy: Policy) -> None:
    asks = ["NVIDIA_VISIBLE_DEVICES=all"]
    env = (asks if where == "first" else []) + ["A=1"] * count + (asks if where == "last" else [])
    message = api.Container(name="main", env=env)
    container = api.Container()
    container.ParseFromString(message.SerializeToString())
    pod = api.PodSandbox(name="p", namespace="ml")
    began = time.perf_counter()
    if may_request(pod, container, policy):
        try:
            bounded(parse_request, container_info(pod, container), policy)
        except RequestError as exc:
            short_line(str(exc))
    else:
        assert where == "nowhere"
    assert time.perf_counter() - began < CASE_SECONDS
