"""The public facade (gpuswarm.app.api) that research and the dashboard use: a run made, fed, read
and drained through it alone, without touching the queue's folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuswarm.app import api
from gpuswarm.core.errors import GpuSpecError
from gpuswarm.store.queue import DirQueue


def _run(tmp_path: Path, gpus: str = "sim:2") -> api.RunPaths:
    spec = api.NewRunSpec(
        workspace=tmp_path,
        folder="queue",
        name="facade",
        base_dir=tmp_path,
        gpus=api.plan_gpus(gpus),
        source="test",
        settings={"lease_ttl": 30.0},
        config={"research": "t"},
    )
    return api.create_run(spec)


def _task(tid: str) -> api.TaskSpec:
    return api.TaskSpec(id=tid, name=tid, command=["true"])


def test_a_run_made_through_the_facade_opens_with_its_slots(tmp_path: Path) -> None:
    run = _run(tmp_path, "sim:3")
    assert run.is_run()
    assert api.slot_count(run) == 3
    assert api.resolve_run(run.run_json, tmp_path) == run.root
    assert not api.has_pending(run)


def test_submitted_tasks_are_queued_and_a_queued_one_can_be_withdrawn(tmp_path: Path) -> None:
    run = _run(tmp_path)
    api.submit(run, _task("v0001"), 1)
    api.submit(run, _task("v0002"), 2)
    states = api.task_states(run)
    assert {tid: ref.state for tid, ref in states.items()} == {
        "v0001": api.TaskState.PENDING,
        "v0002": api.TaskState.PENDING,
    }
    assert api.has_pending(run)
    assert api.last_attempt(run, states["v0001"]) is None  # not ended
    assert api.withdraw(run, "v0001")
    assert not api.withdraw(run, "v0001")  # gone: nothing to withdraw twice
    assert not api.withdraw(run, "v9999")
    assert set(api.task_states(run)) == {"v0002"}
    assert api.finished_ids(run) == set()


def test_last_attempt_is_the_last_one_not_interrupted(tmp_path: Path) -> None:
    run = _run(tmp_path)
    api.submit(run, _task("v0001"), 1)
    queue = DirQueue(run)
    claimed = queue.claim("owner", 0)
    assert claimed is not None
    claimed.data["attempts"] = [
        {"n": 1, "metrics": {"loss": 0.5}, "returncode": 0, "kind": "exit"},
        {"n": 2, "interrupted": True, "kind": "signal"},
    ]
    queue.move(claimed, api.TaskState.DONE)
    ref = api.task_states(run)["v0001"]
    assert ref.state is api.TaskState.DONE
    assert api.finished_ids(run) == {"v0001"}
    last = api.last_attempt(run, ref)
    assert last is not None
    assert (last.n, last.kind, last.returncode, dict(last.metrics)) == (1, "exit", 0, {"loss": 0.5})
    assert last.log == run.attempt_log("v0001", 1)


def test_cut_writes_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    run = _run(tmp_path)
    pending = run.state_dir("pending")
    dead = pending / ".tmp-x.json.999999999.1"
    alive = pending / f".tmp-y.json.{os.getppid()}.1"
    dead.write_text("{")
    alive.write_text("{")
    assert api.remove_cut_writes(run) == 1
    assert not dead.exists() and alive.exists()


def test_a_bad_gpu_spec_fails_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(GpuSpecError):
        api.plan_gpus("sim:nope")
    assert list(tmp_path.iterdir()) == []
