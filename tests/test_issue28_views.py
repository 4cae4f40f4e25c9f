"""Issue 28's smaller items in the views, without task processes: one task per slot in status
and watch while an ended attempt is being committed, the retry line's attempt number, the plain
``[done/total]`` line that follows the queue, and the end-of-run line."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any, cast

import pytest

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.runview import RunView
from gpuswarm.outputs.runreport import RunReport
from gpuswarm.outputs.status import run_status
from gpuswarm.outputs.summaryjson import RunSummary
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.ui import terminal
from gpuswarm.ui.endreport import end_line
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


def test_a_watch_counts_a_task_claimed_before_its_start_line_once(tmp_path: Path) -> None:
    """``gpuswarm watch`` looks at the folders, then folds the journal from its end. A slot
    renames its claim into running/ first and journals ``started`` once the attempt runs: a
    look between the two counted the task running, then its start line moved one more task
    from pending to running (a watch ended saying ``unfinished 1`` of a complete run)."""
    paths = _run(tmp_path, 3)
    queue = DirQueue(paths, durable=False)
    claimed = queue.claim(OWNER, 0)  # renamed into running/; its start line not written yet
    assert claimed is not None and claimed.task_id == "t0"
    view = RunReader(paths).view()
    assert (view.counts["pending"], view.counts["running"]) == (2, 1)
    view.apply({"ev": "started", "task": claimed.task_id, "attempt": 1, "slot": "g0"})
    assert (view.counts["pending"], view.counts["running"]) == (2, 1)  # was: (1, 2)
    for tid in ("t1", "t2"):
        view.apply({"ev": "started", "task": tid, "attempt": 1, "slot": "g0"})
    for tid in ("t0", "t1", "t2"):
        view.apply({"ev": "finished", "task": tid, "attempt": 1, "slot": "g0", "state": "done"})
    assert {k: n for k, n in view.counts.items() if n} == {"done": 3}  # was: done 3, running 1


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


def test_the_plain_failed_count_follows_a_retry_of_another_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gpuswarm retry --failed`` on a live run: the supervisor hears no event of it, and its
    lines said ``[4/4 done, 3 failed]`` once the retried tasks were done."""
    monkeypatch.setattr(terminal, "RECOUNT_SECONDS", 0.0)
    queue_counts = {"pending": 0, "running": 1, "done": 0, "failed": 2}
    reporter = PlainReporter(
        view=RunView(dict(queue_counts)), stream=io.StringIO(), recount=lambda: dict(queue_counts)
    )
    queue_counts.update(pending=2, failed=0)  # `gpuswarm retry --failed` of another process
    queue_counts.update(pending=1, running=2)  # our slot claimed one (renamed, then journaled)
    lines = _fold(
        reporter,
        {"ev": "started", "task": "f1", "attempt": 2, "slot": "g1"},
        # journaled before its rename to done/: the queue has it in running/ still
        {"ev": "finished", "task": "f1", "attempt": 2, "slot": "g1", "state": "done"},
    )
    assert lines[-1].endswith("[1/3 done]"), lines  # was: [1/3 done, 2 failed]
    queue_counts.update(running=1, done=1)  # the rename
    lines = _fold(
        reporter,
        {"ev": "started", "task": "f2", "attempt": 2, "slot": "g1"},
        {"ev": "finished", "task": "f2", "attempt": 2, "slot": "g1", "state": "failed"},
    )
    assert lines[-1].endswith("[1/3 done, 1 failed]"), lines


def _report(
    tmp_path: Path, summary: dict[str, Any], *, interrupted: bool = False, halted: str = ""
) -> RunReport:
    paths = RunPaths(tmp_path / "r")
    return RunReport(
        paths, cast(RunSummary, summary), interrupted=interrupted, halted=halted or None
    )


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
    left = cast(
        RunSummary, {"counts": {"done": 4, "pending": 1}, "complete": False, "state": "stopped"}
    )
    report = RunReport(RunPaths(tmp_path / "r"), left, interrupted=False, budget="budget $1.00")
    assert end_line(report) == "stopped by budget $1.00 (1 task left pending, reason budget)"
