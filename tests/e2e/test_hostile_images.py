"""Hostile images as GPU pods: the container-escape CVEs of the NVIDIA container toolkit,
replayed against ``nri-gpu run`` on real containerd 1.7.24 and 2.1.9, and against
the CDI path (containerd's CDI support running the compiled hook, ``nri-gpu-hook
start-container``, before ``pivot_root``, where the host's files are still in reach).

Each image (hack/testbed/hostile.py) points a link at a HOST "bait" tree under
``/tmp/nri-gpu-bait``, which every test re-creates with a fresh random token and
snapshots (type, mode, owner, size, mtime, inode and sha256 of every entry; plus the
host's own /etc/ld.so.cache and /etc/ld.so.conf.d, ``/tmp/preload-marks`` and the whole
simulated node). After the container was created and started (or refused), and again
after it was removed, the snapshot must be identical: nothing written, replaced, created
or deleted. The outcome for the container itself is either

* it RUNS with its GPU, and the start step did its work inside the container's own
  root: ``/proc/driver/nvidia/gpus`` shows the one GPU, ``ldconfig -p`` lists
  ``libcuda.so.1``; no host bait is visible inside (no token, no bait mount); or
* creation or start FAILS with a message that names the path or the problem (a link),
  not a traceback (the plugin's, in Python) or a panic (the compiled hook's); the
  plugin keeps running.

Cases where refusing would be a regression (the link is nothing the plugin needs) must
run: ``ldcache`` (ldconfig replaces the link), ``compat``, ``preload`` and ``soname``.

The last two cases stay inside the container's root and still reach the host: the
container runs as nobody with a root-owned host folder mounted read-write at /data
(a hostPath volume it cannot write). Whatever the start step writes into the
container's view must not be written there with root's rights: neither
``00-nri-gpu.conf`` through a linked ``/etc/ld.so.conf.d``, nor a SONAME link that
ldconfig makes from a library whose SONAME holds a ``/``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from testbed import hostile, images
from testbed.cri import CriClient, CriError
from testbed.gpunode import SimNode
from testbed.images import GLIBC
from testbed.plugins import NriGpuProcess

from .conftest import Testbed, write_cdi_spec

SLEEP = ["sh", "-c", "sleep 3600"]
BAIT = Path(hostile.BAIT_ROOT)
LIBDIR = "/usr/lib/x86_64-linux-gnu"
LIBCUDA_LINE = f"libcuda.so.1 (libc6,x86-64) => {LIBDIR}/libcuda.so.1"
# Words a refusal may use for the problem, when it does not name the path itself.
PROBLEM_WORDS = ("symbolic link", "symlink", "magic link", "magic-link", "outside", "escape", "too many levels")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hostile_images(containerd: Testbed) -> dict[str, images.Image]:
    """Every hostile image, built (cached) and imported into this containerd."""
    built = {}
    for case in hostile.CASES:
        if hostile.needs_gcc(case) and shutil.which("gcc") is None:
            continue  # its test skips, saying why
        built[case] = hostile.hostile_image(case)
        images.import_image(containerd.containerd, built[case])
    return built


@pytest.fixture(scope="module")
def plugin(
    containerd: Testbed,
    node: SimNode,
    hostile_images: dict[str, images.Image],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[NriGpuProcess]:
    log = tmp_path_factory.mktemp("nri-gpu-log") / "nri-gpu.log"
    proc = NriGpuProcess(containerd.containerd.nri_socket, log, *node.flags()).start()
    yield proc
    assert proc.stop() == 0, proc.log()


@pytest.fixture(scope="module", params=["nri", "cdi"])
def route(request: pytest.FixtureRequest, containerd: Testbed, node: SimNode) -> Iterator[str]:
    """How the GPU is asked for: the NRI plugin (pod annotation), or containerd's CDI
    support running our createContainer hook (``cdi.k8s.io/`` annotation)."""
    spec = write_cdi_spec(containerd, node, "nri-gpu-hostile.json") if request.param == "cdi" else None
    yield str(request.param)
    if spec is not None:
        spec.unlink(missing_ok=True)


Snapshot = dict[str, tuple[object, ...] | None]


def _entry(path: Path, hash_files: bool) -> tuple[object, ...]:
    st = path.lstat()
    what: object = None
    if stat.S_ISLNK(st.st_mode):
        what = os.readlink(path)
    elif stat.S_ISREG(st.st_mode) and hash_files:
        what = hashlib.sha256(path.read_bytes()).hexdigest()
    # No atime (reads are not writes), no ctime/nlink (hard links to the shared driver
    # tree made by other test sessions change them).
    return (stat.filemode(st.st_mode), st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ino, what)


def snapshot(paths: list[Path], hash_files: bool) -> Snapshot:
    """Every entry under each of ``paths`` (not following links), or None if missing."""
    snap: Snapshot = {}
    for top in paths:
        if not os.path.lexists(top):
            snap[str(top)] = None
            continue
        snap[str(top)] = _entry(top, hash_files)
        if top.is_symlink() or not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                snap[str(path)] = _entry(path, hash_files)
    return snap


def diff(before: Snapshot, after: Snapshot) -> list[str]:
    out = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path, "absent"), after.get(path, "absent")
        if old != new:
            out.append(f"{path}: {old} -> {new}")
    return out


@dataclass
class Bait:
    """The host bait tree and the host paths a hostile image must not reach."""

    root: Path
    token: str
    node: SimNode
    route: str = "nri"  # see the route fixture
    before: tuple[Snapshot, Snapshot] = field(default_factory=lambda: ({}, {}))

    def plant(self) -> None:
        if self.root.is_symlink() or self.root.is_file():
            self.root.unlink()
        elif self.root.exists():
            shutil.rmtree(self.root)
        files = {
            "ld.so.cache": f"bait {self.token}: the host's ld.so.cache\n",
            "ld.so.conf.d/host.conf": f"# bait {self.token}\n/bait/host-libs\n",
            "lib/libbait.so.1": f"bait {self.token}: a host library\n",
            "compat/libcuda.so.999.1": f"\x7fELF bait {self.token}: a host compat libcuda\n",
            "etc/passwd": f"root:x:0:0:bait {self.token}:/root:/bin/sh\n",
            "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
            "etc/ld.so.conf.d/host.conf": f"# bait {self.token}\n",
            "volume/keep": f"bait {self.token}: a root-owned volume\n",
        }
        for rel, text in files.items():
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            path.write_text(text)
        (self.root / "compat/libcuda.so.1").symlink_to("libcuda.so.999.1")
        self.before = self._snap()

    def _snap(self) -> tuple[Snapshot, Snapshot]:
        hashed = [
            self.root,
            Path("/etc/ld.so.cache"),
            Path("/etc/ld.so.conf.d"),
            Path("/etc/00-nri-gpu.conf"),
            Path("/tmp/preload-marks"),
        ]
        return snapshot(hashed, True), snapshot([self.node.root], False)

    def assert_untouched(self, when: str) -> None:
        after = self._snap()
        changes = diff(self.before[0], after[0]) + diff(self.before[1], after[1])
        assert not changes, f"host files changed {when}:\n" + "\n".join(changes)


@pytest.fixture
def bait(node: SimNode, route: str) -> Iterator[Bait]:
    # One bait tree at a fixed path (baked into the cached images): serialize sessions.
    with open(f"{BAIT}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        b = Bait(BAIT, secrets.token_hex(8), node, route)
        b.plant()
        yield b
        shutil.rmtree(BAIT, ignore_errors=True)


# --------------------------------------------------------------------------- helpers


@dataclass
class Outcome:
    pod: str
    cid: str | None
    error: CriError | None
    stage: str  # "create", "start" or "" (it runs)

    @property
    def ran(self) -> bool:
        return self.error is None


def _create_and_start(
    cri: CriClient, name: str, image: str, command: list[str], mounts: list[Any], route: str
) -> Outcome:
    if route == "cdi":
        pod, annotations = cri.run_pod(name), {"cdi.k8s.io/hostile": "nvidia.com/gpu=0"}
    else:
        pod, annotations = cri.run_pod(name, annotations={"nvidia.com/gpus": "0"}), {}
    try:
        cid = cri.create_container(pod, None, "main", image, command, mounts=mounts, annotations=annotations)
    except CriError as exc:
        return Outcome(pod, None, exc, "create")
    try:
        cri.start_container(cid)
    except CriError as exc:
        return Outcome(pod, cid, exc, "start")
    return Outcome(pod, cid, None, "")


def launch(
    cri: CriClient, bait: Bait, name: str, image: str, command: list[str] = SLEEP, mounts: list[Any] | None = None
) -> Outcome:
    """A GPU pod (GPU 0) running ``image``, created and started or refused; the host
    is checked at once, before anything else is asked of the container."""
    outcome = _create_and_start(cri, name, image, command, mounts or [], bait.route)
    verdict = "runs" if outcome.ran else f"refused at {outcome.stage}: {outcome.error}"
    print(f"OUTCOME {name}: {verdict}")
    bait.assert_untouched(f"by the {name} container")
    if outcome.cid is not None and not outcome.ran:
        assert cri.container_status(outcome.cid).state != "CONTAINER_RUNNING"
    return outcome


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


def assert_gpu_ready(cri: CriClient, cid: str, node: SimNode) -> str:
    """The start step's work, seen from inside; returns ``ldconfig -p``."""
    gpu = node.gpus[0]
    sh(cri, cid, f"test -c /dev/nvidia{gpu.minor} || test -f /dev/nvidia{gpu.minor}")
    assert sh(cri, cid, "ls /proc/driver/nvidia/gpus").split() == [gpu.bus_id]
    cache = sh(cri, cid, "ldconfig -p")
    assert LIBCUDA_LINE in cache, cache
    return cache


