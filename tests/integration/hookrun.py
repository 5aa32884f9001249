"""The compiled CDI hook (``nri-gpu-hook``) run as runc runs a ``createContainer`` hook.

runc runs a spec's ``createContainer`` hooks after it has set up the container's
mounts and before ``pivot_root``, in the container's mount namespace: the container
root (the bundle's ``root.path``, bind-mounted onto itself, so a mount root) with
the spec's mounts under it and a procfs at its ``/proc``; the host's paths are
still where they are. The hook's working directory is the bundle, its stdin the OCI
state, its argv and environment the spec's and nothing else.

``run_hook`` does exactly that in one forked child: ``unshare(CLONE_NEWNS)``, ``/``
made rprivate, the root bound onto itself, the bundle's mounts bound read-only
under it (their mount points made as runc makes them), a procfs at its ``/proc``,
then the hook, once or more, and after each run ``tree`` of the root read in that
namespace (the procfs view is a mount there and nowhere else). Nothing outlives
the child but the files written into the root.

``tree`` reads what the start work leaves, the same way for either path: the
procfs view (every entry, mode and content, and its mounts), ``/etc``, the
library links and folders. The NRI path's worker runs in a runc container: its
tree is read through ``/proc/<pid>/root`` (``tree_of_container``).

``Spec`` is what a CDI runtime takes from ``engine.cdi.cdi_spec``: the devices'
and the spec-wide edits, the hook as the spec names it. ``image_root`` makes a
bundle's root an overlay of the image runc's test containers get, so that the two
paths start from the same files. Needs root.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import stat
import subprocess
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "BINARY",
    "Bundle",
    "HookRun",
    "Result",
    "Spec",
    "cache_bytes",
    "call",
    "cannot_run",
    "comparable",
    "hook_binary",
    "image_root",
    "oci_state",
    "run_hook",
    "tree",
    "tree_of_container",
    "walk",
]

BINARY = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "nri-gpu-hook"

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x20, 0x1000, 0x4000, 1 << 18
_CLONE_NEWNS = 0x00020000
_LOCKED = frozenset({"ro", "nosuid", "nodev", "noexec"})
_SMALL = 1 << 20  # file contents kept whole up to this size, else a hash
_CHILD_LIMIT = 120  # seconds: a child stuck anywhere is killed (SIGALRM) rather than hang the suite

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def cannot_run(reason: str) -> None:
    """Skip, or fail under ``NRI_GPU_E2E_REQUIRE=1`` (CI), as the other integration tests do."""
    if os.environ.get("NRI_GPU_E2E_REQUIRE") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def hook_binary() -> Path:
    """``.venv/bin/nri-gpu-hook`` (hack/setup keeps it current), or skip/fail saying so."""
    if not os.access(BINARY, os.X_OK):
        cannot_run(f"{BINARY} is missing: run hack/setup to build the compiled hook")
    return BINARY


# --------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class Spec:
    """A CDI spec as a runtime applies it: the spec-wide edits plus the named devices'."""

    data: dict[str, Any]

    @property
    def hook(self) -> dict[str, Any]:
        hooks = self.data["containerEdits"]["hooks"]
        assert len(hooks) == 1 and hooks[0]["hookName"] == "createContainer", hooks
        return dict(hooks[0])

    @property
    def mounts(self) -> list[tuple[str, str]]:
        return [(m["hostPath"], m["containerPath"]) for m in self.data["containerEdits"]["mounts"]]

    def devices(self, *names: str) -> list[dict[str, Any]]:
        """``linux.devices`` of a container given ``names``: the spec-wide nodes, then each
        named device's (a name the spec lacks is a test's mistake)."""
        found = list(self.data["containerEdits"].get("deviceNodes", []))
        by_name = {d["name"]: d for d in self.data["devices"]}
        for name in names:
            found += by_name[name]["containerEdits"].get("deviceNodes", [])
        unique = {(d["major"], d["minor"]): d for d in found}
        return [{**d, "type": d.get("type", "c")} for d in unique.values()]


# --------------------------------------------------------------------------- the bundle


