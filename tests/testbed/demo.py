"""The demo behind ``hack/demo``: a private containerd, ``nri-gpu run`` beside it,
one pod that asks for GPUs and one that does not, and what each container sees.

No GPU is needed: until the engine lands the plugin only turns the request into
the container's ``NVIDIA_VISIBLE_DEVICES``; the point is the whole path from a
pod annotation through containerd, NRI and the plugin into a running container.
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
from .plugins import NriGpuProcess

SLEEP = ["sh", "-c", "sleep 3600"]


@contextmanager
def step(text: str) -> Iterator[None]:
    print(f"-- {text} ...", end=" ", flush=True)
    start = time.monotonic()
    yield
    print(f"done ({time.monotonic() - start:.1f}s)")


def show_env(cri: CriClient, cid: str) -> list[str]:
    code, out, err = cri.exec_sync(cid, ["env"])
    if code != 0:
        raise SystemExit(f"exec failed: {err}")
    return sorted(line for line in out.splitlines() if line.startswith("NVIDIA_"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/demo", description=__doc__.splitlines()[0])
    parser.add_argument("--containerd", choices=runtimes.VERSIONS, default="2.1.9")
    parser.add_argument("--gpus", default="0,1", help="the pod's nvidia.com/gpus annotation (default 0,1)")
    parser.add_argument("--keep", action="store_true", help="leave the work directory for inspection")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("hack/demo runs containers: run it as root (sudo hack/demo)", file=sys.stderr)
        return 1

    workdir = Path(tempfile.mkdtemp(prefix="nri-gpu-demo-"))
    print(f"nri-gpu demo: containerd {args.containerd} with NRI, work directory {workdir}")
    reap_stale()
    with step(f"fetching containerd {args.containerd}, runc and busybox from Debian (cached after the first run)"):
        ctrd = Containerd(args.containerd, workdir)
        images.build_all()
    plugin: NriGpuProcess | None = None
    try:
        with step("starting containerd"):
            ctrd.prepare()
            ctrd.start()
            images.import_all(ctrd)
        cri = CriClient(ctrd.address, cgroup_parent=ctrd.cgroup_parent, log_root=workdir / "pod-logs")
        with step(f"starting `nri-gpu run --socket {ctrd.nri_socket}`"):
            plugin = NriGpuProcess(ctrd.nri_socket, workdir / "nri-gpu.log").start()

        gpu_pod = cri.run_pod("gpu-demo", annotations={"nvidia.com/gpus": args.gpus})
        gpu = cri.run_container(gpu_pod, "cuda-app", SLEEP)
        plain_pod = cri.run_pod("plain-demo")
        plain = cri.run_container(plain_pod, "web", SLEEP)

        print(f'\npod "gpu-demo" (annotation nvidia.com/gpus: {args.gpus}), container "cuda-app" sees:')
        for line in show_env(cri, gpu) or ["(no NVIDIA_* variables)"]:
            print(f"    {line}")
        print('pod "plain-demo" (no annotation), container "web" sees:')
        for line in show_env(cri, plain) or ["(no NVIDIA_* variables: it asked for nothing and got nothing)"]:
            print(f"    {line}")
        print("\nnri-gpu's log:")
        for line in plugin.log().splitlines():
            if "GPUs" in line or "registered" in line:
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
