"""Control requests, the supervisor's side: cancels and pauses a person asked for, applied.

``gpuswarm cancel`` of a running task and ``gpuswarm pause`` write durable records in the run
folder (:mod:`gpuswarm.store.control`); every live supervisor's keeper reads them on its tick (at
most a second apart) through :class:`Controller`:

- a cancel of a task this supervisor runs stops the attempt (TERM, grace, KILL of its tree, by
  the waiter); when that attempt's end is committed (:mod:`.committer`) the task moves to
  ``cancelled/``, the attempt recorded, never retried, neutral for the circuit breaker, with a
  ``control`` event journaled before the rename; then the request is dropped. An attempt that
  was done (exit 0, its completion file) before the cancel took effect stays done (the request
  is dropped, no event). A retry of ours waiting out its backoff is cancelled at once. A request
  whose task is pending (requeued meanwhile) is applied to it here (``DirQueue.cancel_pending``);
  one whose task has ended is dropped (stale); one whose task another supervisor holds is left to
  it (or, when that supervisor is dead, to the reclaim, :mod:`.recovery`);
- a pause (of the run, or of one of this supervisor's slots) is kept in ``Shared.paused``: the
  loop claims nothing for a paused slot, running attempts go on; the first time this supervisor
  sees a pause or unpause it journals ``control`` and wakes the loop.

A request nobody applies (its supervisor died) is applied by recovery: resume, the reclaim of a
dead owner, ``check --repair`` (:func:`cancel_orphan`, :func:`settle_requests`). A crash at any
point applies a request at most once: it is dropped only after its task's move is durable, and a
request whose task has ended is dropped without doing anything.

A cancel is bound to the attempt it was made for (:func:`gpuswarm.store.control.too_late`):
wherever it is applied (our live attempt, a waiting retry, a pending task, an orphan in
recovery), a request whose attempt already has an outcome that counts is dropped instead, with a
``control`` event saying it came too late (:func:`still_bound`). A cancel racing its attempt's
end thus never cancels the retry that follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpuswarm.core.events import Ev
from gpuswarm.core.models import Descriptor, Lease, State
from gpuswarm.store import control
from gpuswarm.store.control import Request
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.names import task_id_of
from gpuswarm.store.queue import Claimed, DirQueue
from gpuswarm.store.release import released
from gpuswarm.supervise.context import Shared

CANCEL = "cancel"
#: ticks a request's task may be found in no folder (a rename seen half-way, a priority change's
#: hold, corrupt/) before the request is dropped as stale
MAX_MISSES = 3

Cancels = dict[str, list[Request]]  # task id -> its cancel requests (usually one)


def cancel_requests(queue: DirQueue, cache: dict[str, Request | None] | None = None) -> Cancels:
    """The recorded cancel requests, by task (``cache``: see :func:`control.requests`)."""
    out: Cancels = {}
    for req in control.requests(queue.paths, cache):
        if req.kind == CANCEL:
            out.setdefault(req.task, []).append(req)
    return out


def reason_of(req: Request) -> str:
    """The cancelled task's reason: who cancelled it (and why, when they said)."""
    return f"cancelled by {req.by}" + (f": {req.reason}" if req.reason else "")


def journal_cancel(
    ledger: Ledger, req: Request, applied_by: str, slot: str | None = None
) -> Callable[[], object]:
    """The ``control`` event of an applied cancel (``slot``: where its attempt ran; None: the
    task was not running, as a reader of the journal counts it)."""
    return lambda: emit_control(
        ledger,
        request=CANCEL,
        task=req.task,
        slot=slot,
        by=req.by,
        applied_by=applied_by,
        state=State.CANCELLED.value,
        attempt=req.attempt,
    )


def emit_control(ledger: Ledger, **fields: str | int | None) -> None:
    """Journal a ``control`` event; fields that are None are left out (a journal's ``slot``
    is always a string)."""
    ledger.emit(Ev.CONTROL, **{k: v for k, v in fields.items() if v is not None})


