"""Scenario 6: property-based tests of the queue state machine (hypothesis).

Several "supervisors" (``DirQueue`` instances on one run folder, each with its own owner id and
in-memory heap) claim, finish (done / failed / back to pending), wait for a retry in running/,
crash (heartbeat gone; optionally half-way through a move: the new ``state`` saved, the rename
not done), restart, reclaim dead owners' leases (``runs.reclaim_dead``), and, when no supervisor
is alive, recover (``runs.recover``, as ``resume`` does); pending descriptors get corrupted.
A person acts on the live queue (issue 17): tasks are added, pending ones cancelled at once or
re-prioritised (the command may die half-way, leaving its hold for the next one to finish), a
supervisor cancels a task it runs, failed and cancelled tasks are retried with a fresh budget.
After every step: every task is in exactly one folder (corrupt/ only if it was corrupted), none
is lost, the folder of each task is the one a model of the state machine predicts, every lease
names a supervisor that holds it, and no temp file is left behind.

Owners live on a fake host, so liveness is decided by heartbeat files (no process table scans).
``GPUSWARM_CHAOS_TRIALS`` scales the number of examples (x30); the base seed is the suite's.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from harness import BASE_SEED, trials
from hypothesis import HealthCheck, event, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpuswarm.core.fsutil import atomic_write_bytes, dumps
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.models.budget import MAX_LOST
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.holds import HELD, parse_hold
from gpuswarm.store.leases import owner_file, write_owner_file
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.names import lease_of, reclaim_name
from gpuswarm.store.queue import Claimed, DirQueue
from gpuswarm.store.staging import create_layout, write_pending
from gpuswarm.supervise.recovery import reclaim_dead, recover

HOST = "chaos-fake-host"  # never this host: liveness by heartbeat only
TTL = 60.0
N_TASKS = 8
N_SUPS = 3
ENDS = [s for s in State if s not in (State.BLOCKED, State.DEPENDENCY_FAILED)]
DEAD_PID = 2**22 + 4321  # above pid_max's default: no such process


def _leases(folder: Path) -> list[str]:
    """The running/ folder's leases: not the temp files of writes (``.tmp-``)."""
    return [n for n in os.listdir(folder) if not n.startswith(".")]


