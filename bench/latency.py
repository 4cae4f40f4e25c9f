"""3. Idle gap: how long a GPU slot sits idle between one task's exit and the next one's start.

400 tasks (160 with --quick) on 4 slots, each the same command line::

    bash -c 'echo $EPOCHREALTIME >> STAMPS/s.$CUDA_VISIBLE_DEVICES; sleep 0.05;
             echo $EPOCHREALTIME >> STAMPS/e.$CUDA_VISIBLE_DEVICES'

run by gpuswarm (``run -q --no-report --gpus sim:4``), simple_gpu_scheduler (``--gpus 0 1 2 3``),
GNU parallel (``-j 4 'CUDA_VISIBLE_DEVICES=$(({%}-1)) eval {}'``) and Ray (``bench/ray_peer.py``,
``num_gpus=1`` on 4 declared GPUs). ``CUDA_VISIBLE_DEVICES`` names the slot; per slot the gap is
the next task's first stamp minus the previous task's last stamp (so it includes the wrapper's
own bash start and exit, equally for every tool). For gpuswarm, the same run also gives its own
turnaround, the issue's target: per slot, an attempt's end (``ended`` of its record: the exit
reaped and judged clean) to the next attempt's start (``started``: just before its fork), from the
attempt records of every descriptor. (Not from the journal: the ``finished`` event is written by
the committer thread after the slot has already started its next task.) xargs assigns no GPU slot,
so it has no per-slot gap.
"""

from __future__ import annotations

import itertools
import json
import shutil
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
    percentile,
    say,
    skipped,
    the_run,
    timed,
)
from ray_peer import call_ray

BENCH = "3 idle gap"


def wrapper_line(stamps: Path, sleep: float) -> str:
    if any(c in str(stamps) for c in " '\"$\\"):
        raise ValueError(f"{stamps}: the stamp folder needs a plain path")
    body = (
        f"echo $EPOCHREALTIME >> {stamps}/s.$CUDA_VISIBLE_DEVICES; sleep {sleep:g}; "
        f"echo $EPOCHREALTIME >> {stamps}/e.$CUDA_VISIBLE_DEVICES"
    )
    return f"bash -c '{body}'"


def stamp_gaps(stamps: Path) -> list[float]:
    """Per slot: next start stamp - previous end stamp, in seconds."""
    gaps: list[float] = []
    for start_file in sorted(stamps.glob("s.*")):
        slot = start_file.name[2:]
        starts = sorted(float(x) for x in start_file.read_text().split())
        ends = sorted(float(x) for x in (stamps / f"e.{slot}").read_text().split())
        if len(starts) != len(ends):
            raise RuntimeError(f"slot {slot}: {len(starts)} starts but {len(ends)} ends")
        gaps += [s - e for s, e in zip(starts[1:], ends[:-1], strict=True)]
    if not gaps:
        raise RuntimeError(f"no stamps in {stamps}")
    return gaps


def attempt_gaps(run_dir: Path) -> list[float]:
    """Per slot: an attempt's ``ended`` to the next attempt's ``started``, in seconds."""
    by_slot: dict[str, list[tuple[float, float]]] = {}
    for state in ("done", "failed"):
        for path in (run_dir / ".parallel" / state).glob("*.json"):
            for a in json.loads(path.read_text()).get("attempts", []):
                span = (float(a["started"]), float(a["ended"]))
                by_slot.setdefault(str(a["slot"]), []).append(span)
    gaps: list[float] = []
    for spans in by_slot.values():
        spans.sort()
        gaps += [nxt[0] - prev[1] for prev, nxt in itertools.pairwise(spans)]
    return gaps


def _ms(gaps: list[float]) -> tuple[float, float]:
    return median(gaps) * 1e3, percentile(gaps, 99) * 1e3


def run(cfg: Config) -> list[Row]:
    n, g = cfg.gap_tasks, cfg.gap_slots
    work = cfg.work / "gap"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    size = f"{n} x sleep {cfg.gap_sleep:g} on {g} slots"
    wrapped = f"{size}: exit -> next start on the slot, task-stamped, median / p99 ms"
    tools = {
        "gpuswarm": True,
        "simple_gpu_scheduler": have_sgs(),
        "GNU parallel": have_parallel(),
        "Ray": have_ray(),
    }
    rows: list[Row] = []
    ours: float | None = None
    for tool, present in tools.items():
        if not present:
            hint = "; bench/setup.sh --ray" if tool == "Ray" else ""
            rows.append(skipped(BENCH, wrapped, tool, f"skipped (not installed{hint})"))
            continue
        say(f"idle gap: {tool}")
        stamps = work / tool.replace(" ", "_") / "stamps"
        stamps.mkdir(parents=True)
        cmds = stamps.parent / "cmds.txt"
        cmds.write_text((wrapper_line(stamps, cfg.gap_sleep) + "\n") * n)
        try:
            if tool == "gpuswarm":
                rows += _gpuswarm(cmds, g, size)
            else:
                _peer(tool, cmds, g)
            med, p99 = _ms(stamp_gaps(stamps))
        except Exception as exc:
            rows.append(failed(BENCH, wrapped, tool, exc))
            continue
        if tool == "gpuswarm":
            ours = med
        ratio = f"gpuswarm {ours / med:.2f}x" if ours is not None and tool != "gpuswarm" else ""
        rows.append(
            Row(
                BENCH,
                wrapped,
                tool,
                med,
                "ms",
                ratio=ratio,
                shown=f"{med:.1f} / {p99:.1f}",
                extra={"median_ms": med, "p99_ms": p99},
            )
        )
    rows.append(skipped(BENCH, wrapped, "xargs", "n/a: xargs assigns no GPU slot"))
    return rows


def _gpuswarm(cmds: Path, slots: int, size: str) -> list[Row]:
    ws = cmds.parent / "ws"
    argv = [*GPUSWARM, "run", "-q", "--no-report", "--gpus", f"sim:{slots}", "--workspace"]
    timed([*argv, str(ws), str(cmds)], env=env_for_bench(LC_ALL="C"))
    run_dir = the_run(ws)
    if run_dir is None:
        raise RuntimeError(f"no run folder under {ws}")
    med, p99 = _ms(attempt_gaps(run_dir))
    metric = f"{size}: attempt end -> next attempt start on the slot (attempt records)"
    return [
        Row(BENCH, f"{metric}, median ms", "gpuswarm", med, "ms", "< 5 ms", med < 5),
        Row(BENCH, f"{metric}, p99 ms", "gpuswarm", p99, "ms", "< 50 ms", p99 < 50),
    ]


def _peer(tool: str, cmds: Path, slots: int) -> None:
    env = env_for_bench(LC_ALL="C")
    if tool == "simple_gpu_scheduler":
        argv = ["simple_gpu_scheduler", "--gpus", *map(str, range(slots))]
        timed(argv, stdin=cmds, env=env)
    elif tool == "GNU parallel":
        argv = ["parallel", "-j", str(slots), "CUDA_VISIBLE_DEVICES=$(({%}-1)) eval {}"]
        timed(argv, stdin=cmds, env=env)
    elif tool == "Ray":
        call_ray(["run", "--cmds", str(cmds), "--gpus", str(slots)], timeout=900)
    else:
        raise ValueError(tool)
