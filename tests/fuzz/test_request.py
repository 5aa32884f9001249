"""Fuzzing what a container asks for: ``engine.request`` (and the NRI messages that feed it).

Device lists, capabilities, the ``NVIDIA_*`` env and the annotations come from
whoever writes the pod spec or the image. For any of them, under any policy,
``parse_request`` returns an outcome or raises ``RequestError``; an outcome never
names more than ``MAX_DEVICES`` devices, never an index past the limit, never a
device twice, and never a capability the policy does not allow.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from hypothesis import example, given
from hypothesis import strategies as st

from engine.config import Policy
from engine.errors import RequestError
from engine.model import Capability
from engine.request import (
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
from plugin._proto import nri_pb2 as api
from plugin.request import container_info
from tests.fuzz.support import fuzz, mutated, mutated_text, typed

ENTRIES = st.one_of(
    st.sampled_from(["0", "1", "007", "1023", "1024", "all", "none", "void", "ALL", "MIG-1", "0:1", "cdi/x", "a=b"]),
    st.sampled_from(["GPU-8e9f1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b", "gpu-8E9F1A2B-3C4D-5E6F-7A8B-9C0D1E2F3A4B", "GPU-1"]),
    st.sampled_from(["0000:07:00.0", "07:00.0", "00010000:b1:1f.7", "0000:07:20.0", "imex/channel0", ""]),
    st.tuples(st.integers(0, 1100), st.integers(0, 1100)).map(lambda r: f"{r[0]}-{r[1]}"),
    st.integers(0, 2000).map(str),
)
LISTS = st.lists(ENTRIES, max_size=6).map(lambda e: ",".join(e))
DEVICE_LISTS = st.one_of(LISTS, mutated_text(LISTS), st.text(max_size=40))
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
}
ENVS = st.fixed_dictionaries({}, optional=ENV_VALUES)
POLICIES = st.builds(
    Policy,
    accept_env_unprivileged=st.booleans(),
    accept_volume_mounts=st.booleans(),
    annotation_namespaces=st.one_of(st.none(), st.lists(st.sampled_from(["ml", "default", ""]), max_size=2).map(tuple)),
    capabilities=st.frozensets(st.sampled_from(list(Capability))),
    require_checks=st.booleans(),
    legacy_image_all_gpus=st.booleans(),
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
        {}, optional={POD_ANNOTATION: DEVICE_LISTS, CONTAINER_ANNOTATION_PREFIX + "main": DEVICE_LISTS}
    ),
    env=ENVS,
    mounts=MARKERS,
    privileged=st.booleans(),
)


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


@fuzz(200)
@given(value=DEVICE_LISTS)
@example(value="0-1023,1023-1023")
@example(value="0-1024")
@example(value="1" * 5000)
@example(value="0" * 5000 + "1-2")
def test_device_lists(value: str) -> None:
    got = typed(RequestError, parse_device_list, value, what="env")
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
def test_parse_request(info: ContainerInfo, policy: Policy) -> None:
    check_outcome(typed(RequestError, parse_request, info, policy), policy)


@st.composite
def create_requests(draw: st.DrawFn) -> bytes:
    env = draw(ENVS)
    pod = api.PodSandbox(name="p", namespace=draw(st.sampled_from(["ml", "default"])))
    for key, value in draw(st.fixed_dictionaries({}, optional={POD_ANNOTATION: DEVICE_LISTS})).items():
        pod.annotations[key] = value
    container = api.Container(name="main", env=[f"{k}={v}" for k, v in env.items()])
    for source, destination in draw(MARKERS):
        container.mounts.add(source=source, destination=destination)
    return api.CreateContainerRequest(pod=pod, container=container).SerializeToString()


@fuzz(200)
@given(payload=st.one_of(create_requests(), mutated(create_requests())), policy=POLICIES)
def test_nri_create_container_to_request(payload: bytes, policy: Policy) -> None:
    message = api.CreateContainerRequest()
    try:
        message.ParseFromString(payload)
    except DecodeError:
        return  # the stub answers INVALID_ARGUMENT (tests/fuzz/test_stub.py)
    info = container_info(message.pod, message.container)
    check_outcome(typed(RequestError, parse_request, info, policy), policy)