@dataclass
class Bundle:
    """A bundle folder with its ``config.json`` and container root (``rootfs`` by default)."""

    path: Path
    devices: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[tuple[str, str]] = field(default_factory=list)
    root_path: str = "rootfs"

    def __post_init__(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.rootfs.mkdir(parents=True, exist_ok=True)
        self.write()

    @property
    def rootfs(self) -> Path:
        return self.path / self.root_path if not self.root_path.startswith("/") else Path(self.root_path)

    def config(self) -> dict[str, Any]:
        return {
            "ociVersion": "1.0.2",
            "root": {"path": self.root_path},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                *(
                    {"destination": dst, "type": "bind", "source": src, "options": ["ro", "nosuid", "nodev", "rbind"]}
                    for src, dst in self.mounts
                ),
            ],
            "linux": {"devices": self.devices},
        }

    def write(self) -> None:
        (self.path / "config.json").write_text(json.dumps(self.config(), indent=1))


def image_root(bundle: Bundle, lower: Path, prepare: Callable[[Path], None] | None = None) -> None:
    """Make ``bundle``'s root an overlay of the image tree ``lower``, as runc's
    containers in testbed.bundle get (so the two start from the same files),
    then ``prepare(rootfs)``. The overlay is the host's: unmount it (``hostops.unmount_under``)."""
    upper, work = bundle.path / "upper", bundle.path / "work"
    upper.mkdir()
    work.mkdir()
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    _mount("overlay", str(bundle.rootfs), "overlay", 0, options)
    if prepare is not None:
        prepare(bundle.rootfs)


def oci_state(bundle: Path, container_id: str = "c1") -> bytes:
    """The state runc writes to a createContainer hook's stdin."""
    state = {"ociVersion": "1.0.2", "id": container_id, "status": "creating", "pid": 4242, "bundle": str(bundle)}
    return json.dumps(state).encode()


@dataclass(frozen=True)
class HookRun:
    returncode: int
    stderr: str
    seconds: float


@dataclass(frozen=True)
class Result:
    """What the child saw: each run of the hook, and the tree after it."""

    runs: tuple[HookRun, ...]
    trees: tuple[dict[str, Any], ...]

    @property
    def run(self) -> HookRun:
        return self.runs[-1]

    @property
    def tree(self) -> dict[str, Any]:
        return self.trees[-1]

    def ok(self) -> dict[str, Any]:
        """The tree after the last run, which must have succeeded."""
        for run in self.runs:
            assert run.returncode == 0, run.stderr
            assert run.stderr == "", run.stderr
        return self.tree


