"""The demo behind ``hack/demo``: a private containerd, ``nri-gpu run`` beside it
pointed at a simulated GPU node (the real NVIDIA 550.163.01 user-space from
Debian, fake procfs and device nodes), one pod that asks for GPUs and one that
does not, and what each container sees.

``--runtime podman`` or ``--runtime docker`` tells the same story through the CDI
path instead: this checkout's ``nri-gpu cdi generate`` writes the node's spec where
the test bed's runtime reads it (podman 4.3: ``/var/run/cdi``, under the e2e tests'
lock, removed at the end; Docker: its private ``cdi-spec-dirs`` folder), and
containers ask with ``--device nvidia.com/gpu=N``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from . import images, runtimes
from .containerd import Containerd, reap_stale
from .cri import CriClient
from .docker import Docker
from .gpunode import SimNode, build_node
from .plugins import NRI_GPU, NriGpuProcess
from .podman import Podman, SpecFolderTaken, shared_spec_path

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
    def run(script: str) -> str:
        _, out, err = cri.exec_sync(cid, ["sh", "-c", script])
        return out + err

    show_with(run, look)


def show_with(run: Callable[[str], str], look: list[tuple[str, str]] = LOOK) -> None:
    """Print each LOOK command and what ``run(script)`` (its output in the container) gives."""
    for title, script in look:
        print(f"  $ {title}")
        for line in run(script).strip().splitlines() or ["(nothing)"]:
            print(f"      {line}")


# A CDI runtime of the test bed: podman or a private dockerd (both callable as the CLI).
CdiRuntime = Podman | Docker


@contextmanager
def cdi_spec(rt: CdiRuntime, node: SimNode) -> Iterator[Path]:
    """``nri-gpu cdi generate`` (this checkout's, ``--allow-untrusted-hook``, its warning
    shown) into the folder ``rt`` reads, removed at the end. For podman 4.3 that is
    /var/run/cdi, as tests/e2e/test_podman.py does it: under its lock, refusing beside a
    foreign nvidia.com/gpu spec, named so that a session killed midway is cleaned up."""
    if isinstance(rt, Docker):
        path = rt.cdi_dir / "nri-gpu.json"
        _generate(node, path)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)
        return
    try:
        with shared_spec_path("demo-") as path:
            _generate(node, path)
            yield path
    except SpecFolderTaken as exc:
        raise SystemExit(str(exc)) from exc


def _generate(node: SimNode, path: Path) -> None:
    argv = [NRI_GPU, "cdi", "generate", *node.flags(), "--output", str(path), "--allow-untrusted-hook"]
    print(f"     $ {' '.join(argv)}")
    done = subprocess.run(argv, capture_output=True, text=True)
    for line in done.stderr.strip().splitlines():
        print(f"       {line}")
    if done.returncode != 0:
        raise RuntimeError(f"nri-gpu cdi generate exited {done.returncode}")


def cdi_demo(rt: CdiRuntime, name: str, node: SimNode, gpus: list[str]) -> None:
    """The pod story through the CDI path: ``rt`` and a spec it reads are ready."""
    devices = [flag for g in gpus for flag in ("--device", f"nvidia.com/gpu={g}")]

    def start(container: str, options: list[str]) -> Callable[[str], str]:
        started = rt.run(images.GLIBC, *SLEEP, options=["--detach", "--name", container, *options], check=True)
        cid = started.stdout.strip().splitlines()[-1]

        def run(script: str) -> str:
            done = rt("exec", cid, "sh", "-c", script, check=False)
            return done.stdout + done.stderr

        return run

    print(f"\n{name} run {' '.join(devices)} --name cuda-app:")
    show_with(start("cuda-app", devices))
    print(f"\n{name} run --name web (no --device): it asked for nothing and got nothing")
    show_with(start("web", []))
    bad = f"nvidia.com/gpu={len(node.gpus) + 3}"
    done = rt.run(images.GLIBC, "true", options=["--device", bad])
    print(f"\n{name} run --device {bad} is refused (exit {done.returncode}):")
    for line in done.stderr.strip().splitlines():
        if line.strip():
            print(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runtime",
        choices=("containerd", "podman", "docker"),
        default="containerd",
        help="containerd with NRI (default), or podman 4.3.1 / Docker through the CDI path",
    )
    parser.add_argument("--containerd", choices=runtimes.VERSIONS, default="2.1.9")
    parser.add_argument(
        "--gpus",
        default="0,1",
        help="the pod's nvidia.com/gpus annotation, or the --device nvidia.com/gpu= list (default 0,1)",
    )
    parser.add_argument("--node-gpus", type=int, default=4, help="GPUs of the simulated node (default 4)")
    parser.add_argument("--keep", action="store_true", help="leave the work directory for inspection")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("hack/demo runs containers: run it as root (sudo hack/demo)", file=sys.stderr)
        return 1

    workdir = Path(tempfile.mkdtemp(prefix="nri-gpu-demo-"))
    reap_stale()
    try:
        if args.runtime == "containerd":
            print(f"nri-gpu demo: containerd {args.containerd} with NRI, work directory {workdir}")
            return containerd_main(args, workdir)
        print(f"nri-gpu demo: {args.runtime} through CDI (no NRI), work directory {workdir}")
        return cdi_main(args, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def simulated_node(args: argparse.Namespace, workdir: Path) -> tuple[SimNode, int]:
    """The demo's node (its last GPU in MIG mode), listed; returns it and the MIG GPU."""
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
    print(
        f"     GPU {mig_gpu}: MIG instances "
        + " ".join(f"gi{gi}(" + ",".join(f"ci{c}" for c in cis) + ")" for gi, cis in MIG_INSTANCES)
    )
    return node, mig_gpu


