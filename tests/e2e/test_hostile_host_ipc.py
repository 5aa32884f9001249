"""A hostile host: local accounts that plant the daemons' IPC endpoints, replayed
against ``nri-gpu run`` on real containerd 1.7.24 and 2.1.9.

``/tmp`` is every local account's and ``/run`` holds folders daemons may hand to
their own users. Discovery used to take ``/tmp/nvidia-mps``,
``/run/nvidia-persistenced/socket`` and ``/run/nvidia-fabricmanager/socket`` through
links and accept any folder, and the plan bound them read-write with ``rbind``:
``ln -s / /tmp/nvidia-mps`` gave every compute container the host's tree, writable.
Later, checked only at discovery, the same link planted after root's folder went away
still reached every compute container (read-only), and a daemon's socket gone since
discovery failed every GPU pod.

Each test builds its own simulated node (its root stands for the host's ``/``: a link
to ``/`` resolves there), plants the endpoints, starts ``nri-gpu run`` with
``engine.mps = true`` (the setting that hands the MPS folder out) and runs a GPU
pod. The bait is a file at the node's root with a random token, checked by hash
before and after, and looked for inside the container.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.cri import CriClient, CriError
from testbed.gpunode import SimNode, build_node
from testbed.images import GLIBC
from testbed.plugins import NriGpuProcess

from .conftest import Testbed, write_cdi_spec

SLEEP = ["sh", "-c", "sleep 3600"]
MPS, PERSISTENCED, FABRIC = "/tmp/nvidia-mps", "/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket"


@pytest.fixture
def ipc_node(tmp_path: Path) -> SimNode:
    node = build_node(tmp_path / "node", gpus=1)
    root = node.driver_root
    (root / "tmp").mkdir()
    os.chmod(root / "tmp", 0o1777)  # as the real /tmp: sticky, world-writable, root's
    for sub in ("run/nvidia-persistenced", "run/nvidia-fabricmanager", "var/lib/bait"):
        (root / sub).mkdir(mode=0o755, parents=True)
    return node


@pytest.fixture
def serve(testbed: Testbed) -> Iterator[list[NriGpuProcess]]:
    """Start ``serve[0]`` with ``start(node)``: nri-gpu for ``node`` with the MPS folder on."""
    started: list[NriGpuProcess] = []
    yield started
    for proc in started:
        assert proc.stop() == 0, proc.log()


def start(serve: list[NriGpuProcess], containerd: Testbed, node: SimNode, tmp_path: Path) -> NriGpuProcess:
    config = tmp_path / "config.toml"
    config.write_text("[engine]\nmps = true\n")
    proc = NriGpuProcess(
        containerd.containerd.nri_socket, tmp_path / "nri-gpu.log", *node.flags(), "--config", str(config)
    )
    serve.append(proc)
    return proc.start()


def gpu_pod(cri: CriClient, name: str) -> str:
    pod = cri.run_pod(name, annotations={"nvidia.com/gpus": "0"})
    return cri.run_container(pod, "main", SLEEP, image=GLIBC)


def sh(cri: CriClient, cid: str, script: str) -> tuple[int, str]:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    return code, out + err


def ipc_mounts(cri: CriClient, cid: str) -> dict[str, str]:
    """Mount point -> its mountinfo line, for our three endpoints."""
    code, out = sh(cri, cid, "cat /proc/self/mountinfo")
    assert code == 0, out
    found = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] in (MPS, PERSISTENCED, FABRIC):
            found[fields[4]] = line
    return found


def digest(root: Path) -> dict[str, str]:
    """sha256 of every regular file, and the type and mode of every entry, under ``root``
    (not following links): what the container could have changed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            what = stat.filemode(st.st_mode)
            if stat.S_ISREG(st.st_mode) and st.st_size < 1 << 20:
                what += " " + hashlib.sha256(path.read_bytes()).hexdigest()
            out[str(path.relative_to(root))] = what
    return out