def call(
    argv: Sequence[str], *, stdin: bytes | int | None = None, env: dict[str, str] | None = None, timeout: float = 30
) -> HookRun:
    """The hook run as a plain process (no namespace of its own): for what fails before
    it touches a container root."""
    began = time.monotonic()
    done = subprocess.run(
        list(argv),
        input=stdin if isinstance(stdin, bytes) else None,
        stdin=stdin if isinstance(stdin, int) else (None if isinstance(stdin, bytes) else subprocess.DEVNULL),
        capture_output=True,
        env=env if env is not None else {},
        timeout=timeout,
        check=False,
    )
    return HookRun(done.returncode, done.stderr.decode(errors="replace"), time.monotonic() - began)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(
        None if source is None else os.fsencode(source),
        os.fsencode(target),
        None if fstype is None else fstype.encode(),
        flags,
        None if data is None else os.fsencode(data),
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _mount_point(source: str, target: Path) -> None:
    """runc's: a folder for a folder, an empty file for anything else."""
    if os.path.isdir(source):
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(target):
            target.touch()


def _set_up(
    bundle: Bundle, binds: Iterable[tuple[str, str]], volumes: Iterable[tuple[str, str]], readonly: bool
) -> None:
    if _libc.unshare(_CLONE_NEWNS):
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    root = str(bundle.rootfs)
    _mount(root, root, None, _MS_BIND | _MS_REC)
    for writable, (source, destination) in [*((False, b) for b in binds), *((True, v) for v in volumes)]:
        target = bundle.rootfs / destination.lstrip("/")
        _mount_point(source, target)
        _mount(source, str(target), None, _MS_BIND | _MS_REC)
        lock = _MS_NOSUID | _MS_NODEV | (0 if writable else _MS_RDONLY)
        _mount(None, str(target), None, _MS_REMOUNT | _MS_BIND | lock)
    (bundle.rootfs / "proc").mkdir(exist_ok=True)
    _mount("proc", f"{root}/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    if readonly:
        _mount(None, root, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)


def run_hook(
    bundle: Bundle,
    argv: Sequence[str],
    env: Sequence[str],
    *,
    state: bytes | None = None,
    binds: Iterable[tuple[str, str]] | None = None,
    volumes: Iterable[tuple[str, str]] = (),
    readonly: bool = False,
    times: int = 1,
    before: Callable[[int], None] | None = None,
    links: Iterable[str] = (),
    folders: Iterable[str] = (),
    timeout: float = 15,
) -> Result:
    """Run the hook ``times`` times as runc would on ``bundle`` (see the module doc).

    ``argv``/``env``: the spec's; ``binds``: (host source, container path) pairs bound
    read-only, by default the bundle's mounts (a test gives others to stand for what
    runc really bound); ``volumes``: read-write ones (a hostPath); ``readonly``: the
    root bound read-only (``root.readonly``); ``before(i)``: called in the child,
    its mounts made, before run ``i`` (from 0); ``links``/``folders``: read back by
    ``tree``."""
    payload = state if state is not None else oci_state(bundle.path)
    chosen, writable = list(bundle.mounts if binds is None else binds), list(volumes)
    environment = dict(item.split("=", 1) for item in env)
    links, folders = list(links), list(folders)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.close(r)
        signal.alarm(_CHILD_LIMIT)
        outcome: dict[str, Any] = {"runs": [], "trees": [], "error": None}
        held: list[int] = []
        try:
            _set_up(bundle, chosen, writable, readonly)
            for i in range(times):
                if before is not None:
                    before(i)
                began = time.monotonic()
                done = subprocess.run(
                    list(argv),
                    input=payload,
                    capture_output=True,
                    env=environment,
                    cwd=bundle.path,
                    timeout=timeout,
                    check=False,
                )
                outcome["runs"].append(
                    [done.returncode, done.stderr.decode(errors="replace"), time.monotonic() - began]
                )
                found = tree(bundle.rootfs, str(bundle.rootfs), "/proc/self/mountinfo", links, folders)
                outcome["trees"].append(found)
                # Held to the end: a view replaced later stays allocated, so no new
                # mount can take its id (ids are reused as soon as they are free).
                held.extend(os.open(f"{bundle.rootfs}{m[0]}", os.O_PATH) for m in found["view_mounts"])
        except BaseException:
            outcome["error"] = traceback.format_exc()
        with os.fdopen(w, "w") as out:
            json.dump(outcome, out)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, f"the hook's namespace child ended with {status:#x}"
    outcome = json.loads(data)
    assert outcome["error"] is None, outcome["error"]
    return Result(tuple(HookRun(*run) for run in outcome["runs"]), tuple(outcome["trees"]))


# --------------------------------------------------------------------------- reading a tree back


def _entry(path: Path, st: os.stat_result) -> list[Any]:
    """[type, mode, what]: a link's target, a small file's content (latin-1), a big one's hash."""
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return ["l", mode, os.readlink(path)]
    if stat.S_ISDIR(st.st_mode):
        return ["d", mode, None]
    if stat.S_ISREG(st.st_mode):
        if st.st_size <= _SMALL:
            return ["f", mode, path.read_bytes().decode("latin-1")]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return ["f", mode, f"sha256:{h.hexdigest()} size:{st.st_size}"]
    kind = "c" if stat.S_ISCHR(st.st_mode) else "p" if stat.S_ISFIFO(st.st_mode) else "?"
    return [kind, mode, None]  # never opened: a FIFO would block, a device is not ours to open


def walk(top: Path, *, deep: bool = True) -> dict[str, list[Any]] | None:
    """Every entry under ``top`` (not following links), by path relative to it; None if absent."""
    try:
        top_stat = os.lstat(top)
    except FileNotFoundError:
        return None
    found = {".": _entry(top, top_stat)}
    if not stat.S_ISDIR(top_stat.st_mode):
        return found
    pending = [top]
    while pending:
        folder = pending.pop()
        for item in os.scandir(folder):
            path = Path(item.path)
            st = item.stat(follow_symlinks=False)
            found[str(path.relative_to(top))] = _entry(path, st)
            if deep and stat.S_ISDIR(st.st_mode):
                pending.append(path)
    return dict(sorted(found.items()))


def _unescape(text: str) -> str:
    return text.encode().decode("unicode_escape").encode("latin-1").decode()


def _mounts(mountinfo: str, prefix: str) -> tuple[list[list[Any]], list[int], list[str]]:
    """The view's mounts under ``<prefix>/proc/driver`` as [path, fs type, source,
    locking options]; their ids; the options of the root's top mount."""
    view: list[list[Any]] = []
    ids: list[int] = []
    root_options: list[str] = []
    for line in Path(mountinfo).read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, (fstype, source, *_) = left.split(), right.split()
        point = _unescape(fields[4])
        if point == (prefix or "/"):
            root_options = sorted(fields[5].split(","))
        if point == f"{prefix}/proc/driver" or point.startswith(f"{prefix}/proc/driver/"):
            view.append([point[len(prefix) :], fstype, source, sorted(_LOCKED & set(fields[5].split(",")))])
            ids.append(int(fields[0]))
    return sorted(view), ids, root_options


def tree(
    root: Path, prefix: str, mountinfo: str, links: Iterable[str] = (), folders: Iterable[str] = ()
) -> dict[str, Any]:
    """What the start work leaves in the container whose root is ``root`` (read from this
    mount namespace), ``prefix`` being that root as ``mountinfo`` names it: the procfs
    view (``proc/driver``, as a tree and as mounts), ``/etc``, ``links`` (their
    targets, None when not a link), ``folders`` (their direct entries) and the
    ld.so.cache's identity (inode, mtime: a cache not written again keeps both)."""
    view_mounts, view_ids, root_options = _mounts(mountinfo, prefix)
    targets: dict[str, str | None] = {}
    for link in links:
        try:
            targets[link] = os.readlink(root / link.lstrip("/"))
        except OSError:
            targets[link] = None
    try:
        cache = os.lstat(root / "etc/ld.so.cache")
        cache_id: list[int] | None = [cache.st_ino, cache.st_mtime_ns]
    except OSError:
        cache_id = None
    return {
        "view": walk(root / "proc/driver"),
        "view_mounts": view_mounts,
        "view_ids": view_ids,
        "root_options": root_options,
        "etc": walk(root / "etc"),
        "links": targets,
        "folders": {f: walk(root / f.lstrip("/"), deep=False) for f in folders},
        "cache_id": cache_id,
    }


def tree_of_container(pid: int, links: Iterable[str] = (), folders: Iterable[str] = ()) -> dict[str, Any]:
    """``tree`` of a runc container (its init ``pid``), read through ``/proc/<pid>/root``."""
    return tree(Path(f"/proc/{pid}/root"), "", f"/proc/{pid}/mountinfo", links, folders)


def comparable(found: dict[str, Any]) -> dict[str, Any]:
    """A tree less what differs between two containers whatever was done in them."""
    return {k: v for k, v in found.items() if k not in ("view_ids", "cache_id", "root_options")}


def cache_bytes(found: dict[str, Any]) -> bytes | None:
    """The container's ``/etc/ld.so.cache`` as ``tree`` read it (None: no regular file)."""
    entry = (found["etc"] or {}).get("ld.so.cache")
    if entry is None or entry[0] != "f":
        return None
    text: str = entry[2]
    assert not text.startswith("sha256:"), "a cache over the size tree() keeps whole"
    return text.encode("latin-1")
