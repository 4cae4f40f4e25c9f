"""Issue 28 item 3: a cancel request is bound to the attempt it was made for.

A cancel whose attempt ends (with an outcome that counts) before a supervisor applies it is
dropped as too late, journaled, wherever it meets the task next: a retry waiting out its backoff,
the task pending again, recovery; ``gpuswarm retry`` drops the requests of the tasks it requeues.
In process, sim slots, real processes."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuswarm.app.control import cancel_tasks, retry_tasks
from gpuswarm.app.replies import TaskRow
from gpuswarm.config.models import TaskSpec
from gpuswarm.core.models import AttemptRecord, Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.store import control
from gpuswarm.store.holds import HELD
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.supervise.recovery import recover
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig

PY = sys.executable
FAILED_1 = AttemptRecord.launched(
    n=1, slot="sim0", gpus=(0,), started=1.0, ended=2.0, duration=1.0, kind="exited",
    returncode=1, signal=None, reason="exit 1", oom=False, killed=0,
)  # fmt: skip
FAILS_FIRST = "import os,sys; sys.exit(0 if int(os.environ['GPUSWARM_ATTEMPT']) > 1 else 1)"


def task(tid: str, code: str, **kw: Any) -> dict[str, Any]:
    return TaskSpec(id=tid, name=tid, command=[PY, "-c", code], **kw).model_dump(mode="json")


def new_run(tmp_path: Path, tasks: list[dict[str, Any]]) -> RunPaths:
    return create_run(NewRun("bind", tmp_path, {"name": "bind"}, tasks))


def supervisor(tmp_path: Path, paths: RunPaths, gpus: int = 2, **cfg: Any) -> Supervisor:
    slots = plan_slots(parse_gpu_spec(f"sim:{gpus}"))
    conf = SupervisorConfig(slots, tmp_path, owner=f"test:{time.time_ns()}:1", **cfg)
    return Supervisor(paths, DirQueue(paths, durable=False), Ledger(paths.events), conf)


def run_to_end(sup: Supervisor, during: Callable[[], object] = lambda: None) -> None:
    runner = threading.Thread(target=sup.run)
    runner.start()
    during()
    runner.join(60)
    assert not runner.is_alive()


def states(paths: RunPaths) -> dict[str, str]:
    q = DirQueue(paths)
    return {data["id"]: s.value for s in State for _, data in q.iter_state(s)}


def events(paths: RunPaths, ev: str) -> list[dict[str, Any]]:
    return [e for e in read_events(paths.events) if e["ev"] == ev]


def wait_for(what: Callable[[], object], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _dropped(paths: RunPaths, tid: str) -> list[dict[str, Any]]:
    return [e for e in events(paths, "control") if e.get("task") == tid and e.get("dropped")]


def test_a_late_cancel_left_after_the_run_never_cancels_a_retry_and_resume(
    tmp_path: Path,
) -> None:
    # the case: the attempt failed (its last), the request landed after; then
    # `gpuswarm retry` + resume must run the task, not cancel it at once
    paths = new_run(tmp_path, [task("t", FAILS_FIRST)])
    run_to_end(supervisor(tmp_path, paths, gpus=1))
    assert states(paths) == {"t": "failed"}
    control.put(paths, "cancel", "t", attempt=1)  # what `cancel` wrote, seeing attempt 1 run
    out = retry_tasks(paths.root, [], failed=True, cancelled=False)
    assert out["retried"] == 1
    assert control.requests(paths) == []  # retry dropped it
    (ev,) = _dropped(paths, "t")
    assert ev["attempt"] == 1 and ev["dropped"].startswith("too late") and "state" not in ev

    moved = recover(DirQueue(paths, durable=False), Ledger(paths.events), retry_failed=False)
    assert moved["cancelled"] == 0
    run_to_end(supervisor(tmp_path, paths, gpus=1))
    assert states(paths) == {"t": "done"}
    assert [e["attempt"] for e in events(paths, "started")] == [1, 2]


def test_without_retry_clearing_resume_still_drops_the_late_cancel(tmp_path: Path) -> None:
    paths = new_run(tmp_path, [task("t", FAILS_FIRST, max_attempts=2)])
    queue = DirQueue(paths, durable=False)
    claimed = queue.claim("deadhost:999999:1", 0)  # its supervisor died after attempt 1 failed
    assert claimed is not None
    claimed.desc.add_attempt(FAILED_1)
    queue.move(claimed, State.FAILED)
    control.put(paths, "cancel", "t", attempt=1)
    with queue.control_lock():  # what `gpuswarm retry` does, minus dropping the request
        (name,) = queue.names(State.FAILED)
        assert queue.retry(State.FAILED, name, lambda d: None) is not None
    assert recover(queue, Ledger(paths.events), retry_failed=False)["cancelled"] == 0
    assert states(paths) == {"t": "pending"} and control.requests(paths) == []
    run_to_end(supervisor(tmp_path, paths, gpus=1))
    assert states(paths) == {"t": "done"}


def test_recovery_drops_a_cancel_whose_attempt_failed_before_and_keeps_the_retry(
    tmp_path: Path,
) -> None:
    # a dead supervisor committed attempt 1 failed, its retry pending; the request for attempt 1
    # is left: resume must run the retry (no `gpuswarm retry` involved)
    paths = new_run(tmp_path, [task("t", "pass", max_attempts=3)])
    queue = DirQueue(paths, durable=False)
    claimed = queue.claim("deadhost:999999:1", 0)
    assert claimed is not None
    claimed.desc.add_attempt(FAILED_1)
    queue.move(claimed, State.PENDING)
    control.put(paths, "cancel", "t", attempt=1)
    control.put(paths, "cancel", "t", attempt=2)  # one for the retry: it applies
    ledger = Ledger(paths.events)
    assert recover(queue, ledger, retry_failed=False)["cancelled"] == 1
    assert states(paths) == {"t": "cancelled"}
    (late,) = _dropped(paths, "t")
    assert late["attempt"] == 1 and "attempt 1 ended (exit 1)" in late["dropped"]
    assert control.requests(paths) == []


def test_recovery_keeps_a_pending_retry_a_late_cancel_was_made_for(tmp_path: Path) -> None:
    paths = new_run(tmp_path, [task("t", "pass", max_attempts=3)])
    queue = DirQueue(paths, durable=False)
    claimed = queue.claim("deadhost:999999:1", 0)
    assert claimed is not None
    claimed.desc.add_attempt(FAILED_1)
    queue.move(claimed, State.PENDING)
    control.put(paths, "cancel", "t", attempt=1)
    assert recover(queue, Ledger(paths.events), retry_failed=False)["cancelled"] == 0
    assert states(paths) == {"t": "pending"}
    assert len(_dropped(paths, "t")) == 1 and control.requests(paths) == []
    pending = os.listdir(paths.state_dir("pending"))
    assert len(pending) == 1 and not pending[0].startswith(HELD)  # the look's hold undone


def test_a_cancel_made_for_the_attempt_that_failed_does_not_cancel_its_waiting_retry(
    tmp_path: Path,
) -> None:
    paths = new_run(tmp_path, [task("t", FAILS_FIRST, max_attempts=3)])

    def late_cancel() -> None:
        wait_for(lambda: any(e["state"] == "waiting" for e in events(paths, "finished")))
        control.put(paths, "cancel", "t", attempt=1)  # landed as attempt 1 ended
        wait_for(lambda: _dropped(paths, "t"))

    run_to_end(supervisor(tmp_path, paths, retry_backoff=2), late_cancel)
    assert states(paths) == {"t": "done"}
    assert [e["attempt"] for e in events(paths, "started")] == [1, 2]
    assert not [e for e in events(paths, "control") if e.get("state")]


def test_cancel_binds_the_attempt_it_sees_and_cancels_a_waiting_retry(tmp_path: Path) -> None:
    paths = new_run(tmp_path, [task("t", "import sys; sys.exit(1)", max_attempts=3)])
    rows: list[TaskRow] = []

    def cancel() -> None:
        wait_for(lambda: any(e["state"] == "waiting" for e in events(paths, "finished")))
        rows.extend(cancel_tasks(paths.root, ["t"], reason="", wait=None)["tasks"])

    run_to_end(supervisor(tmp_path, paths, retry_backoff=300), cancel)  # not 300 s
    (row,) = rows
    assert row["now"] == "cancel requested" and row["attempt"] == 2  # the retry it waits for
    assert states(paths) == {"t": "cancelled"}
    (ev,) = [e for e in events(paths, "control") if e.get("state") == "cancelled"]
    assert ev["attempt"] == 2


def test_a_look_hold_a_crash_cut_short_is_undone(tmp_path: Path) -> None:
    paths = new_run(tmp_path, [task("t", "pass")])
    queue = DirQueue(paths, durable=False)
    pending = paths.state_dir("pending")
    (name,) = queue.names(State.PENDING)
    dead = 2**22 + 12345  # no such pid
    os.rename(pending / name, pending / f"{HELD}look-{dead}-{name}")
    assert queue.finish_holds(lambda d: None) == 1
    assert os.listdir(pending) == [name] and queue.names(State.CANCELLED) == []


def test_a_request_names_its_attempt_and_an_older_one_binds_none(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    paths.parallel.mkdir()
    control.put(paths, "cancel", "a", attempt=3)
    (paths.control / "0-cancel-old.json").write_text('{"kind":"cancel","task":"b","by":"x","at":1}')
    got = {r.task: r.attempt for r in control.requests(paths)}
    assert got == {"a": 3, "b": None}
    desc = Descriptor.new({"id": "a"}, 0)
    req_a, req_b = sorted(control.requests(paths), key=lambda r: r.task)
    assert control.too_late(req_a, desc) is None and control.too_late(req_b, desc) is None
