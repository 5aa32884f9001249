"""deploy/: what can be checked without a Docker engine, a Kubernetes cluster or helm.

* deploy/Dockerfile states the same facts as the image tests/testbed/plugin_image.py builds
  (hack/build-image): Debian suites, .debs, what is left out, wheels, paths, environment,
  entrypoint, user. Each test reads both, so either drifting fails it.
* The plain manifests parse; the DaemonSet's args are flags ``nri-gpu run`` accepts; its
  ConfigMap's config.toml loads with the plugin's own loader and agrees with the pod's
  mounts, probes and port.
* The Helm chart, rendered by tests/helm_render.py (no helm in Debian), gives exactly the
  plain manifests' objects with its default values, and its values reach the config file.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.config import Policy, policy_from_mapping
from plugin import node_setup
from plugin.__main__ import build_parser
from plugin.config import Settings, from_toml, parse_address
from plugin.config_doc import OPTIONS
from plugin.logfmt import DEFAULT_LOG_FORMAT, DEFAULT_LOG_LEVEL, LOG_FORMATS, LOG_LEVELS
from tests.helm_render import TemplateError, load_chart, render_chart
from tests.testbed import images, plugin_image

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "nri-gpu"
PLAIN = ("namespace.yaml", "configmap.yaml", "daemonset.yaml")
CONFIG_FLAG = "--config="


# --------------------------------------------------------------------------- Dockerfile


@dataclass(frozen=True)
class Instruction:
    op: str
    value: str
    stage: str  # the stage's AS name, "final" for the last, "" before the first FROM


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined (as the builder joins them) and
    comment lines dropped."""
    logical: list[str] = []
    current = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        current += line
        if current.strip():
            logical.append(current.strip())
        current = ""
    froms = [i for i, line in enumerate(logical) if line.split()[0].upper() == "FROM"]
    result, stage = [], ""
    for i, line in enumerate(logical):
        op, _, value = line.partition(" ")
        if op.upper() == "FROM":
            words = value.split()
            stage = "final" if i == froms[-1] else words[words.index("AS") + 1] if "AS" in words else str(i)
        result.append(Instruction(op.upper(), value.strip(), stage))
    return result


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return parse_dockerfile((DEPLOY / "Dockerfile").read_text())


def _args(instructions: list[Instruction], stage: str) -> dict[str, str]:
    found = {}
    for ins in instructions:
        if ins.op == "ARG" and ins.stage == stage:
            key, _, value = shlex.split(ins.value)[0].partition("=")
            found[key] = value
    return found


def _stage(instructions: list[Instruction], stage: str) -> list[Instruction]:
    return [i for i in instructions if i.stage == stage]


def _run_text(instructions: list[Instruction], stage: str) -> str:
    return "\n".join(i.value for i in _stage(instructions, stage) if i.op == "RUN")


def test_dockerfile_uses_the_image_builders_debian_suites(dockerfile: list[Instruction]) -> None:
    suites = _args(dockerfile, "")
    assert suites["SUITE"] == plugin_image._SUITE
    assert {suite for _, suite, _ in plugin_image._PYTHON_DEBS} == {plugin_image._SUITE}
    assert {suite for _, suite, _ in images._LIBC_DEBS} == {plugin_image._SUITE}
    busybox_package, busybox_suite, _ = images._BUSYBOX_DEB
    assert suites["BUSYBOX_SUITE"] == busybox_suite
    froms = {i.stage: i.value for i in dockerfile if i.op == "FROM"}
    assert froms["rootfs"] == "debian:${SUITE}-slim AS rootfs"
    assert froms["busybox"] == "debian:${BUSYBOX_SUITE}-slim AS busybox"
    assert f"apt-get download {busybox_package};" in _run_text(dockerfile, "busybox")
    assert froms["final"] == "scratch"


def test_dockerfile_unpacks_the_same_debs(dockerfile: list[Instruction]) -> None:
    args = _args(dockerfile, "rootfs")
    assert args["PYTHON_DEBS"].split() == [name for name, _, _ in plugin_image._PYTHON_DEBS]
    assert args["LIBC_DEBS"].split() == [name for name, _, _ in images._LIBC_DEBS]
    run = _run_text(dockerfile, "rootfs")
    assert "apt-get download $LIBC_DEBS $PYTHON_DEBS;" in run
    assert 'dpkg -x "$deb" /rootfs;' in run