def assert_no_bait_inside(cri: CriClient, cid: str, bait: Bait) -> None:
    """No host bait is visible in the container: no mount of it, no token in any file
    the hostile links name (read through them, as the container sees them)."""
    for line in sh(cri, cid, "cat /proc/self/mountinfo").splitlines():
        source_root = line.split()[3]
        if source_root == f"{bait.root}/volume":
            continue  # the soname test's own volume, mounted on purpose
        assert not source_root.startswith(str(bait.root)), f"host bait mounted into the container: {line}"
    # Small files only: with a linked library folder the driver libraries live under /tmp.
    seen = sh(
        cri,
        cid,
        (
            "find /etc/ /tmp/ /usr/local/ /lib/ /opt/ /data/ -type f -size -64k 2>/dev/null"
            " | xargs grep -l " + bait.token + " 2>/dev/null;"
            " cat /etc/ld.so.cache /etc/ld.so.conf.d/* /usr/local/cuda/compat/* 2>/dev/null;"
            f" ls -a {LIBDIR}/ /usr/local/cuda/compat/ /etc/ld.so.conf.d/ 2>/dev/null; true"
        ),
    )
    assert bait.token not in seen and "libbait" not in seen and "host.conf" not in seen, seen


def assert_clear_refusal(outcome: Outcome, names: tuple[str, ...]) -> None:
    assert outcome.error is not None
    text = outcome.error.details
    assert "Traceback" not in text and 'File "' not in text and "panicked" not in text, text
    lowered = text.lower()
    assert any(n in text for n in names) or any(w in lowered for w in PROBLEM_WORDS), (
        f"the refusal names neither {names} nor the problem: {text}"
    )


