"""A container's cgroup directory from the OCI cgroupsPath."""

from __future__ import annotations

import pytest

from engine.start.cgroup import relative_path


@pytest.mark.parametrize(
    ("cgroups_path", "expected"),
    [
        ("/k8s-e2e/abc", "k8s-e2e/abc"),
        ("/kubepods/burstable/pod1/abc", "kubepods/burstable/pod1/abc"),
        ("kubepods/abc", "kubepods/abc"),
        (
            "kubepods-burstable-pod1.slice:cri-containerd:abc",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope",
        ),
        ("system.slice:docker:abc", "system.slice/docker-abc.scope"),
        (":crio:abc", "system.slice/crio-abc.scope"),
        ("-.slice:p:abc", "p-abc.scope"),
        ("machine.slice:p:sub.slice", "machine.slice/sub.slice"),
    ],
)
def test_both_forms(cgroups_path: str, expected: str) -> None:
    assert relative_path(cgroups_path) == expected


@pytest.mark.parametrize("bad", ["", "/", "/a/../b", "bad-.slice:p:x", "a--b.slice:p:x", "notaslice:p:x", "s.slice:p:"])
def test_bad_paths_are_named(bad: str) -> None:
    with pytest.raises(ValueError, match=r"slice|cgroups path"):
        relative_path(bad)
