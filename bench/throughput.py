"""1. Throughput: N no-op tasks on 8 GPU slots, gpuswarm (durable queue, fsync on) beside peers.

Every tool gets the same command list, ``cmds.txt`` (the line ``true``, N times), and runs it the
way it naturally does; each is timed end to end (wall clock of the whole command), 3 times, and
the median is kept:

- gpuswarm: ``python -m gpuswarm run -q --no-report --gpus sim:8 --workspace W cmds.txt``
  (each line run with ``/bin/sh -c``, as the peers do; a durable run folder per run)
- xargs (the process-spawn floor; no GPU assignment, no durability):
  ``xargs -d '\\n' -P 8 -I{} sh -c {} < cmds.txt``
- GNU parallel with the usual GPU recipe:
  ``parallel -j 8 'CUDA_VISIBLE_DEVICES=$(({%}-1)) eval {}' < cmds.txt``
- simple_gpu_scheduler (non-durable per-GPU queue; ``sh -c`` per line):
  ``simple_gpu_scheduler --gpus 0 1 2 3 4 5 6 7 < cmds.txt``
- Ray (optional): ``num_gpus=1`` tasks on 8 declared GPUs, each ``subprocess.run(line,
  shell=True)``; timed from submission to the last result, ``ray.init`` excluded
  (``bench/ray_peer.py``).

gpuswarm's in-run rate (first ``started`` to last ``finished`` event) is reported beside its
wall-clock rate: the difference is interpreter start, run creation and the end-of-run outputs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    GPUSWARM,
    Config,
    Row,
    env_for_bench,
    failed,
    have_parallel,
    have_ray,
    have_sgs,
    median,
    ratio_text,
    read_events,
    say,
    skipped,
    the_run,
    timed,
)
from cpu import thread_ns
from floor import durable_floor, spawn_floor
from ray_peer import call_ray

BENCH = "1 throughput"


@dataclass
class Cpu:
    """CPU ms per task of one run: all processes (children reaped by the tool included) and,
    for gpuswarm, its own threads: main (start-up, enqueue, results), the busiest (the slot
    loop) and the second (the committer)."""

    total: float
    threads: dict[str, float] = field(default_factory=dict)

    def split(self) -> str:
        return ", ".join(f"{k} {v:.3f}" for k, v in self.threads.items())


Runs = list[tuple[float, float, Cpu]]  # (wall s, in-run s, CPU) of each repeat


def _rates(runs: Runs, n: int) -> tuple[float, float, Cpu]:
    """Median wall and in-run tasks/s of the repeats, and their median CPU."""
    wall = n / median([w for w, _, _ in runs])
    in_run = n / median([r for _, r, _ in runs])
    return wall, in_run, _median_cpu([c for _, _, c in runs])


def gpuswarm_once(cmds: Path, slots: int, ws: Path) -> tuple[float, float, Cpu]:
    """(wall seconds, in-run seconds, CPU) of one durable gpuswarm run over ``cmds`` in ``ws``.

    Run folders are removed only after the whole benchmark run: on ext4 without a journal (this
    VM's disk) creating files right after thousands were deleted costs up to 0.7 ms of CPU per
    file (``find_inode_bit`` skips recently freed inodes), which would measure the disk's
    bookkeeping of the previous repeat, not gpuswarm.
    """
    argv = [*GPUSWARM, "run", "-q", "--no-report", "--gpus", f"sim:{slots}"]
    n = sum(1 for line in cmds.read_text().splitlines() if line.strip())
    before = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*argv, "--workspace", str(ws), str(cmds)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env_for_bench(),
    )
    last: dict[int, int] = {}
    while proc.poll() is None:  # per-thread clocks until the threads end
        last.update(thread_ns(proc.pid))
        time.sleep(0.01)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"gpuswarm exited {proc.returncode}")
    cpu = Cpu((_children_cpu() - before) / n * 1e3, _thread_split(proc.pid, last, n))
    run = the_run(ws)
    if run is None:
        raise RuntimeError(f"no run folder under {ws}")
    done = json.loads((run / "summary.json").read_text())["counts"]["done"]
    if done != n:
        raise RuntimeError(f"gpuswarm finished {done} of {n} tasks")
    starts, ends = [], []
    for ev in read_events(run / "events.jsonl"):
        if ev.get("ev") == "started":
            starts.append(float(ev["ts"]))
        elif ev.get("ev") == "finished":
            ends.append(float(ev["ts"]))
    return wall, max(ends) - min(starts), cpu


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _thread_split(pid: int, ns: dict[int, int], n: int) -> dict[str, float]:
    main = ns.pop(pid, 0)
    ranked = sorted(ns.values(), reverse=True)
    names = ("loop", "committer")
    split = {"main": main / n / 1e6}
    for name, value in zip(names, ranked, strict=False):
        split[name] = value / n / 1e6
    split["other threads"] = sum(ranked[len(names) :]) / n / 1e6
    return split


def timed_cpu(shell: str, cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and everything it reaped)."""
    before = _children_cpu()
    wall = timed(shell, shell=True, cwd=cwd, timeout=900)
    return wall, _children_cpu() - before


def run(cfg: Config) -> list[Row]:
    n, g = cfg.throughput_tasks, cfg.throughput_slots
    work = cfg.work / "throughput"
    work.mkdir(parents=True, exist_ok=True)
    cmds = work / "cmds.txt"
    cmds.write_text("true\n" * n)
    metric = f"{n} x `true` on {g} slots, tasks/s (wall, median of {cfg.repeats})"
    peers = {
        "xargs": (True, f"xargs -d '\\n' -P {g} -I{{}} sh -c {{}} < cmds.txt"),
        "GNU parallel": (
            have_parallel(),
            f"parallel -j {g} 'CUDA_VISIBLE_DEVICES=$(({{%}}-1)) eval {{}}' < cmds.txt",
        ),
        "simple_gpu_scheduler": (
            have_sgs(),
            f"simple_gpu_scheduler --gpus {' '.join(map(str, range(g)))} < cmds.txt",
        ),
    }
    rows: list[Row] = []
    cpus: dict[str, Cpu] = {}
    say(f"throughput: gpuswarm, {n} tasks x {cfg.repeats}")
    try:
        runs = [gpuswarm_once(cmds, g, work / f"ws-{i}") for i in range(cfg.repeats)]
        ours, in_run, cpus["gpuswarm"] = _rates(runs, n)
        rows.append(Row(BENCH, metric, "gpuswarm", ours, "tasks/s", note="durable, fsync on"))
        rows.append(
            Row(
                BENCH,
                f"{n} x `true` on {g} slots, tasks/s in-run (first start to last finish)",
                "gpuswarm",
                in_run,
                "tasks/s",
                note="excludes start-up, run creation and end-of-run outputs",
            )
        )
    except Exception as exc:
        rows.append(failed(BENCH, metric, "gpuswarm", exc))
        ours = 0.0
    targets = {"GNU parallel": 3.0, "simple_gpu_scheduler": 1.0}
    for tool, (present, shell) in peers.items():
        if not present:
            rows.append(skipped(BENCH, metric, tool))
            continue
        say(f"throughput: {tool}")
        try:
            timings = [timed_cpu(shell, work) for _ in range(cfg.repeats)]
        except Exception as exc:
            rows.append(failed(BENCH, metric, tool, exc))
            continue
        rate = n / median([w for w, _ in timings])
        cpus[tool] = Cpu(median([c for _, c in timings]) / n * 1e3)
        rows.append(_peer_row(metric, tool, rate, ours, targets.get(tool)))
    rows.append(_ray_row(cfg, cmds, metric, ours))
    rows.append(_in_ram_row(cfg, cmds, metric))
    rows += _cpu_rows(cfg, cpus, work)
    # nothing is deleted here: run.py removes the scratch folder after the last benchmark, so
    # the next one (the enqueue of 100k files) does not pay for this one's freed inodes
    return rows


def _in_ram_row(cfg: Config, cmds: Path, metric: str) -> Row:
    """The same gpuswarm run with its workspace in RAM (``/dev/shm``): the disk's share of the
    time, for the profile only (a tmpfs does not survive a reboot; fsync is a no-op there)."""
    shm = Path("/dev/shm")
    tool = "gpuswarm, workspace in RAM"
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        return skipped(BENCH, metric, tool, "skipped (no writable /dev/shm)")
    say("throughput: gpuswarm with its workspace in /dev/shm (profile only)")
    scratch = Path(tempfile.mkdtemp(prefix="gpuswarm-bench-", dir=shm))
    try:
        runs = [
            gpuswarm_once(cmds, cfg.throughput_slots, scratch / f"ws-{i}")
            for i in range(cfg.repeats)
        ]
    except Exception as exc:
        return failed(BENCH, metric, tool, exc)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wall, in_run, cpu = _rates(runs, cfg.throughput_tasks)
    note = (
        f"profile only, not durable; in-run {in_run:,.0f}/s; "
        f"CPU {cpu.total:.2f} ms/task ({cpu.split()})"
    )
    return Row(BENCH, metric, tool, wall, "tasks/s", note=note)


def _median_cpu(runs: list[Cpu]) -> Cpu:
    names = runs[0].threads.keys()
    return Cpu(
        median([c.total for c in runs]),
        {k: median([c.threads.get(k, 0.0) for c in runs]) for k in names},
    )


def _cpu_rows(cfg: Config, cpus: dict[str, Cpu], work: Path) -> list[Row]:
    """Where the time goes: CPU per task of each tool, gpuswarm's threads, and the floors."""
    metric = "CPU per task, all processes (ms; children included)"
    rows = [Row(BENCH, metric, tool, cpu.total, "ms") for tool, cpu in cpus.items()]
    ours = cpus.get("gpuswarm")
    if ours is not None:
        rows[0].note = f"threads: {ours.split()}; the rest is the `true` children"
        rows[0].extra = {"threads": ours.threads}
    say("throughput: floors (posix_spawn of `true`, durable file work alone)")
    parent, child = spawn_floor(cfg.throughput_tasks)
    rows.append(
        Row(
            BENCH,
            "floor: start and reap one `true` (posix_spawn), CPU ms",
            "any tool",
            parent + child,
            "ms",
            note=f"child {child:.3f}, parent {parent:.3f}: every tool pays the child",
        )
    )
    floor = durable_floor(work / "floor", cfg.throughput_tasks)
    rows.append(
        Row(
            BENCH,
            "floor: gpuswarm's durable file work of one task alone, CPU ms",
            "gpuswarm",
            floor,
            "ms",
            note="descriptor, claim rename + read, 2 mkdirs + log, temp + fsync + 2 renames, "
            "2 journal lines; no logic between the calls",
        )
    )
    return rows


def _peer_row(metric: str, tool: str, rate: float, ours: float, want: float | None) -> Row:
    row = Row(BENCH, metric, tool, rate, "tasks/s", ratio=ratio_text(ours, rate) if ours else "")
    if want is not None:
        row.target = f"gpuswarm >= {want:.1f}x"
        row.ok = bool(ours) and ours / rate >= want
    else:
        row.note = "the floor: no GPU assignment, no durability"
    return row


def _ray_row(cfg: Config, cmds: Path, metric: str, ours: float) -> Row:
    if not have_ray():
        return skipped(BENCH, metric, "Ray", "skipped (not installed; bench/setup.sh --ray)")
    say("throughput: Ray")
    try:
        args = ["throughput", "--cmds", str(cmds), "--gpus", str(cfg.throughput_slots)]
        data = call_ray([*args, "--repeats", str(cfg.repeats)], timeout=900)
    except Exception as exc:
        return failed(BENCH, metric, "Ray", exc)
    rate = cfg.throughput_tasks / median(data["seconds"])
    note = f"ray.init ({data['init_s']:.1f} s) excluded; max_calls=0 (workers reused)"
    return Row(BENCH, metric, "Ray", rate, "tasks/s", ratio=ratio_text(ours, rate), note=note)
