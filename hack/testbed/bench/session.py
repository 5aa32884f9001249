"""One containerd version under the benchmark: its daemon, the plugins and the three measurements.

Latency (``RuntimeBench.latency``): for each variant, ``pods`` pods are run
(RunPodSandbox, not timed) and in each one container is created and started;
the time of CreateContainer and of StartContainer is taken at the CRI client,
which is what kubelet waits for and what NRI plugins add to. The variants that
need a plugin process share it (the three nri-gpu ones), so the work is done in
rounds: in each round the four plugin set-ups (none, the do-nothing plugin,
nri-gpu, nri-gpu with ``ld_cache = "rebuild"``) come in a random order, and within one set-up its variants' pods are
shuffled. Each set-up starts with one unrecorded pod per variant (connection
warm-up), and the whole run with a few unrecorded pods without any plugin
(image unpack, first shim). Drift of the machine therefore falls on every
variant alike.

Burst (``RuntimeBench.burst``): ``n`` pods asking for one GPU each are run at
once, then their containers are created and started from ``n`` threads released
together; the plugin's handler durations (its JSON log) show whether any call
came near the runtime's 2 s NRI deadline.

Churn (``RuntimeBench.churn``): a freshly started nri-gpu serves ``n`` GPU
containers created, started, stopped and removed one after the other in one
pod; its RSS and descriptor count are read from ``/proc/<pid>`` at start and
every ``n / 20`` containers.
"""

from __future__ import annotations

import math
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import discover
from nri_gpu.engine.plan import plan as make_plan
from nri_gpu.engine.request import ContainerInfo, parse_request
from testbed import images
from testbed.containerd import Containerd
from testbed.cri import CriClient, CriError
from testbed.gpunode import SimNode
from testbed.images import GLIBC
from testbed.plugins import ROOT, NriGpuProcess

from .logparse import PluginLog, parse_log

__all__ = [
    "DEADLINE_MS",
    "NEAR_DEADLINE_MS",
    "PLUGIN_KINDS",
    "VARIANTS",
    "BurstResult",
    "ChurnResult",
    "RuntimeBench",
    "Sample",
    "Usage",
    "Variant",
    "usage",
]

SLEEP = ["sleep", "3600"]
GPU_ANNOTATION = "nvidia.com/gpus"
DEADLINE_MS = 2000.0  # containerd's default NRI plugin_request_timeout
NEAR_DEADLINE_MS = DEADLINE_MS - 500.0
_ROUND_SIZE = 10  # pods per variant per round
_INITIAL_WARMUP = 3


@dataclass(frozen=True)
class Variant:
    name: str  # key in results and pod name part
    label: str  # for tables
    plugin: str | None  # None or one of PLUGIN_KINDS
    annotations: tuple[tuple[str, str], ...] = ()
    # The control: without a plugin, CRI itself gives the container the devices and
    # read-only driver mounts nri-gpu would give a one-GPU pod (no start work).
    cri_gpu_files: bool = False


VARIANTS: tuple[Variant, ...] = (
    Variant("no-plugin", "no plugin", None),
    Variant("no-plugin-gpu-files", "no plugin, 1 GPU's files via CRI", None, cri_gpu_files=True),
    Variant("noop-plugin", "do-nothing plugin (our stub)", "noop"),
    Variant("nri-gpu-none", "nri-gpu, pod asks for nothing", "nri-gpu"),
    Variant("nri-gpu-1gpu", "nri-gpu, 1 GPU", "nri-gpu", ((GPU_ANNOTATION, "0"),)),
    Variant("nri-gpu-8gpu", "nri-gpu, 8 GPUs", "nri-gpu", ((GPU_ANNOTATION, "0,1,2,3,4,5,6,7"),)),
    # The same one-GPU pod with engine.ld_cache = "rebuild": the trusted ldconfig, as before the merge.
    Variant("nri-gpu-rebuild-1gpu", "nri-gpu, 1 GPU, ld_cache rebuild", "nri-gpu-rebuild", ((GPU_ANNOTATION, "0"),)),
)
PLUGIN_KINDS: tuple[str | None, ...] = (None, "noop", "nri-gpu", "nri-gpu-rebuild")


