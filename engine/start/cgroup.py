"""Where a container's cgroup is, from the OCI ``linux.cgroupsPath``.  (pure)

Needed when a runtime reports pid 0 at StartContainer: the container's init
process is then the one process in its cgroup. And to check that a pid is the
container's at all (``is_in``): the start work acts as root on whatever mount
namespace that pid has.
"""

from __future__ import annotations

__all__ = ["is_in", "relative_path"]

MAX_PROC_CGROUP = 1 << 16  # /proc/<pid>/cgroup: one line per v1 hierarchy, a few hundred bytes


def _expand_slice(slice_name: str) -> str:
    # systemd nests slices by their dashes: a-b-c.slice -> a.slice/a-b.slice/a-b-c.slice
    # (runc's ExpandSlice); "-.slice" is the root slice.
    if slice_name == "-.slice":
        return ""
    if not slice_name.endswith(".slice") or "/" in slice_name:
        raise ValueError(f"{slice_name!r} is not a systemd slice name")
    stem = slice_name[: -len(".slice")]
    if not stem or stem.startswith("-") or stem.endswith("-") or "--" in stem:
        raise ValueError(f"{slice_name!r} is not a systemd slice name")
    parts = stem.split("-")
    return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def relative_path(cgroups_path: str) -> str:
    """The cgroup directory below a hierarchy's root, without a leading slash.

    Two forms, as runc takes them: cgroupfs (``/kubepods/pod1/abc``) and systemd
    (``slice:prefix:name``: the unit ``prefix-name.scope`` in the slice).

    >>> relative_path("/k8s-e2e/abc")
    'k8s-e2e/abc'
    >>> relative_path("kubepods-besteffort-pod1.slice:cri-containerd:abc")
    'kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope'

    Raises ``ValueError`` naming a path of neither form (or with ``..``).
    """
    if cgroups_path.count(":") == 2 and not cgroups_path.startswith("/"):
        slice_name, prefix, name = cgroups_path.split(":")
        if not name or "/" in name or "/" in prefix:
            raise ValueError(f"cgroups path {cgroups_path!r}: bad systemd unit")
        unit = name if name.endswith(".slice") else (f"{prefix}-{name}.scope" if prefix else f"{name}.scope")
        parent = _expand_slice(slice_name or "system.slice")
        return f"{parent}/{unit}" if parent else unit
    parts = [p for p in cgroups_path.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"cgroups path {cgroups_path!r} is neither /parent/name nor slice:prefix:name")
    return "/".join(parts)


def is_in(proc_cgroup: str, cgroups_path: str) -> bool:
    """Whether a process whose ``/proc/<pid>/cgroup`` reads ``proc_cgroup`` is in the
    cgroup of ``cgroups_path`` (as ``relative_path`` takes it), on any hierarchy:
    the unified one (``0::/path``) or a v1 controller's (``4:pids:/path``).

    The paths there are relative to the *reader's* cgroup namespace: the whole
    path for a reader at the root, its tail for one whose namespace root is above
    the cgroup, and ``/../../tail`` for one beside it (a plugin in a pod of its
    own, with a private cgroup namespace). So a path matches when what is left
    after its leading ``..`` components starts with a tail of the expected path
    of at least the container's own last component: the container's cgroup, or
    one below it (crun's systemd driver puts the processes in ``container``
    below the scope; only the runtime or the container itself can make a
    cgroup there and move a process into it).

    >>> is_in("0::/kubepods/pod1/abc\\n", "/kubepods/pod1/abc")
    True
    >>> is_in("0::/../../pod1/abc\\n", "/kubepods/pod1/abc")
    True
    >>> is_in("12:pids:/kubepods/pod1/other\\n0::/\\n", "/kubepods/pod1/abc")
    False
    >>> is_in("0::/system.slice/cri-containerd-abc.scope\\n", "system.slice:cri-containerd:abc")
    True
    >>> is_in("0::/system.slice/crio-abc.scope/container\\n", "system.slice:crio:abc")
    True

    Raises ``ValueError`` naming a line not in the kernel's format, or a
    ``cgroups_path`` ``relative_path`` refuses.
    """
    want = relative_path(cgroups_path).split("/")
    for line in proc_cgroup.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[2].startswith("/"):
            raise ValueError(f"/proc/<pid>/cgroup: malformed line {line[:200]!r}")
        parts = [p for p in fields[2].split("/") if p]
        while parts and parts[0] == "..":
            del parts[0]
        if ".." in parts:
            continue
        for end, part in enumerate(parts[: len(want)], 1):  # the container's leaf, then below it
            if part == want[-1] and parts[:end] == want[len(want) - end :]:
                return True
    return False
