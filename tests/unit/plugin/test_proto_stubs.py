"""The committed NRI protobuf stubs: fresh, and byte-exact on the wire.

The golden bytes are the worked examples of the protocol notes (section 13); they
were produced independently of our schema, so a wrong field number or type in
``plugin/_proto/nri.proto`` shows up here even without the conformance suite.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from nri_gpu.plugin._proto import nri_pb2

ROOT = Path(__file__).resolve().parents[3]


def test_committed_stubs_are_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen-proto"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"hack/gen-proto --check failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize("stub", sorted((ROOT / "plugin" / "_proto").glob("*_pb2.pyi")), ids=lambda p: p.name)
def test_type_stubs_are_valid_python(stub: Path) -> None:
    # Regression: protoc wrote Field's enum value None as `None: _ClassVar[Field]`, a
    # syntax error that stops mypy; hack/gen-proto comments such lines out.
    ast.parse(stub.read_text(), filename=stub.name)


@pytest.mark.parametrize(
    ("message", "wire"),
    [
        pytest.param(
            nri_pb2.RegisterPluginRequest(plugin_name="devinj", plugin_idx="10"),
            b"\n\x06devinj\x12\x0210",
            id="register-plugin-request",
        ),
        pytest.param(
            # CreateContainer | RemoveContainer; events is field 2, not 1.
            nri_pb2.ConfigureResponse(events=0x408),
            bytes([0x10, 0x88, 0x08]),
            id="configure-response-events-0x408",
        ),
        pytest.param(
            nri_pb2.LinuxDevice(
                path="/dev/null",
                type="c",
                major=1,
                minor=3,
                file_mode=nri_pb2.OptionalFileMode(value=0o666),
            ),
            b"\x0a\x09/dev/null\x12\x01c\x18\x01\x20\x03\x2a\x03\x08\xb6\x03",
            id="linux-device-dev-null",
        ),
    ],
)
def test_golden_wire_bytes(message: object, wire: bytes) -> None:
    assert message.SerializeToString() == wire  # type: ignore[attr-defined]
    parsed = type(message)()
    parsed.ParseFromString(wire)  # type: ignore[attr-defined]
    assert parsed == message


def test_zero_optional_wrapper_keeps_presence() -> None:
    device = nri_pb2.LinuxDevice(path="/dev/x", uid=nri_pb2.OptionalUInt32(value=0))
    wire = device.SerializeToString()
    # Field 6 (uid), length-delimited, empty: the wrapper itself says "set to 0".
    assert wire.endswith(b"\x32\x00")
    parsed = nri_pb2.LinuxDevice.FromString(wire)
    assert parsed.HasField("uid")
    assert parsed.uid.value == 0
    assert not parsed.HasField("gid")


def test_zero_memory_limit_keeps_presence() -> None:
    memory = nri_pb2.LinuxMemory(limit=nri_pb2.OptionalInt64(value=0))
    assert memory.SerializeToString() == b"\x0a\x00"
    assert nri_pb2.LinuxMemory.FromString(b"\x0a\x00").HasField("limit")


def test_io_priority_class_field_is_reachable() -> None:
    # `class` is a Python keyword: attribute syntax cannot name it.
    prio = nri_pb2.LinuxIOPriority(**{"class": nri_pb2.IOPRIO_CLASS_BE}, priority=4)
    assert getattr(prio, "class") == nri_pb2.IOPRIO_CLASS_BE
    assert prio.SerializeToString() == b"\x08\x02\x10\x04"
    setattr(prio, "class", nri_pb2.IOPRIO_CLASS_IDLE)
    assert getattr(prio, "class") == 3
    prio.ClearField("class")
    assert getattr(prio, "class") == nri_pb2.IOPRIO_CLASS_NONE


def test_field_enum_none_value_by_name() -> None:
    # Value 0 of enum Field is named None, which Python cannot spell as an attribute.
    assert nri_pb2.Field.Value("None") == 0
    assert nri_pb2.Field.Name(40) == "MemoryPolicy"


def test_services_and_package_names() -> None:
    fd = nri_pb2.DESCRIPTOR
    assert fd.package == "nri.pkg.api.v1alpha1"
    # nri.proto stands alone: generated modules register as top-level names, so an
    # import of ttrpc.proto would not resolve from the package.
    assert [dep.name for dep in fd.dependencies] == []
    assert fd.services_by_name["Runtime"].full_name == "nri.pkg.api.v1alpha1.Runtime"
    plugin = fd.services_by_name["Plugin"]
    assert plugin.full_name == "nri.pkg.api.v1alpha1.Plugin"
    assert plugin.methods_by_name["StateChange"].input_type.name == "StateChangeEvent"
    assert len(plugin.methods) == 18
