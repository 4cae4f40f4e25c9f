"""A queue verb that looks a task up while the task moves between state folders (found by the
cancel-race chaos test: the folders are listed one after the other, so one scan can miss a
task renamed from one to the other meanwhile; `cancel` then died with a KeyError)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.app import control as control_ops
from gpuswarm.app import controlframe
from gpuswarm.config.models import TaskSpec
from gpuswarm.core.errors import QueueError
from gpuswarm.store.runs import NewRun, create_run


def task(tid: str) -> dict[str, Any]:
    return TaskSpec(id=tid, name=tid, command=[sys.executable, "-c", "pass"]).model_dump(
        mode="json"
    )


def test_a_scan_that_missed_a_moving_task_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = create_run(NewRun("idx", tmp_path, {"name": "idx"}, [task("t1")]))
    real, scans = controlframe._index, []

    def flaky(queue: Any) -> Any:
        scans.append(1)
        return {} if len(scans) == 1 else real(queue)  # the first scan missed it mid-move

    monkeypatch.setattr(controlframe, "_index", flaky)
    out = control_ops.cancel_tasks(paths.root, ["t1"], reason="test", wait=None)
    assert [r["now"] for r in out["tasks"]] == ["cancelled"] and len(scans) == 2


def test_a_task_that_never_settles_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = create_run(NewRun("idx", tmp_path, {"name": "idx"}, [task("t1")]))
    monkeypatch.setattr(controlframe, "_index", lambda queue: {})
    monkeypatch.setattr(controlframe, "INDEX_TRIES", 3)
    with pytest.raises(QueueError, match="kept moving between states"):
        control_ops.cancel_tasks(paths.root, ["t1"], reason="test", wait=None)