def drop_late(queue: DirQueue, ledger: Ledger, req: Request, why: str, applied_by: str) -> None:
    """Drop a request that no longer applies; journaled by whoever removed it (once)."""
    if control.drop(queue.paths, req):
        emit_control(
            ledger,
            request=req.kind,
            task=req.task,
            by=req.by,
            applied_by=applied_by,
            attempt=req.attempt,
            dropped=why,
        )


def still_bound(
    queue: DirQueue, ledger: Ledger, reqs: list[Request], desc: Descriptor, applied_by: str
) -> list[Request]:
    """The requests that still apply to the task as ``desc`` records it; the others (their
    attempt has an outcome already) are dropped and journaled as too late."""
    bound = []
    for req in reqs:
        why = control.too_late(req, desc)
        if why is None:
            bound.append(req)
        else:
            drop_late(queue, ledger, req, why, applied_by)
    return bound


def drop_all(queue: DirQueue, reqs: Iterable[Request]) -> None:
    for req in reqs:
        control.drop(queue.paths, req)


def move_cancelled(
    queue: DirQueue,
    ledger: Ledger,
    claimed: Claimed,
    reqs: list[Request],
    applied_by: str,
    slot: str | None,
) -> None:
    """A claimed task (its attempt, if any, already recorded) ends cancelled: saved, journaled,
    renamed into cancelled/ (LeaseLostError: nothing written); then its requests are dropped."""
    claimed.desc.mark_cancelled(reason_of(reqs[0]))
    queue.paths.state_dir(State.CANCELLED.value).mkdir(exist_ok=True)  # a run made before it
    queue.move(claimed, State.CANCELLED, journal_cancel(ledger, reqs[0], applied_by, slot))
    drop_all(queue, reqs)


def cancel_pending(queue: DirQueue, ledger: Ledger, reqs: list[Request], applied_by: str) -> bool:
    """Cancel the requests' task if it is pending and they still apply to it (then drop them;
    too late ones are dropped as such); False when it was not cancelled."""
    bound: list[Request] = []

    def decide(desc: Descriptor) -> str | None:
        bound[:] = still_bound(queue, ledger, reqs, desc, applied_by)
        return reason_of(bound[0]) if bound else None

    def announce(_desc: Descriptor) -> None:
        journal_cancel(ledger, bound[0], applied_by)()

    if queue.cancel_pending_if(reqs[0].task, decide, announce) is None:
        return False
    drop_all(queue, bound)
    released(queue, ledger, reqs[0].task, State.CANCELLED)  # issue 35: its dependents
    return True


def locate(queue: DirQueue, tasks: set[str]) -> dict[str, tuple[State, str]]:
    """Where each of ``tasks`` is now, by file name: (state, file name). Running first (the
    common case: one small folder), then pending, then the ended folders, only as long as some
    task is still unfound."""
    found: dict[str, tuple[State, str]] = {}
    for state in (State.RUNNING, State.PENDING, *State.terminal()):
        if len(found) == len(tasks):
            break
        for name in queue.names(state):
            tid = task_id_of(name)
            if tid in tasks and tid not in found:
                found[tid] = (state, name)
    return found


def settle_requests(queue: DirQueue, ledger: Ledger, cancels: Cancels, applied_by: str) -> int:
    """Recovery, once running/ was dealt with (no supervisor is live): cancel the pending tasks
    that have requests; drop every other request (its task ended, or is gone). Returns how many
    tasks were cancelled."""
    if not cancels:
        return 0
    where = locate(queue, set(cancels))
    count = 0
    for task, reqs in cancels.items():
        state = where.get(task, (None, ""))[0]
        if state is State.PENDING:
            if cancel_pending(queue, ledger, reqs, applied_by):
                count += 1
        elif state is not None and state.is_terminal():
            why = f"too late: the task ended {state.value} before the cancel was applied"
            for req in reqs:
                drop_late(queue, ledger, req, why, applied_by)
        elif state is not State.RUNNING:  # running: an unreadable one, set aside later
            drop_all(queue, reqs)
    return count


