"""Our hand-written ``nri.proto`` against the upstream NRI schema Debian ships.

``plugin/_proto/nri.proto`` is written from the tables of our protocol notes, not
copied. This suite checks it against the real thing: it downloads Debian's
``golang-github-containerd-nri-dev`` (trixie: NRI 0.6.1, the version containerd
1.7.24 speaks; sid: 0.8.0) at test time - nothing of it is committed - compiles the
``pkg/api/api.proto`` it contains and ours with the pinned protoc into descriptor
sets, and compares them:

* every upstream message, field, enum value, service and method exists in ours
  (upstream 0.6.1 and 0.8.0 are subsets of the v0.12 schema we cover);
* every field present in both (same message full name, same field name) has the
  same number, label and type, message/enum types compared by name within the
  package;
* every enum value present in both has the same number;
* every method present in both has the same request and reply types.

All differences are reported together in one assertion message. The test skips
(with the reason) only when the package cannot be downloaded.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
OUR_PROTO = ROOT / "plugin" / "_proto" / "nri.proto"
PACKAGE = "golang-github-containerd-nri-dev"
# Where the Go source tree of the package puts the schema, below the extracted root.
UPSTREAM_REL = "github.com/containerd/nri/pkg/api/api.proto"

# NRI 0.6.1-2 in trixie, 0.8.0-1 in sid when written. Not pinned: when sid moves
# on, this suite is what tells us the newer schema still agrees with ours.
SUITES = ["trixie", "sid"]

_FieldType = descriptor_pb2.FieldDescriptorProto

# Enum values whose number depends on the NRI version, by design: they must exist in
# ours, but their number is ours (v0.12). Event.LAST is "one past the highest event":
# 12 up to v0.9.0, 14 in v0.9.1-pre, 15 from v0.10.
VERSIONED_ENUM_VALUES = {("nri.pkg.api.v1alpha1.Event", "LAST")}


# --------------------------------------------------------------------------
# Compiling
# --------------------------------------------------------------------------


def _protoc(include_dirs: list[Path], proto: Path, out: Path) -> descriptor_pb2.FileDescriptorSet:
    """Compile ``proto`` (found under one of ``include_dirs``) to a descriptor set."""
    import grpc_tools  # the pinned protoc; a test dependency

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [sys.executable, "-m", "grpc_tools.protoc"]
    args += [f"-I{d}" for d in include_dirs]
    args += [f"-I{well_known}", f"--descriptor_set_out={out}", "--include_imports", str(proto)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"protoc failed on {proto.name}:\n{proc.stderr}"
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(out.read_bytes())
    return fds


_IMPORT_RE = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;\s*$', re.M)
# Custom (extension) options: `option (x.y) = ...;` lines and `[(x.y) = ..., ...]`
# field options. Upstream has used gogoproto options in some releases.
_CUSTOM_OPTION_LINE_RE = re.compile(r"^\s*option\s+\([^)]*\)[^;]*;\s*$", re.M)
_CUSTOM_FIELD_OPTIONS_RE = re.compile(r"\s*\[\s*\([^\]]*\]")


def _standalone_copy(upstream: Path, include_dirs: list[Path], tmp: Path) -> Path:
    """Copy the upstream schema, dropping imports protoc cannot resolve here.

    The Debian package ships ``api.proto`` without the protos of its build-time
    plugins. Should a release import one (gogoproto, say), the import and every
    custom option it provides are stripped from a temporary copy: they change the
    generated Go code, never the wire schema we compare. The 0.6.1 and 0.8.0
    schemas import nothing, so today this copies the file unchanged.
    """
    text = upstream.read_text()

    def resolvable(name: str) -> bool:
        return name.startswith("google/protobuf/") or any((d / name).is_file() for d in include_dirs)

    missing = [m.group(1) for m in _IMPORT_RE.finditer(text) if not resolvable(m.group(1))]
    if missing:
        text = _IMPORT_RE.sub(lambda m: "" if m.group(1) in missing else m.group(0), text)
        text = _CUSTOM_OPTION_LINE_RE.sub("", text)
        text = _CUSTOM_FIELD_OPTIONS_RE.sub("", text)
    copy = tmp / "upstream" / "api.proto"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(text)
    return copy


# --------------------------------------------------------------------------
# Indexing a descriptor set by full name
# --------------------------------------------------------------------------


@dataclass
class Schema:
    messages: dict[str, descriptor_pb2.DescriptorProto] = field(default_factory=dict)
    enums: dict[str, descriptor_pb2.EnumDescriptorProto] = field(default_factory=dict)
    services: dict[str, descriptor_pb2.ServiceDescriptorProto] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=dict)  # full name -> its file's package


def _index(fds: descriptor_pb2.FileDescriptorSet, only_file: str) -> Schema:
    schema = Schema()
    for fd in fds.file:
        if fd.name != only_file:  # imported well-known protos are not compared
            continue
        prefix = f"{fd.package}." if fd.package else ""

        def walk(msgs: Iterable[descriptor_pb2.DescriptorProto], scope: str, package: str) -> None:
            for msg in msgs:
                name = f"{scope}{msg.name}"
                schema.messages[name] = msg
                schema.packages[name] = package
                for enum in msg.enum_type:
                    schema.enums[f"{name}.{enum.name}"] = enum
                walk(msg.nested_type, f"{name}.", package)

        walk(fd.message_type, prefix, fd.package)
        for enum in fd.enum_type:
            schema.enums[f"{prefix}{enum.name}"] = enum
        for svc in fd.service:
            schema.services[f"{prefix}{svc.name}"] = svc
    return schema


def _type_ref(type_name: str, package: str) -> str:
    """A message/enum reference by its name within the package."""
    name = type_name.lstrip(".")
    return name[len(package) + 1 :] if package and name.startswith(package + ".") else name


def _describe(f: descriptor_pb2.FieldDescriptorProto, package: str) -> str:
    label = _FieldType.Label.Name(f.label).removeprefix("LABEL_").lower()
    kind = _FieldType.Type.Name(f.type).removeprefix("TYPE_").lower()
    ref = f" {_type_ref(f.type_name, package)}" if f.type_name else ""
    return f"#{f.number} {label} {kind}{ref}"


# --------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------


def compare(upstream: Schema, ours: Schema) -> list[str]:
    """Every difference that matters, as readable lines; empty when conformant."""
    problems: list[str] = []

    for name, up_msg in sorted(upstream.messages.items()):
        our_msg = ours.messages.get(name)
        if our_msg is None:
            problems.append(f"message {name}: missing in ours")
            continue
        up_pkg, our_pkg = upstream.packages[name], ours.packages[name]
        our_fields = {f.name: f for f in our_msg.field}
        for up_f in up_msg.field:
            our_f = our_fields.get(up_f.name)
            if our_f is None:
                problems.append(f"field {name}.{up_f.name} ({_describe(up_f, up_pkg)}): missing in ours")
                continue
            up_d, our_d = _describe(up_f, up_pkg), _describe(our_f, our_pkg)
            if up_d != our_d:
                problems.append(f"field {name}.{up_f.name}: upstream {up_d}, ours {our_d}")
        up_map = up_msg.options.map_entry
        if up_map != our_msg.options.map_entry:
            problems.append(f"message {name}: map_entry upstream {up_map}, ours {our_msg.options.map_entry}")

    for name, up_enum in sorted(upstream.enums.items()):
        our_enum = ours.enums.get(name)
        if our_enum is None:
            problems.append(f"enum {name}: missing in ours")
            continue
        our_values = {v.name: v.number for v in our_enum.value}
        for v in up_enum.value:
            if v.name not in our_values:
                problems.append(f"enum value {name}.{v.name} (= {v.number}): missing in ours")
            elif our_values[v.name] != v.number and (name, v.name) not in VERSIONED_ENUM_VALUES:
                problems.append(f"enum value {name}.{v.name}: upstream {v.number}, ours {our_values[v.name]}")

    for name, up_svc in sorted(upstream.services.items()):
        our_svc = ours.services.get(name)
        if our_svc is None:
            problems.append(f"service {name}: missing in ours")
            continue
        our_methods = {m.name: m for m in our_svc.method}
        pkg = name.rpartition(".")[0]
        for up_m in up_svc.method:
            our_m = our_methods.get(up_m.name)
            if our_m is None:
                problems.append(f"method {name}/{up_m.name}: missing in ours")
                continue
            for what in ("input_type", "output_type"):
                up_t = _type_ref(getattr(up_m, what), pkg)
                our_t = _type_ref(getattr(our_m, what), pkg)
                if up_t != our_t:
                    problems.append(f"method {name}/{up_m.name} {what}: upstream {up_t}, ours {our_t}")
            if (up_m.client_streaming, up_m.server_streaming) != (our_m.client_streaming, our_m.server_streaming):
                problems.append(f"method {name}/{up_m.name}: streaming differs")
    return problems


# --------------------------------------------------------------------------
# Fixtures and tests
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nri-schema")


@pytest.fixture(scope="module")
def our_schema(workdir: Path) -> Schema:
    fds = _protoc([OUR_PROTO.parent], OUR_PROTO, workdir / "ours.pb")
    return _index(fds, OUR_PROTO.name)


def _upstream_proto(suite: str) -> Path:
    """Download and unpack the Debian package; skip when that is impossible."""
    from testbed import debs

    try:
        root = debs.extract(PACKAGE, suite)
    except debs.DebUnavailable as exc:  # no network / mirror unreachable: the only reason to skip
        pytest.skip(f"cannot download {PACKAGE} from Debian {suite}: {exc}")
    found = sorted(root.rglob(UPSTREAM_REL))
    assert found, f"{PACKAGE} ({suite}) unpacked to {root} has no {UPSTREAM_REL}"
    return found[0]


@pytest.mark.parametrize("suite", SUITES)
def test_our_schema_matches_upstream(suite: str, our_schema: Schema, workdir: Path) -> None:
    upstream = _upstream_proto(suite)
    tmp = workdir / suite
    tmp.mkdir()
    include_dirs = [upstream.parent]
    copy = _standalone_copy(upstream, include_dirs, tmp)
    up_schema = _index(_protoc([copy.parent], copy, tmp / "upstream.pb"), copy.name)

    # Guard against a vacuous pass (wrong file, empty parse).
    assert "nri.pkg.api.v1alpha1.RegisterPluginRequest" in up_schema.messages, sorted(up_schema.messages)
    assert "nri.pkg.api.v1alpha1.Plugin" in up_schema.services

    problems = compare(up_schema, our_schema)
    assert not problems, (
        f"plugin/_proto/nri.proto disagrees with upstream NRI from Debian {suite} "
        f"({len(problems)} problems):\n  " + "\n  ".join(problems)
    )


def test_compare_reports_every_kind_of_difference(our_schema: Schema) -> None:
    """The comparison itself: a doctored copy of our schema must be caught."""
    fds = descriptor_pb2.FileDescriptorSet()
    fd = fds.file.add(name="x.proto", package="nri.pkg.api.v1alpha1", syntax="proto3")
    cfg = fd.message_type.add(name="ConfigureResponse")
    cfg.field.add(name="events", number=1, type=_FieldType.TYPE_INT32, label=_FieldType.LABEL_OPTIONAL)
    dev = fd.message_type.add(name="LinuxDevice")
    dev.field.add(
        name="file_mode",
        number=5,
        type=_FieldType.TYPE_MESSAGE,
        type_name=".nri.pkg.api.v1alpha1.OptionalUInt32",
        label=_FieldType.LABEL_OPTIONAL,
    )
    dev.field.add(name="vendor_only", number=99, type=_FieldType.TYPE_STRING, label=_FieldType.LABEL_OPTIONAL)
    fd.message_type.add(name="NotOurs")
    ev = fd.enum_type.add(name="Event")
    ev.value.add(name="UNKNOWN", number=0)
    ev.value.add(name="CREATE_CONTAINER", number=5)
    svc = fd.service.add(name="Plugin")
    svc.method.add(
        name="Frobnicate", input_type=".nri.pkg.api.v1alpha1.Empty", output_type=".nri.pkg.api.v1alpha1.Empty"
    )
    svc.method.add(
        name="Configure",
        input_type=".nri.pkg.api.v1alpha1.ConfigureRequest",
        output_type=".nri.pkg.api.v1alpha1.Empty",
    )
    doctored = _index(fds, "x.proto")

    problems = compare(doctored, our_schema)
    joined = "\n".join(problems)
    assert "ConfigureResponse.events: upstream #1 optional int32, ours #2 optional int32" in joined
    assert (
        "LinuxDevice.file_mode: upstream #5 optional message OptionalUInt32, ours #5 optional message OptionalFileMode"
        in joined
    )
    assert "LinuxDevice.vendor_only (#99 optional string): missing in ours" in joined
    assert "message nri.pkg.api.v1alpha1.NotOurs: missing in ours" in joined
    assert "Event.CREATE_CONTAINER: upstream 5, ours 4" in joined
    assert "Plugin/Frobnicate: missing in ours" in joined
    assert "Plugin/Configure output_type: upstream Empty, ours ConfigureResponse" in joined
    assert len(problems) == 7, joined


def test_standalone_copy_strips_unshipped_imports(tmp_path: Path) -> None:
    """An upstream schema importing gogoproto (not shipped) still compiles."""
    src = tmp_path / "src" / "api.proto"
    src.parent.mkdir()
    src.write_text(
        'syntax = "proto3";\n'
        "package nri.pkg.api.v1alpha1;\n"
        'import "github.com/gogo/protobuf/gogoproto/gogo.proto";\n'
        'import "google/protobuf/empty.proto";\n'
        "option (gogoproto.marshaler_all) = true;\n"
        'option go_package = "example/api";\n'
        "message KeyValue {\n"
        '  string key = 1 [(gogoproto.moretags) = "x", (gogoproto.nullable) = false];\n'
        "  string value = 2;\n"
        "}\n"
    )
    copy = _standalone_copy(src, [src.parent], tmp_path / "work")
    text = copy.read_text()
    assert "gogo" not in text
    assert 'import "google/protobuf/empty.proto";' in text
    assert 'option go_package = "example/api";' in text
    schema = _index(_protoc([copy.parent], copy, tmp_path / "out.pb"), copy.name)
    assert [f.name for f in schema.messages["nri.pkg.api.v1alpha1.KeyValue"].field] == ["key", "value"]


def test_skips_only_when_the_mirror_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed import debs

    def offline(package: str, suite: str) -> Path:
        raise debs.DebUnavailable("mirror unreachable")

    def broken(package: str, suite: str) -> Path:
        raise debs.DebError("no such version")

    monkeypatch.setattr(debs, "extract", offline)
    with pytest.raises(pytest.skip.Exception, match=f"cannot download {PACKAGE} from Debian sid"):
        _upstream_proto("sid")
    monkeypatch.setattr(debs, "extract", broken)
    with pytest.raises(debs.DebError, match="no such version"):
        _upstream_proto("sid")
