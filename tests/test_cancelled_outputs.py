"""``cancelled`` in the outputs (issue 17): counted apart, out of the pass-rate denominators, a
run whose only unfinished tasks are cancelled is complete (exit 0 unless --strict); the run
view folds the control commands' events (added, a pending task cancelled, a retry)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import cast

from rich.console import Console

from gpuswarm.core.errors import EXIT_OK, EXIT_UNFINISHED
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.runview import RunView, SlotRow
from gpuswarm.outputs.aggregate import COMPLETE, WITH_FAILURES, end_state, summarize
from gpuswarm.outputs.results import shown_counts
from gpuswarm.outputs.rowtypes import Row
from gpuswarm.outputs.runreport import RunReport
from gpuswarm.outputs.summaryjson import RunSummary
from gpuswarm.outputs.taskrow import TaskRow
from gpuswarm.store.runinfo import RunRecord
from gpuswarm.ui.table import LiveView


def _row(task: str, state: str, ok: bool | None = None, reason: str = "") -> Row:
    row = Row()
    row.values = TaskRow(task=task, name=task, state=state, attempts=1, reason=reason)
    if ok is not None:
        row.result = {"ok": ok}
    return row


def _summary(rows: list[Row]) -> RunSummary:
    summary = cast(RunSummary, {**summarize(rows, RunRecord.from_json({"name": "t"}), None)})
    summary["state"] = end_state(summary["counts"], False)
    return summary


def test_cancelled_is_counted_apart_and_out_of_the_pass_rates() -> None:
    rows = [
        _row("a", "done", ok=True),
        _row("b", "done", ok=False),
        _row("c", "cancelled", reason="not needed"),
        _row("d", "skipped", reason="skip code"),
    ]
    summary = _summary(rows)
    assert summary["counts"]["cancelled"] == 1
    assert summary["complete"] is True and summary["state"] == COMPLETE
    assert summary["failures"] == [] and summary["not_done"] == 0
    assert summary["cancelled"] == [{"task": "c", "reason": "not needed"}]
    ok = summary["fields"]["result.ok"]
    assert (ok["of_done"], ok["of_total"]) == (2, 2)  # neither skipped nor cancelled counts


def test_a_failure_beside_a_cancel_is_still_a_failure() -> None:
    summary = _summary([_row("a", "failed", reason="exit 1"), _row("b", "cancelled")])
    assert summary["complete"] is False and summary["state"] == WITH_FAILURES
    assert [f["task"] for f in summary["failures"]] == ["a"]


def test_the_exit_code_is_0_with_cancelled_tasks_unless_strict(tmp_path: Path) -> None:
    summary = _summary([_row("a", "done"), _row("b", "cancelled")])
    report = RunReport(RunPaths(tmp_path), summary, interrupted=False)
    assert report.exit_code == EXIT_OK
    report.strict = True
    assert report.exit_code == EXIT_UNFINISHED
    plain = RunReport(RunPaths(tmp_path), _summary([_row("a", "done")]), False, strict=True)
    assert plain.exit_code == EXIT_OK


def test_shown_counts_name_cancelled_only_when_some_task_is() -> None:
    counts = {"pending": 0, "running": 0, "done": 3, "failed": 0, "skipped": 0, "cancelled": 0}
    assert "cancelled" not in shown_counts(counts) and "skipped" not in shown_counts(counts)
    assert shown_counts({**counts, "cancelled": 2})["cancelled"] == 2


def test_the_run_view_folds_add_cancel_and_retry() -> None:
    view = RunView({"pending": 1, "running": 0, "done": 0, "failed": 1, "cancelled": 0})
    view.apply({"ev": "added", "count": 3, "ids": ["x", "y", "z"], "by": "me"})
    assert view.counts["pending"] == 4 and view.added == 3
    view.apply(
        {
            "ev": "control",
            "request": "cancel",
            "task": "x",
            "by": "me",
            "applied_by": "me",
            "state": "cancelled",
        }
    )
    assert view.counts["pending"] == 3 and view.counts["cancelled"] == 1
    view.apply({"ev": "requeued", "task": "x", "frm": "cancelled", "reason": "retry"})
    view.apply({"ev": "requeued", "task": "f", "frm": "failed", "reason": "retry"})
    assert view.counts == {
        "pending": 5,
        "running": 0,
        "done": 0,
        "failed": 0,
        "cancelled": 0,
        "blocked": 0,
    }
    view.apply({"ev": "control", "request": "pause", "by": "me"})
    view.apply({"ev": "control", "request": "pause", "slot": "gpu1", "by": "me"})
    assert view.paused and view.paused_slots == {"gpu1"}
    view.apply({"ev": "control", "request": "unpause", "by": "me"})
    assert not view.paused


def test_the_live_table_marks_a_paused_run_and_slot_and_counts_cancelled(tmp_path: Path) -> None:
    state = RunView({"pending": 1, "running": 0, "done": 1, "failed": 0, "cancelled": 2})
    state.slots["gpu0"] = SlotRow()
    state.slots["gpu1"] = SlotRow()
    view = LiveView(
        state, lambda t, n: tmp_path / "log", paused=lambda: (True, frozenset({"gpu1"}))
    )
    console = Console(record=True, width=140, file=io.StringIO())
    console.print(view.render())
    text = console.export_text()
    assert "PAUSED" in text and "cancelled 2" in text
    (line,) = [ln for ln in text.splitlines() if "gpu1" in ln]
    assert "(paused)" in line
    assert "(paused)" not in next(ln for ln in text.splitlines() if "gpu0" in ln)
