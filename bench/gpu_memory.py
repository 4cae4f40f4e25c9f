"""8. GPU memory packing (issue 19): GPU-hours of a mixed workload, packed by memory vs one
task per GPU.

A simulated machine: 8 GPUs of 80 GiB, a fake NVML (tests/fakes/nvml/pynvml.py, first on the
CLI's ``PYTHONPATH``, so ``--gpus auto`` finds them as NVIDIA GPUs and the VRAM sampler reads
them). The workload: 48 small tasks (8 GiB for 1.0 s; 16 for 0.5 s with --quick) and 4 large
ones (60 GiB for 3.0 s), the real ``gpuswarm run`` CLI, each task a real process
(tests/fakes/fake_gpu_task.py) that holds its memory on the GPU its ``CUDA_VISIBLE_DEVICES``
names and fails as a CUDA OOM would when it is not free (``--check-free``: an over-packed GPU
shows up as failed tasks, never as a faster number).

- one task per GPU: the tasks declare nothing (gpuswarm's default: one slot per GPU);
- packed: the same tasks declare ``gpu_memory`` (8G / 60G); gpuswarm makes 10 slots per GPU
  (80 / 8) and places each task where its need fits.

Measured per mode, one run each, alternating, median of ``repeats``: wall time (first
``started`` to last ``finished``), GPU-hours reserved (wall x 8 GPUs, scaled 1 s = 1 hour: what
a cluster bills for the 8 GPUs held), GPU-hours busy (per GPU, the union of its attempts'
intervals), failed tasks (OOMs) and the measured peak of each task (it must equal what it
allocated). The ratio is one-per-GPU / packed (higher: packing saves more).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import GPUSWARM, REPO, Config, Row, say

BENCH = "8 gpumem"
GPUS = 8
GPU_MB = 81920
FAKES = REPO / "tests" / "fakes"
TASK = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKES / 'fake_gpu_task.py'))}"


def _machine(root: Path) -> dict[str, str]:
    (root / "procs").mkdir(parents=True, exist_ok=True)
    gpus = [
        {"name": "Fake H100 80GB", "uuid": f"GPU-bench-{i:04d}", "memory_mb": GPU_MB}
        for i in range(GPUS)
    ]
    (root / "gpus.json").write_text(json.dumps({"gpus": gpus}))
    path = os.pathsep.join(p for p in (str(FAKES / "nvml"), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "FAKE_NVML_DIR": str(root),
        "GPUSWARM_LOCK_DIR": str(root / "locks"),
    }


def _config(work: Path, packed: bool, small: int, small_s: float) -> Path:
    def entry(name: str, count: int, gib: int, seconds: float) -> str:
        need = f"    gpu_memory: {gib}G\n" if packed else ""
        return (
            f"  - matrix: {{i: [{', '.join(str(i) for i in range(count))}]}}\n"
            f'    name: "{name}{{i}}"\n'
            f"    priority: {1 if name == 'large' else 0}\n"
            f"{need}"
            f"    command: {TASK} --mb {gib * 1024} --hold {seconds} --check-free\n"
        )

    path = work / f"{'packed' if packed else 'one'}.yaml"
    path.write_text(
        f"name: {'packed' if packed else 'one'}\nworkspace: runs\ngpus: auto\n"
        "reliability: {retry_backoff: null}\n"
        "tasks:\n" + entry("large", 4, 60, 3.0) + entry("small", small, 8, small_s)
    )
    return path


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _one(work: Path, packed: bool, small: int, small_s: float, k: int) -> dict[str, Any]:
    folder = work / f"{'packed' if packed else 'one'}-{k}"
    folder.mkdir(parents=True)
    env = _machine(folder / "nvml")
    cfg = _config(folder, packed, small, small_s)
    t0 = time.perf_counter()
    done = subprocess.run(
        [*GPUSWARM, "run", str(cfg), "-q", "--no-report"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    wall_cli = time.perf_counter() - t0
    (run,) = (folder / "runs").glob("*/run_*")
    spans: dict[int, list[tuple[float, float]]] = {}
    peaks_ok = failed = 0
    first, last = float("inf"), 0.0
    for state in ("done", "failed"):
        for path in (run / ".parallel" / state).glob("*.json"):
            desc = json.loads(path.read_text())
            failed += state == "failed"
            a = desc["attempts"][-1]
            spans.setdefault(a["gpus"][0], []).append((a["started"], a["ended"]))
            first, last = min(first, a["started"]), max(last, a["ended"])
            want = (60 if desc["id"].startswith("large") else 8) * 1024
            peaks_ok += a.get("peak_vram_mb") == want
    wall = last - first
    return {
        "rc": done.returncode,
        "wall": wall,
        "wall_cli": wall_cli,
        "reserved_gpu_s": wall * GPUS,
        "busy_gpu_s": sum(_union(s) for s in spans.values()),
        "failed": failed,
        "peaks_ok": peaks_ok,
        "tasks": 4 + small,
        "slots": json.loads((run / "run.json").read_text())["slot_count"],
    }


def run(cfg: Config) -> list[Row]:
    small, small_s = (16, 0.5) if cfg.quick else (48, 1.0)
    work = cfg.work / "gpumem"
    work.mkdir(parents=True, exist_ok=True)
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for k in range(cfg.repeats):
        for mode in (False, True):
            r = _one(work, mode, small, small_s, k)
            say(
                f"gpumem {'packed' if mode else 'one/GPU'} #{k}: wall {r['wall']:.2f} s, "
                f"{r['failed']} failed, {r['peaks_ok']}/{r['tasks']} peaks exact"
            )
            results[mode].append(r)
    one, packed = _median(results[False]), _median(results[True])
    what = f"4 x 60G/3s + {small} x 8G/{small_s:g}s on 8x80G"
    ratio = one["reserved_gpu_s"] / packed["reserved_gpu_s"] if packed["reserved_gpu_s"] else 0
    rows = []
    for tool, m in (("gpuswarm one task per GPU", one), ("gpuswarm gpu_memory packing", packed)):
        rows.append(
            Row(
                BENCH,
                f"GPU-hours reserved (1 s = 1 h), {what}",
                tool,
                round(m["reserved_gpu_s"], 1),
                "GPU-h",
                target="packing < one per GPU, 0 OOM" if m is packed else "",
                ok=(m["reserved_gpu_s"] < one["reserved_gpu_s"] and m["failed"] == 0)
                if m is packed
                else None,
                ratio=f"{ratio:.2f}x fewer" if m is packed else "",
                note=(
                    f"wall {m['wall']:.2f} s, busy {m['busy_gpu_s']:.1f} GPU-h, {m['slots']} "
                    f"slots, {m['failed']} failed, {m['peaks_ok']}/{m['tasks']} measured peaks "
                    f"exact (median of {cfg.repeats})"
                ),
                extra=m,
            )
        )
    return rows


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: float(r["wall"]))
    mid = ordered[len(ordered) // 2]
    return {**mid, "walls": [round(float(r["wall"]), 3) for r in runs]}
