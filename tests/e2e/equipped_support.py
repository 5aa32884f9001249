"""Shared by the equipped-container e2e modules: a CDI spec standing in for another
producer (NVIDIA's own, DRA's, the device plugin's), and how to ask for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testbed.cri import CriClient
from testbed.gpunode import SimNode
from testbed.images import GLIBC

SLEEP = ["sh", "-c", "sleep 3600"]
KIND = "k8s.device-plugin.nvidia.com/gpu"  # the device plugin's cdi-annotations vendor
LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.163.01"


def write_other_spec(cdi_dir: Path, node: SimNode) -> Path:
    """A spec as another producer writes one: per GPU its node, for all of them the
    driver's libcuda bound in and NVIDIA_VISIBLE_DEVICES=void; no hook of ours, so
    what the container gets beyond it is nri-gpu's doing."""
    devices = [
        {
            "name": str(g.index),
            "containerEdits": {
                "deviceNodes": [
                    {"path": f"/dev/nvidia{g.minor}", "type": "c", "major": 195, "minor": g.minor, "fileMode": 0o666}
                ]
            },
        }
        for g in node.gpus
    ]
    spec = {
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "mounts": [
                {
                    "hostPath": f"{node.driver_root}{LIBCUDA}",
                    "containerPath": LIBCUDA,
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            ],
        },
    }
    path = cdi_dir / "other-producer.json"
    path.write_text(json.dumps(spec))
    return path


def run(
    cri: CriClient, name: str, *, cdi: str | None = None, annotations: dict[str, str] | None = None, **kw: Any
) -> str:
    pod = cri.run_pod(name, annotations=annotations or {})
    ctr_annotations = {"cdi.k8s.io/other": f"{KIND}={cdi}"} if cdi is not None else {}
    return cri.run_container(pod, "main", SLEEP, image=GLIBC, annotations=ctr_annotations, **kw)


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out