def test_planted_endpoints_are_skipped_and_the_host_tree_stays_out(
    testbed: Testbed, cri: CriClient, ipc_node: SimNode, serve: list[NriGpuProcess], tmp_path: Path
) -> None:
    root = ipc_node.driver_root
    token = secrets.token_hex(8)
    (root / "host-bait").write_text(f"bait {token}: a file of the host's own /\n")
    (root / "var/lib/bait/secret").write_text(f"bait {token}: a root-owned host folder\n")
    os.symlink("/", root / "tmp/nvidia-mps")  # any local account: ln -s / /tmp/nvidia-mps
    os.symlink("/var/lib/bait", root / "run/nvidia-persistenced/socket")  # a folder where a socket should be
    os.mkfifo(root / "run/nvidia-fabricmanager/socket")  # a FIFO where a socket should be
    before = digest(root)

    plugin = start(serve, testbed, ipc_node, tmp_path)
    cid = gpu_pod(cri, "ipc-planted")

    assert ipc_mounts(cri, cid) == {}
    _, listed = sh(cri, cid, f"ls -a {MPS} {MPS}/ /run/nvidia-persistenced/ {PERSISTENCED}/ 2>&1; true")
    assert "host-bait" not in listed and "secret" not in listed, listed
    _, seen = sh(
        cri,
        cid,
        f"cat {MPS}/host-bait {PERSISTENCED}/secret 2>&1; touch {MPS}/planted {PERSISTENCED}/planted 2>&1; true",
    )
    assert token not in seen, seen
    assert digest(root) == before, "the container changed the host's files"
    assert "started with GPUs" in plugin.log(), plugin.log()  # a GPU pod all the same
    for why in (
        f"IPC endpoint {MPS} skipped: {root}/tmp/nvidia-mps is a symbolic link",
        f"IPC endpoint {PERSISTENCED} skipped: {root}/run/nvidia-persistenced/socket is a symbolic link",
        f"IPC endpoint {FABRIC} skipped: {root}/run/nvidia-fabricmanager/socket is a FIFO, not a socket",
    ):
        assert why in plugin.log(), plugin.log()


def test_the_real_endpoints_are_mounted_read_only(
    testbed: Testbed, cri: CriClient, ipc_node: SimNode, serve: list[NriGpuProcess], tmp_path: Path
) -> None:
    """Root's MPS folder (0755, under a sticky root-owned /tmp) and root's sockets: the
    container sees them, and cannot write through them to the host."""
    root = ipc_node.driver_root
    token = secrets.token_hex(8)
    (root / "tmp/nvidia-mps").mkdir(mode=0o755)
    (root / "tmp/nvidia-mps/marker").write_text(f"mps {token}\n")
    os.mkfifo(root / "tmp/nvidia-mps/control")
    listeners = []
    for path in (PERSISTENCED, FABRIC):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listeners.append(s)
        s.bind(str(root / path.lstrip("/")))
        s.listen(1)
    try:
        before = digest(root / "tmp/nvidia-mps")
        plugin = start(serve, testbed, ipc_node, tmp_path)
        assert "IPC endpoint" not in plugin.log(), plugin.log()
        cid = gpu_pod(cri, "ipc-real")

        mounts = ipc_mounts(cri, cid)
        assert set(mounts) == {MPS, PERSISTENCED, FABRIC}, mounts
        for line in mounts.values():
            assert "ro" in line.split()[5].split(","), line  # the per-mount options
        code, out = sh(
            cri, cid, f"cat {MPS}/marker && test -p {MPS}/control && test -S {PERSISTENCED} && test -S {FABRIC}"
        )
        assert code == 0 and token in out, out
        code, out = sh(cri, cid, f"touch {MPS}/planted 2>&1; chmod 0 {PERSISTENCED} 2>&1; true")
        assert out.count("Read-only file system") == 2, out
        assert digest(root / "tmp/nvidia-mps") == before
        assert stat.S_IMODE(os.stat(root / PERSISTENCED.lstrip("/")).st_mode) != 0
    finally:
        for s in listeners:
            s.close()


