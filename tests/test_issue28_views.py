"""Issue 28's smaller items in the views, without task processes: one task per slot in status
and watch while an ended attempt is being committed, the retry line's attempt number, the plain
``[done/total]`` line that follows the queue, and the end-of-run line."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.runview import RunView
from gpuswarm.outputs.results import RunReport
from gpuswarm.outputs.status import run_status
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.ui.printers import end_line
from gpuswarm.ui.terminal import PlainReporter

OWNER = "host:1:1"


def _run(tmp_path: Path, n: int) -> RunPaths:
    tasks = [
        TaskSpec(id=f"t{i}", name=f"t{i}", command=["true"]).model_dump(mode="json")
        for i in range(n)
    ]
    return create_run(NewRun("v", tmp_path, {"name": "v"}, tasks))


def test_a_slot_shows_one_task_while_its_last_attempt_is_being_committed(tmp_path: Path) -> None:
    paths = _run(tmp_path, 3)
    queue = DirQueue(paths, durable=False)
    ended = queue.claim(OWNER, 0)  # its attempt ended; the committer has not moved it yet ...
    assert ended is not None
    old = time.time() - 30
    os.utime(ended.path, (old, old))
    nxt = queue.claim(OWNER, 0)  # ... and its slot claimed the next task already
    assert nxt is not None
    running = run_status(paths.root)["running"]
    assert [r["task"] for r in running] == [nxt.task_id], running
    rows = RunReader(paths).running()
    assert [(r.task, r.ending) for r in rows] == [(ended.task_id, True), (nxt.task_id, False)]
    view = RunReader(paths).view()
    assert [row.task for row in view.slots.values()] == [nxt.task_id]


def _fold(reporter: PlainReporter, *events: dict[str, Any]) -> list[str]:
    for raw in events:
        reporter({"ts": 1.0, **raw})
    out = reporter.stream
    assert isinstance(out, io.StringIO)
    return out.getvalue().splitlines()


def test_the_retry_line_names_the_attempt_its_start_line_named(tmp_path: Path) -> None:
    reporter = PlainReporter(view=RunView({"pending": 1}), stream=io.StringIO())
    lines = _fold(
        reporter,
        {"ev": "started", "task": "t", "attempt": 2, "slot": "g0"},
        {"ev": "finished", "task": "t", "attempt": 2, "slot": "g0", "state": "waiting",
         "reason": "exit 1", "retry": True, "retry_in": 1, "max_attempts": 2, "used": 1},
    )  # fmt: skip
    assert lines[0].endswith("start  t attempt 2")
    assert "(attempt 2, 1/2 of max_attempts used, again in 1s)" in lines[1]


def test_the_plain_total_follows_the_queue(tmp_path: Path) -> None:
    queue_counts = {"pending": 0, "running": 1, "done": 0}
    reporter = PlainReporter(
        view=RunView({"pending": 0, "running": 1, "done": 0, "failed": 0}),
        stream=io.StringIO(),
        recount=lambda: dict(queue_counts),
    )
    queue_counts["pending"] = 1500  # `gpuswarm add` from another process: no event of ours
    lines = _fold(
        reporter,
        {"ev": "finished", "task": "t", "attempt": 1, "slot": "g0", "state": "done"},
    )
    assert lines[-1].endswith("[1/1501 done]"), lines


def _report(
    tmp_path: Path, summary: dict[str, Any], *, interrupted: bool = False, halted: str = ""
) -> RunReport:
    paths = RunPaths(tmp_path / "r")
    return RunReport(paths, summary, interrupted=interrupted, halted=halted or None)


def test_the_end_line_says_how_the_run_ended(tmp_path: Path) -> None:
    root = tmp_path / "r"
    failed = {
        "counts": {"failed": 2, "done": 1},
        "complete": False,
        "state": "finished with failures",
    }
    assert end_line(_report(tmp_path, failed)) == (
        f"finished with failures: 2 failed (see the reasons above); run them again with: "
        f"gpuswarm resume {root}"
    )
    stopped = {"counts": {"pending": 133}, "complete": False, "state": "stopped",
               "stopped_by": "Ctrl-C (SIGINT)", "requeued": 8}  # fmt: skip
    assert end_line(_report(tmp_path, stopped, interrupted=True)) == (
        "stopped by Ctrl-C (SIGINT): 8 running tasks put back in the queue, 125 pending; "
        f"finish with: gpuswarm resume {root}"
    )
    done = {"counts": {"done": 3}, "complete": True, "state": "complete"}
    assert end_line(_report(tmp_path, done)) == ""
    halt = "halt: 2 tasks failed (halt soon,fail=2)"
    left = {"counts": {"failed": 2, "pending": 5}, "complete": False, "state": "stopped"}
    assert end_line(_report(tmp_path, left, halted=halt)) == (
        f"stopped by {halt}: 5 pending; finish with: gpuswarm resume {root}"
    )
    # the last task met the rule: nothing was left, the run is finished with failures
    assert end_line(_report(tmp_path, failed, halted=halt)).startswith("finished with failures")


def test_watch_lines_count_tasks_the_journal_says_were_added() -> None:
    view = RunView({"pending": 1, "running": 0, "done": 0, "failed": 0})
    reporter = PlainReporter(view=view, stream=io.StringIO())  # watch: it folds the journal
    for raw in (
        {"ev": "added", "count": 2},  # `gpuswarm add` of another process, in the journal
        {"ev": "started", "task": "t", "attempt": 1, "slot": "g0"},
        {"ev": "finished", "task": "t", "attempt": 1, "slot": "g0", "state": "done"},
    ):
        event = view.apply(raw)
        assert event is not None
        reporter.show(event)
    out = reporter.stream
    assert isinstance(out, io.StringIO)
    assert out.getvalue().splitlines()[-1].endswith("[1/3 done]")


def test_the_live_view_keeps_saying_why_a_halt_now_stops_the_run() -> None:
    view = RunView({"pending": 3})
    reason = "halt: 1 task failed (halt now,fail=1): running tasks are stopped and put back"
    view.apply({"ev": "halted", "spec": "now,fail=1", "reason": reason})
    view.apply({"ev": "shutdown", "mode": "warm"})
    assert view.note == reason
    view.apply({"ev": "shutdown", "mode": "cold"})  # Ctrl-C again: killing everything
    assert view.note == ""


def test_a_budget_stop_counts_the_tasks_it_left(tmp_path: Path) -> None:
    """Issue 33's plurals: ``1 task left pending``, never ``1 tasks``."""
    left = {"counts": {"done": 4, "pending": 1}, "complete": False, "state": "stopped"}
    report = RunReport(RunPaths(tmp_path / "r"), left, interrupted=False, budget="budget $1.00")
    assert end_line(report) == "stopped by budget $1.00 (1 task left pending, reason budget)"
