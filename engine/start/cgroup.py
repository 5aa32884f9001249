"""Where a container's cgroup is, from the OCI ``linux.cgroupsPath``.  (pure)

Needed when a runtime reports pid 0 at StartContainer: the container's init
process is then the one process in its cgroup.
"""

from __future__ import annotations

__all__ = ["relative_path"]


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
