"""4. Supervisor CPU: what the scheduler itself burns while 8 tasks sleep for 60 s (15 s quick).

Each tool runs the command list ``sleep 60`` x 8 on 8 slots (gpuswarm ``run -q --no-report
--gpus sim:8``; simple_gpu_scheduler ``--gpus 0..7``; GNU parallel ``-j 8`` with the
``CUDA_VISIBLE_DEVICES`` recipe; Ray ``num_gpus=1`` tasks on 8 declared GPUs). Once the 8
``sleep`` processes exist, 3 s of warm-up, then the CPU time of the tool's whole process tree
minus the ``sleep`` processes is sampled, and again 1 s before the sleeps end; the difference
over the window is reported as % of one core. CPU time comes from the per-thread nanosecond
clocks (``/proc/PID/task/TID/schedstat``), or from psutil's user + system time (10 ms ticks) for
a process whose threads changed during the window. For gpuswarm that tree is the supervisor
process alone (its tasks are exec'd directly).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
from common import (
    BENCH_DIR,
    GPUSWARM,
    Config,
    Row,
    env_for_bench,
    failed,
    have_parallel,
    have_ray,
    have_sgs,
    kill_tree,
    ratio_text,
    say,
    skipped,
    wait_for,
)

BENCH = "4 supervisor CPU"
WARMUP = 3.0


Sample = dict[tuple[int, float], tuple[float, dict[int, int]]]


def thread_ns(pid: int) -> dict[int, int]:
    """Per thread: nanoseconds on a CPU (``/proc/PID/task/TID/schedstat``); {} if unreadable."""
    out: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                out[int(tid)] = int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


def tree_cpu(root: psutil.Process) -> Sample:
    """Per process of ``root``'s tree (``sleep`` left out): (user + system s, per-thread ns)."""
    out: Sample = {}
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return out
    for p in procs:
        try:
            if p.name() == "sleep":
                continue
            t = p.cpu_times()
            out[(p.pid, p.create_time())] = (t.user + t.system, thread_ns(p.pid))
        except psutil.Error:
            continue
    return out


def cpu_used(before: Sample, after: Sample) -> float:
    """CPU seconds between two samples: nanosecond thread clocks where every thread lived through
    the window, else the process's user + system time (10 ms ticks, but counts exited threads)."""
    total = 0.0
    for key, (ticks, threads) in after.items():
        ticks0, threads0 = before.get(key, (0.0, {}))
        by_ticks = ticks - ticks0
        if threads and threads.keys() == threads0.keys():
            total += sum(threads[t] - threads0[t] for t in threads) / 1e9
        else:
            total += by_ticks
    return total


def sleeps(root: psutil.Process) -> int:
    try:
        return sum(1 for p in root.children(recursive=True) if p.name() == "sleep")
    except psutil.Error:
        return 0


def measure(argv: list[str], cmds: Path, n: int, seconds: float, env: dict[str, str]) -> float:
    """% of one core the tool's tree (minus the sleeps) uses while its ``n`` sleeps run."""
    with cmds.open("rb") as stdin:
        proc = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=cmds.parent,
            env=env,
        )
    try:
        root = psutil.Process(proc.pid)
        if not wait_for(lambda: sleeps(root) >= n, timeout=180, every=0.05):
            raise RuntimeError(f"only {sleeps(root)} of {n} sleeps started in 180 s")
        all_started = time.monotonic()
        time.sleep(WARMUP)
        before, t0 = tree_cpu(root), time.monotonic()
        time.sleep(max(1.0, all_started + seconds - 1.0 - time.monotonic()))
        after, t1 = tree_cpu(root), time.monotonic()
        used = cpu_used(before, after)
        proc.wait(timeout=seconds + 300)
        if proc.returncode != 0:
            raise RuntimeError(f"exited {proc.returncode}")
        return used / (t1 - t0) * 100
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)


def run(cfg: Config) -> list[Row]:
    d, g = cfg.cpu_seconds, cfg.cpu_slots
    work = cfg.work / "cpu"
    work.mkdir(parents=True, exist_ok=True)
    cmds = work / "cmds.txt"
    cmds.write_text(f"sleep {d:g}\n" * g)
    metric = f"{g} x sleep {d:g} on {g} slots: scheduler CPU, % of one core"
    ours_argv = [*GPUSWARM, "run", "-q", "--no-report", "--gpus", f"sim:{g}"]
    ray_argv = [sys.executable, str(BENCH_DIR / "ray_peer.py"), "run", "--gpus", str(g)]
    peers: dict[str, tuple[bool, list[str]]] = {
        "gpuswarm": (True, [*ours_argv, "--workspace", str(work / "ws"), str(cmds)]),
        "simple_gpu_scheduler": (
            have_sgs(),
            ["simple_gpu_scheduler", "--gpus", *map(str, range(g))],
        ),
        "GNU parallel": (
            have_parallel(),
            ["parallel", "-j", str(g), "CUDA_VISIBLE_DEVICES=$(({%}-1)) eval {}"],
        ),
        "Ray": (have_ray(), [*ray_argv, "--cmds", str(cmds)]),
    }
    rows: list[Row] = []
    ours: float | None = None
    for tool, (present, argv) in peers.items():
        if not present:
            hint = "; bench/setup.sh --ray" if tool == "Ray" else ""
            rows.append(skipped(BENCH, metric, tool, f"skipped (not installed{hint})"))
            continue
        say(f"cpu: {tool} ({d:g} s)")
        try:
            pct = measure(argv, cmds, g, d, env_for_bench(RAY_AUTH_MODE="disabled"))
        except Exception as exc:
            rows.append(failed(BENCH, metric, tool, exc))
            continue
        if tool == "gpuswarm":
            ours = pct
            rows.append(Row(BENCH, metric, tool, pct, "%", "< 0.5%", pct < 0.5))
        else:
            ratio = ratio_text(ours, pct) if ours and pct > 0 else ""
            rows.append(Row(BENCH, metric, tool, pct, "%", ratio=ratio))
    rows.append(skipped(BENCH, metric, "xargs", "n/a: xargs assigns no GPU slot"))
    return rows
