"""1. Throughput: N no-op tasks on 8 GPU slots, gpuswarm (durable queue, fsync on) beside peers.

Every tool gets the same command list, ``cmds.txt`` (the line ``true``, N times), and runs it the
way it naturally does; each is timed end to end (wall clock of the whole command), 3 times, and
the median is kept:

- gpuswarm: ``python -m gpuswarm run -q --no-report --gpus sim:8 --workspace W cmds.txt``
  (each line split with shlex and exec'd, no shell; a durable run folder per run)
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
import shutil
from pathlib import Path

from common import (
    GPUSWARM,
    Config,
    Row,
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
from ray_peer import call_ray

BENCH = "1 throughput"


def gpuswarm_once(cmds: Path, slots: int, ws: Path) -> tuple[float, float]:
    """(wall seconds, in-run seconds) of one durable gpuswarm run over ``cmds`` in ``ws``.

    Run folders are removed only after the whole benchmark: on ext4 without a journal (this
    VM's disk) creating files right after thousands were deleted costs up to 0.7 ms of CPU per
    file (``find_inode_bit`` skips recently freed inodes), which would measure the disk's
    bookkeeping of the previous repeat, not gpuswarm.
    """
    argv = [*GPUSWARM, "run", "-q", "--no-report", "--gpus", f"sim:{slots}"]
    wall = timed([*argv, "--workspace", str(ws), str(cmds)])
    run = the_run(ws)
    if run is None:
        raise RuntimeError(f"no run folder under {ws}")
    n = sum(1 for line in cmds.read_text().splitlines() if line.strip())
    done = json.loads((run / "summary.json").read_text())["counts"]["done"]
    if done != n:
        raise RuntimeError(f"gpuswarm finished {done} of {n} tasks")
    starts, ends = [], []
    for ev in read_events(run / "events.jsonl"):
        if ev.get("ev") == "started":
            starts.append(float(ev["ts"]))
        elif ev.get("ev") == "finished":
            ends.append(float(ev["ts"]))
    return wall, max(ends) - min(starts)


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
    say(f"throughput: gpuswarm, {n} tasks x {cfg.repeats}")
    try:
        runs = [gpuswarm_once(cmds, g, work / f"ws-{i}") for i in range(cfg.repeats)]
        ours = n / median([w for w, _ in runs])
        in_run = n / median([r for _, r in runs])
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
            rate = n / median(
                [timed(shell, shell=True, cwd=work, timeout=900) for _ in range(cfg.repeats)]
            )
        except Exception as exc:
            rows.append(failed(BENCH, metric, tool, exc))
            continue
        rows.append(_peer_row(metric, tool, rate, ours, targets.get(tool)))
    rows.append(_ray_row(cfg, cmds, metric, ours))
    for i in range(cfg.repeats):
        shutil.rmtree(work / f"ws-{i}", ignore_errors=True)
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
