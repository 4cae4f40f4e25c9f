"""One rule for "ended" (``State.is_terminal``): the public facade's task states, ended ids and
last attempts count a skipped task as ended, as the queue verbs and the views do.

Before, ``gpuswarm.app.api`` kept its own list of ended states without skipped: a task that ended
skipped was missing from ``task_states`` and ``finished_ids``, so a client waiting for it
(``research wait``) waited forever, and research's settle took its variant for one never
queued and queued it again."""

from __future__ import annotations

from pathlib import Path

from gpuswarm.app import api
from gpuswarm.core.models import State
from gpuswarm.store.lookup import task_ended
from gpuswarm.store.queue import DirQueue


def test_every_state_but_pending_running_and_blocked_is_terminal() -> None:
    # blocked (issue 35): a task waiting for its prerequisites has still to run
    assert [s for s in State if not s.is_terminal()] == [
        State.PENDING,
        State.RUNNING,
        State.BLOCKED,
    ]
    assert State.terminal() == (
        State.DONE,
        State.FAILED,
        State.SKIPPED,
        State.CANCELLED,
        State.DEPENDENCY_FAILED,
    )
    assert all(task_ended(s) == s.is_terminal() for s in State)


def _skipped_task(tmp_path: Path) -> api.RunPaths:
    spec = api.NewRunSpec(
        workspace=tmp_path,
        folder="queue",
        name="ended",
        base_dir=tmp_path,
        gpus=api.plan_gpus("sim:1"),
        source="test",
    )
    run = api.create_run(spec)
    api.submit(run, api.TaskSpec(id="v0001", name="v0001", command=["true"]), 1)
    queue = DirQueue(run)
    claimed = queue.claim("owner", 0)
    assert claimed is not None
    claimed.data["attempts"] = [{"n": 1, "returncode": 3, "kind": "exited", "reason": "skip"}]
    queue.move(claimed, State.SKIPPED)
    return run


def test_the_facade_counts_a_skipped_task_as_ended(tmp_path: Path) -> None:
    run = _skipped_task(tmp_path)
    ref = api.task_states(run).get("v0001")
    assert ref is not None and ref.state is State.SKIPPED
    assert api.finished_ids(run) == {"v0001"}
    last = api.last_attempt(run, ref)
    assert last is not None
    assert (last.state, last.n, last.returncode) == (State.SKIPPED, 1, 3)