def test_dockerfile_leaves_out_what_the_image_builder_leaves_out(dockerfile: list[Instruction]) -> None:
    args = _args(dockerfile, "rootfs")
    assert args["SKIP"].split() == [prefix.rstrip("/") for prefix in plugin_image._SKIP_PREFIXES]
    assert tuple(args["SKIP_DYNLOAD"].split()) == plugin_image._SKIP_NAMES
    assert f'rm -f {plugin_image._STDLIB}lib-dynload/"$name"*;' in _run_text(dockerfile, "rootfs")


def test_dockerfile_takes_the_wheels_the_image_builder_pins(dockerfile: list[Instruction]) -> None:
    pins = plugin_image.wheel_pins()
    assert tuple(pins) == plugin_image.WHEELS
    # The pins are what the tests run against (hack/build-image --pin-wheels writes them),
    # inside what pyproject.toml allows.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert [re.split(r"[<>=!~ ]", req, maxsplit=1)[0] for req in pyproject["project"]["dependencies"]] == list(pins)
    for name, (version, _) in pins.items():
        assert importlib.metadata.version(name) == version, name
    args = _args(dockerfile, "rootfs")
    assert "WHEELS" not in args
    assert args["SITE_PACKAGES"] == plugin_image.SITE_PACKAGES
    copies = [i.value for i in _stage(dockerfile, "rootfs") if i.op == "COPY"]
    assert f"{plugin_image.WHEEL_PINS.relative_to(ROOT)} /image-requirements.txt" in copies
    run = _run_text(dockerfile, "rootfs")
    # The same pip download as plugin_image._wheels: pure-Python wheels for the image's Python.
    for flag in ("--no-deps", "--only-binary=:all:", "--platform any", "--implementation py", "--abi none",
                 f"--python-version {_python_version()}", "--require-hashes -r /image-requirements.txt"):
        assert flag in run
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert f"!{plugin_image.WHEEL_PINS.relative_to(ROOT)}" in ignore


def test_image_wheel_pins_are_well_formed() -> None:
    text = plugin_image.WHEEL_PINS.read_text()
    assert plugin_image.wheel_pins(text)
    with pytest.raises(ValueError, match="not NAME==VERSION"):
        plugin_image.wheel_pins("protobuf>=7 --hash=sha256:" + "0" * 64)


def _python_version() -> str:
    """3.11, from the interpreter .deb the image builder unpacks."""
    match = re.fullmatch(r"python(3\.[0-9]+)-minimal", plugin_image._PYTHON_DEBS[0][0])
    assert match, plugin_image._PYTHON_DEBS[0]
    return match.group(1)


def test_dockerfile_image_config_is_the_image_builders(dockerfile: list[Instruction]) -> None:
    final = _stage(dockerfile, "final")
    ops = [i.op for i in final]
    config = plugin_image.CONFIG
    (env,) = [i.value for i in final if i.op == "ENV"]
    assert shlex.split(env) == config["Env"]
    (workdir,) = [i.value for i in final if i.op == "WORKDIR"]
    assert workdir == config["WorkingDir"] == plugin_image.INSTALL_DIR
    (entrypoint,) = [json.loads(i.value) for i in final if i.op == "ENTRYPOINT"]
    assert entrypoint == config["Entrypoint"]
    assert entrypoint[0] == f"python{_python_version()}"
    (label,) = [i.value for i in final if i.op == "LABEL"]
    assert dict(pair.split("=", 1) for pair in shlex.split(label)) == config["Labels"]
    # Neither sets a user (root, which the plugin needs) or a command after the entrypoint.
    assert "User" not in config and "USER" not in ops
    assert "Cmd" not in config and "CMD" not in ops
    assert [i.value for i in final if i.op == "COPY"] == ["--from=rootfs /rootfs/ /"]


