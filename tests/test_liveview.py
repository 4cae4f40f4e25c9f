"""The live view: its state follows the journal, a frame shows every slot, tails read only
appended bytes, and `gpuswarm watch` follows a run another process supervises."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from gpuswarm.core.runview import RunView as ViewState
from gpuswarm.core.runview import SlotRow
from gpuswarm.store.ledger import EventTail
from gpuswarm.ui.table import LiveView
from gpuswarm.ui.terminal import is_terminal


def _view(tmp_path: Path) -> tuple[ViewState, LiveView]:
    state = ViewState({"pending": 3, "running": 0, "done": 0, "failed": 0})
    for label in ("gpu0", "gpu1", "gpu10", "gpu2"):
        state.slots[label] = SlotRow()

    def log_of(task: str, attempt: int) -> Path:
        path = tmp_path / task / f"attempt-{attempt}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    return state, LiveView(state, log_of, title="run_x")


def _frame(view: LiveView) -> str:
    console = Console(record=True, width=140, file=io.StringIO())
    console.print(view.render())
    return console.export_text()


def test_state_follows_events_and_a_frame_shows_every_slot(tmp_path: Path) -> None:
    state, view = _view(tmp_path)
    now = time.time()
    view(
        {
            "ev": "started",
            "task": "t1",
            "attempt": 1,
            "slot": "gpu1",
            "ts": now - 65,
            "name": "train lr=0.1",
            "timeout": 600,
        }
    )
    view({"ev": "started", "task": "t2", "attempt": 2, "slot": "gpu0", "ts": now})
    (tmp_path / "t1").mkdir(exist_ok=True)
    (tmp_path / "t1" / "attempt-1.log").write_text("epoch 1\rstep 5/10 loss 0.3\n")
    view(
        {
            "ev": "finished",
            "task": "t2",
            "attempt": 2,
            "slot": "gpu0",
            "state": "failed",
            "reason": "exit 3",
            "ts": now,
        }
    )
    assert state.counts == {"pending": 1, "running": 1, "done": 0, "failed": 1}
    text = _frame(view)
    assert "run_x" in text and "done 0  failed 1  running 1  pending 1" in text
    assert "t1 train lr=0.1" in text and "1m05s/10m00s" in text
    assert "step 5/10 loss 0.3" in text and "epoch 1" not in text  # \r progress: last state
    assert "t2 failed: exit 3" in text  # recent failures
    lines = [ln for ln in text.splitlines() if ln.startswith("gpu")]
    assert [ln.split()[0] for ln in lines] == ["gpu0", "gpu1", "gpu2", "gpu10"]  # natural order


def test_requeue_and_done_update_counts_and_eta(tmp_path: Path) -> None:
    state, view = _view(tmp_path)
    t0 = time.time() - 10
    for i, slot in enumerate(("gpu0", "gpu1")):
        view({"ev": "started", "task": f"t{i}", "attempt": 1, "slot": slot, "ts": t0})
    view({"ev": "requeued", "task": "t1", "frm": "running", "reason": "interrupted"})
    view(
        {
            "ev": "finished",
            "task": "t0",
            "attempt": 1,
            "slot": "gpu0",
            "state": "done",
            "ts": t0 + 5,
        }
    )
    assert state.counts == {"pending": 2, "running": 0, "done": 1, "failed": 0}
    assert state.slots["gpu1"].task == "" and state.slots["gpu0"].done == 1
    eta = state.eta(time.time())
    assert eta is not None and eta > 0


def test_a_finish_journaled_after_the_slots_next_start_keeps_that_start(tmp_path: Path) -> None:
    """The committer journals `finished` after the loop has started the slot's next task:
    the slot keeps showing the new task and still counts the finished one."""
    state, _ = _view(tmp_path)
    for e in (
        {"ev": "started", "task": "a", "slot": "gpu0", "attempt": 1, "ts": 1.0},
        {"ev": "started", "task": "b", "slot": "gpu0", "attempt": 1, "ts": 2.0},
        {"ev": "finished", "task": "a", "slot": "gpu0", "state": "done", "ts": 2.1},
    ):
        state.apply(e)
    row = state.slots["gpu0"]
    assert (row.task, row.done) == ("b", 1)
    assert state.counts["running"] == 1 and state.counts["done"] == 1


def test_event_tail_returns_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"ev": "old"}) + "\n")
    tail = EventTail(path, from_end=True)
    assert tail.poll() == []
    with path.open("a") as fh:
        fh.write(json.dumps({"ev": "a"}) + "\n" + '{"ev": "b"')  # b is half-written
    assert [e["ev"] for e in tail.poll()] == ["a"]
    with path.open("a") as fh:
        fh.write("}\nnot json\n")
    assert [e["ev"] for e in tail.poll()] == ["b"]


def test_pipes_are_not_terminals() -> None:
    assert not is_terminal(io.StringIO())


@pytest.mark.slow  # runs the CLI
@pytest.mark.timeout(60)
def test_watch_follows_a_run_in_another_process(tmp_path: Path) -> None:
    cmds = tmp_path / "cmds.txt"
    cmds.write_text("sleep 1.5\nsleep 1.5\nsleep 1\nfalse\n")
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuswarm",
            "run",
            "-q",
            "--no-report",
            "--gpus",
            "sim:2",
            "--workspace",
            str(tmp_path / "ws"),
            str(cmds),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        runs: list[Path] = []
        while not runs and time.monotonic() < deadline:
            runs = [p for p in (tmp_path / "ws").glob("*/run_*") if (p / "run.json").exists()]
            time.sleep(0.05)
        assert runs
        watch = subprocess.run(
            [sys.executable, "-m", "gpuswarm", "watch", str(runs[0])],
            capture_output=True,
            text=True,
            timeout=40,
        )
    finally:
        run.wait(30)
    assert watch.returncode == 1  # `false` failed: the run is not complete
    out = watch.stderr
    assert "\x1b[" not in out  # not a terminal: plain lines
    assert "done   cmd-" in out and "no supervisor running" in out
    assert "failed 1" in out.splitlines()[-1]


def test_a_live_run_s_view_takes_the_queue_s_counts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task another process added (``gpuswarm add``) or cancelled is in no event this
    supervisor emitted: the view takes the queue's counts again every RECOUNT_SECONDS."""
    import gpuswarm.ui.table as table

    monkeypatch.setattr(table, "RECOUNT_SECONDS", 0.0)
    state = ViewState({"pending": 3, "running": 0, "done": 0, "failed": 0})
    folders = {"pending": 5, "running": 0, "done": 0, "failed": 0, "cancelled": 1}
    view = LiveView(state, lambda t, n: tmp_path / "log", title="run_x", recount=lambda: folders)
    frame = _frame(view)
    assert "pending 5" in frame and "cancelled 1" in frame


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_a_narrow_frame_keeps_long_slot_ids_and_elapsed_whole(tmp_path: Path, width: int) -> None:
    """Issue 33: the slot id (a cluster's ``gs-node-b-…-gpu0``, ``gpu0.1``), the attempt and
    elapsed/timeout always show in full; the task and the last output give way, with an
    ellipsis, and no row wraps."""
    state = ViewState({"pending": 0, "running": 3, "done": 0, "failed": 0})
    labels = ["gs-node-b-7f3a9c-gpu0", "gpu0.1", "vm-gpu12"]
    now = time.time()

    def log_of(task: str, attempt: int) -> Path:
        return tmp_path / f"{task}-{attempt}.log"

    view = LiveView(state, log_of, title="run_x", gpu_stats=lambda: {labels[0]: "97% 61.2/80G"})
    for i, label in enumerate(labels):
        state.slots[label] = SlotRow()
        task = f"t{i}"
        view(
            {
                "ev": "started",
                "task": task,
                "attempt": 3,
                "slot": label,
                "ts": now - 3725,
                "name": "train-a-model-with-a-rather-long-name " * 3,
                "timeout": 36000,
            }
        )
        log_of(task, 3).write_text("loss 0.25 " * 30 + "\n")
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(view.render())
    lines = console.export_text().splitlines()
    rows = [line for line in lines if line.split(" ", 1)[0] in labels]
    assert len(rows) == 3, lines
    for row in rows:
        assert len(row) <= width
        assert re.search(r"\s3\s+1h02m/10h00m\s", row), row
        assert "t" in row.split()[1]  # the task's column keeps its start
    (cluster,) = (row for row in rows if row.startswith(labels[0]))
    # the GPU line shows where it fits; at 60 columns it is the column that goes
    assert ("97% 61.2/80G" in cluster) == (width >= 80), cluster
    if width <= 120:
        assert all("…" in row for row in rows), lines
