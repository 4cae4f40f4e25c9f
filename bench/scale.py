"""2. Scale: a 100,000-task queue (10,000 with --quick).

(a) enqueue: ``gpuswarm.store.runs.create_run`` timed through the API with 100k TaskSpec dumps of a
    command list of ``true`` (built as ``engine.start_run`` does: ``load_command_list``,
    ``runsetup.plan``, ``runsetup.run_info``; that loading is reported on its own row). The page
    cache is flushed (``os.sync``) first, so the run's one ``syncfs`` pays only for its own files.
(b) claim cost: ``DirQueue(paths).claim(owner, slot)`` on fresh runs of 1,000 and of 100,000
    pending tasks; the first claim (it fills the in-memory index) is reported apart, then the
    median of the next 500 single claims; the ratio of the two medians is the target.
(c)-(e) the CLI on one big run: ``gpuswarm run -q --no-report --gpus sim:8`` over a 100k-line
    ``true`` list is started; its first ``started`` event gives the time from launch to the
    first task (creation included); its RSS is sampled every 50 ms (psutil) while it runs the
    first 5,000 tasks (1,000 with --quick), then it is stopped with SIGINT (warm stop: it writes
    summary.json and results.tsv over all 100k tasks, sampled too). Then, on that stopped run:
    ``gpuswarm status RUN --json`` (median of 3), and ``gpuswarm resume RUN -q --no-report``
    from launch until its first ``started`` event (the event's timestamp), after which it is
    stopped with SIGINT.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from common import (
    GPUSWARM,
    Config,
    EventTail,
    PeakRss,
    Row,
    env_for_bench,
    failed,
    median,
    say,
    stop_tree,
    the_run,
    timed,
    wait_for,
)

BENCH = "2 scale"
OWNER = "bench-host:1:1"


def api_run(n: int, where: Path, *, stream: bool = False) -> tuple[Any, float, float]:
    """(RunPaths, load seconds, create_run seconds) of a fresh run of ``n`` ``true`` tasks;
    ``stream``: as ``gpuswarm run`` makes it (the first tasks in pending/, the rest spooled)."""
    from gpuswarm.app.planning import plan
    from gpuswarm.app.setup import new_run
    from gpuswarm.config.load import load_command_list
    from gpuswarm.store.runs import create_run

    where.mkdir(parents=True, exist_ok=True)
    cmds = where / "cmds.txt"
    cmds.write_text("true\n" * n)
    t0 = time.perf_counter()
    loaded = load_command_list(cmds, base_dir=where)
    gpus, slots = plan(loaded, "sim:8")
    loaded = dataclasses.replace(loaded, workspace=where / "ws")
    new = new_run(loaded, gpus, slots, stream=stream)  # as engine.start_run builds it
    t1 = time.perf_counter()
    os.sync()
    t2 = time.perf_counter()
    paths = create_run(new)
    return paths, t1 - t0, time.perf_counter() - t2


def _streamed(n: int, where: Path) -> list[Row]:
    """A streamed create_run (as ``gpuswarm run`` makes a big run): until the run is visible
    with every task durable (the first in pending/, the rest in the spool), then the spool's
    move into pending/ (a supervisor's thread does it while the first tasks run)."""
    from gpuswarm.store.ledger import Ledger
    from gpuswarm.store.spool import stream

    metric = f"enqueue {n:,} tasks streamed: create_run until every task is durable, s"
    try:
        paths, _, create_s = api_run(n, where, stream=True)
        ledger = Ledger(paths.events)
        t0 = time.perf_counter()
        stream(paths, lambda name: None, ledger)
        rest_s = time.perf_counter() - t0
        ledger.close()
    except Exception as exc:
        return [failed(BENCH, metric, "gpuswarm", exc)]
    note = (
        f"then the spool's move into pending/ (in the background, while tasks run): {rest_s:.1f} s"
    )
    return [Row(BENCH, metric, "gpuswarm", create_s, "s", "<= 3 s", create_s <= 3, note=note)]


def claim_cost(paths: Any, claims: int) -> tuple[float, float]:
    """(first claim seconds, median seconds of the next ``claims`` claims)."""
    from gpuswarm.store.queue import DirQueue

    queue = DirQueue(paths)
    t0 = time.perf_counter()
    if queue.claim(OWNER, 0) is None:
        raise RuntimeError("nothing to claim")
    first = time.perf_counter() - t0
    times = []
    for i in range(claims):
        t = time.perf_counter()
        got = queue.claim(OWNER, i % 8)
        times.append(time.perf_counter() - t)
        if got is None:
            raise RuntimeError(f"queue ran dry after {i + 1} claims")
    return first, median(times)


def run(cfg: Config) -> list[Row]:
    n = cfg.scale_tasks
    work = cfg.work / "scale"
    rows: list[Row] = []
    say(f"scale: create_run of {n} tasks (API)")
    big = small = None
    enq = f"enqueue {n:,} tasks: create_run (API), s"
    try:
        big, load_s, create_s = api_run(n, work / "api-big")
        rows.append(Row(BENCH, enq, "gpuswarm", create_s, "s", "< 5 s", create_s < 5))
        rows[-1].note = "every task in pending/ when it returns (not streamed)"
        rows.append(
            Row(BENCH, f"load + validate a {n:,}-line command list (API), s", "gpuswarm", load_s)
        )
        rows[-1].unit = "s"
        small, _, _ = api_run(cfg.scale_small, work / "api-small")
    except Exception as exc:
        rows.append(failed(BENCH, enq, "gpuswarm", exc))
    rows += _streamed(n, work / "api-stream")
    rows += _claims(cfg, small, big)
    rows += _cli(cfg, work / "cli")
    return rows


def _claims(cfg: Config, small: Any, big: Any) -> list[Row]:
    n, k = cfg.scale_tasks, cfg.scale_small
    metric = f"one claim, {n:,} pending vs {k:,} pending (median of {cfg.claims}), us"
    if small is None or big is None:
        return [Row(BENCH, metric, "gpuswarm", None, note="not measured: no run was created")]
    say("scale: claim cost")
    try:
        first_small, cost_small = claim_cost(small, cfg.claims)
        first_big, cost_big = claim_cost(big, cfg.claims)
    except Exception as exc:
        return [failed(BENCH, metric, "gpuswarm", exc)]
    ratio = cost_big / cost_small
    return [
        Row(
            BENCH,
            metric,
            "gpuswarm",
            cost_big * 1e6,
            "us",
            "<= 1.5x the 1k cost",
            ratio <= 1.5,
            ratio=f"{ratio:.2f}x the {k:,} cost",
            shown=f"{cost_big * 1e6:.0f} vs {cost_small * 1e6:.0f}",
            note=f"first claim (fills the index): {first_big * 1e3:.0f} ms vs "
            f"{first_small * 1e3:.1f} ms",
            extra={"us_small": cost_small * 1e6, "first_s_big": first_big, "first_s": first_small},
        )
    ]


def _cli(cfg: Config, work: Path) -> list[Row]:
    n, ran = cfg.scale_tasks, cfg.rss_tasks_run
    metric_rss = f"supervisor peak RSS, {n:,}-task queue, first {ran:,} run + stop, MB"
    say(f"scale: gpuswarm run over {n} tasks, RSS, stop after {ran}")
    try:
        got = _big_cli_run(work, n, ran)
    except Exception as exc:
        return [failed(BENCH, metric_rss, "gpuswarm", exc)]
    rss = got["peak_rss"] / 2**20
    rows = [
        Row(
            BENCH,
            f"CLI: {n:,}-line command list -> first task started, s",
            "gpuswarm",
            got["first_start"],
            "s",
            target="<= 2 s",
            ok=got["first_start"] <= 2,
            note="gpuswarm run: interpreter start + parse + create (streamed) + first claim",
        ),
        Row(
            BENCH,
            metric_rss,
            "gpuswarm",
            rss,
            "MB",
            "< 150 MB",
            rss < 150,
            note=f"peak until the first start {mb(got['peak_start'])}, before the stop "
            f"{mb(got['peak_before'])}; {mb(got['running'])} while running at the stop; warm "
            f"stop (outputs of {n:,} tasks) took {got['stop_s']:.1f} s",
            extra={k: v for k, v in got.items() if k != "run"},
        ),
    ]
    stop = f"warm stop of the {n:,}-task run (SIGINT -> exit: outputs over every task), s"
    rows.append(Row(BENCH, stop, "gpuswarm", got["stop_s"], "s", "<= 2 s", got["stop_s"] <= 2))
    run_dir: Path = got["run"]
    metric = f"`gpuswarm status RUN --json`, {n:,}-task run, s (median of 3)"
    say("scale: status")
    try:
        status_s = median([timed([*GPUSWARM, "status", str(run_dir), "--json"]) for _ in range(3)])
        rows.append(Row(BENCH, metric, "gpuswarm", status_s, "s", "< 1 s", status_s < 1))
    except Exception as exc:
        rows.append(failed(BENCH, metric, "gpuswarm", exc))
    metric = f"`gpuswarm resume` of a {n:,}-task run -> first task started, s"
    say("scale: resume")
    try:
        resume_s = _resume(run_dir, work)
        rows.append(Row(BENCH, metric, "gpuswarm", resume_s, "s", "< 5 s", resume_s < 5))
    except Exception as exc:
        rows.append(failed(BENCH, metric, "gpuswarm", exc))
    return rows


def mb(size: int) -> str:
    return f"{size / 2**20:.0f} MB"


def _launch(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, env=env_for_bench()
        )


def _first_started(follower: EventTail, proc: subprocess.Popen[bytes], timeout: float) -> float:
    """The timestamp of the next ``started`` event; raises if the process ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in follower.poll():
            if ev.get("ev") == "started":
                return float(ev["ts"])
        if proc.poll() is not None:
            raise RuntimeError(f"gpuswarm exited {proc.returncode} before any task started")
        time.sleep(0.02)
    raise RuntimeError(f"no task started within {timeout:.0f} s")


def _big_cli_run(work: Path, n: int, ran: int) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    cmds, ws = work / "cmds.txt", work / "ws"
    cmds.write_text("true\n" * n)
    os.sync()
    argv = [*GPUSWARM, "run", "-q", "--no-report", "--gpus", "sim:8", "--workspace", str(ws)]
    launched = time.time()
    proc = _launch([*argv, str(cmds)], work / "run.log")
    try:
        with PeakRss(proc.pid) as rss:
            if not wait_for(lambda: the_run(ws) is not None or proc.poll() is not None, 300):
                raise RuntimeError("no run folder after 300 s")
            run_dir = the_run(ws)
            if run_dir is None:
                raise RuntimeError(f"gpuswarm exited {proc.returncode} without a run folder")
            follower = EventTail(run_dir / "events.jsonl", from_end=False)
            first = _first_started(follower, proc, 300) - launched
            peak_start = rss.peak
            finished = 0
            deadline = time.monotonic() + 600
            while finished < ran and proc.poll() is None and time.monotonic() < deadline:
                finished += sum(1 for ev in follower.poll() if ev.get("ev") == "finished")
                time.sleep(0.05)
            peak_before, running = rss.peak, rss.current
            t0 = time.perf_counter()
            stop_tree(proc, signal.SIGINT, wait=600)
            stop_s = time.perf_counter() - t0
    finally:
        stop_tree(proc, signal.SIGKILL, wait=10)
    return {
        "run": run_dir,
        "first_start": first,
        "peak_rss": rss.peak,
        "peak_before": peak_before,
        "peak_start": peak_start,
        "running": running,
        "stop_s": stop_s,
    }


def _resume(run_dir: Path, work: Path) -> float:
    events = run_dir / "events.jsonl"
    follower = EventTail(events, from_end=True)
    os.sync()
    launched = time.time()
    proc = _launch([*GPUSWARM, "resume", str(run_dir), "-q", "--no-report"], work / "resume.log")
    try:
        return _first_started(follower, proc, 300) - launched
    finally:
        stop_tree(proc, signal.SIGINT, wait=600)
