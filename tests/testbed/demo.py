"""The demo behind ``hack/demo``: a private containerd, ``nri-gpu run`` beside it
pointed at a simulated GPU node (the real NVIDIA 550.163.01 user-space from
Debian, fake procfs and device nodes), one pod that asks for GPUs and one that
does not, and what each container sees.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import images, runtimes
from .containerd import Containerd, reap_stale
from .cri import CriClient
from .gpunode import build_node
from .plugins import NriGpuProcess

SLEEP = ["sh", "-c", "sleep 3600"]


@contextmanager
def step(text: str) -> Iterator[None]:
    print(f"-- {text} ...", end=" ", flush=True)
    start = time.monotonic()
    yield
    print(f"done ({time.monotonic() - start:.1f}s)")


# What a person would type in the container to see what it got.
LOOK = [
    ("ls /dev | grep nvidia", "ls /dev | grep nvidia || echo '(no NVIDIA devices)'"),
    ("env | grep NVIDIA_", "env | grep NVIDIA_ | sort || echo '(no NVIDIA_* variables)'"),
    ("ls /proc/driver/nvidia/gpus", "ls /proc/driver/nvidia/gpus 2>&1"),
    ("ldconfig -p | grep -E 'libcuda|libnvidia-ml'", "ldconfig -p | grep -E 'libcuda|libnvidia-ml' || echo '(none)'"),
    ("nvidia-smi", "nvidia-smi 2>&1 | head -3"),
]


# A MIG container: its capability nodes and the access files its view shows.
MIG_LOOK = [
    ("ls /dev/nvidia-caps", "ls /dev/nvidia-caps"),
    ("find /proc/driver/nvidia/capabilities -type f", "find /proc/driver/nvidia/capabilities -type f | sort"),
    ("ls /proc/driver/nvidia/gpus", "ls /proc/driver/nvidia/gpus 2>&1"),
]
# GPU instance 2 (a 3g slice) with two compute instances, GPU instance 3 (2g) with one.
MIG_INSTANCES = [(2, [0, 1]), (3, [0])]


def show(cri: CriClient, cid: str, look: list[tuple[str, str]] = LOOK) -> None:
    for title, script in look:
        _, out, err = cri.exec_sync(cid, ["sh", "-c", script])
        print(f"  $ {title}")
        for line in (out + err).strip().splitlines() or ["(nothing)"]:
            print(f"      {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/demo", description=__doc__.splitlines()[0])
    parser.add_argument("--containerd", choices=runtimes.VERSIONS, default="2.1.9")
    parser.add_argument("--gpus", default="0,1", help="the pod's nvidia.com/gpus annotation (default 0,1)")
    parser.add_argument("--node-gpus", type=int, default=4, help="GPUs of the simulated node (default 4)")
    parser.add_argument("--keep", action="store_true", help="leave the work directory for inspection")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("hack/demo runs containers: run it as root (sudo hack/demo)", file=sys.stderr)
        return 1

    workdir = Path(tempfile.mkdtemp(prefix="nri-gpu-demo-"))
    print(f"nri-gpu demo: containerd {args.containerd} with NRI, work directory {workdir}")
    reap_stale()
    with step(
        f"fetching containerd {args.containerd}, runc, busybox, glibc and the NVIDIA driver from Debian (cached)"
    ):
        ctrd = Containerd(args.containerd, workdir)
        images.build_all()
    mig_gpu = args.node_gpus - 1
    with step(
        f"building a simulated {args.node_gpus}-GPU node (real driver files, fake /proc and /dev; "
        f"GPU {mig_gpu} in MIG mode)"
    ):
        # NVIDIA's own libnvidia-ml stays (nvml="real"): it has no kernel driver here,
        # so MIG devices are asked for by placement, the form procfs alone resolves.
        node = build_node(workdir / "node", gpus=args.node_gpus, mig={mig_gpu: MIG_INSTANCES}, nvml="real")
    for gpu in node.gpus:
        print(f"     GPU {gpu.index}: /dev/nvidia{gpu.minor}  {gpu.bus_id}  {gpu.uuid}")
    parent = node.gpus[mig_gpu]
    print(
        f"     GPU {mig_gpu}: MIG instances "
        + " ".join(f"gi{gi}(" + ",".join(f"ci{c}" for c in cis) + ")" for gi, cis in MIG_INSTANCES)
    )
    plugin: NriGpuProcess | None = None
    try:
        with step("starting containerd"):
            ctrd.prepare()
            ctrd.start()
            images.import_all(ctrd)
        cri = CriClient(ctrd.address, cgroup_parent=ctrd.cgroup_parent, log_root=workdir / "pod-logs")
        flags = " ".join(node.flags())
        with step(f"starting `nri-gpu run --socket {ctrd.nri_socket} {flags}`"):
            plugin = NriGpuProcess(ctrd.nri_socket, workdir / "nri-gpu.log", *node.flags()).start()

        gpu_pod = cri.run_pod("gpu-demo", annotations={"nvidia.com/gpus": args.gpus})
        gpu = cri.run_container(gpu_pod, "cuda-app", SLEEP, image=images.GLIBC)
        plain_pod = cri.run_pod("plain-demo")
        plain = cri.run_container(plain_pod, "web", SLEEP, image=images.GLIBC)

        print(f'\npod "gpu-demo" (annotation nvidia.com/gpus: {args.gpus}), container "cuda-app":')
        show(cri, gpu)
        print('\npod "plain-demo" (no annotation), container "web": it asked for nothing and got nothing')
        show(cri, plain)
        mig_device = f"MIG-{parent.uuid}/2/1"
        mig_pod = cri.run_pod("mig-demo", annotations={"nvidia.com/gpus": mig_device})
        mig = cri.run_container(mig_pod, "inference", SLEEP, image=images.GLIBC)
        print(f'\npod "mig-demo" (nvidia.com/gpus: {mig_device}: GPU {mig_gpu}\'s GPU instance 2, compute instance 1):')
        show(cri, mig, LOOK[:2] + MIG_LOOK)
        refused = cri.run_pod("bad-demo", annotations={"nvidia.com/gpus": "7"})
        try:
            cri.run_container(refused, "main", SLEEP, image=images.GLIBC)
        except Exception as exc:  # the CRI error carries the plugin's message
            print(f'\npod "bad-demo" (nvidia.com/gpus: 7) is refused:\n  {exc}')
        print("\nnri-gpu's log:")
        for line in plugin.log().splitlines():
            if "GPUs" in line or "registered" in line or "refused" in line:
                print(f"    {line}")
        cri.remove_all()
        cri.close()
    finally:
        with step("stopping nri-gpu and containerd, cleaning up"):
            if plugin is not None:
                plugin.stop()
            ctrd.stop()
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