@dataclass
class Sup:
    index: int
    owner: str = ""
    queue: DirQueue | None = None
    alive: bool = False
    held: dict[str, Claimed] = field(default_factory=dict)


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="gpuswarm-queue-sm-"))
        self.paths = RunPaths(self.tmp / "run")
        self.paths.root.mkdir()
        create_layout(self.paths)
        self.paths.tasks.mkdir()
        self.max_attempts = {f"t{i}": 1 + i % 3 for i in range(N_TASKS)}
        tasks = [
            {"id": tid, "name": tid, "priority": 0, "max_attempts": m}
            for tid, m in self.max_attempts.items()
        ]
        write_pending(self.paths, (Descriptor.new(t, i) for i, t in enumerate(tasks)))
        self.ledger = Ledger(self.paths.events, durable=False)
        # the model: each task's folder and number of recorded attempts
        self.model: dict[str, str] = dict.fromkeys(self.max_attempts, "pending")
        self.attempts: dict[str, int] = dict.fromkeys(self.max_attempts, 0)
        self.begun: dict[str, str] = {}  # a dead supervisor saved this move, did not rename
        self.corrupted: set[str] = set()
        self.generation = 0
        self.seq = N_TASKS
        self.holds: dict[str, str] = {}  # task -> op of a hold whose command died
        self.sups = [Sup(i) for i in range(N_SUPS)]
        for sup in self.sups:
            self._start(sup)

    def teardown(self) -> None:
        self.ledger.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------------------
    def _start(self, sup: Sup) -> None:
        self.generation += 1
        sup.owner = f"{HOST}:{1000 + sup.index}:{self.generation}"
        sup.queue = DirQueue(self.paths, durable=False)
        sup.alive = True
        sup.held = {}
        write_owner_file(self.paths, sup.owner, {})

    def _die(self, sup: Sup) -> None:
        os.utime(owner_file(self.paths, sup.owner), (0, 0))  # heartbeat long gone
        sup.alive = False
        sup.held = {}

    def _where(self) -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = {}
        for state in (*(s.value for s in State), "corrupt"):  # every folder: none can hide one
            folder = self.paths.parallel / state
            for name in os.listdir(folder) if folder.is_dir() else []:
                hold = parse_hold(name)
                if hold is not None and state == "pending":
                    assert task_of(hold[2]) in self.holds, f"a hold nobody left: {name}"
                    out.setdefault(task_of(hold[2]), []).append(("held", hold[2]))
                    continue
                assert not name.startswith("."), f"temp file left behind: {state}/{name}"
                out.setdefault(task_of(name), []).append((state, name))
        return out

    def _orphaned(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(task, running file name, data) of every lease whose owner is dead."""
        live = {s.owner for s in self.sups if s.alive}
        out = []
        for name in sorted(_leases(self.paths.parallel / "running")):
            lease = lease_of(name)
            assert lease is not None, name
            if lease[0] not in live:
                data = json.loads((self.paths.parallel / "running" / name).read_bytes())
                out.append((task_of(name), name, data))
        return out

    def _live(self, i: int) -> Sup | None:
        sup = self.sups[i % N_SUPS]
        return sup if sup.alive else None

    def _pick_held(self, sup: Sup | None, k: int) -> Claimed | None:
        if sup is None or not sup.held:
            return None
        return sup.held[sorted(sup.held)[k % len(sup.held)]]

    def _sync_corrupt(self) -> None:
        where = self._where()
        for tid in self.corrupted:
            if [s for s, _ in where.get(tid, [])] == ["corrupt"] and self.model[tid] != "corrupt":
                self.model[tid] = "corrupt"
                event("claim quarantined a corrupt descriptor")

    def _record(self, claimed: Claimed, ok: bool) -> None:
        attempts = claimed.data["attempts"]
        attempts.append({"n": len(attempts) + 1, "kind": "exited", "returncode": 0 if ok else 1})
        self.attempts[claimed.task_id] += 1

    # -- rules ---------------------------------------------------------------------------------
    @rule(i=st.integers(0, N_SUPS - 1), slot=st.integers(0, 3))
    def claim(self, i: int, slot: int) -> None:
        sup = self._live(i)
        if sup is None:
            return
        assert sup.queue is not None
        got = sup.queue.claim(sup.owner, slot)
        self._sync_corrupt()
        if got is None:
            pending = [n for n in os.listdir(self.paths.parallel / "pending") if n[0] != "."]
            assert not pending, f"claim found nothing while pending/ holds {pending}"
            return
        tid = got.task_id
        assert self.model[tid] == "pending", f"claimed {tid}, which the model has {self.model[tid]}"
        assert tid not in self.corrupted
        assert lease_of(got.path.name) == (sup.owner, slot)
        for other in self.sups:
            assert tid not in other.held, f"{tid} claimed twice"
        sup.held[tid] = got
        self.model[tid] = "running"
        event("claim")

    # where a running attempt's end moves its task (blocked/ and dependency_failed/ are the
    # dependency release's, of tasks never claimed: issue 35)
    @rule(i=st.integers(0, N_SUPS - 1), k=st.integers(0, 7), to=st.sampled_from(ENDS))
    def finish(self, i: int, k: int, to: State) -> None:
        """An attempt ends: done, failed, or back to pending for a retry; a waiting retry is
        released to pending (no new attempt)."""
        sup = self._live(i)
        claimed = self._pick_held(sup, k)
        if sup is None or claimed is None or to is State.RUNNING:
            return
        assert sup.queue is not None
        waiting = claimed.data.pop("retry_at", None) is not None
        if waiting and to is not State.PENDING:
            claimed.data["retry_at"] = 1e12
            return
        if not waiting:
            self._record(claimed, ok=to is State.DONE)
        if to is State.FAILED:
            claimed.data["reason"] = "exit 1"
        sup.queue.move(claimed, to)
        del sup.held[claimed.task_id]
        self.model[claimed.task_id] = to.value
        event(f"finish {to.value}" + (" (released retry)" if waiting else ""))

    @rule(i=st.integers(0, N_SUPS - 1), k=st.integers(0, 7))
    def wait_for_retry(self, i: int, k: int) -> None:
        """A failed attempt waits out its backoff in running/ under its lease."""
        sup = self._live(i)
        claimed = self._pick_held(sup, k)
        if sup is None or claimed is None or "retry_at" in claimed.data:
            return
        assert sup.queue is not None
        self._record(claimed, ok=False)
        claimed.data["retry_at"] = 1e12
        sup.queue.save(claimed)
        event("wait for retry")

    @rule(
        i=st.integers(0, N_SUPS - 1),
        k=st.integers(0, 7),
        half=st.sampled_from([None, "done", "failed", "pending"]),
    )
    def crash(self, i: int, k: int, half: str | None) -> None:
        """The supervisor dies; ``half``: its attempt ended and it saved the move (the new
        ``state`` and ``moved_from``, as DirQueue.move does), but did not rename."""
        sup = self._live(i)
        if sup is None:
            return
        claimed = self._pick_held(sup, k)
        begun = half is not None and claimed is not None and "retry_at" not in claimed.data
        if begun and claimed is not None and half is not None:
            self._record(claimed, ok=half == "done")
            claimed.data["state"] = half
            claimed.data["moved_from"] = claimed.path.name
            atomic_write_bytes(claimed.path, dumps(claimed.data), durable=False)
            self.begun[claimed.task_id] = half
        self._die(sup)
        event(f"crash (a move begun: {half if begun else None})")

    @rule(i=st.integers(0, N_SUPS - 1), k=st.integers(0, 7))
    def crash_while_reclaiming(self, i: int, k: int) -> None:
        """A reclaimer renames a dead owner's task under its own lease, then dies itself."""
        sup = self._live(i)
        orphans = self._orphaned()
        if sup is None or not orphans:
            return
        _, name, _ = orphans[k % len(orphans)]
        running = self.paths.parallel / "running"
        mine = reclaim_name(name, sup.owner)
        os.rename(running / name, running / mine)
        self._die(sup)
        # The reclaim name encodes the old one, so recovery still recognises a begun move
        # (test_a_reclaimer_crash_does_not_forget_a_begun_move) and never a stale marker
        # (test_a_stale_moved_from_is_not_taken_for_a_begun_move).
        event("crash while reclaiming")

    @rule(i=st.integers(0, N_SUPS - 1))
    def restart(self, i: int) -> None:
        sup = self.sups[i % N_SUPS]
        if not sup.alive:
            self._start(sup)

    def _lost(self, tid: str, data: dict[str, Any]) -> str:
        """Where a dead supervisor's task goes, reclaimed or resumed: one rule (issue 28.5).
        Its attempt is recorded lost, free (interrupted) unless the last MAX_LOST - 1 were
        lost too; only a counted one that used the last attempt ends it failed."""
        self.attempts[tid] += 1
        kinds = [a.get("kind") for a in data["attempts"]][-(MAX_LOST - 1) :]
        if kinds.count("lost") < MAX_LOST - 1:
            return "pending"
        used = Descriptor(data).attempts_used + 1
        return "failed" if used >= self.max_attempts[tid] else "pending"

    @rule(i=st.integers(0, N_SUPS - 1))
    def reclaim(self, i: int) -> None:
        sup = self._live(i)
        if sup is None:
            return
        assert sup.queue is not None
        expected: dict[str, str] = {}
        for tid, _, data in self._orphaned():
            if data.get("retry_at") is not None:
                expected[tid] = "pending"
            elif tid in self.begun:
                expected[tid] = self.begun.pop(tid)  # reclaim finishes a begun move
            else:
                expected[tid] = self._lost(tid, data)
        count = reclaim_dead(sup.queue, self.ledger, sup.owner, lease_ttl=TTL)
        assert count == len(expected), (count, expected)
        self.model.update(expected)
        event(f"reclaim {min(count, 2)}+")

    @precondition(lambda self: not any(s.alive for s in self.sups))
    @rule(retry_failed=st.booleans())
    def recover_all(self, retry_failed: bool) -> None:
        """``gpuswarm resume``: only when no supervisor is alive."""
        for tid, _, data in self._orphaned():
            if data.get("retry_at") is not None:
                self.model[tid] = "pending"
            elif tid in self.begun:
                self.model[tid] = self.begun.pop(tid)
            else:
                self.model[tid] = self._lost(tid, data)
        queue = DirQueue(self.paths, durable=False)
        moved = recover(queue, self.ledger, retry_failed=retry_failed, grace=0.1)
        pending = os.listdir(self.paths.parallel / "pending")
        for tid, op in list(self.holds.items()):  # a resume may finish a killed command's hold
            held = [h[2] for n in pending if (h := parse_hold(n)) is not None]
            if not any(task_of(name) == tid for name in held):
                self.model[tid] = "cancelled" if op == "cancel" else "pending"
                del self.holds[tid]
        assert moved["killed"] == 0 and moved["corrupt"] == 0, moved
        if retry_failed:
            for tid, state in self.model.items():
                if state == "failed":
                    self.model[tid] = "pending"
        event("recover")

    @rule(k=st.integers(0, N_TASKS - 1), how=st.sampled_from(["truncate", "garbage"]))
    def corrupt_pending(self, k: int, how: str) -> None:
        if len(self.corrupted) >= 2:
            return
        names = sorted(n for n in os.listdir(self.paths.parallel / "pending") if n[0] != ".")
        if not names:
            return
        path = self.paths.parallel / "pending" / names[k % len(names)]
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2] if how == "truncate" else b"\x00garbage{")
        self.corrupted.add(task_of(path.name))
        event("corrupt a pending descriptor")

    # -- a person's changes (issue 17) ---------------------------------------------------------
    @rule(priority=st.integers(-3, 3), attempts=st.integers(1, 3))
    def add(self, priority: int, attempts: int) -> None:
        """``gpuswarm add``: a new task, claimable at once by every supervisor."""
        if self.seq >= N_TASKS + 6:
            return
        tid = f"t{self.seq}"
        task = {"id": tid, "name": tid, "priority": priority, "max_attempts": attempts}
        DirQueue.add_pending(self.paths, task, self.seq)
        self.seq += 1
        self.max_attempts[tid] = attempts
        self.model[tid] = "pending"
        self.attempts[tid] = 0
        event("add")

    def _pending_task(self, k: int) -> str | None:
        names = sorted(n for n in os.listdir(self.paths.parallel / "pending") if n[0] != ".")
        return task_of(names[k % len(names)]) if names else None

    @rule(k=st.integers(0, 15), dies=st.booleans())
    def cancel_pending(self, k: int, dies: bool) -> None:
        """``gpuswarm cancel`` of a pending task; ``dies``: the command is killed right after
        its hold (the next control command finishes the cancel)."""
        tid = self._pending_task(k)
        if tid is None or tid in self.corrupted:
            return
        queue = DirQueue(self.paths, durable=False)
        if dies:
            with pytest.raises(Crash):
                queue.cancel_pending(tid, "by a test", _crash)
            pending = self.paths.parallel / "pending"
            mine = f"-{os.getpid()}-"
            (held,) = [n for n in os.listdir(pending) if n.startswith(HELD) and mine in n]
            op, _, name = parse_hold(held) or ("", 0, "")
            os.rename(pending / held, pending / f"{HELD}{op}-{DEAD_PID}-{name}")
            self.holds[tid] = "cancel"
            self.model[tid] = "held"
            event("cancel pending, the command dies")
            return
        assert queue.cancel_pending(tid, "by a test", lambda d: None) is not None
        self.model[tid] = "cancelled"
        event("cancel pending")

    @rule()
    def finish_holds(self) -> None:
        """The next control command finishes what a killed one left."""
        if not self.holds:
            return
        DirQueue(self.paths, durable=False).finish_holds(lambda d: None)
        for tid, op in self.holds.items():
            self.model[tid] = "cancelled" if op == "cancel" else "pending"
        self.holds.clear()
        event("finish holds")

    @rule(k=st.integers(0, 15), priority=st.integers(-5, 5))
    def reprioritize(self, k: int, priority: int) -> None:
        tid = self._pending_task(k)
        if tid is None or tid in self.corrupted:
            return
        assert DirQueue(self.paths, durable=False).reprioritize(tid, priority, lambda d: None)
        event("priority")

    @rule(i=st.integers(0, N_SUPS - 1), k=st.integers(0, 7))
    def cancel_running(self, i: int, k: int) -> None:
        """The supervisor holding a task applies a cancel request: its attempt ends cancelled."""
        sup = self._live(i)
        claimed = self._pick_held(sup, k)
        if sup is None or claimed is None or sup.queue is None:
            return
        waiting = claimed.data.pop("retry_at", None) is not None
        if not waiting:
            self._record(claimed, ok=False)
        claimed.desc.mark_cancelled("cancelled by a test")
        sup.queue.move(claimed, State.CANCELLED)
        del sup.held[claimed.task_id]
        self.model[claimed.task_id] = "cancelled"
        event("cancel running")

    @rule(k=st.integers(0, 15), state=st.sampled_from([State.FAILED, State.CANCELLED]))
    def retry(self, k: int, state: State) -> None:
        """``gpuswarm retry``: a failed or cancelled task back to pending, fresh budget."""
        folder = self.paths.parallel / state.value
        names = sorted(os.listdir(folder)) if folder.is_dir() else []
        if not names:
            return
        name = names[k % len(names)]
        queue = DirQueue(self.paths, durable=False)
        with queue.control_lock():
            assert queue.retry(state, name, lambda d: None) is not None
        self.model[task_of(name)] = "pending"
        event(f"retry {state.value}")

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def every_task_in_exactly_one_folder_with_its_attempts(self) -> None:
        where = self._where()
        assert set(where) == set(self.model), f"lost or unknown: {set(where) ^ set(self.model)}"
        for tid, places in where.items():
            assert len(places) == 1, f"{tid} in {places}"
            state, name = places[0]
            if state == "corrupt":
                assert tid in self.corrupted, f"{tid} moved to corrupt/ but was never corrupted"
            assert state == self.model[tid], f"{tid}: in {state}/, the model says {self.model[tid]}"
            if state not in ("corrupt", "held") and tid not in self.corrupted:
                data = json.loads((self.paths.parallel / state / name).read_bytes())
                kinds = [a.get("kind") for a in data["attempts"]]
                assert len(kinds) == self.attempts[tid], (
                    f"{tid}: attempts {kinds}, the model expects {self.attempts[tid]}"
                )

    @invariant()
    def leases_name_their_holders(self) -> None:
        alive = {s.owner for s in self.sups if s.alive}
        holders = {(s.owner, tid) for s in self.sups if s.alive for tid in s.held}
        for name in _leases(self.paths.parallel / "running"):
            lease = lease_of(name)
            assert lease is not None, name
            if lease[0] in alive:
                assert (lease[0], task_of(name)) in holders, f"{name}: held by no one"
        for owner, tid in holders:
            running = [n for n in _leases(self.paths.parallel / "running") if task_of(n) == tid]
            assert len(running) == 1 and lease_of(running[0])[0] == owner  # type: ignore[index]