def cdi_main(args: argparse.Namespace, workdir: Path) -> int:
    rt: CdiRuntime
    if args.runtime == "podman":
        with step("fetching podman 4.3.1, conmon, runc, glibc and the NVIDIA driver from Debian (cached)"):
            rt = Podman(workdir / "podman")
            image = images.glibc_image()
    else:
        with step("fetching Docker, containerd, runc, glibc and the NVIDIA driver from Debian (cached)"):
            rt = Docker(workdir / "docker")
            image = images.glibc_image()
    name = f"{args.runtime} {rt.version}"
    node, _ = simulated_node(args, workdir)
    try:
        if isinstance(rt, Docker):
            with step(f"starting a private dockerd {rt.version} (its CDI spec folder: {rt.cdi_dir})"):
                rt.start()
        with step(f"loading {images.GLIBC} into {args.runtime}"):
            rt.load(image)
        print(f"-- writing the node's CDI spec with this checkout's nri-gpu ({NRI_GPU}):")
        with cdi_spec(rt, node) as path:
            spec = json.loads(path.read_text())
            names = [d["name"] for d in spec["devices"] if not d["name"].startswith("GPU-")]
            print(
                f"     {path}: cdiVersion {spec['cdiVersion']}, devices {spec['kind']}="
                + ",".join(names)
                + " and each GPU's UUID"
            )
            cdi_demo(rt, name, node, args.gpus.split(","))
            with step(f"removing the containers and {path}"):
                # sleep as PID 1 ignores SIGTERM: podman would wait 10 s before killing it
                rt(
                    "rm",
                    "--force",
                    *(["--time", "0"] if isinstance(rt, Podman) else []),
                    "cuda-app",
                    "web",
                    check=False,
                )
    finally:
        with step(f"stopping {args.runtime}, cleaning up"):
            if isinstance(rt, Docker):
                rt.stop()
            else:
                rt.cleanup()
    return 0


def containerd_main(args: argparse.Namespace, workdir: Path) -> int:
    with step(
        f"fetching containerd {args.containerd}, runc, busybox, glibc and the NVIDIA driver from Debian (cached)"
    ):
        ctrd = Containerd(args.containerd, workdir)
        images.build_all()
    node, mig_gpu = simulated_node(args, workdir)
    parent = node.gpus[mig_gpu]
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
