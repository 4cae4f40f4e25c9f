"""A check for a machine with a real NVIDIA GPU (issue 19); not part of the test suite.

    PYTHONPATH=src python tests/gpu/check_gpu.py [--gpus auto] [--keep]

Runs two real CUDA tasks (PyTorch) through ``gpuswarm run`` and compares the peak GPU memory
gpuswarm measured for each (its VRAM sampler, through NVML) with what PyTorch says it reserved
(``torch.cuda.max_memory_reserved()``). NVML counts a process's whole footprint, so the measured
peak must be at least what PyTorch reserved and at most that plus the CUDA context (a few
hundred MiB; :data:`CONTEXT_SLACK_MB` allowed). Also checked: both tasks done, each on a GPU of
the run, its utilisation measured, and nothing of the run left on a GPU afterwards.
Energy (issue 37): each task reads NVML's total-energy counter around its busy loop; the
``energy_j`` gpuswarm recorded (its sampler's counter deltas over the attempt) must be at least
:data:`ENERGY_LOW` of that and at most it plus :data:`ENERGY_SLACK_J` (start-up and the last
look), and be ``exclusive`` (one task per GPU).

Needs: ``torch`` with CUDA, ``nvidia-ml-py`` (gpuswarm's dependency), a driver. Prints a
PASS/FAIL table; exit 0 when every line passes, 1 otherwise (2: it could not run at all).
Self-contained: the task script is written into a scratch folder at run time.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONTEXT_SLACK_MB = 1536  # CUDA context + cuBLAS workspace beyond torch's caching allocator
SIZES_MB = (1536, 4096)  # what the two tasks allocate (torch.empty on the GPU)
HOLD_S = 6.0  # how long each holds it (the sampler looks every 0.25 s)
ENERGY_LOW = 0.7  # gpuswarm's energy_j vs the task's own counter delta over its busy loop
ENERGY_SLACK_J = 2000.0  # context creation, allocation and the last look's interval

TASK = r"""
import json, sys, time
import torch

mb = int(sys.argv[1])
hold = float(sys.argv[2])
dev = torch.device("cuda:0")
block = torch.empty(mb * 1024 * 1024, dtype=torch.uint8, device=dev)
block.fill_(1)
a = torch.randn(2048, 2048, device=dev)
try:  # the task's own reading of the energy counter around its busy loop (issue 37)
    import os, pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ["GPUSWARM_HOST_GPU_ID"]))
    e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
except Exception:
    h = None
t0 = time.time()
while time.time() - t0 < hold:
    a = (a @ a).clamp_(-1, 1)  # keep the GPU busy: utilisation is measured too
    torch.cuda.synchronize()
    time.sleep(0.05)
out = {
    "torch_max_reserved_mb": torch.cuda.max_memory_reserved() // (1024 * 1024),
    "torch_max_allocated_mb": torch.cuda.max_memory_allocated() // (1024 * 1024),
    "device": torch.cuda.get_device_name(0),
}
if h is not None:
    out["own_energy_j"] = (pynvml.nvmlDeviceGetTotalEnergyConsumption(h) - e0) / 1000
print("torch: " + json.dumps(out), flush=True)
with open("torch.json", "w") as f:
    json.dump(out, f)