def test_dockerfile_copies_the_packages_to_the_install_dir(dockerfile: list[Instruction]) -> None:
    copies = [i.value.split() for i in _stage(dockerfile, "rootfs") if i.op == "COPY" and "/rootfs/" in i.value
              and "--from" not in i.value]
    assert copies == [[package, f"/rootfs{plugin_image.INSTALL_DIR}/{package}"] for package in plugin_image.PACKAGES]
    cleanup = _run_text(dockerfile, "rootfs")
    assert "-name __pycache__" in cleanup and "-name '*.pyc' -delete" in cleanup  # as source_files() skips them


def test_dockerfile_base_layout_is_the_image_builders(dockerfile: list[Instruction]) -> None:
    run = _run_text(dockerfile, "rootfs")
    base = images._base_layer(b"", [])
    written = {path: text.encode().decode("unicode_escape").encode()
               for text, path in re.findall(r"printf '([^']*)' > (\S+);", run)}
    for path in ("etc/passwd", "etc/group"):
        assert written[path] == base.entries[path][1], path
    modes = {path: 0o755 for path in re.search(r"mkdir -p ([^;]+);", run).group(1).split()}  # type: ignore[union-attr]
    modes.update({path: int(mode, 8) for mode, path in re.findall(r"install -d -m ([0-7]+) (\S+);", run)})
    for path, (info, _) in base.entries.items():
        if info.isdir():
            implied = any(p.startswith(path + "/") for p in modes)
            assert modes.get(path) == info.mode or (path not in modes and implied), path
    assert "var/run/nri" in modes  # plugin_image._build_layer adds it: the socket's mount point
    assert "ln -s python3.11 usr/bin/python3;" in run


# --------------------------------------------------------------------------- plain manifests


def _docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


@pytest.fixture(scope="module")
def plain() -> dict[str, dict[str, Any]]:
    """kind -> object, from namespace.yaml, configmap.yaml and daemonset.yaml."""
    objects = {}
    for name in PLAIN:
        (doc,) = _docs((DEPLOY / name).read_text())
        objects[doc["kind"]] = doc
    assert sorted(objects) == ["ConfigMap", "DaemonSet", "Namespace"]
    return objects