def finish(cri: CriClient, outcome: Outcome, bait: Bait, plugin: NriGpuProcess, case: str) -> None:
    """Check the host again once the pod is gone (clean-up must not write through the
    links either), and that the plugin lives."""
    cri.stop_pod(outcome.pod)
    cri.remove_pod(outcome.pod)
    bait.assert_untouched(f"after the {case} pod was removed")
    assert plugin.proc is not None and plugin.proc.poll() is None, plugin.log()


def image_of(case: str, built: dict[str, images.Image]) -> str:
    if case not in built:
        pytest.skip(f"the {case} image needs gcc, which this machine lacks")
    return hostile.image_name(case)


# --------------------------------------------------------------------------- control


def test_control_plain_glibc_gpu_pod(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode, bait: Bait
) -> None:
    """The plain image gets its GPU, its /proc/driver/nvidia view and its ld.so.cache:
    the checks below would see a start step that did nothing."""
    outcome = launch(cri, bait, "control", GLIBC)
    assert outcome.ran, outcome.error
    assert outcome.cid is not None
    cache = assert_gpu_ready(cri, outcome.cid, node)
    assert "/usr/local/cuda/compat" not in cache
    assert "00-nri-gpu.conf" in sh(cri, outcome.cid, "ls /etc/ld.so.conf.d")
    assert_no_bait_inside(cri, outcome.cid, bait)
    finish(cri, outcome, bait, plugin, "control")


