"""Issue 11's smaller items, in-process: the staging folder never leaks, one attempt-number rule
for watch and status, and a quarantine in the live view's slot rows."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from rich.console import Console

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.runview import RunView as ViewState
from gpuswarm.core.runview import SlotRow
from gpuswarm.outputs.status import run_status
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.ui.table import LiveView


def spec(tid: str) -> dict[str, Any]:
    return TaskSpec(id=tid, name=tid, command=["true"]).model_dump(mode="json")


class Stop(BaseException):
    """Stands for the Interrupted a SIGTERM handler raises."""


def test_a_stop_right_after_the_staging_folder_is_made_leaves_nothing(tmp_path: Path) -> None:
    """The stop arrives when the staging folder's mkdir returns (before the old ``try:``)."""

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if event == "call" and frame.f_code.co_name == "mkdir":
            return local
        return None

    def local(frame: FrameType, event: str, arg: object) -> Any:
        path = frame.f_locals.get("self")
        if event == "return" and ".staging-" in str(path) and arg is None:
            sys.settrace(None)
            raise Stop
        return local

    sys.settrace(tracer)
    try:
        with pytest.raises(Stop):
            create_run(NewRun("leak", tmp_path, {"name": "leak"}, [spec("a")]))
    finally:
        sys.settrace(None)
    assert list((tmp_path / "leak").iterdir()) == []  # no staging folder, no run


def test_watch_and_status_number_an_attempt_alike(tmp_path: Path) -> None:
    paths = create_run(NewRun("num", tmp_path, {"name": "num", "slot_count": 1}, [spec("a")]))
    queue = DirQueue(paths)
    claimed = queue.claim("host:1:1", 0)
    assert claimed is not None
    # an interrupted attempt and a failed one before this claim: this is attempt 3
    claimed.data["attempts"] = [{"n": 1, "interrupted": True}, {"n": 2, "reason": "exit 1"}]
    queue.save(claimed)
    (row,) = run_status(paths.root)["running"]
    assert row["log"] is not None
    assert row["attempt"] == 3 and row["log"].endswith("attempt-3/output.log")
    state = RunReader(paths).view()
    assert [r.attempt for r in state.slots.values() if r.task == "a"] == [3]


def test_the_live_view_marks_a_quarantined_slot(tmp_path: Path) -> None:
    state = ViewState({"pending": 1, "running": 0, "done": 0, "failed": 0})
    for label in ("gpu0", "gpu1"):
        state.slots[label] = SlotRow()
    view = LiveView(state, lambda task, n: tmp_path / task / f"{n}.log", title="t")
    state.apply({"ev": "quarantined", "slot": "gpu1", "reason": "CUDA error on this GPU"})
    out = io.StringIO()
    Console(file=out, width=160).print(view.render())
    line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("gpu1"))
    assert "QUARANTINED" in line and "CUDA error on this GPU" in line
    state.apply({"ev": "unquarantined", "slot": "gpu1", "reason": "lifted by hand"})
    out = io.StringIO()
    Console(file=out, width=160).print(view.render())
    assert "QUARANTINED" not in out.getvalue().split("gpu1", 1)[1].splitlines()[0]