def _pod(plain: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = plain["DaemonSet"]["spec"]["template"]["spec"]
    return spec


def _container(plain: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (container,) = _pod(plain)["containers"]
    assert isinstance(container, dict)
    return container


def _settings(configmap: dict[str, Any]) -> Settings:
    return from_toml(configmap["data"]["config.toml"], source="configmap config.toml")


@pytest.mark.parametrize(
    "path",
    sorted(p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*.yaml") if "templates" not in p.parts),
)
def test_yaml_parses(path: str) -> None:
    docs = _docs((DEPLOY / path).read_text())
    assert docs, path
    if path.startswith("helm/"):
        return
    for doc in docs:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], path


def test_namespace_admits_a_privileged_pod_and_holds_the_objects(plain: dict[str, dict[str, Any]]) -> None:
    namespace = plain["Namespace"]["metadata"]
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for kind in ("ConfigMap", "DaemonSet"):
        assert plain[kind]["metadata"]["namespace"] == namespace["name"], kind


def test_daemonset_args_are_flags_nri_gpu_run_accepts(plain: dict[str, dict[str, Any]],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    container = _container(plain)
    assert "command" not in container  # the image's entrypoint, `python3.11 -m plugin run`
    args = container["args"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    documented = set(re.findall(r"--[a-z][a-z-]*", capsys.readouterr().out))
    for arg in args:  # exact names: argparse would also take a prefix of one
        assert arg.startswith("--") and arg.partition("=")[0] in documented, arg
    parsed = build_parser().parse_args(["run", *args])
    assert parsed.command == "run"
    assert str(parsed.config) == _config_path(plain)
    # The check can fail: a flag `run` does not know ends argparse with usage and exit 2.
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", *args, "--driver_root=/host"])
    assert "unrecognized arguments" in capsys.readouterr().err


def _config_path(plain: dict[str, dict[str, Any]]) -> str:
    (flag,) = [a for a in _container(plain)["args"] if a.startswith(CONFIG_FLAG)]
    return str(flag[len(CONFIG_FLAG):])


def _mounts(plain: dict[str, dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """volume name -> (its volumeMount, the volume)."""
    volumes = {v["name"]: v for v in _pod(plain)["volumes"]}
    return {m["name"]: (m, volumes[m["name"]]) for m in _container(plain)["volumeMounts"]}


def test_configmap_config_loads_and_agrees_with_the_pod(plain: dict[str, dict[str, Any]]) -> None:
    settings = _settings(plain["ConfigMap"])
    mounts = _mounts(plain)
    # The config file is the ConfigMap's key, where the pod mounts it.
    directory, _, key = _config_path(plain).rpartition("/")
    (_, volume) = next(mv for mv in mounts.values() if mv[0]["mountPath"] == directory)
    assert volume["configMap"]["name"] == plain["ConfigMap"]["metadata"]["name"] and key in plain["ConfigMap"]["data"]
    # The NRI socket's directory comes from the host at the same path.
    socket_dir = settings.plugin.socket.rpartition("/")[0]
    (_, volume) = next(mv for mv in mounts.values() if mv[0]["mountPath"] == socket_dir)
    assert volume["hostPath"]["path"] == socket_dir
    # The host's / is at host_root; the driver and dev roots are read through it; /proc
    # is the host's through hostPID. (How each is mounted: test_daemonset_grants_the_least_that_works.)
    engine = settings.engine
    (_, volume) = next(mv for mv in mounts.values() if mv[0]["mountPath"] == engine.host_root)
    assert volume["hostPath"]["path"] == "/"
    for root in (engine.driver_root, engine.dev_root):
        assert engine.to_host_path(root).startswith("/"), root
    assert engine.proc_root == "/proc" and _pod(plain)["hostPID"] is True
    assert engine.policy == SHIPPED_POLICY


# What a shared cluster needs: no GPUs from an image's NVIDIA_VISIBLE_DEVICES=all in
# an unprivileged pod, the device plugin's volume-mounts markers honoured instead.
SHIPPED_POLICY = Policy(accept_env_unprivileged=False, accept_volume_mounts=True)


def test_manifests_ship_env_requests_off_and_volume_markers_on(plain: dict[str, dict[str, Any]]) -> None:
    shipped = _settings(plain["ConfigMap"]).engine.policy
    assert shipped == SHIPPED_POLICY
    # `nri-gpu run` on one node keeps the toolkit's defaults: only these two differ.
    assert Policy(accept_env_unprivileged=True, accept_volume_mounts=False) == Policy()
    text = plain["ConfigMap"]["data"]["config.toml"]
    assert 'namespaces = ["*"]' in text and "accept_env_unprivileged = false" in text


def test_daemonset_probes_reach_the_metrics_endpoint(plain: dict[str, dict[str, Any]]) -> None:
    host, port = parse_address(_settings(plain["ConfigMap"]).plugin.metrics_address)
    container = _container(plain)
    assert container["ports"] == [{"name": "metrics", "containerPort": port}]
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"]) == ("/healthz", port), probe
        # The pod has its own network namespace: the kubelet probes the pod's address,
        # so the server listens on every address of that namespace (and on no node port).
        assert "host" not in get and host == "0.0.0.0", probe
    assert not _pod(plain).get("hostNetwork")


def test_daemonset_is_the_node_plugin_the_image_builder_builds(plain: dict[str, dict[str, Any]]) -> None:
    pod = _pod(plain)
    container = _container(plain)
    assert container["image"] == plugin_image.IMAGE
    assert pod["hostPID"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    labels = plain["DaemonSet"]["spec"]["selector"]["matchLabels"]
    assert labels.items() <= plain["DaemonSet"]["spec"]["template"]["metadata"]["labels"].items()


def test_daemonset_grants_the_least_that_works(plain: dict[str, dict[str, Any]]) -> None:
    """Issue 12, item 13: each privilege the pod keeps is one the plugin uses
    (tests/e2e/test_daemonset.py runs exactly this pod); the rest are gone."""
    pod, container = _pod(plain), _container(plain)
    # Its own network namespace: no local user can take the probe port first.
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    # It never talks to the API server.
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    # Not privileged: capabilities the start work uses (each one's use: the e2e test
    # test_without_a_capability_gpu_pods_fail), the runtime's seccomp profile and
    # device cgroup, so a device node planted in an image cannot be opened by us.
    security = container["securityContext"]
    assert "privileged" not in security
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"]["add"]) == {
        "SYS_ADMIN", "SYS_CHROOT", "SYS_PTRACE", "DAC_OVERRIDE", "SETUID", "SETGID", "SETPCAP", "KILL"}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["readOnlyRootFilesystem"] is True
    # Bounded: a leak or a bomb is killed by the kernel, not the node.
    assert container["resources"]["limits"]["memory"]
    assert container["resources"]["requests"]["memory"] and container["resources"]["requests"]["cpu"]
    # Tolerates the GPU taint only; the DaemonSet controller adds the node-condition ones.
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    mounts = _mounts(plain)
    settings = _settings(plain["ConfigMap"])
    # Every mount read-only; the host's / recursively so (its /run, /dev, /sys too),
    # which Kubernetes allows only without propagation.
    for name, (mount, _) in mounts.items():
        assert mount["readOnly"] is True, name
    (host, _) = next(mv for mv in mounts.values() if mv[0]["mountPath"] == settings.engine.host_root)
    assert host["recursiveReadOnly"] == "Enabled" and host["mountPropagation"] == "None"
    # The NRI socket: its directory only (a runtime restart makes a new socket inode
    # there), read-only (connect(2) needs write permission on the socket, not the mount).
    socket_dir = settings.plugin.socket.rpartition("/")[0]
    (nri, volume) = next(mv for mv in mounts.values() if mv[0]["mountPath"] == socket_dir)
    assert volume["hostPath"] == {"path": socket_dir, "type": "Directory"} and "mountPropagation" not in nri


def _init(pod: dict[str, Any]) -> dict[str, Any]:
    (init,) = pod["initContainers"]
    assert init["name"] == "node-setup"
    assert isinstance(init, dict)
    return init


def test_node_setup_init_container_sets_up_the_runtime_the_plugin_talks_to(plain: dict[str, dict[str, Any]]) -> None:
    """Issue 15, item 7: the init step's flags are ones ``nri-gpu node-setup`` accepts
    and validates, and they agree with the plugin's config: the NRI socket it waits
    for is the one the plugin connects to, through the same host root."""
    pod, init = _pod(plain), _init(_pod(plain))
    assert init["image"] == _container(plain)["image"] and init["command"] == ["python3.11", "-m", "plugin",
                                                                               "node-setup"]
    args = build_parser().parse_args(["node-setup", *init["args"]])
    options = node_setup.options_from(args)  # validates them together
    settings = _settings(plain["ConfigMap"])
    assert options.nri_socket == settings.plugin.socket
    assert options.host_root == settings.engine.host_root
    assert (options.runtime, options.restart_mode.value) == ("containerd", "signal")
    assert options.config == "/etc/containerd/config.toml" and not options.undo
    # A flag node-setup does not know ends argparse with usage and exit 2.
    with pytest.raises(SystemExit):
        build_parser().parse_args(["node-setup", *init["args"], "--restart=signal"])
    assert pod["hostPID"] is True  # signal mode: the runtime's pid is the host's


def test_node_setup_writes_only_the_runtimes_config_folder(plain: dict[str, dict[str, Any]]) -> None:
    """Least privilege for the init step: no capability (signal mode), the runtime's
    seccomp profile, a read-only root, the host's / read-only as the plugin has it, and
    one writable host path: the folder of the config it edits."""
    pod, init = _pod(plain), _init(_pod(plain))
    security = init["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]} and "privileged" not in security
    assert security["seccompProfile"] == {"type": "RuntimeDefault"} and security["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in init["volumeMounts"]}
    assert set(mounts) == {"host", "runtime-config"}
    host = next(m for m in _container(plain)["volumeMounts"] if m["name"] == "host")
    assert mounts["host"] == host
    writable = mounts["runtime-config"]
    assert "readOnly" not in writable
    assert writable["mountPath"] == "/host/etc/containerd"
    assert volumes["runtime-config"]["hostPath"] == {"path": "/etc/containerd", "type": "DirectoryOrCreate"}
    assert "/" + writable["mountPath"].removeprefix(host["mountPath"]).strip("/") == "/etc/containerd"


def test_chart_node_setup_values() -> None:
    off = _rendered(**{"nodeSetup.enabled": False})["DaemonSet"]["spec"]["template"]["spec"]
    assert "initContainers" not in off and "runtime-config" not in {v["name"] for v in off["volumes"]}
    crio = _rendered(**{"nodeSetup.runtime": "crio", "nodeSetup.config": "/etc/crio/crio.conf.d",
                        "nodeSetup.restartMode": "systemd", "nodeSetup.runtimeSocket": "/var/run/crio/crio.sock",
                        "nodeSetup.timeout": 120, "roots.hostRoot": "/node", "nri.socket": "/run/nri/api.sock"})
    pod = crio["DaemonSet"]["spec"]["template"]["spec"]
    init = _init(pod)
    options = node_setup.options_from(build_parser().parse_args(["node-setup", *init["args"]]))
    assert (options.runtime, options.config, options.restart_mode.value, options.timeout) == (
        "crio", "/etc/crio/crio.conf.d", "systemd", 120.0)
    assert (options.host_root, options.nri_socket) == ("/node", "/run/nri/api.sock")
    assert options.runtime_socket == "/var/run/crio/crio.sock"
    # systemd mode chroots into the host's /: that capability, and only then.
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_CHROOT"]}
    # CRI-O's config is a drop-in folder: that folder itself is the writable mount.
    (writable,) = [m for m in init["volumeMounts"] if m["name"] == "runtime-config"]
    assert writable["mountPath"] == "/node/etc/crio/crio.conf.d"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "runtime-config"]
    assert volume["hostPath"]["path"] == "/etc/crio/crio.conf.d"
    # The chart's other values reach the init step as they reach the plugin.
    none = _init(_rendered(**{"nodeSetup.restartMode": "none"})["DaemonSet"]["spec"]["template"]["spec"])
    assert "--restart-mode=none" in none["args"] and "add" not in none["securityContext"]["capabilities"]


_CONNECT_THROUGH_RO_BIND = r"""
import os, socket, subprocess, sys
base = sys.argv[1]
os.makedirs(f"{base}/host/nri"); os.makedirs(f"{base}/pod/nri")
server = socket.socket(socket.AF_UNIX); server.bind(f"{base}/host/nri/nri.sock"); server.listen(1)
for args in (["--bind", f"{base}/host/nri", f"{base}/pod/nri"], ["-o", "remount,bind,ro", f"{base}/pod/nri"]):
    subprocess.run(["mount", *args], check=True)
try:
    open(f"{base}/pod/nri/x", "w")
except OSError as exc:
    print("write:", exc.strerror)
client = socket.socket(socket.AF_UNIX); client.connect(f"{base}/pod/nri/nri.sock")
conn, _ = server.accept(); client.sendall(b"ping"); print("got:", conn.recv(4).decode())
"""


def test_nri_socket_connects_through_a_read_only_bind_mount(tmp_path: Path) -> None:
    """What lets the DaemonSet mount the NRI socket's directory read-only: a Unix
    socket is reached through a read-only bind mount of its directory (the kernel
    checks write permission on the socket inode, not whether the mount is writable)."""
    import os
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                           _CONNECT_THROUGH_RO_BIND, str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["write: Read-only file system", "got: ping"]


# --------------------------------------------------------------------------- Helm chart


def _render(**values: Any) -> dict[str, list[dict[str, Any]]]:
    rendered = render_chart(load_chart(CHART), release="nri-gpu", namespace="nri-gpu", values=values)
    return {name: _docs(text) for name, text in rendered.items() if name.endswith(".yaml")}


def _rendered(**values: Any) -> dict[str, dict[str, Any]]:
    """kind -> object of the chart rendered with ``values`` (dotted keys, as --set)."""
    objects = {}
    for docs in _render(**values).values():
        for doc in docs:
            assert doc["kind"] not in objects, doc["kind"]
            objects[doc["kind"]] = doc
    return objects


def test_chart_default_render_is_the_plain_manifests(plain: dict[str, dict[str, Any]]) -> None:
    rendered = _rendered()
    # The namespace is `helm install -n`'s (namespace.yaml or --create-namespace), not the chart's.
    assert sorted(rendered) == ["ConfigMap", "DaemonSet"]
    for kind, obj in rendered.items():
        assert obj == plain[kind], kind


def test_chart_values_reach_the_config_and_the_pod() -> None:
    rendered = _rendered(**{
        "image.repository": "registry.example/nri-gpu", "image.tag": "", "image.pullPolicy": "IfNotPresent",
        "roots.driverRoot": "/host/run/nvidia/driver", "roots.hostRoot": "/node",
        "plugin.index": "05", "plugin.name": "gpus", "nri.socket": "/run/nri/api.sock",
        "policy.accept_env_unprivileged": False, "policy.annotation_namespaces": ["ml", "research"],
        "policy.namespaces": ["ml", "research", "web"], "policy.accept_volume_mounts": False,
        "policy.capabilities": ["compute", "utility"], "logging.format": "json", "logging.level": "debug",
        "metrics.address": "0.0.0.0", "metrics.port": 9500, "nodeSelector": {"gpu": "yes"},
        "tolerations": [], "resources": {"limits": {"memory": "200Mi"}},
    })
    settings = _settings(rendered["ConfigMap"])
    plugin, engine = settings.plugin, settings.engine
    assert (plugin.index, plugin.name, plugin.socket) == ("05", "gpus", "/run/nri/api.sock")
    assert (plugin.log_format, plugin.log_level, plugin.metrics_address) == ("json", "debug", "0.0.0.0:9500")
    assert (engine.driver_root, engine.host_root) == ("/host/run/nvidia/driver", "/node")
    assert engine.policy == policy_from_mapping({
        "accept_env_unprivileged": False, "annotation_namespaces": ["ml", "research"],
        "namespaces": ["ml", "research", "web"], "capabilities": ["compute", "utility"]})
    pod = rendered["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"registry.example/nri-gpu:{load_chart(CHART).metadata['appVersion']}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["livenessProbe"]["httpGet"]["port"] == container["ports"][0]["containerPort"] == 9500
    assert container["resources"] == {"limits": {"memory": "200Mi"}}
    assert pod["nodeSelector"] == {"gpu": "yes"} and "tolerations" not in pod
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["nri"] == volumes["nri"]["hostPath"]["path"] == "/run/nri"
    assert mounts["host"] == "/node"


@pytest.mark.parametrize(("value", "expected"), [
    ("IfPossible", {"recursiveReadOnly": "IfPossible", "mountPropagation": "None"}),
    ("", {"mountPropagation": "HostToContainer"}),
], ids=["if-possible", "containerd-1.7-propagating"])
def test_chart_host_mount_fallbacks(value: str, expected: dict[str, str]) -> None:
    """Where the runtime has no recursive read-only mounts (containerd 1.7), the chart
    offers the documented fallbacks; each keeps the host's / read-only at the top."""
    (container,) = _rendered(**{"hostMount.recursiveReadOnly": value})["DaemonSet"]["spec"]["template"]["spec"][
        "containers"]
    (host,) = [m for m in container["volumeMounts"] if m["name"] == "host"]
    assert host == {"name": "host", "mountPath": "/host", "readOnly": True, **expected}


def test_chart_without_metrics_has_no_probes() -> None:
    rendered = _rendered(**{"metrics.enabled": False})
    assert _settings(rendered["ConfigMap"]).plugin.metrics_address == ""
    (container,) = rendered["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert not {"ports", "livenessProbe", "readinessProbe"} & set(container)


def test_chart_policy_values_are_the_config_files_policy_table() -> None:
    values = load_chart(CHART).values
    keys = [o.key for o in OPTIONS if o.table == "policy"]
    assert list(values["policy"]) == keys
    defaults = {o.key: tomllib.loads(f"v = {o.default}")["v"] for o in OPTIONS if o.table == "policy"}
    assert policy_from_mapping(defaults) == Policy()
    assert policy_from_mapping(values["policy"]) == SHIPPED_POLICY


def _names(text: str) -> tuple[str, ...]:
    """``"`debug`, `info`, `warning` or `error`"`` -> the four names."""
    return tuple(w for w in re.findall(r"[a-z]+", text) if w != "or")


def test_chart_logging_values_name_logfmts_levels_and_formats() -> None:
    """Levels and formats are listed once, in plugin.logfmt; the chart's defaults, the
    comments beside them and its README's rows must name exactly those."""
    values = load_chart(CHART).values["logging"]
    assert (values["level"], values["format"]) == (DEFAULT_LOG_LEVEL, DEFAULT_LOG_FORMAT)
    lines = (CHART / "values.yaml").read_text().splitlines()
    start = lines.index("logging:") + 1
    block = lines[start:start + next(i for i, line in enumerate(lines[start:]) if not line.startswith("  "))]
    # Each key's comment is the line above it.
    comment = {line.split(":")[0].strip(): block[i - 1] for i, line in enumerate(block) if not line.lstrip().startswith("#")}
    assert _names(comment["level"].lstrip(" #")) == LOG_LEVELS
    assert _names(comment["format"].lstrip(" #")) == LOG_FORMATS
    rows = {row.split("|")[1].strip(" `"): row.split("|")[3] for row in (CHART / "README.md").read_text().splitlines()
            if row.startswith("| `logging.")}
    assert (_names(rows["logging.level"]), _names(rows["logging.format"])) == (LOG_LEVELS, LOG_FORMATS)


def test_chart_metadata_and_image() -> None:
    chart = load_chart(CHART)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert chart.metadata["apiVersion"] == "v2"
    assert chart.metadata["appVersion"] == pyproject["project"]["version"]
    image = chart.values["image"]
    assert f"{image['repository']}:{image['tag']}" == plugin_image.IMAGE
    notes = render_chart(chart, release="nri-gpu", namespace="nri-gpu")["NOTES.txt"]
    assert plugin_image.IMAGE in notes


# --------------------------------------------------------------------------- the renderer


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{23 -}} < {{- 45}}", "23<45"),  # text/template's own trimming example
        ('{{ if .Values.on }}yes{{ else }}no{{ end }}|{{ if .Values.off }}yes{{ else }}no{{ end }}', "yes|no"),
        ('{{ .Values.empty | default "d" }} {{ default "d" .Values.name }}', "d x"),
        ("a:{{ toYaml .Values.map | nindent 2 }}", "a:\n  k: v\n  l:\n  - 1"),
        ("{{ .Values.name | quote }} {{ toJson .Values.list }} {{ .Values.on }}", '"x" ["a","b"] true'),
        ('{{ dir "/var/run/nri/nri.sock" }}', "/var/run/nri"),
        ('{{ if eq .Values.name "x" }}y{{ end }}{{ if eq .Values.name "z" }}n{{ end }}', "y"),
        ('{{- define "t" -}}\n[{{ .Values.name }}]\n{{- end }}{{ include "t" . | indent 2 }}', "  [x]"),
    ],
    ids=["trim", "if-else", "default", "toYaml-nindent", "quote-toJson-bool", "dir", "eq", "define-include"],
)
def test_renderer_follows_go_templates(template: str, expected: str) -> None:
    chart = load_chart(CHART)
    chart.templates = {"t.yaml": template}
    values = {"on": True, "off": False, "empty": "", "name": "x", "list": ["a", "b"], "map": {"k": "v", "l": [1]}}
    chart.values = values
    assert render_chart(chart, release="r", namespace="n")["t.yaml"] == expected


@pytest.mark.parametrize(
    "template",
    ["{{ range .Values.list }}x{{ end }}", "{{ with .Values.map }}x{{ end }}", "{{ .Values.missing }}",
     '{{ printf "%s" .Values.name }}', "{{ if .Values.on }}x", "{{ $x := 1 }}"],
    ids=["range", "with", "missing-value", "printf", "unclosed-if", "variable"],
)
def test_renderer_refuses_what_it_does_not_implement(template: str) -> None:
    chart = load_chart(CHART)
    chart.templates = {"t.yaml": template}
    chart.values = {"on": True, "list": [1], "map": {"k": 1}, "name": "x"}
    with pytest.raises(TemplateError):
        render_chart(chart, release="r", namespace="n")