@dataclass(frozen=True)
class Sample:
    variant: str
    pod: str
    round: int
    create_ms: float
    start_ms: float

    @property
    def total_ms(self) -> float:
        return self.create_ms + self.start_ms


@dataclass(frozen=True)
class Usage:
    """A process's resident memory and open descriptors."""

    rss_kib: int
    hwm_kib: int  # peak RSS so far (VmHWM)
    fds: int


def usage(pid: int) -> Usage:
    """Read ``/proc/<pid>/status`` (VmRSS, VmHWM) and count ``/proc/<pid>/fd``."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(rest.split()[0])  # "  12345 kB"
    return Usage(rss_kib=fields["VmRSS"], hwm_kib=fields["VmHWM"], fds=len(os.listdir(f"/proc/{pid}/fd")))


@dataclass
class BurstResult:
    pods: int
    errors: list[str]
    cri_create_ms: list[float]
    cri_start_ms: list[float]
    handler_create_ms: list[float]
    handler_start_ms: list[float]
    runtime_nri_complaints: list[str]  # containerd log lines about NRI timeouts in the burst


@dataclass
class ChurnResult:
    containers: int
    seconds: float
    points: list[tuple[int, Usage]]  # (containers done, usage); the first is right after registration
    errors: list[str] = field(default_factory=list)


class _NoopProcess(NriGpuProcess):
    """The do-nothing plugin, started and stopped as the real one is."""

    def __init__(self, socket_path: Path, log_path: Path) -> None:
        super().__init__(socket_path, log_path)
        self.argv = [self.argv[0], "-m", "testbed.bench.noop", "--socket", str(socket_path)]
        self.cwd = ROOT / "hack"  # `-m testbed.bench.noop`: the test bed is not installed


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RuntimeBench:
    """One containerd ``version`` serving pods on ``node``; ``open()`` first, ``close()`` last."""

    def __init__(self, version: str, node: SimNode, workdir: Path, rng: random.Random, say: Any = print) -> None:
        self.version = version
        self.node = node
        self.workdir = workdir
        self.rng = rng
        self.say = say
        self.containerd = Containerd(version, workdir / "ctrd")
        self._cri: CriClient | None = None
        self._sessions = 0
        self._gpu_logs: list[str] = []  # texts of every nri-gpu log of this runtime
        self._seq = 0
        self._files: dict[str, list[Any]] | None = None

    @property
    def cri(self) -> CriClient:
        assert self._cri is not None, "RuntimeBench.open() first"
        return self._cri

    def open(self) -> None:
        images.build_all()
        self.containerd.start()
        try:
            images.import_all(self.containerd)
            self._cri = CriClient(
                self.containerd.address, cgroup_parent=self.containerd.cgroup_parent, log_root=self.workdir / "pod-logs"
            )
        except BaseException:
            self.containerd.stop()
            raise

    def close(self) -> None:
        if self._cri is not None:
            self._cri.close()
        self.containerd.stop()

    def plugin_log(self) -> PluginLog:
        """Everything every nri-gpu process of this runtime logged so far."""
        return parse_log("\n".join(self._gpu_logs))

    # ------------------------------------------------------------------ plugins

    @contextmanager
    def plugin(self, kind: str | None) -> Iterator[NriGpuProcess | None]:
        """Run the plugin ``kind`` (None: no plugin) against this containerd for the block."""
        if kind is None:
            yield None
            return
        self._sessions += 1
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{kind}-{self._sessions}.log"
        proc: NriGpuProcess
        if kind == "noop":
            proc = _NoopProcess(self.containerd.nri_socket, log)
        elif kind in ("nri-gpu", "nri-gpu-rebuild"):
            config = self.workdir / f"{kind}.toml"
            config.write_text('[engine]\nld_cache = "rebuild"\n' if kind == "nri-gpu-rebuild" else "")
            # At info, as deployed: every timing the bench reads is in the info decision lines,
            # and at debug each container that asks for nothing would pay for lines of its own.
            proc = NriGpuProcess(
                self.containerd.nri_socket,
                log,
                *self.node.flags(),
                "--log-format",
                "json",
                "--log-level",
                "info",
                "--metrics-address",
                f"127.0.0.1:{_free_port()}",
                "--config",
                str(config),
            )
        else:
            raise ValueError(f"unknown plugin kind {kind!r}")
        proc.start()
        try:
            yield proc
        finally:
            code = proc.stop()
            if kind.startswith("nri-gpu"):
                self._gpu_logs.append(proc.log())
            if code != 0:
                raise RuntimeError(f"{kind} plugin exited with {code}:\n{proc.log()[-4000:]}")
            time.sleep(0.2)  # let the runtime see the connection close before the next set-up

    # ------------------------------------------------------------------ latency

    def _name(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self._seq}"

    def sample(self, variant: Variant, pod_name: str, round_no: int = 0) -> Sample:
        """One pod of ``variant``: RunPodSandbox, then timed CreateContainer and
        StartContainer of one container, then the pod is stopped and removed."""
        cri = self.cri
        files = self._gpu_files() if variant.cri_gpu_files else {"mounts": [], "devices": []}
        pod = cri.run_pod(pod_name, annotations=dict(variant.annotations))
        try:
            t0 = time.perf_counter()
            cid = cri.create_container(
                pod, None, "main", GLIBC, SLEEP, mounts=files["mounts"], devices=files["devices"]
            )
            t1 = time.perf_counter()
            cri.start_container(cid)
            t2 = time.perf_counter()
        finally:
            cri.stop_pod(pod)
            cri.remove_pod(pod)
        return Sample(variant.name, pod_name, round_no, (t1 - t0) * 1000, (t2 - t1) * 1000)

    def _gpu_files(self) -> dict[str, list[Any]]:
        """CRI mounts and devices equal to what nri-gpu's plan gives a one-GPU container."""
        if self._files is None:
            node = self.node
            config = EngineConfig(
                driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root)
            )
            info = ContainerInfo(name="main", pod_namespace="default", pod_annotations={GPU_ANNOTATION: "0"})
            request = parse_request(info, config.policy).request
            assert request is not None
            planned = make_plan(request, discover(config), config)
            pb = self.cri.pb
            self._files = {
                "mounts": [
                    pb.Mount(container_path=m.destination, host_path=m.source, readonly=True) for m in planned.mounts
                ],
                "devices": [
                    pb.Device(
                        container_path=d.path, host_path=str(node.dev_root / d.path.lstrip("/")), permissions="rw"
                    )
                    for d in planned.devices
                ],
            }
        return self._files

    def _warm(self, variant: Variant) -> None:
        for attempt in range(3):
            try:
                self.sample(variant, self._name(f"warm-{variant.name}"))
                return
            except CriError:
                if attempt == 2:
                    raise
                time.sleep(0.5)  # a runtime still dropping the previous plugin's connection

    def latency(self, pods: int) -> list[Sample]:
        """``pods`` recorded samples of every variant, interleaved (see module doc)."""
        for _ in range(_INITIAL_WARMUP):
            self._warm(VARIANTS[0])
        rounds = max(1, math.ceil(pods / _ROUND_SIZE))
        quotas = [pods // rounds + (1 if r < pods % rounds else 0) for r in range(rounds)]
        samples: list[Sample] = []
        for round_no, quota in enumerate(quotas):
            kinds = list(PLUGIN_KINDS)
            self.rng.shuffle(kinds)
            for kind in kinds:
                variants = [v for v in VARIANTS if v.plugin == kind]
                with self.plugin(kind):
                    for v in variants:
                        self._warm(v)
                    order = [v for v in variants for _ in range(quota)]
                    self.rng.shuffle(order)
                    for v in order:
                        samples.append(self.sample(v, self._name(f"bench-{v.name}"), round_no))
            self.say(f"  containerd {self.version}: round {round_no + 1}/{rounds} done ({len(samples)} pods)")
        self._check_decisions(samples)
        return samples

    def _check_decisions(self, samples: list[Sample]) -> None:
        """Every GPU sample must have been allocated and started by nri-gpu (else it measured nothing)."""
        log = self.plugin_log()
        allocated = {d.pod for d in log.decisions if d.event == "CreateContainer" and d.decision == "allocated"}
        started = {d.pod for d in log.decisions if d.event == "StartContainer" and d.decision == "started"}
        for s in samples:
            gpu = dict(next(v for v in VARIANTS if v.name == s.variant).annotations)
            if gpu and not (s.pod in allocated and s.pod in started):
                raise RuntimeError(f"pod {s.pod} ({s.variant}) was not allocated and started by nri-gpu")
            if not gpu and s.pod in allocated:
                raise RuntimeError(f"pod {s.pod} ({s.variant}) asked for nothing but got GPUs")

    # ------------------------------------------------------------------ burst

    def burst(self, n: int) -> BurstResult:
        """``n`` one-GPU pods at once (see module doc)."""
        cri = self.cri
        result = BurstResult(n, [], [], [], [], [], [])
        lock = threading.Lock()
        with self.plugin("nri-gpu"):
            self._warm(VARIANTS[3])
            log_mark = len(self.containerd.log_text())
            barrier = threading.Barrier(n, timeout=120)

            def one(i: int) -> None:
                try:
                    pod = cri.run_pod(f"bench-burst-{i}", annotations={GPU_ANNOTATION: str(i % 8)})
                except CriError as exc:
                    barrier.abort()
                    with lock:
                        result.errors.append(str(exc))
                    return
                try:
                    barrier.wait()
                    t0 = time.perf_counter()
                    cid = cri.create_container(pod, None, "main", GLIBC, SLEEP)
                    t1 = time.perf_counter()
                    cri.start_container(cid)
                    t2 = time.perf_counter()
                except (CriError, threading.BrokenBarrierError) as exc:
                    with lock:
                        result.errors.append(f"{type(exc).__name__}: {exc}")
                    return
                with lock:
                    result.cri_create_ms.append((t1 - t0) * 1000)
                    result.cri_start_ms.append((t2 - t1) * 1000)

            with ThreadPoolExecutor(n, thread_name_prefix="burst") as pool:
                list(pool.map(one, range(n)))
            tail = self.containerd.log_text()[log_mark:]
            result.runtime_nri_complaints = [
                line[:300]
                for line in tail.splitlines()
                if "nri" in line.lower() and any(w in line.lower() for w in ("deadline", "timeout", "timed out"))
            ]
            cri.remove_all()
        log = parse_log(self._gpu_logs[-1])
        result.handler_create_ms = log.durations("CreateContainer", "bench-burst-")
        result.handler_start_ms = log.durations("StartContainer", "bench-burst-")
        return result

    # ------------------------------------------------------------------ churn

    def churn(self, n: int) -> ChurnResult:
        """``n`` GPU containers through a fresh nri-gpu, its memory and descriptors watched."""
        cri = self.cri
        every = max(1, n // 20)
        with self.plugin("nri-gpu") as proc:
            assert proc is not None and proc.proc is not None
            pid = proc.proc.pid
            result = ChurnResult(n, 0.0, [(0, usage(pid))])
            pod = cri.run_pod("bench-churn", annotations={GPU_ANNOTATION: "0"})
            began = time.monotonic()
            for i in range(n):
                cid = cri.create_container(pod, None, f"c{i}", GLIBC, SLEEP)
                cri.start_container(cid)
                cri.stop_container(cid, 0)
                cri.remove_container(cid)
                if (i + 1) % every == 0 or i + 1 == n:
                    result.points.append((i + 1, usage(pid)))
                if (i + 1) % max(1, n // 5) == 0:
                    self.say(f"  containerd {self.version}: churn {i + 1}/{n}")
            result.seconds = time.monotonic() - began
            cri.stop_pod(pod)
            cri.remove_pod(pod)
        return result
