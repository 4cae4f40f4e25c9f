"""``gpuswarm cancel`` of a blocked task that a release moves to pending/ the same instant
(issue 35): the cancel cancels it where it went (pending -> cancelled), never answers "nothing
to do" for a task that then runs. Made deterministic with the ``cancel.blocked.seen`` fault
point: the release runs between the cancel's look and its take."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.app import control as control_ops
from gpuswarm.config.models import TaskSpec
from gpuswarm.core import faults
from gpuswarm.core.models import State
from gpuswarm.store import release
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run


def task(tid: str, **more: Any) -> dict[str, Any]:
    spec = TaskSpec(id=tid, name=tid, command=[sys.executable, "-c", "pass"], **more)
    return spec.model_dump(mode="json")


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    yield
    faults.disarm()


def test_a_blocked_task_released_while_it_is_cancelled_ends_cancelled(tmp_path: Path) -> None:
    paths = create_run(
        NewRun("race", tmp_path, {"name": "race"}, [task("a"), task("b", after=["a"])])
    )
    assert [n for n in os.listdir(paths.state_dir("blocked")) if "_b" in n]
    (a_name,) = os.listdir(paths.state_dir("pending"))
    os.rename(paths.state_dir("pending") / a_name, paths.state_dir("done") / a_name)  # a ended

    def release_b(spec: str) -> None:  # a's committer releases b this very instant
        assert release.released(DirQueue(paths), Ledger(paths.events), "a", State.DONE) == 1

    faults.arm("cancel.blocked.seen?task=b:raise", action=release_b)
    out = control_ops.cancel_tasks(paths.root, ["b"], reason="test", wait=None)
    (row,) = out["tasks"]
    assert (row["was"], row["now"]) == ("pending", "cancelled"), row
    assert not [n for n in os.listdir(paths.state_dir("pending")) if not n.startswith(".")]
    (b_name,) = os.listdir(paths.state_dir("cancelled"))
    assert json.loads((paths.state_dir("cancelled") / b_name).read_text())["id"] == "b"
    events = [json.loads(line) for line in paths.events.read_text().splitlines()]
    assert [e["state"] for e in events if e.get("task") == "b" and e.get("ev") == "control"] == [
        "cancelled"
    ]