def task_of(name: str) -> str:
    """Task id of a file in any state folder (``<rank+seq 13>_<id>.json[@lease][.reason]``)."""
    return name.split("@", 1)[0][14:].split(".json", 1)[0]


EXAMPLES = 30 * trials(3)
QueueMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=50,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestQueueStateMachine = pytest.mark.timeout(max(60, EXAMPLES // 5))(
    pytest.mark.slow(hypothesis_seed(BASE_SEED)(QueueMachine.TestCase))
)


# -- the examples hypothesis found, pinned deterministically -----------------------------------
class Crash(BaseException):
    """Stands for a SIGKILL at this point: nothing after it runs in that process."""


def _crash(*_: object, **__: object) -> None:
    raise Crash


def _one_task_run(tmp_path: Path, max_attempts: int) -> tuple[RunPaths, Ledger]:
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir()
    create_layout(paths)
    task = {"id": "t0", "name": "t0", "priority": 0, "max_attempts": max_attempts}
    write_pending(paths, [Descriptor.new(task, 0)])
    return paths, Ledger(paths.events, durable=False)


def _supervisor(paths: RunPaths, n: int) -> tuple[str, DirQueue]:
    owner = f"{HOST}:{n}:{n}"
    write_owner_file(paths, owner, {})
    return owner, DirQueue(paths, durable=False)


def _dies(paths: RunPaths, owner: str) -> None:
    os.utime(owner_file(paths, owner), (0, 0))


def _reclaim_and_crash_after_the_rename(paths: RunPaths, ledger: Ledger, n: int) -> None:
    """A reclaimer renames a dead owner's task under its own lease, then dies."""
    owner, queue = _supervisor(paths, n)
    queue.adopt_running = _crash  # type: ignore[method-assign,assignment]  # the next step of _reclaim_one
    with pytest.raises(Crash):
        reclaim_dead(queue, ledger, owner, lease_ttl=TTL)
    _dies(paths, owner)


def _only(paths: RunPaths) -> tuple[str, dict[str, Any]]:
    ((state, path),) = [
        (s, paths.parallel / s / n) for s in STATE_NAMES for n in os.listdir(paths.parallel / s)
    ]
    return state, json.loads(path.read_bytes())


STATE_NAMES = ("pending", "running", "done", "failed")


def test_a_reclaimer_crash_does_not_forget_a_begun_move(tmp_path: Path) -> None:
    paths, ledger = _one_task_run(tmp_path, max_attempts=1)
    a, qa = _supervisor(paths, 1)
    claimed = qa.claim(a, 0)
    assert claimed is not None
    claimed.data["attempts"].append({"n": 1, "kind": "exited", "returncode": 0})
    with pytest.raises(Crash):  # saved (state done, moved_from), journaled, not renamed
        qa.move(claimed, State.DONE, _crash)
    _dies(paths, a)
    _reclaim_and_crash_after_the_rename(paths, ledger, 2)
    c, qc = _supervisor(paths, 3)
    reclaim_dead(qc, ledger, c, lease_ttl=TTL)
    state, data = _only(paths)
    assert (state, [x["kind"] for x in data["attempts"]]) == ("done", ["exited"]), data


def test_a_stale_moved_from_is_not_taken_for_a_begun_move(tmp_path: Path) -> None:
    paths, ledger = _one_task_run(tmp_path, max_attempts=5)
    a, qa = _supervisor(paths, 1)
    assert qa.claim(a, 0) is not None
    _dies(paths, a)
    r, qr = _supervisor(paths, 2)
    assert reclaim_dead(qr, ledger, r, lease_ttl=TTL) == 1  # lost attempt 1 (a), to pending
    s, qs = _supervisor(paths, 3)
    assert qs.claim(s, 0) is not None
    _dies(paths, s)
    qr.adopt_running = _crash  # type: ignore[method-assign,assignment]  # r renames it again and dies
    with pytest.raises(Crash):
        reclaim_dead(qr, ledger, r, lease_ttl=TTL)
    _dies(paths, r)
    recover(DirQueue(paths, durable=False), ledger, retry_failed=False, grace=0.1)
    state, data = _only(paths)
    kinds = [x["kind"] for x in data["attempts"]]
    assert (state, kinds) == ("pending", ["lost", "lost"]), f"attempt of {s} not recorded: {kinds}"