def finish_holds(queue: DirQueue, ledger: Ledger, applied_by: str) -> int:
    """Cancels and priority changes a dead CLI left half-way (``pending/.held-*``): a cancel is
    finished (journaled, in cancelled/), a priority change undone. Returns the cancels."""
    cancelled = 0

    def announce(desc: Descriptor) -> None:
        nonlocal cancelled
        cancelled += 1
        emit_control(
            ledger,
            request=CANCEL,
            task=str(desc.id_if_any),
            applied_by=applied_by,
            state=State.CANCELLED.value,
        )

    queue.finish_holds(announce)
    return cancelled


class Controller:
    """The keeper's control duty: one ``listdir`` of the control folder per tick for requests,
    one for the pause flags (the folder is usually empty or absent)."""

    def __init__(self, run: Shared, cancel_waiting: Callable[[str, list[Request]], bool]) -> None:
        self.run = run
        self.cancel_waiting = cancel_waiting  # the committer's: a retry of ours in its backoff
        self._misses: dict[str, int] = {}  # request file name -> ticks its task was not found
        self._read: dict[str, Request | None] = {}  # request files read (each is read once)

    def tick(self) -> None:
        self.refresh_pause()
        self.apply_requests()

    # -- pause ---------------------------------------------------------------------------------
    def refresh_pause(self) -> None:
        """Read the pause flags; on a change journal it (what concerns this supervisor: the run
        or one of its slots) and let the loop look again."""
        run = self.run
        now = control.paused(run.paths)
        old = run.paused
        if now == old:
            return
        run.paused = now
        mine = {slot.label for slot in run.cfg.slots}
        changes: list[tuple[str, str | None]] = []
        if now.run != old.run:
            changes.append(("pause" if now.run else "unpause", None))
        changes += [("pause", s) for s in sorted((now.slots - old.slots) & mine)]
        changes += [("unpause", s) for s in sorted((old.slots - now.slots) & mine)]
        for request, slot in changes:
            emit_control(run.ledger, request=request, slot=slot, applied_by=run.cfg.owner)
        run.more_work()

    # -- cancel --------------------------------------------------------------------------------
    def apply_requests(self) -> None:
        run = self.run
        me = run.cfg.owner
        cancels = cancel_requests(run.queue, self._read)
        if not cancels:
            self._misses.clear()
            return
        left: Cancels = {}
        for task, reqs in cancels.items():
            live = next((a for a in list(run.live.values()) if a.task_id == task), None)
            if live is not None:
                if live.stopped_by is None and not live.fenced:
                    reqs = still_bound(run.queue, run.ledger, reqs, live.claimed.desc, me)
                if reqs and live.stopped_by is None and not live.fenced:
                    live.stopped_by = reqs  # the committer commits its end as the requests ask
                    live.handle.cancel()
                    run.wakeup()  # the loop hands it to a waiter: TERM, grace, KILL
            elif not self.cancel_waiting(task, reqs):
                left[task] = reqs
        if left:
            self._elsewhere(left)
        names = {r.name for reqs in cancels.values() for r in reqs}
        self._misses = {n: c for n, c in self._misses.items() if n in names}

    def _elsewhere(self, cancels: Cancels) -> None:
        """Requests whose task is no attempt of ours: pending (cancel it), ended (drop them),
        running under a lease (leave them: ours between a claim and its launch, or between an
        attempt's end and its commit; another supervisor's, which applies them)."""
        run = self.run
        where = locate(run.queue, set(cancels))
        for task, reqs in cancels.items():
            state, name = where.get(task, (None, ""))
            if state is State.RUNNING:
                lease = Lease.parse(name)
                if lease is None:  # not a claim of anyone's: nothing will apply it
                    drop_all(run.queue, reqs)
            elif state is State.PENDING:
                cancel_pending(run.queue, run.ledger, reqs, run.cfg.owner)  # False: claimed
            elif state is not None:  # ended already: too late
                for req in reqs:
                    why = f"too late: the task ended {state.value} before the cancel was applied"
                    drop_late(run.queue, run.ledger, req, why, run.cfg.owner)
            else:
                self._missed(reqs)

    def _missed(self, reqs: list[Request]) -> None:
        for req in reqs:
            self._misses[req.name] = misses = self._misses.get(req.name, 0) + 1
            if misses >= MAX_MISSES:
                control.drop(self.run.paths, req)
