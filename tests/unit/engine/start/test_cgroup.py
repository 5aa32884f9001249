"""A container's cgroup directory from the OCI cgroupsPath."""

from __future__ import annotations

import pytest

from nri_gpu.engine.start import cgroup
from nri_gpu.engine.start.cgroup import relative_path


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


@pytest.mark.parametrize(
    ("proc_cgroup", "cgroups_path", "inside"),
    [
        ("0::/k8s/pod1/abc\n", "/k8s/pod1/abc", True),
        ("0::/k8s/pod1/abcd\n", "/k8s/pod1/abc", False),  # whole components only
        ("0::/k8s/pod1/other\n", "/k8s/pod1/abc", False),
        ("0::/\n", "/k8s/pod1/abc", False),  # the host's root cgroup
        ("0::/pod1/abc\n", "/k8s/pod1/abc", True),  # the reader's cgroup namespace is /k8s
        ("0::/../../pod1/abc\n", "/k8s/pod1/abc", True),  # ... or beside it (a plugin pod, cgroupns private)
        ("0::/../../pod2/abc\n", "/k8s/pod1/abc", False),
        ("0::/../../pod1/abc/x\n", "/k8s/pod1/abc", True),  # below it: only the container or its runtime put it there
        ("0::/k8s/pod1/x/abc/y\n", "/k8s/pod1/abc", False),
        ("0::/../../..\n", "/k8s/pod1/abc", False),
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope\n",
            "kubepods-besteffort-pod1.slice:cri-containerd:abc",
            True,
        ),
        (  # crun's systemd driver: the processes go into a "container" cgroup below the scope
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/crio-abc.scope/container\n",
            "kubepods-besteffort-pod1.slice:crio:abc",
            True,
        ),
        (
            "12:pids:/kubepods/pod1/abc\n11:memory:/kubepods/pod1/abc\n1:name=systemd:/kubepods/pod1/abc\n0::/\n",
            "/kubepods/pod1/abc",
            True,
        ),  # cgroup v1 (hybrid: the unified hierarchy is unused)
        ("12:pids:/user.slice\n0::/user.slice/session-1.scope\n", "/kubepods/pod1/abc", False),
    ],
    ids=[
        "v2",
        "v2-prefix-of-a-name",
        "v2-other",
        "v2-root",
        "cgroupns-below",
        "cgroupns-beside",
        "cgroupns-wrong-tail",
        "cgroupns-beside-below",
        "wrong-parent-below",
        "only-dots",
        "systemd",
        "systemd-crun",
        "v1",
        "v1-other",
    ],
)
def test_is_in(proc_cgroup: str, cgroups_path: str, inside: bool) -> None:
    assert cgroup.is_in(proc_cgroup, cgroups_path) is inside


@pytest.mark.parametrize("text", ["garbage\n", "0:/x\n", "0::relative\n"])
def test_is_in_names_a_malformed_line(text: str) -> None:
    with pytest.raises(ValueError, match=r"/proc/<pid>/cgroup: malformed line"):
        cgroup.is_in(text, "/k8s/abc")