# --------------------------------------------------------------------------- cases


def test_ld_so_cache_linked_to_a_host_file(
    testbed: Testbed,
    cri: CriClient,
    plugin: NriGpuProcess,
    node: SimNode,
    bait: Bait,
    hostile_images: dict[str, images.Image],
) -> None:
    """CVE-2025-23267: ldconfig must not write the cache through an image link."""
    outcome = launch(cri, bait, "ldcache", image_of("ldcache", hostile_images))
    assert outcome.ran, f"a linked /etc/ld.so.cache must not stop a GPU container: {outcome.error}"
    assert outcome.cid is not None
    assert_gpu_ready(cri, outcome.cid, node)
    assert_no_bait_inside(cri, outcome.cid, bait)
    finish(cri, outcome, bait, plugin, "ldcache")


@pytest.mark.parametrize("case", ["confdir", "relconfdir", "magicconf"])
def test_ld_so_conf_d_linked_out_of_the_root(
    testbed: Testbed,
    cri: CriClient,
    plugin: NriGpuProcess,
    node: SimNode,
    bait: Bait,
    hostile_images: dict[str, images.Image],
    case: str,
) -> None:
    """CVE-2025-23267 / CVE-2024-0133: /etc/ld.so.conf.d links to a host directory
    (absolute, by ``..``, through /proc/self/root): no 00-nri-gpu.conf appears there."""
    outcome = launch(cri, bait, case, image_of(case, hostile_images))
    if outcome.ran:
        assert outcome.cid is not None
        assert_gpu_ready(cri, outcome.cid, node)
        if case == "confdir":  # the image has the link's target inside its own root
            listing = sh(cri, outcome.cid, f"ls {BAIT}/ld.so.conf.d").split()
            assert "00-nri-gpu.conf" in listing and "libc.conf" in listing, listing
        assert_no_bait_inside(cri, outcome.cid, bait)
    else:
        assert_clear_refusal(outcome, ("/etc/ld.so.conf.d", "ld.so.conf.d"))
    finish(cri, outcome, bait, plugin, case)


@pytest.mark.parametrize("case", ["libdir", "magiclib"])
def test_library_folder_linked_out_of_the_root(
    testbed: Testbed,
    cri: CriClient,
    plugin: NriGpuProcess,
    node: SimNode,
    bait: Bait,
    hostile_images: dict[str, images.Image],
    case: str,
) -> None:
    """CVE-2024-0134: the folder the driver libraries and their SONAME links go to is a
    link to a host directory (plain, or through /proc/1/root): links are made inside."""
    outcome = launch(cri, bait, case, image_of(case, hostile_images))
    if outcome.ran:
        assert outcome.cid is not None
        assert_gpu_ready(cri, outcome.cid, node)
        assert sh(cri, outcome.cid, f"readlink {LIBDIR}/libcuda.so.1").strip() == "libcuda.so.550.163.01"
        magic = sh(cri, outcome.cid, f"head -c 4 {LIBDIR}/libcuda.so.1 | od -c | head -1").split()[1:5]
        assert magic == ["177", "E", "L", "F"]
        assert_no_bait_inside(cri, outcome.cid, bait)
    else:
        assert_clear_refusal(outcome, (LIBDIR, "x86_64-linux-gnu"))
    finish(cri, outcome, bait, plugin, case)