"""


def _missing() -> list[str]:
    problems = []
    if importlib.util.find_spec("torch") is None:
        problems.append("torch is not installed (pip install torch)")
    if importlib.util.find_spec("pynvml") is None:
        problems.append("nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    if not problems:
        probe = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.stdout.strip() != "True":
            problems.append(f"torch sees no CUDA device ({probe.stderr.strip()[-200:]})")
    return problems


def _config(work: Path, gpus: str) -> Path:
    script = work / "cuda_task.py"
    script.write_text(TASK)
    lines = ["name: gpucheck", "workspace: runs", f"gpus: {json.dumps(gpus)}", "tasks:"]
    for mb in SIZES_MB:
        lines += [
            f"  - name: cuda{mb}",
            f"    gpu_memory: {mb + CONTEXT_SLACK_MB}M",
            f"    command: [{json.dumps(sys.executable)}, {json.dumps(str(script))}, "
            f'"{mb}", "{HOLD_S}"]',
            '    cwd: "{workspace}"',
        ]
    path = work / "gpucheck.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _table(rows: list[tuple[str, str, str, bool]]) -> bool:
    width = max(len(r[0]) for r in rows)
    print(f"\n{'check'.ljust(width)}  {'expected':<34}  {'measured':<34}  result")
    for name, want, got, ok in rows:
        print(f"{name.ljust(width)}  {want:<34}  {got:<34}  {'PASS' if ok else 'FAIL'}")
    passed = all(r[3] for r in rows)
    print(f"\n{'PASS' if passed else 'FAIL'}: {sum(r[3] for r in rows)}/{len(rows)} checks")
    return passed


def _leftovers(run: Path) -> list[int]:
    """Compute processes on any GPU whose environment names this run (none may be left)."""
    import pynvml  # type: ignore[import-untyped]

    pynvml.nvmlInit()
    try:
        pids = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            pids += [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    finally:
        pynvml.nvmlShutdown()
    ours = []
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"GPUSWARM_RUN_DIR={run}".encode() in env:
            ours.append(pid)
    return ours


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="auto", help="gpuswarm's --gpus (default auto)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    problems = _missing()
    if problems:
        for p in problems:
            print(f"FAIL: cannot run: {p}")
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpuswarm-gpucheck-"))
    try:
        cfg = _config(work, args.gpus)
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        print(f"running 2 CUDA tasks through gpuswarm in {work} ...", flush=True)
        done = subprocess.run(
            [sys.executable, "-m", "gpuswarm", "run", str(cfg), "--no-report"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        print(done.stderr[-3000:])
        runs = sorted((work / "runs" / "gpucheck").glob("run_*"))
        if not runs:
            print("FAIL: gpuswarm made no run")
            return 1
        run = runs[-1]
        with (run / "results.tsv").open() as f:
            results = {r["task"]: r for r in csv.DictReader(f, delimiter="\t")}
        rows: list[tuple[str, str, str, bool]] = [
            ("gpuswarm run exit code", "0", str(done.returncode), done.returncode == 0)
        ]
        for mb in SIZES_MB:
            task = f"cuda{mb}"
            row = results.get(task, {})
            rows.append(
                (f"{task} state", "done", row.get("state", "?"), row.get("state") == "done")
            )
            torch_file = run / "tasks" / task / "torch.json"
            torch = json.loads(torch_file.read_text()) if torch_file.exists() else {}
            reserved = int(torch.get("torch_max_reserved_mb", -1))
            peak_text = row.get("peak_vram_mb", "")
            peak = int(peak_text) if peak_text.isdigit() else -1
            ok = reserved > 0 and reserved <= peak <= reserved + CONTEXT_SLACK_MB
            rows.append(
                (
                    f"{task} peak_vram_mb vs torch",
                    f"{reserved}..{reserved + CONTEXT_SLACK_MB} MiB (reserved {reserved})",
                    f"{peak} MiB (+{peak - reserved} over torch)" if peak >= 0 else "not measured",
                    ok,
                )
            )
            desc = _descriptor(run, task)
            last = (desc.get("attempts") or [{}])[-1]
            util = last.get("peak_gpu_util")
            rows.append(
                (f"{task} utilisation measured", "a percentage", str(util), util is not None)
            )
            rows.append(_energy_row(task, last, torch))
        left = _leftovers(run)
        rows.append(("run's processes left on a GPU", "none", str(left or "none"), not left))
        return 0 if _table(rows) else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _energy_row(
    task: str, last: dict[str, Any], torch: dict[str, Any]
) -> tuple[str, str, str, bool]:
    """gpuswarm's energy_j of the attempt against the task's own counter delta."""
    own = torch.get("own_energy_j")
    got = last.get("energy_j")
    mode = last.get("energy_mode")
    if not isinstance(own, int | float):
        return (f"{task} energy_j", "the task's own counter", "no counter on this GPU", True)
    low, high = own * ENERGY_LOW, own + ENERGY_SLACK_J
    ok = isinstance(got, int | float) and low <= got <= high and mode == "exclusive"
    return (
        f"{task} energy_j vs its own counter",
        f"{low:.0f}..{high:.0f} J exclusive (own {own:.0f} J)",
        f"{got} J {mode}",
        ok,
    )


def _descriptor(run: Path, task: str) -> dict[str, Any]:
    for state in ("done", "failed"):
        for path in (run / ".parallel" / state).glob(f"*_{task}.json"):
            data: dict[str, Any] = json.loads(path.read_text())
            return data
    return {}


if __name__ == "__main__":
    sys.exit(main())
