"""Slots that come and go (``supervise/membership.py``) on the in-process supervisor with real
subprocesses: a scripted membership over the local backend plays the cluster. A slot that
joins runs the ``preflight:`` commands before it claims anything, and one that fails them
never claims; a membership that is lost (a Ray head gone) stops the run warm with its reason,
every task back in the queue."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import BackendOptions, SlotChanges
from gpuswarm.exec.local.backend import LocalBackend
from gpuswarm.placement.gpus import Slot, parse_gpu_spec, plan_slots
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


class Scripted:
    """A membership without a cluster: ``joins`` arrive once the loop watches; ``lose``."""

    def __init__(self, joins: list[Slot]) -> None:
        self.joins = joins
        self.lock = threading.Lock()
        self.pending = SlotChanges()
        self.wakeup: Callable[[], None] = lambda: None

    def initial_slots(self) -> list[Slot]:
        return []

    def watch(self, wakeup: Callable[[], None]) -> None:
        self.wakeup = wakeup
        if not self.joins:
            return

        def join() -> None:
            time.sleep(0.3)
            with self.lock:
                self.pending.added.extend(self.joins)
                labels = [s.label for s in self.joins]
                self.pending.notes.append({"change": "joined", "slots": labels})
            wakeup()

        threading.Thread(target=join, daemon=True).start()

    def changes(self) -> SlotChanges:
        with self.lock:
            out, self.pending = self.pending, SlotChanges()
        return out

    def lose(self, why: str) -> None:
        with self.lock:
            self.pending.fatal = why
        self.wakeup()


class ClusterLike(LocalBackend):
    def __init__(self, membership: Scripted) -> None:
        super().__init__(BackendOptions())
        self.membership = membership


def _slots(n: int, host: str) -> list[Slot]:
    return [
        replace(s, ident=f"{host}-gpu{s.gpu_ids[0]}")
        for s in plan_slots(parse_gpu_spec(f"sim:{n}"))
    ]


def _task(tid: str, code: str) -> dict[str, Any]:
    return TaskSpec(id=tid, name=tid, command=[sys.executable, "-c", code]).model_dump(mode="json")


def _supervisor(
    tmp_path: Path, tasks: list[dict[str, Any]], slots: list[Slot], member: Scripted, **kw: Any
) -> tuple[Supervisor, RunPaths]:
    paths = create_run(NewRun("m", tmp_path, {"name": "m"}, tasks))
    cfg = SupervisorConfig(slots, tmp_path, owner="test:1:1", heartbeat=0.2, **kw)
    queue = DirQueue(paths, durable=False)
    return Supervisor(paths, queue, Ledger(paths.events), cfg, ClusterLike(member)), paths


def _ev(paths: RunPaths, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(paths.events) if e["ev"] == kind]


def test_a_joining_slot_claims_only_after_its_preflight_passed(tmp_path: Path) -> None:
    first = _slots(1, "a")
    joins = [s for s in _slots(3, "b") if s.gpu_ids[0] > 0]  # b-gpu1 (passes), b-gpu2 (fails)
    joins = [replace(s, index=s.index + 10) for s in joins]
    tasks = [_task(f"t{i}", "import time; time.sleep(0.4)") for i in range(10)]
    sup, paths = _supervisor(
        tmp_path,
        tasks,
        first,
        Scripted(joins),
        preflight=('test "$GPUSWARM_HOST_GPU_ID" != 2 || { echo no GPU here; exit 3; }',),
    )
    sup.run()
    started = {e["slot"] for e in _ev(paths, "started")}
    assert "b-gpu1" in started and "a-gpu0" in started
    assert "b-gpu2" not in started  # its preflight failed: it never claimed
    failed = [e for e in _ev(paths, "slots") if e["change"] == "preflight_failed"]
    assert [e["slots"] for e in failed] == [["b-gpu2"]]
    assert "exit 3" in failed[0]["reason"] and "no GPU here" in failed[0]["reason"]
    assert "\n" not in failed[0]["reason"] and "(log: " in failed[0]["reason"]
    assert "no task was started" not in failed[0]["reason"]  # the run goes on
    assert [e["slots"] for e in _ev(paths, "preflight")] == [["b-gpu1"]]
    assert (paths.root / "preflight" / "b-gpu2.log").read_text().splitlines()[-1] == "no GPU here"
    done = [e for e in _ev(paths, "finished") if e["state"] == "done"]
    assert len(done) == 10


def test_a_lost_membership_stops_the_run_warm_with_its_reason(tmp_path: Path) -> None:
    member = Scripted([])
    tasks = [_task(f"t{i}", "import time; time.sleep(30)") for i in range(3)]
    sup, paths = _supervisor(tmp_path, tasks, _slots(2, "a"), member)
    runner = threading.Thread(target=sup.run)
    runner.start()
    deadline = time.monotonic() + 20
    while len(sup.live) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    member.lose("the head is gone")
    runner.join(40)
    assert not runner.is_alive()
    assert sup.shared.ended_by == "the head is gone"
    queue = DirQueue(paths)
    assert sorted(d["id"] for _, d in queue.iter_state(State.PENDING)) == ["t0", "t1", "t2"]
    lost = [e for e in _ev(paths, "slots") if e["change"] == "backend_lost"]
    assert [e["reason"] for e in lost] == ["the head is gone"]
    # the journal's last word before the stop is why (views show it as the run's note)
    changes = [e.get("change") or e["ev"] for e in read_events(paths.events)]
    assert changes.index("shutdown") < changes.index("backend_lost")


def test_a_joined_slot_is_named_with_its_node_where_its_task_runs(tmp_path: Path) -> None:
    """``status`` reads a lease's slot from the supervisor's owner file: a slot that joined
    later is in it too, and its task is shown on the slot's node, not the driver's host."""
    from gpuswarm.store.leases import write_owner_file
    from gpuswarm.store.reader import RunReader

    release = tmp_path / "release"
    wait = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"
    joined = [replace(s, index=7, host="node-b") for s in _slots(1, "b")]
    sup, paths = _supervisor(
        tmp_path, [_task("t0", wait), _task("t1", wait)], _slots(1, "a"), Scripted(joined)
    )
    write_owner_file(paths, "test:1:1", {"slots": ["a-gpu0"]})
    runner = threading.Thread(target=sup.run)
    runner.start()
    try:
        deadline = time.monotonic() + 20
        while len(sup.live) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        rows = {r.slot: r.host for r in RunReader(paths).running()}
    finally:
        release.touch()
        runner.join(30)
    assert rows == {"a-gpu0": "test", "b-gpu0": "node-b"}


class Timed(Scripted):
    """A membership that plays ``script``: (seconds after watch, slots added, labels retired)."""

    def __init__(self, script: list[tuple[float, list[Slot], list[str]]]) -> None:
        super().__init__([])
        self.script = script

    def watch(self, wakeup: Callable[[], None]) -> None:
        self.wakeup = wakeup

        def play() -> None:
            started = time.monotonic()
            for at, added, retired in self.script:
                time.sleep(max(0.0, started + at - time.monotonic()))
                with self.lock:
                    self.pending.added.extend(added)
                    self.pending.retired.extend(retired)
                wakeup()

        threading.Thread(target=play, daemon=True).start()


def test_a_run_whose_nodes_all_left_waits_for_one_to_join(tmp_path: Path) -> None:
    """Every slot gone with tasks still pending (a cluster's only node dropped out, the head
    still there): the run waits, says so, and goes on when a node joins; it does not end."""
    first = _slots(1, "a")
    later = [replace(s, index=5) for s in _slots(1, "b")]
    tasks = [_task(f"t{i}", "import time; time.sleep(0.3)") for i in range(4)]
    member = Timed([(0.1, [], ["a-gpu0"]), (2.0, later, [])])
    sup, paths = _supervisor(tmp_path, tasks, first, member)
    sup.run()
    done = [e["task"] for e in _ev(paths, "finished") if e["state"] == "done"]
    assert sorted(done) == ["t0", "t1", "t2", "t3"]
    assert "b-gpu0" in {e["slot"] for e in _ev(paths, "started")}
    waiting = [e for e in _ev(paths, "slots") if e["change"] == "waiting"]
    assert len(waiting) == 1 and "waiting for one to join" in waiting[0]["reason"]
