"""The supervisor driven in-process on simulated slots, with real subprocesses."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig

PY = sys.executable


def task(tid: str, code: str, **kw: Any) -> dict[str, Any]:
    return TaskSpec(id=tid, name=tid, command=[PY, "-c", code], **kw).model_dump(mode="json")


def make(tmp_path: Path, tasks: list[dict[str, Any]], gpus: int = 2) -> tuple[Supervisor, RunPaths]:
    paths = create_run(NewRun("sup", tmp_path, {"name": "sup"}, tasks))
    slots = plan_slots(parse_gpu_spec(f"sim:{gpus}"))
    queue = DirQueue(paths, durable=False)
    cfg = SupervisorConfig(slots, tmp_path, owner="test:1:1", heartbeat=0.2)
    return Supervisor(paths, queue, Ledger(paths.events), cfg), paths


def states(paths: RunPaths) -> dict[str, str]:
    q = DirQueue(paths)
    return {data["id"]: s.value for s in State for _, data in q.iter_state(s)}


def test_retry_is_picked_up_while_other_slots_are_idle(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    flaky = (
        f"import pathlib,sys; p=pathlib.Path({str(marker)!r}); e=p.exists(); p.touch(); "
        "sys.exit(0 if e else 1)"
    )
    sup, paths = make(tmp_path, [task("flaky", flaky, max_attempts=2), task("ok", "pass")])
    sup.run()
    assert states(paths) == {"flaky": "done", "ok": "done"}
    finished = [e for e in read_events(paths.events) if e["ev"] == "finished"]
    assert [(e["task"], e["state"]) for e in finished if e["task"] == "flaky"] == [
        ("flaky", "waiting"),  # the retry waits out its backoff in running/
        ("flaky", "done"),
    ]
    requeued = [e for e in read_events(paths.events) if e["ev"] == "requeued"]
    assert [(e["task"], e["reason"], e["frm"]) for e in requeued] == [("flaky", "retry", "waiting")]


def test_invalid_descriptor_is_quarantined_and_the_run_goes_on(tmp_path: Path) -> None:
    bad = task("bad", "pass")
    bad["max_attempts"] = "many"
    sup, paths = make(tmp_path, [bad, task("good", "pass")])
    sup.run()
    assert states(paths) == {"good": "done"}
    assert len(list(paths.corrupt.iterdir())) == 1
    assert any(e["ev"] == "corrupt" for e in read_events(paths.events))


def test_warm_stop_hands_running_tasks_back_uncounted(tmp_path: Path) -> None:
    sup, paths = make(tmp_path, [task(f"s{i}", "import time; time.sleep(30)") for i in range(3)])
    runner = threading.Thread(target=sup.run)
    runner.start()
    deadline = time.time() + 20
    while len(sup.live) < 2 and time.time() < deadline:
        time.sleep(0.02)
    sup.request_stop()
    runner.join(30)
    assert not runner.is_alive()
    assert set(states(paths).values()) == {"pending"}
    q = DirQueue(paths)
    interrupted = [d for _, d in q.iter_state(State.PENDING) if d["interruptions"]]
    assert len(interrupted) == 2
    assert all(d["attempts"][0]["interrupted"] for d in interrupted)


def _outcomes(paths: RunPaths) -> dict[str, tuple[str, str]]:
    q = DirQueue(paths)
    return {
        data["id"]: (s.value, data["attempts"][-1]["kind"])
        for s in State
        for _, data in q.iter_state(s)
        if data["attempts"]
    }


def test_loop_without_pidfds_runs_every_attempt_in_a_waiter_thread(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Where os.pidfd_open is missing (macOS, old kernels) every attempt takes the blocking
    path in a waiter thread: exits, failures and timeouts come out the same."""
    from gpuswarm.exec.local import process

    monkeypatch.setattr(process, "_USE_PIDFD", False)
    tasks = [task(f"ok{i}", "pass") for i in range(5)]
    tasks += [task("bad", "import sys; sys.exit(3)"), task("slow", "import time; time.sleep(30)")]
    tasks[-1]["timeout"] = 0.5
    sup, paths = make(tmp_path, tasks)
    sup.run()
    got = _outcomes(paths)
    assert got == {
        **{f"ok{i}": ("done", "exited") for i in range(5)},
        "bad": ("failed", "exited"),
        "slow": ("failed", "timeout"),
    }


def test_many_short_tasks_on_few_slots_are_each_committed_once(tmp_path: Path) -> None:
    """The loop frees a slot before its outcome is committed (in batches, by the committer):
    every task still ends in exactly one state with one attempt and one `finished` event."""
    n = 60
    sup, paths = make(tmp_path, [task(f"t{i:02d}", "pass") for i in range(n)], gpus=3)
    sup.run()
    assert states(paths) == {f"t{i:02d}": "done" for i in range(n)}
    events = list(read_events(paths.events))
    finished = [e["task"] for e in events if e["ev"] == "finished"]
    started = [e["task"] for e in events if e["ev"] == "started"]
    assert sorted(finished) == sorted(started) == sorted(f"t{i:02d}" for i in range(n))
    assert all(len(d["attempts"]) == 1 for _, d in DirQueue(paths).iter_state(State.DONE))


def test_a_failing_commit_stops_the_run_without_hanging_or_losing_the_task(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A disk error while committing an outcome: the run stops and raises it; the task whose
    outcome could not be saved stays in running/ (a resume re-runs it), none vanishes."""
    import pytest

    sup, paths = make(tmp_path, [task(f"t{i}", "pass") for i in range(4)])
    move = sup.queue.move

    def failing_move(claimed: Any, state: State, announce: Any = None, **kw: Any) -> Path:
        if claimed.task_id == "t1":
            raise OSError(28, "No space left on device")
        return move(claimed, state, announce, **kw)

    monkeypatch.setattr(sup.queue, "move", failing_move)
    with pytest.raises(OSError, match="No space left"):
        sup.run()
    got = states(paths)
    assert set(got) == {f"t{i}" for i in range(4)}  # every task is somewhere
    assert got["t1"] == "running"