def test_an_mps_folder_replaced_by_a_link_to_root_after_discovery_is_left_out(
    testbed: Testbed, cri: CriClient, ipc_node: SimNode, serve: list[NriGpuProcess], tmp_path: Path
) -> None:
    """Discovery found root's MPS folder; then the MPS daemon quit (its folder gone) and
    a local account put ``ln -s / /tmp/nvidia-mps`` there. Discovery does not run again
    (the driver did not change). Before: the plan still named the folder, and runc
    bound the host's / through the link into every compute container."""
    root = ipc_node.driver_root
    token = secrets.token_hex(8)
    (root / "host-bait").write_text(f"bait {token}: a file of the host's own /\n")
    (root / "tmp/nvidia-mps").mkdir(mode=0o755)
    plugin = start(serve, testbed, ipc_node, tmp_path)
    assert "IPC endpoint" not in plugin.log(), plugin.log()
    os.rmdir(root / "tmp/nvidia-mps")
    os.symlink("/", root / "tmp/nvidia-mps")  # any local account, once root's folder is gone

    cid = gpu_pod(cri, "ipc-replaced")
    assert ipc_mounts(cri, cid) == {}
    _, out = sh(cri, cid, f"ls {MPS}/ 2>&1; cat {MPS}/host-bait 2>&1; true")
    assert token not in out and "host-bait" not in out.split(), out
    log = plugin.log()
    assert "started with GPUs" in log, log
    assert f"IPC endpoint {MPS} skipped: {root}/tmp/nvidia-mps is a symbolic link" in log, log


def test_a_socket_gone_after_discovery_fails_no_pod_and_a_new_one_is_handed_out(
    testbed: Testbed, cri: CriClient, ipc_node: SimNode, serve: list[NriGpuProcess], tmp_path: Path
) -> None:
    """persistenced stopped after discovery (its socket gone) and the fabric manager
    started. Before: runc failed every GPU pod on the missing bind source until the
    plugin restarted, and the fabric manager's socket was never handed out."""
    root = ipc_node.driver_root
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as persistenced:
        persistenced.bind(str(root / PERSISTENCED.lstrip("/")))
        persistenced.listen(1)
        plugin = start(serve, testbed, ipc_node, tmp_path)
        assert "IPC endpoint" not in plugin.log(), plugin.log()
    os.unlink(root / PERSISTENCED.lstrip("/"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as fabric:
        fabric.bind(str(root / FABRIC.lstrip("/")))
        fabric.listen(1)
        cid = gpu_pod(cri, "ipc-gone")
        assert set(ipc_mounts(cri, cid)) == {FABRIC}
        code, out = sh(cri, cid, f"test -S {FABRIC}")
        assert code == 0, out
    assert "started with GPUs" in plugin.log(), plugin.log()


def test_the_cdi_hook_refuses_an_endpoint_its_spec_names_once_a_link_is_there(
    testbed: Testbed, cri: CriClient, ipc_node: SimNode
) -> None:
    """A CDI spec names the endpoints it found when it was written, for good; runc binds
    them at every start, following links. The hook walks the host path again and
    compares it with what runc bound. Here persistenced's socket is replaced by a link
    to another socket (a daemon's user, or a folder's owner, could do it): before, the
    container started with whatever the link led to."""
    root = ipc_node.driver_root
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as persistenced:
        persistenced.bind(str(root / PERSISTENCED.lstrip("/")))
        persistenced.listen(1)
        path = write_cdi_spec(testbed, ipc_node, "nri-gpu-ipc.json")
    try:
        mounts = json.loads(path.read_text())["containerEdits"]["mounts"]
        assert PERSISTENCED in [m["containerPath"] for m in mounts]
        os.unlink(root / PERSISTENCED.lstrip("/"))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as restarted:  # the same daemon, started again
            restarted.bind(str(root / PERSISTENCED.lstrip("/")))
            restarted.listen(1)
            cid = cdi_container(cri, "cdi-ipc-real")
            assert sh(cri, cid, f"test -S {PERSISTENCED}")[0] == 0
        os.unlink(root / PERSISTENCED.lstrip("/"))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
            other.bind(str(root / "var/lib/bait/socket"))
            other.listen(1)
            os.symlink(str(root / "var/lib/bait/socket"), root / PERSISTENCED.lstrip("/"))
            with pytest.raises(CriError) as err:
                cdi_container(cri, "cdi-ipc-link")
        assert f"IPC endpoint {PERSISTENCED}: {root}{PERSISTENCED} is a symbolic link" in str(err.value), err.value
    finally:
        path.unlink(missing_ok=True)


def cdi_container(cri: CriClient, name: str) -> str:
    pod = cri.run_pod(name)
    return cri.run_container(
        pod, "main", SLEEP, image=GLIBC, annotations={"cdi.k8s.io/nri-gpu-test": "nvidia.com/gpu=0"}
    )
