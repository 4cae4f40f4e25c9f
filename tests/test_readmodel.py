"""The read model: typed journal events (core/events.py), the one reducer (core/runview.py) and
the one reader of a run's folders (store/reader.py). Fast: no task processes."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.events import (
    Ev,
    Finished,
    Other,
    Requeued,
    Started,
    SupervisorStarted,
    decode,
)
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.runview import RunView, SlotRow
from gpuswarm.outputs.status import run_status
from gpuswarm.store.ledger import EventTail, Ledger, read_events
from gpuswarm.store.quarantines import lift_by_hand, read_quarantines, write_quarantine
from gpuswarm.store.queue import Claimed, DirQueue
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.ui import watch as watch_module
from gpuswarm.ui.terminal import PlainReporter

OWNER = "host:1:1"
COUNTS = {"pending": 2, "running": 0, "done": 0, "failed": 0, "skipped": 0}


def spec(tid: str, max_attempts: int = 1) -> dict[str, Any]:
    task = TaskSpec(id=tid, name=tid, command=["true"], max_attempts=max_attempts)
    return task.model_dump(mode="json")


# -- events ------------------------------------------------------------------------------------
def test_each_kind_decodes_to_its_payload_and_back_to_the_same_line() -> None:
    line = {"ts": 5.0, "ev": "started", "task": "a", "attempt": 2, "slot": "gpu0", "pid": 7}
    event = decode(line)
    assert isinstance(event, Started)
    assert (event.task, event.attempt, event.slot) == ("a", 2, "gpu0")
    assert event.extra == {"pid": 7}  # a field without a name here is kept
    assert event.to_json() == {**line, "name": ""}
    fin = decode({"ev": "finished", "task": "a", "slot": "gpu0", "state": "waiting", "retry": True})
    assert isinstance(fin, Finished) and fin.retry and fin.attempt is None
    req = decode({"ev": "requeued", "reason": "config-change", "added": 3})  # no task
    assert isinstance(req, Requeued) and req.task is None and req.added == 3
    sup = decode({"ev": Ev.SUPERVISOR_STARTED.value, "slots": ["gpu0", "gpu1"], "owner": OWNER})
    assert isinstance(sup, SupervisorStarted) and sup.slots == ["gpu0", "gpu1"]


@pytest.mark.parametrize(
    "line",
    [
        {"ev": "started", "task": "a", "slot": "gpu0"},  # no attempt
        {"ev": "started", "task": "a", "attempt": "2", "slot": "gpu0"},  # mistyped
        {"ev": "finished", "task": "a"},  # no slot
        {"ev": "quarantined", "reason": "x"},  # no slot
        {"ev": "unquarantined", "slot": "gpu0", "probe": "yes"},
        {"ev": 5},
    ],
)
def test_a_line_of_the_wrong_shape_decodes_to_none_and_changes_nothing(
    line: dict[str, Any],
) -> None:
    view = RunView(dict(COUNTS))
    assert decode(line) is None
    assert view.apply(line) is None
    assert view.counts == COUNTS and not view.slots


def test_a_record_this_process_emitted_is_taken_as_it_is_but_needs_its_fields() -> None:
    own = {"ts": 1.0, "ev": "started", "task": "a", "attempt": 1, "slot": "gpu0", "gpus": [0]}
    assert decode(own, own=True) == decode(own)
    assert decode({"ev": "started", "task": "a"}, own=True) is None


def test_kinds_without_a_payload_of_their_own_and_new_kinds_still_open() -> None:
    for line in ({"ev": "run_created", "tasks": 3}, {"ev": "from_a_later_version", "x": 1}):
        event = decode(line)
        assert isinstance(event, Other) and event.ev == line["ev"]
        assert event.to_json() == line


# -- the reducer -------------------------------------------------------------------------------
def _fold(events: list[dict[str, Any]], counts: dict[str, int] | None = None) -> RunView:
    view = RunView(dict(counts or COUNTS), tasks={})
    for e in events:
        assert view.apply(e) is not None, e
    return view


def test_what_runs_where_follows_starts_ends_and_requeues() -> None:
    view = _fold(
        [
            {"ev": "supervisor_started", "slots": ["gpu0", "gpu1"]},
            {"ev": "started", "task": "a", "attempt": 1, "slot": "gpu0", "ts": 1.0},
            {"ev": "started", "task": "b", "attempt": 1, "slot": "gpu1", "ts": 2.0},
            {"ev": "requeued", "task": "b", "frm": "running", "reason": "interrupted"},
        ]
    )
    assert view.slots["gpu0"] == SlotRow(task="a", attempt=1, since=1.0)
    assert view.slots["gpu1"].task == ""  # handed back: idle
    assert view.counts["running"] == 1 and view.counts["pending"] == 1
    view.apply({"ev": "started", "task": "b", "attempt": 2, "slot": "gpu1", "ts": 3.0})
    view.apply({"ev": "finished", "task": "a", "slot": "gpu0", "state": "done", "attempt": 1})
    assert (view.slots["gpu1"].task, view.slots["gpu1"].attempt) == ("b", 2)
    assert view.slots["gpu0"] == SlotRow(task="", attempt=1, since=1.0, done=1)
    assert view.counts == {**COUNTS, "pending": 0, "running": 1, "done": 1}
    assert view.tasks is not None and view.tasks["b"].started == 2


def test_a_retry_that_waits_out_its_backoff_counts_as_pending_and_frees_its_slot() -> None:
    view = _fold(
        [
            {"ev": "started", "task": "a", "attempt": 1, "slot": "gpu0"},
            {"ev": "finished", "task": "a", "slot": "gpu0", "state": "waiting", "retry": True},
        ]
    )
    assert view.counts["pending"] == 2 and view.counts["running"] == 0
    assert view.slots["gpu0"].task == "" and "a retrying" in view.failures[-1]
    assert view.tasks is not None and view.tasks["a"].state == "running"  # still in running/
    view.apply({"ev": "requeued", "task": "a", "frm": "waiting", "reason": "retry"})
    assert view.counts["pending"] == 2 and view.tasks["a"].state == "pending"


def test_the_journal_folded_from_its_start_says_each_tasks_state() -> None:
    view = RunView.of_journal(
        [
            {"ev": "requeued", "reason": "config-change", "added": 2},
            {"ev": "started", "task": "a", "attempt": 1, "slot": "g"},
            {"ev": "finished", "task": "a", "slot": "g", "state": "done", "attempt": 1},
            {"ev": "started", "task": "b", "attempt": 1, "slot": "g"},
            {"ev": "recovered", "task": "b", "state": "failed"},
            {"ev": "finished", "task": "a", "slot": "g", "state": "done", "attempt": 2},
        ]
    )
    assert view.tasks is not None
    assert {t: v.state for t, v in view.tasks.items()} == {"a": "done", "b": "failed"}
    assert view.tasks["a"].completions == [1, 2] and view.added == 2


def test_slot_health_follows_quarantines_and_probes() -> None:
    view = _fold(
        [
            {"ev": "quarantined", "slot": "gpu1", "reason": "CUDA error"},
            {"ev": "unquarantined", "slot": "gpu1", "probe": True},
        ]
    )
    assert view.quarantined == {"gpu1": "probe"}
    view.apply({"ev": "unquarantined", "slot": "gpu1", "reason": "probe succeeded"})
    assert view.quarantined == {}


def test_terminal_lines_share_the_view_they_are_given_without_counting_twice() -> None:
    view = RunView(dict(COUNTS))
    out = io.StringIO()
    reporter = PlainReporter(view=view, stream=out)
    for raw in (
        {"ev": "started", "task": "a", "attempt": 1, "slot": "gpu0"},
        {"ev": "finished", "task": "a", "slot": "gpu0", "state": "done", "seconds": 1.5},
    ):
        event = view.apply(raw)
        assert event is not None
        reporter.show(event)
    assert view.counts["done"] == 1 and view.counts["pending"] == 1
    assert out.getvalue().splitlines()[-1].endswith("done   a 1.5s [1/2 done]")


# -- the reader, and the watch that follows a run from it ----------------------------------------
def _record(n: int, ok: bool) -> dict[str, Any]:
    now = time.time()
    return {
        "n": n,
        "slot": "gpu0",
        "started": now,
        "ended": now,
        "duration": 0.0,
        "kind": "exit",
        "returncode": 0 if ok else 1,
        "reason": None if ok else "exit code 1",
    }


def _claim(queue: DirQueue, ledger: Ledger) -> Claimed:
    claimed = queue.claim(OWNER, 0)
    assert claimed is not None
    n = len(claimed.data["attempts"]) + 1
    ledger.emit(Ev.STARTED, task=claimed.task_id, attempt=n, slot="gpu0", name="a", timeout=None)
    return claimed


def _waiting_retry(tmp_path: Path) -> tuple[RunPaths, DirQueue, Ledger, Claimed]:
    """A run whose one task failed its attempt 1 and waits out its retry backoff in running/,
    saved and journaled as the supervisor does it."""
    paths = create_run(NewRun("rm", tmp_path, {"name": "rm", "slot_count": 1}, [spec("a", 2)]))
    queue, ledger = DirQueue(paths), Ledger(paths.events)
    ledger.emit(Ev.SUPERVISOR_STARTED, owner=OWNER, slots=["gpu0"], pid=1)
    claimed = _claim(queue, ledger)
    claimed.data["attempts"].append(_record(1, ok=False))
    claimed.data["retry_at"] = round(time.time() + 60, 3)
    queue.save(claimed)
    ledger.emit(
        Ev.FINISHED, task="a", attempt=1, slot="gpu0", state="waiting", reason="exit code 1",
        seconds=0.0, retry=True, retry_in=60.0, max_attempts=2, used=1,
    )  # fmt: skip
    return paths, queue, ledger, claimed


def test_the_reader_says_a_waiting_retry_runs_nowhere(tmp_path: Path) -> None:
    paths, _, ledger, _ = _waiting_retry(tmp_path)
    ledger.close()
    (row,) = RunReader(paths).running()
    assert row.waiting and row.attempt == 2 and row.log is None  # attempt 2 has not started
    (shown,) = run_status(paths.root)["running"]
    assert shown["log"] is None and shown["retry_at"] == row.retry_at
    view = RunReader(paths).view()
    assert view.counts["running"] == 0 and view.counts["pending"] == 1
    assert view.slots == {"gpu0": SlotRow()}  # as a watch that followed the journal sees it
    followed = RunView({**view.counts, "pending": 1, "running": 0})
    for raw in read_events(paths.events):
        followed.apply(raw)
    assert followed.slots["gpu0"].task == ""


def test_a_watch_started_during_a_retry_backoff_ends_complete_when_the_run_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the watch's first look counted the waiting task as running (and showed it on
    a slot, with the log of an attempt not yet started); the journal then moved it to running
    again when attempt 2 started, so a run that completed ended the watch "unfinished 1"."""
    paths, queue, ledger, claimed = _waiting_retry(tmp_path)

    class Later(EventTail):
        """The rest of the run happens once the watch has taken its first look."""

        moved = False

        def poll(self) -> list[dict[str, Any]]:
            if not Later.moved:
                Later.moved = True
                claimed.data.pop("retry_at")
                announce = lambda: ledger.emit(  # noqa: E731
                    Ev.REQUEUED, task="a", reason="retry", frm="waiting"
                )
                queue.move(claimed, State.PENDING, announce)
                again = _claim(queue, ledger)
                again.data["attempts"].append(_record(2, ok=True))
                done = lambda: ledger.emit(  # noqa: E731
                    Ev.FINISHED, task="a", attempt=2, slot="gpu0", state="done", seconds=0.0
                )
                queue.move(again, State.DONE, done)
            return super().poll()

    monkeypatch.setattr(watch_module, "EventTail", Later)
    out = io.StringIO()
    code = watch_module.watch(paths.root, stream=out, plain=True, once=True)
    ledger.close()
    assert "start  a attempt 2" in out.getvalue()
    assert "done 1  failed 0  unfinished 0" in out.getvalue(), out.getvalue()
    assert code == 0
    assert run_status(paths.root)["counts"]["done"] == 1


def test_quarantine_files_the_breaker_writes_are_read_and_lifted_by_hand(tmp_path: Path) -> None:
    paths = create_run(NewRun("q", tmp_path, {"name": "q", "slot_count": 2}, [spec("a")]))
    for slot in ("vm-gpu0", "vm-gpu1"):
        write_quarantine(paths, slot, OWNER, {"reason": f"CUDA error on {slot}"})
    found = RunReader(paths).quarantines()
    assert [q["slot"] for q in found] == ["vm-gpu0", "vm-gpu1"]
    assert found[0]["reason"] == "CUDA error on vm-gpu0" and found[0]["file"].endswith(".json")
    assert [q["slot"] for q in lift_by_hand(paths, "gpu1")] == ["vm-gpu1"]  # by its short name
    assert [q["slot"] for q in read_quarantines(paths)] == ["vm-gpu0"]