def test_cuda_compat_folder_linked_to_the_host(
    testbed: Testbed,
    cri: CriClient,
    plugin: NriGpuProcess,
    node: SimNode,
    bait: Bait,
    hostile_images: dict[str, images.Image],
) -> None:
    """CVE-2024-0132 / CVE-2025-23359: /usr/local/cuda/compat links to a host folder with
    a libcuda.so.999.1 (and to a real one inside the image): nothing of it is mounted or
    put on the loader's path."""
    outcome = launch(cri, bait, "compat", image_of("compat", hostile_images))
    assert outcome.ran, f"an image's compat link is nothing nri-gpu reads: {outcome.error}"
    assert outcome.cid is not None
    cache = assert_gpu_ready(cri, outcome.cid, node)
    for needle in ("/usr/local/cuda", "/compat/", ".999", str(BAIT)):
        assert needle not in cache, cache
    assert_no_bait_inside(cri, outcome.cid, bait)
    finish(cri, outcome, bait, plugin, "compat")


def test_image_env_reaches_nothing_of_ours(
    testbed: Testbed,
    cri: CriClient,
    plugin: NriGpuProcess,
    node: SimNode,
    bait: Bait,
    hostile_images: dict[str, images.Image],
) -> None:
    """CVE-2025-23266 "NVIDIAScape": LD_PRELOAD / LD_LIBRARY_PATH / NVIDIA_* in the image
    env. Only the container's own dynamic programs carry the mark; no helper of ours
    (ldconfig, python, anything in the host's root) does."""
    outcome = launch(cri, bait, "preload", image_of("preload", hostile_images), hostile.PRELOAD_COMMAND)
    assert outcome.ran, f"an image env is no reason to refuse: {outcome.error}"
    cid = outcome.cid
    assert cid is not None
    cache = assert_gpu_ready(cri, cid, node)
    assert "/evil" not in cache, cache
    sh(cri, cid, "getconf PAGESIZE")  # an exec'd process gets the image env too
    deadline = time.monotonic() + 5
    while (marks := sh(cri, cid, "cat /tmp/preload-marks 2>/dev/null; true")).count(" getconf") < 2:
        assert time.monotonic() < deadline, f"the preload never marked the container's getconf: {marks!r}"
        time.sleep(0.05)
    programs = sorted({line.split(" ", 1)[1] for line in marks.splitlines()})
    assert programs == ["getconf"], f"processes other than the container's own ran with its env: {marks}"
    spec = cri.container_status(cid, verbose=True).spec
    for kind, hooks in spec.get("hooks", {}).items():
        for hook in hooks:
            leaked = [e for e in hook.get("env", []) if e.startswith(("LD_", "NVIDIA_"))]
            assert "env" in hook and not leaked, f"{kind} hook without a clean env: {hook}"
    assert_no_bait_inside(cri, cid, bait)
    finish(cri, outcome, bait, plugin, "preload")


def test_ld_so_cache_magic_link(
    testbed: Testbed,
    cri: CriClient,
    plugin: NriGpuProcess,
    node: SimNode,
    bait: Bait,
    hostile_images: dict[str, images.Image],
) -> None:
    """/etc/ld.so.cache -> /proc/1/cwd/<bait>/ld.so.cache (a magic link)."""
    outcome = launch(cri, bait, "magiccache", image_of("magiccache", hostile_images))
    if outcome.ran:
        assert outcome.cid is not None
        assert_gpu_ready(cri, outcome.cid, node)
        assert_no_bait_inside(cri, outcome.cid, bait)
    else:
        assert_clear_refusal(outcome, ("/etc/ld.so.cache", "ld.so.cache"))
    finish(cri, outcome, bait, plugin, "magiccache")


