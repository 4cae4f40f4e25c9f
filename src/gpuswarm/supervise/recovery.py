"""Recovering a run: after a crash, a stop, a dead supervisor (reclaim), or to retry failures.

:func:`recover` repairs a run no supervisor holds (resume, ``check --repair``); :func:`reclaim_dead`
takes back the tasks of supervisors that are gone (any live supervisor calls it). Both first end
what still runs of the dead supervisor's attempts, through the backend that ran them
(:class:`EndsLeftovers`, the part of ``exec.base.Backend`` they need): the store knows no backend.

Both apply the control requests nobody applied (:mod:`.controls`): an orphaned running task with
a cancel request ends cancelled (its lost attempt recorded), not back in pending/; recovery also
finishes the cancels a dead CLI left half-way, cancels pending tasks that have a request and
drops the requests of tasks that ended; each applied cancel is journaled (``control``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

from gpuswarm.core.errors import QueueError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import AttemptRecord, Descriptor, Lease, State
from gpuswarm.core.models.budget import MAX_LOST
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import create_backend
from gpuswarm.store.control import Request
from gpuswarm.store.leases import on_this_host, owner_alive, slot_label
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.names import leased_by, reclaimed_from
from gpuswarm.store.queue import Claimed, DirQueue
from gpuswarm.store.release import settle_all, settle_locked
from gpuswarm.store.runs import set_aside, temp_files
from gpuswarm.supervise.controls import (
    Cancels,
    cancel_requests,
    finish_holds,
    move_cancelled,
    settle_requests,
    still_bound,
)
from gpuswarm.supervise.orphans import judge_orphan


class EndsLeftovers(Protocol):
    """What recovery and reclaim need of a backend (``exec.base.Backend.end_leftovers``): end
    what still runs of a dead supervisor's attempts, and say (ids found, task ids whose attempt
    was still alive, how many were signalled)."""

    def end_leftovers(
        self, *, run_dir: str | None = None, owner: str | None = None, grace: float = 10.0
    ) -> tuple[list[int | str], frozenset[str], int]: ...


def _local_backend() -> EndsLeftovers:
    """For callers that pass no backend (tests, old callers): the local one."""
    return create_backend("local")


def recover(
    queue: DirQueue,
    ledger: Ledger,
    *,
    retry_failed: bool,
    grace: float = 10.0,
    backend: EndsLeftovers | None = None,
    applied_by: str = "recovery",
) -> dict[str, int]:
    """Repair a run no supervisor holds: after a crash, a stop, or to retry failures.

    Call only while holding the run lock: then no supervisor is live and every running
    descriptor was orphaned. First the attempts a crashed supervisor left running are killed
    (they run on in their own sessions and would hold their GPU twice); then each running
    descriptor either completes the move its supervisor had begun (done/failed), or goes back
    to pending/ with an interrupted attempt recorded, so the re-run gets a new attempt number.
    Unless ``retry_failed`` is False, failed tasks are re-queued with a fresh attempt budget.
    Control requests are applied (see the module docstring; ``applied_by`` in their events):
    ``cancelled`` counts the tasks that ended cancelled.
    """
    moved = {"killed": 0, "interrupted": 0, "recovered": 0, "requeued": 0, "retried": 0}
    moved["corrupt"] = moved["cancelled"] = moved["adopted"] = 0
    moved["temp_files"] = _remove_temp_files(queue.paths)
    killer = backend or _local_backend()
    leftovers, alive, killed = killer.end_leftovers(run_dir=str(queue.paths.root), grace=grace)
    still_running = set(alive)
    kept = kept_attempts(killer)
    if leftovers:
        moved["killed"] = killed
        ledger.emit(Ev.KILLED, pids=leftovers, reason="attempts of a crashed supervisor")
    moved["judged_done"] = 0
    with queue.control_lock():  # no `gpuswarm cancel` / `priority` half-way meanwhile
        moved["cancelled"] += finish_holds(queue, ledger, applied_by)
        cancels = cancel_requests(queue)
        for name in queue.names(State.RUNNING):
            if _adopt(queue, name, kept, cancels, applied_by):
                moved["adopted"] += 1
                continue
            how = _recover_running(queue, ledger, name, still_running, cancels, applied_by)
            moved[how] += 1
        moved["cancelled"] += settle_requests(queue, ledger, cancels, applied_by)
    for name in queue.names(State.CANCELLED):  # a `gpuswarm retry` a crash cut short
        if queue.finish_begun_retry(name, _retry_journaled(ledger, "cancelled"), State.CANCELLED):
            moved["retried"] += 1
    for name in queue.names(State.FAILED):
        if _finish_begun_retry(queue, ledger, name):
            moved["retried"] += 1  # begun before a crash: finished even with --no-retry-failed
        elif retry_failed:
            moved["retried"] += _retry_failed(queue, ledger, name)
    with queue.control_lock():  # issue 35: every blocked task against the folders
        moved.update({f"blocked_{k}": n for k, n in settle_all(queue, ledger).items()})
    return moved


def kept_attempts(backend: object) -> frozenset[str]:
    """Tasks whose attempt the backend kept running for the new supervisor to wait for (a
    cluster's slot actors outlive their driver: ``ray``); none for local and docker."""
    kept = getattr(backend, "kept_attempts", None)
    return frozenset(kept()) if callable(kept) else frozenset()


def _adopt(
    queue: DirQueue, name: str, kept: frozenset[str], cancels: Cancels, applied_by: str
) -> bool:
    """A running task whose attempt the backend kept (and nobody cancelled, no move of it
    begun): it stays in running/, under the new supervisor's lease, which waits for it."""
    if not kept:
        return False
    try:
        claimed = queue.adopt_running(name)
    except QueueError:
        return False
    task_id = claimed.task_id
    if task_id not in kept or task_id in cancels or _begun_move(claimed) is not None:
        return False
    if claimed.desc.retry_at is not None:
        return False
    return queue.take_lease(name, applied_by) is not None


def _remove_temp_files(paths: RunPaths) -> int:
    found = temp_files(paths)
    for path in found:
        path.unlink(missing_ok=True)
    return len(found)


def _recover_running(
    queue: DirQueue,
    ledger: Ledger,
    name: str,
    still_running: set[str],
    cancels: Cancels,
    applied_by: str,
) -> str:
    try:
        claimed = queue.adopt_running(name)
    except QueueError:
        set_aside(queue, ledger, queue.paths.state_dir("running") / name, "unreadable running")
        return "corrupt"
    reqs = cancels.pop(claimed.task_id, None)
    if reqs is not None:  # those made for an attempt that has its outcome are dropped
        reqs = still_bound(queue, ledger, reqs, claimed.desc, applied_by)
    if reqs:
        if _cancel_orphan(queue, ledger, claimed, reqs, applied_by):
            return "cancelled"
        cancels[claimed.task_id] = reqs  # its begun move ends it: dropped once it did
    if _requeue_waiting(queue, ledger, claimed):
        return "requeued"
    if _finish_begun_move(queue, ledger, claimed):
        return "recovered"
    lease = Lease.parse(name)
    owner = lease.owner if lease else "?"
    if claimed.task_id not in still_running and judge_orphan(
        queue, ledger, claimed, f"its supervisor died ({owner})"
    ):
        return "judged_done"
    _requeue_lost(queue, ledger, claimed, owner, "interrupted")
    return "interrupted"


def _requeue_lost(queue: DirQueue, ledger: Ledger, claimed: Claimed, owner: str, why: str) -> None:
    """The attempt of a running task whose supervisor ``owner`` died is recorded ``lost`` by
    the one rule resume, reclaim and the committer share (``Descriptor.lost_is_free``: a
    supervisor's death is never the task's attempt): back to pending/ (event ``requeued``,
    reason ``why``); to failed/ as ``abandoned`` only when it counted and used the last one."""
    desc = claimed.desc
    lease = Lease.parse(claimed.path.name)
    label = "" if lease is None or lease.reclaimer else slot_label(queue.paths, owner, lease.slot)
    n = desc.next_attempt
    record = AttemptRecord.lost(n=n, slot=label, reason=f"its supervisor died ({owner})")
    if desc.add_lost(record) or desc.attempts_used < desc.max_attempts:
        queue.move(claimed, State.PENDING, _requeued(ledger, claimed, why, "running"))
        return
    desc.reason = reason = (
        f"abandoned: lost with its supervisor {MAX_LOST} times in a row (the last: {owner}) "
        "and its attempts are used up"
    )
    queue.move(
        claimed,
        State.FAILED,
        lambda: ledger.emit(
            Ev.FINISHED,
            task=claimed.task_id,
            attempt=n,
            slot="",
            state="failed",
            reason=reason,
            seconds=0,
            retry=False,
        ),
    )


def _cancel_orphan(
    queue: DirQueue, ledger: Ledger, claimed: Claimed, reqs: list[Request], applied_by: str
) -> bool:
    """An orphaned running task a person cancelled: it ends cancelled, the attempt that was
    under way recorded as lost (nothing of it runs any more: the caller ended the leftovers),
    and the requests are dropped. A retry waiting out its backoff, or a requeue begun, is
    cancelled as it is. False (nothing done) when its supervisor had begun a move to an end
    (done, failed, cancelled: the cancel itself): the caller finishes it, done stands."""
    desc = claimed.desc
    begun = _begun_move(claimed)
    if begun is not None and begun != State.PENDING.value:
        return False
    lease = Lease.parse(claimed.path.name)
    slot: str | None = None  # not running as the journal tells it: waiting, or requeued
    if begun is None and desc.take_retry_at() is None:  # an attempt was under way
        owner = lease.owner if lease else "?"
        label = slot_label(queue.paths, lease.owner, lease.slot) if lease else ""
        if lease is None or lease.reclaimer:
            label = ""
        desc.add_attempt(
            AttemptRecord.lost(
                n=desc.next_attempt,
                slot=label,
                interrupted=True,
                reason=f"its supervisor died ({owner}); cancelled",
            )
        )
        slot = label or "?"
    move_cancelled(queue, ledger, claimed, reqs, applied_by, slot)
    return True


def _requeued(ledger: Ledger, claimed: Claimed, reason: str, frm: str) -> Callable[[], object]:
    return lambda: ledger.emit(Ev.REQUEUED, task=claimed.task_id, reason=reason, frm=frm)


def _requeue_waiting(queue: DirQueue, ledger: Ledger, claimed: Claimed) -> bool:
    """A task that was only waiting out its retry backoff goes back to pending/ as it is."""
    if claimed.desc.take_retry_at() is None:
        return False
    queue.move(claimed, State.PENDING, _requeued(ledger, claimed, "retry", "waiting"))
    return True


def _finish_begun_move(queue: DirQueue, ledger: Ledger, claimed: Claimed) -> bool:
    """Complete a move that a crash cut short after its descriptor was saved.

    ``moved_from`` names the claim that began the move: the file's current name, or, after a
    reclaimer renamed it, the name :func:`reclaim_name` encodes. A later claim of the same task
    has another name, so an old marker is never mistaken for a begun move.
    """
    target = _begun_move(claimed)
    if target is None:
        return False
    if target == State.PENDING.value:
        announce = _requeued(ledger, claimed, "retry", "running")
    else:
        announce = lambda: ledger.emit(Ev.RECOVERED, task=claimed.task_id, state=target)  # noqa: E731
    queue.move(claimed, State(target), announce)
    return True


STATE_VALUES = tuple(s.value for s in State if s is not State.RUNNING)


def _begun_move(claimed: Claimed) -> str | None:
    """The state a move this claim began was going to (its descriptor saved, not renamed),
    or None when no move of this claim was begun."""
    desc = claimed.desc
    target, begun, now = desc.state, desc.moved_from, claimed.path.name
    if begun is None or target not in STATE_VALUES or Lease.parse(now) is None:
        return None
    if begun != now and not reclaimed_from(now, begun):
        return None
    return target


def _retry_failed(queue: DirQueue, ledger: Ledger, name: str) -> int:
    if queue.retry_failed(name, _retry_journaled(ledger)) is None:
        set_aside(queue, ledger, queue.paths.state_dir("failed") / name, "unreadable failed")
        return 0
    return 1


def _retry_journaled(ledger: Ledger, frm: str = "failed") -> Callable[[Descriptor], object]:
    return lambda desc: ledger.emit(
        Ev.REQUEUED, task=desc.id_if_any, reason="resume-retry", frm=frm
    )


def _finish_begun_retry(queue: DirQueue, ledger: Ledger, name: str) -> bool:
    """A failed task saved as ``pending`` (a retry a crash cut short after its save): journal
    it (again: the journal must never lag behind the folders) and finish the rename."""
    return queue.finish_begun_retry(name, _retry_journaled(ledger))


def reclaim_dead(
    queue: DirQueue,
    ledger: Ledger,
    me: str,
    *,
    lease_ttl: float,
    grace: float = 10.0,
    backend: EndsLeftovers | None = None,
) -> int:
    """Take back the tasks of supervisors that are gone; any live supervisor may call this.

    Each reclaimed task's attempt is recorded lost by the rule resume keeps too (not counted:
    a supervisor's death is never the task's attempt; see :func:`_requeue_lost`) and goes back
    to pending/. The rename to our own lease arbitrates between
    supervisors reclaiming at once. Processes a dead owner left on this host are killed first.
    A reclaimed task with a cancel request ends cancelled instead (journaled, applied by ``me``).
    """
    cancels = cancel_requests(queue)
    verdicts: dict[str, bool] = {}
    still_running: set[str] = set()  # tasks whose attempt was alive: killed, never judged done
    count = 0
    killer = backend or _local_backend()
    for name in queue.names(State.RUNNING):
        lease = Lease.parse(name)
        if lease is None or lease.owner == me:
            continue
        owner = lease.owner
        if owner not in verdicts:
            verdicts[owner] = owner_alive(queue.paths, owner, lease_ttl)
            if not verdicts[owner] and on_this_host(owner):
                leftovers, alive, _ = killer.end_leftovers(owner=owner, grace=grace)
                if leftovers:
                    still_running |= alive
                    ledger.emit(Ev.KILLED, pids=leftovers, reason=f"attempts of dead {owner}")
        if not verdicts[owner] and _reclaim_one(
            queue, ledger, name, owner, me, still_running, cancels
        ):
            count += 1
    dead = [o for o, alive in verdicts.items() if not alive]
    _remove_dead_writes(queue.paths, dead)
    if dead:  # issue 35: a release it had begun (or not begun yet) is finished here
        settle_locked(queue, ledger)
    return count


def _remove_dead_writes(paths: RunPaths, dead: list[str]) -> None:
    """Temp files of descriptor writes a dead owner's crash cut short: their names carry the
    claimed file's name, so the owner (host:pid:start) is in them; nobody else writes them."""
    if not dead:
        return
    running = paths.state_dir("running")
    for name in os.listdir(running):
        if name.startswith(".tmp-") and leased_by(name, dead):
            (running / name).unlink(missing_ok=True)


def _reclaim_one(
    queue: DirQueue,
    ledger: Ledger,
    name: str,
    owner: str,
    me: str,
    still_running: set[str],
    cancels: Cancels,
) -> bool:
    mine = queue.take_lease(name, me)
    if mine is None:
        return False  # another supervisor reclaimed it first
    try:
        claimed = queue.adopt_running(mine)
    except QueueError:
        set_aside(queue, ledger, queue.running_path(mine), "unreadable running")
        return False
    reqs = cancels.get(claimed.task_id)
    if reqs is not None:  # those made for an attempt that has its outcome are dropped
        reqs = cancels[claimed.task_id] = still_bound(queue, ledger, reqs, claimed.desc, me)
    if reqs and _cancel_orphan(queue, ledger, claimed, reqs, me):
        return False  # ended: nothing came back to pending/
    if _requeue_waiting(queue, ledger, claimed) or _finish_begun_move(queue, ledger, claimed):
        return True
    judge = on_this_host(owner) and claimed.task_id not in still_running
    if judge and judge_orphan(queue, ledger, claimed, f"its supervisor {owner} died"):
        return True
    _requeue_lost(queue, ledger, claimed, owner, f"reclaimed from {owner}")
    return True
