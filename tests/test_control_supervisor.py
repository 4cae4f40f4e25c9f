"""Control requests applied by the supervisor (in process, sim slots, real processes): cancel of a
running, waiting or pending task, pause and unpause of the run and of one slot, tasks added to a
live run claimed by priority, and recovery / reclaim applying the requests nobody applied."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.runview import RunView
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.store import control
from gpuswarm.store.leases import write_owner_file
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.supervise.recovery import reclaim_dead, recover
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig

PY = sys.executable
OWNER = "test:1:1"
SLEEPER = "import time; time.sleep(60)"


def task(tid: str, code: str, **kw: Any) -> dict[str, Any]:
    return TaskSpec(id=tid, name=tid, command=[PY, "-c", code], **kw).model_dump(mode="json")


def make(
    tmp_path: Path, tasks: list[dict[str, Any]], gpus: int = 2, **cfg: Any
) -> tuple[Supervisor, RunPaths]:
    paths = create_run(NewRun("ctl", tmp_path, {"name": "ctl"}, tasks))
    slots = plan_slots(parse_gpu_spec(f"sim:{gpus}"))
    queue = DirQueue(paths, durable=False)
    conf = SupervisorConfig(slots, tmp_path, owner=OWNER, heartbeat=0.2, **cfg)
    return Supervisor(paths, queue, Ledger(paths.events), conf), paths


def states(paths: RunPaths) -> dict[str, str]:
    q = DirQueue(paths)
    return {data["id"]: s.value for s in State for _, data in q.iter_state(s)}


def descriptor(paths: RunPaths, tid: str) -> dict[str, Any]:
    q = DirQueue(paths)
    found = [data for s in State for _, data in q.iter_state(s) if data["id"] == tid]
    assert len(found) == 1
    return found[0]


def events(paths: RunPaths, ev: str) -> list[dict[str, Any]]:
    return [e for e in read_events(paths.events) if e["ev"] == ev]


def wait_for(what: Callable[[], object], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def start(sup: Supervisor) -> threading.Thread:
    runner = threading.Thread(target=sup.run)
    runner.start()
    return runner


def finish(runner: threading.Thread) -> None:
    runner.join(60)
    assert not runner.is_alive()


def live_pid(sup: Supervisor, tid: str) -> int:
    wait_for(lambda: any(a.task_id == tid and a.handle.pid for a in list(sup.live.values())))
    pid = next(a.handle.pid for a in list(sup.live.values()) if a.task_id == tid)
    assert pid is not None
    return pid


# -- cancel ------------------------------------------------------------------------------------
def test_a_running_task_cancelled_ends_cancelled_its_tree_gone_never_retried(
    tmp_path: Path,
) -> None:
    child = tmp_path / "child.pid"
    # the task starts a grandchild that ignores nothing: the whole tree must go
    code = (
        "import subprocess,sys,time; "
        f"p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); "
        f"open({str(child)!r},'w').write(str(p.pid)); time.sleep(60)"
    )
    tasks = [task("victim", code, max_attempts=3)]
    tasks += [task(f"ok{i}", "import time; time.sleep(0.2)") for i in range(4)]
    sup, paths = make(tmp_path, tasks, breaker_failures=1, retry_backoff=0)
    runner = start(sup)
    pid = live_pid(sup, "victim")
    wait_for(child.exists)
    grandchild = int(child.read_text() or "0") or None
    req = control.put(paths, "cancel", "victim")
    finish(runner)

    assert states(paths) == {"victim": "cancelled", **{f"ok{i}": "done" for i in range(4)}}
    desc = descriptor(paths, "victim")
    assert desc["reason"] == f"cancelled by {req.by}"
    assert [a["kind"] for a in desc["attempts"]] == ["cancelled"]  # no retry of max_attempts=3
    assert [e["task"] for e in events(paths, "started")].count("victim") == 1
    assert not any(e.get("task") == "victim" for e in events(paths, "finished"))
    (ev,) = events(paths, "control")
    assert ev["request"] == "cancel" and ev["task"] == "victim" and ev["state"] == "cancelled"
    assert ev["by"] == req.by and ev["applied_by"] == OWNER and ev["slot"]
    assert control.requests(paths) == []
    for gone in (pid, grandchild):
        assert gone is None or not psutil.pid_exists(gone) or _zombie(gone)
    assert events(paths, "quarantined") == [] and sup.quarantined == []  # neutral for the breaker
    view = RunView.of_journal(read_events(paths.events))
    assert view.counts.get("cancelled") == 1 and view.counts.get("running", 0) == 0
    assert view.tasks is not None and view.tasks["victim"].state == "cancelled"


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_cancelled_task_that_exits_0_on_term_is_cancelled_not_done(tmp_path: Path) -> None:
    code = "import signal,sys,time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
    code += "time.sleep(60)"
    sup, paths = make(tmp_path, [task("polite", code, max_attempts=2)], gpus=1)
    runner = start(sup)
    live_pid(sup, "polite")
    control.put(paths, "cancel", "polite")
    finish(runner)
    assert states(paths) == {"polite": "cancelled"}
    (attempt,) = descriptor(paths, "polite")["attempts"]
    assert attempt["kind"] == "cancelled"


def test_an_attempt_done_before_the_cancel_took_effect_stays_done(tmp_path: Path) -> None:
    # it has written its completion file and exits 0 on the TERM: done for sure
    code = (
        "import json,os,signal,sys,time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
        "ws=os.environ['GPUSWARM_TASK_WORKSPACE']; "
        "open(os.path.join(ws,'result.json'),'w').write(json.dumps({'acc': 1})); "
        "open(os.path.join(ws,'ready'),'w').close(); time.sleep(60)"
    )
    sup, paths = make(tmp_path, [task("ready", code, done_when="result.json")], gpus=1)
    runner = start(sup)
    live_pid(sup, "ready")
    wait_for((paths.task_dir("ready") / "ready").exists)
    control.put(paths, "cancel", "ready")
    finish(runner)
    assert states(paths) == {"ready": "done"}
    (ev,) = events(paths, "control")  # applied to nothing: dropped, journaled as too late
    assert ev["dropped"].startswith("too late: attempt 1 was done") and "state" not in ev
    assert control.requests(paths) == []


def test_a_cancel_of_a_pending_task_is_applied_by_the_supervisor(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    busy = f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    sup, paths = make(tmp_path, [task("busy", busy), task("later", "pass")], gpus=1)
    runner = start(sup)
    live_pid(sup, "busy")
    req = control.put(paths, "cancel", "later")
    wait_for(lambda: events(paths, "control"))
    gate.touch()
    finish(runner)
    assert states(paths) == {"busy": "done", "later": "cancelled"}
    (ev,) = events(paths, "control")
    got = (ev["task"], ev["applied_by"], ev["by"], ev.get("slot"))
    assert got == ("later", OWNER, req.by, None)
    assert descriptor(paths, "later")["attempts"] == []
    assert control.requests(paths) == []


def test_a_retry_waiting_out_its_backoff_is_cancelled_at_once(tmp_path: Path) -> None:
    sup, paths = make(
        tmp_path, [task("flaky", "import sys; sys.exit(1)", max_attempts=3)], retry_backoff=300
    )
    runner = start(sup)
    wait_for(lambda: any(e["state"] == "waiting" for e in events(paths, "finished")))
    control.put(paths, "cancel", "flaky")
    finish(runner)  # not 300 s: the waiting retry is gone
    assert states(paths) == {"flaky": "cancelled"}
    desc = descriptor(paths, "flaky")
    assert [a["kind"] for a in desc["attempts"]] == ["exited"]
    assert "retry_at" not in desc
    view = RunView.of_journal(read_events(paths.events))
    assert view.counts.get("cancelled") == 1 and view.counts.get("pending", 0) == 0


def test_a_request_for_an_ended_task_is_dropped(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    busy = f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    sup, paths = make(tmp_path, [task("quick", "pass"), task("busy", busy)], gpus=1)
    runner = start(sup)
    live_pid(sup, "busy")
    wait_for(lambda: states(paths)["quick"] == "done")  # committed by a committer thread
    control.put(paths, "cancel", "quick")
    wait_for(lambda: control.requests(paths) == [])
    gate.touch()
    finish(runner)
    assert states(paths) == {"quick": "done", "busy": "done"}
    (ev,) = events(paths, "control")  # dropped: the task had ended; it moves nothing
    assert ev["dropped"] == "too late: the task ended done before the cancel was applied"
    assert "state" not in ev and ev["task"] == "quick"


# -- pause -------------------------------------------------------------------------------------
def test_a_paused_slot_claims_nothing_while_the_other_works(tmp_path: Path) -> None:
    tasks = [task(f"t{i}", "import time; time.sleep(0.05)") for i in range(6)]
    sup, paths = make(tmp_path, tasks)
    paused, working = (s.label for s in reversed(sup.cfg.slots))
    control.pause(paths, paused)
    sup.run()
    assert set(states(paths).values()) == {"done"}
    assert {e["slot"] for e in events(paths, "started")} == {working}
    (ev,) = events(paths, "control")
    assert (ev["request"], ev["slot"], ev["applied_by"]) == ("pause", paused, OWNER)


def test_a_paused_run_waits_without_ending_and_unpause_resumes_it(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    busy = f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    tasks = [task("running", busy)] + [task(f"t{i}", "pass") for i in range(3)]
    sup, paths = make(tmp_path, tasks, gpus=1)
    runner = start(sup)
    live_pid(sup, "running")
    control.pause(paths)
    wait_for(lambda: events(paths, "control"))
    gate.touch()  # the running task goes on and ends; nothing new starts
    wait_for(lambda: states(paths)["running"] == "done")
    time.sleep(0.5)  # room for a wrong claim or a wrong exit
    assert runner.is_alive()  # paused with tasks left: it waits, it does not end
    assert [e["task"] for e in events(paths, "started")] == ["running"]
    control.unpause(paths)
    finish(runner)
    assert set(states(paths).values()) == {"done"}
    requests = [(e["request"], e.get("slot")) for e in events(paths, "control")]
    assert requests == [("pause", None), ("unpause", None)]


def test_a_supervisor_started_on_a_paused_run_claims_nothing(tmp_path: Path) -> None:
    sup, paths = make(tmp_path, [task("t", "pass")], gpus=1)
    control.pause(paths)
    runner = start(sup)
    wait_for(lambda: events(paths, "control"))
    time.sleep(0.3)
    assert runner.is_alive() and events(paths, "started") == []
    control.unpause(paths)
    finish(runner)
    assert states(paths) == {"t": "done"}


def test_a_slot_paused_with_no_task_left_does_not_keep_the_run_alive(tmp_path: Path) -> None:
    sup, paths = make(tmp_path, [task("t", "pass")])
    control.pause(paths, sup.cfg.slots[1].label)
    sup.run()  # ends: nothing is pending
    assert states(paths) == {"t": "done"}


# -- add to a live run ---------------------------------------------------------------------------
def test_a_task_added_with_a_higher_priority_is_claimed_before_those_loaded(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    first = f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    tasks = [task("a0", first)] + [task(f"a{i}", "pass") for i in range(1, 4)]
    sup, paths = make(tmp_path, tasks, gpus=1)
    runner = start(sup)
    live_pid(sup, "a0")  # the heap holds a1..a3 now
    DirQueue.add_pending(paths, task("urgent", "pass", priority=10), seq=100, durable=False)
    gate.touch()
    finish(runner)
    assert [e["task"] for e in events(paths, "started")] == ["a0", "urgent", "a1", "a2", "a3"]


# -- recovery ------------------------------------------------------------------------------------
def _orphan_run(tmp_path: Path) -> tuple[RunPaths, DirQueue, Ledger]:
    tasks = [task("orphan", SLEEPER), task("waiting", "pass"), task("ended", "pass")]
    paths = create_run(NewRun("rec", tmp_path, {"name": "rec"}, tasks))
    queue = DirQueue(paths, durable=False)
    ledger = Ledger(paths.events)
    claimed = queue.claim("deadhost:999999:1", 0)
    assert claimed is not None and claimed.task_id == "orphan"
    back = queue.claim("deadhost:999999:1", 0)
    assert back is not None and back.task_id == "waiting"
    done = queue.claim("deadhost:999999:1", 0)
    assert done is not None and done.task_id == "ended"
    queue.move(done, State.DONE)
    queue.move(back, State.PENDING)  # requeued: pending again
    for tid in ("orphan", "waiting", "ended"):
        control.put(paths, "cancel", tid)
    return paths, queue, ledger


def test_recovery_applies_cancel_requests_to_an_orphan_and_a_pending_task(tmp_path: Path) -> None:
    paths, queue, ledger = _orphan_run(tmp_path)
    moved = recover(queue, ledger, retry_failed=False, applied_by="resumer:1:1")
    assert moved["cancelled"] == 2 and moved["interrupted"] == 0
    assert states(paths) == {"orphan": "cancelled", "waiting": "cancelled", "ended": "done"}
    (attempt,) = descriptor(paths, "orphan")["attempts"]
    assert attempt["kind"] == "lost" and attempt["interrupted"]
    controls = {e["task"]: e for e in events(paths, "control")}
    assert set(controls) == {"orphan", "waiting", "ended"}
    assert all(e["applied_by"] == "resumer:1:1" for e in controls.values())
    assert controls["ended"]["dropped"].startswith("too late") and "state" not in controls["ended"]
    assert control.requests(paths) == []
    assert recover(queue, ledger, retry_failed=False)["cancelled"] == 0  # at most once


def test_reclaim_of_a_dead_owner_cancels_its_task_instead_of_requeueing(tmp_path: Path) -> None:
    paths, queue, ledger = _orphan_run(tmp_path)
    reclaim_dead(queue, ledger, OWNER, lease_ttl=1.0)
    assert states(paths)["orphan"] == "cancelled"
    (ev,) = [e for e in events(paths, "control") if e["task"] == "orphan"]
    assert ev["applied_by"] == OWNER
    assert {r.task for r in control.requests(paths)} == {"waiting", "ended"}  # the keeper's


def test_recovery_finishes_a_cancel_a_crash_left_half_way(tmp_path: Path) -> None:
    """A supervisor died after it saved the cancelled descriptor, before its rename."""
    paths, queue, ledger = _orphan_run(tmp_path)
    (claimed_name,) = queue.names(State.RUNNING)
    claimed = queue.adopt_running(claimed_name)
    claimed.desc.mark_cancelled("cancelled by someone")
    desc = claimed.desc
    desc.state = State.CANCELLED
    desc.moved_from = claimed.path.name
    queue.save(claimed)
    moved = recover(queue, ledger, retry_failed=False)
    assert moved["recovered"] == 1
    assert states(paths) == {"orphan": "cancelled", "waiting": "cancelled", "ended": "done"}
    assert [e["task"] for e in events(paths, "recovered")] == ["orphan"]
    assert control.requests(paths) == []


def test_with_two_supervisors_the_one_holding_the_task_applies_the_cancel(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    busy = f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    tasks = [task("a", busy), task("b", busy)]
    paths = create_run(NewRun("two", tmp_path, {"name": "two"}, tasks))
    sups = []
    for owner in ("one:1:1", "two:2:2"):
        slots = plan_slots(parse_gpu_spec("sim:1"))
        cfg = SupervisorConfig(slots, tmp_path, owner=owner, heartbeat=0.2, lease_ttl=60)
        write_owner_file(paths, owner, {"slots": [s.label for s in slots]})
        sups.append(Supervisor(paths, DirQueue(paths, durable=False), Ledger(paths.events), cfg))
    runners = [start(s) for s in sups]
    wait_for(lambda: all(s.live for s in sups))
    holder = sups[1]
    (victim,) = [a.task_id for a in holder.live.values()]
    control.put(paths, "cancel", victim)
    wait_for(lambda: states(paths)[victim] == "cancelled")
    gate.touch()
    for runner in runners:
        finish(runner)
    other = "a" if victim == "b" else "b"
    assert states(paths) == {victim: "cancelled", other: "done"}
    (ev,) = events(paths, "control")
    assert ev["applied_by"] == holder.cfg.owner