def test_etc_linked_to_a_host_folder(
    testbed: Testbed,
    cri: CriClient,
    plugin: NriGpuProcess,
    node: SimNode,
    bait: Bait,
    hostile_images: dict[str, images.Image],
) -> None:
    """/etc itself -> <bait>/etc (the image keeps its real /etc at that path inside)."""
    outcome = launch(cri, bait, "etc", image_of("etc", hostile_images))
    if outcome.ran:
        assert outcome.cid is not None
        assert_gpu_ready(cri, outcome.cid, node)
        assert "00-nri-gpu.conf" in sh(cri, outcome.cid, f"ls {BAIT}/etc/ld.so.conf.d").split()
        assert_no_bait_inside(cri, outcome.cid, bait)
    else:
        assert_clear_refusal(outcome, ("/etc",))
    finish(cri, outcome, bait, plugin, "etc")


def test_soname_cannot_plant_links_with_our_rights(
    testbed: Testbed,
    cri: CriClient,
    plugin: NriGpuProcess,
    node: SimNode,
    bait: Bait,
    hostile_images: dict[str, images.Image],
) -> None:
    """ldconfig makes a ``<dir>/<SONAME>`` link for every library it scans, and glibc's
    takes a SONAME with ``/`` as it is. The image runs as nobody and names its own
    folder; /data is a root-owned host folder the container cannot write. Whatever
    runs ldconfig for us must not plant the image's link there with root's rights."""
    outcome = launch(cri, bait, "soname", image_of("soname", hostile_images), mounts=[volume_mount(cri)])
    assert outcome.ran, f"an odd SONAME is no reason to refuse: {outcome.error}"
    cid = outcome.cid
    assert cid is not None
    assert_volume_not_writable_by_the_container(cri, cid)
    assert_gpu_ready(cri, cid, node)
    sh(cri, cid, f"test ! -L {hostile.SONAME_TARGET}")
    assert_no_bait_inside(cri, cid, bait)
    finish(cri, outcome, bait, plugin, "soname")


def test_conf_d_linked_into_a_volume_the_container_cannot_write(
    testbed: Testbed,
    cri: CriClient,
    plugin: NriGpuProcess,
    node: SimNode,
    bait: Bait,
    hostile_images: dict[str, images.Image],
) -> None:
    """/etc/ld.so.conf.d -> /data: inside the container's root, but a root-owned host
    volume that the container (nobody) cannot write: the start step must not write
    00-nri-gpu.conf there with root's rights."""
    outcome = launch(cri, bait, "confvolume", image_of("confvolume", hostile_images), mounts=[volume_mount(cri)])
    if outcome.ran:
        assert outcome.cid is not None
        assert_volume_not_writable_by_the_container(cri, outcome.cid)
        assert_gpu_ready(cri, outcome.cid, node)
        assert_no_bait_inside(cri, outcome.cid, bait)
    else:
        assert_clear_refusal(outcome, ("/etc/ld.so.conf.d", "ld.so.conf.d", hostile.VOLUME))
    finish(cri, outcome, bait, plugin, "confvolume")


def volume_mount(cri: CriClient) -> Any:
    """The bait's root-owned ``volume`` folder, read-write at /data (as a hostPath)."""
    return cri.pb.Mount(container_path=hostile.VOLUME, host_path=str(BAIT / "volume"))


def assert_volume_not_writable_by_the_container(cri: CriClient, cid: str) -> None:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", f"id -u; touch {hostile.VOLUME}/probe"])
    assert out.split()[:1] == ["65534"] and code != 0 and "Permission denied" in err, (out, err)


def test_plugin_still_serves_after_the_hostile_images(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode, bait: Bait
) -> None:
    outcome = launch(cri, bait, "control-after", GLIBC)
    assert outcome.ran and outcome.cid is not None, outcome.error
    assert_gpu_ready(cri, outcome.cid, node)
    finish(cri, outcome, bait, plugin, "control-after")
