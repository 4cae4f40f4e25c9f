"""``gpuswarm retry`` and ``requeue`` (:mod:`gpuswarm.app.control`'s handlers): ended tasks back
to pending. A retry takes failed / cancelled tasks with a fresh attempt budget (history kept); a
requeue takes any ended task, done too, as a fresh attempt series. Their cancel requests are
dropped first (made for an attempt that ended); dependents follow (issue 35, :mod:`.deps`).
"""

from __future__ import annotations

from collections.abc import Callable

from gpuswarm.app import deps, replies
from gpuswarm.app.controlframe import (
    NotApplicableError,
    Session,
    requeue_announce,
    resolve,
    resume_hint,
)
from gpuswarm.core import verbs
from gpuswarm.core.events import Ev
from gpuswarm.core.models import Descriptor, State
from gpuswarm.store import control
from gpuswarm.store.leases import is_live
from gpuswarm.store.queuebase import note_added


def retry(s: Session, req: verbs.Retry) -> replies.RetryReply:
    """The ``retry`` verb's handler."""
    known, ids = resolve(s, req.tasks)
    deps.check_requeue(known, ids, "retry")  # issue 35: not a dependency_failed task
    for tid in ids:
        state = known[tid][0]
        if state in (State.DONE, State.SKIPPED):
            raise NotApplicableError(
                f"task {tid!r} is {state.value}: retry applies to failed or cancelled tasks"
            )
    wanted = set(ids)
    wanted |= {t for t, (st, _) in known.items() if req.failed and st is State.FAILED}
    wanted |= {t for t, (st, _) in known.items() if req.cancelled and st is State.CANCELLED}
    rows: list[replies.TaskRow] = []
    back = {t for t in wanted if known[t][0] in (State.FAILED, State.CANCELLED)}
    _drop_requests(s, back)
    gate = deps.Gate(s.queue, s.ledger, known, back, "retry", s.me)  # issue 35
    for tid in sorted(wanted):
        state, name = known[tid]
        row: replies.TaskRow = {"task": tid, "was": state.value, "now": state.value, "note": ""}
        if state in (State.FAILED, State.CANCELLED):
            gate.move(row, s.queue.retry, state, name, _retry_announce(s, state))
        else:
            row["note"] = f"{state.value}: not ended, nothing to do"
        rows.append(row)
    return _requeued(s, rows, gate)


def requeue(s: Session, req: verbs.Requeue) -> replies.RetryReply:
    """The ``requeue`` verb's handler."""
    known, ids = resolve(s, req.tasks)
    deps.check_requeue(known, ids, "requeue")  # issue 35: as retry
    back = {t for t in ids if known[t][0].is_terminal()}
    _drop_requests(s, back)
    rows: list[replies.TaskRow] = []
    gate = deps.Gate(s.queue, s.ledger, known, back, "requeue", s.me)  # issue 35
    for tid in ids:
        state, name = known[tid]
        row: replies.TaskRow = {"task": tid, "was": state.value, "now": state.value, "note": ""}
        if not state.is_terminal():
            row["note"] = f"{state.value}: not ended, nothing to do"
        else:
            gate.move(row, s.queue.requeue, state, name, requeue_announce(s.ledger, s.me, state))
        rows.append(row)
    return _requeued(s, rows, gate)


def _requeued(s: Session, rows: list[replies.TaskRow], gate: deps.Gate) -> replies.RetryReply:
    deps.retried(s.queue, s.ledger, rows)  # issue 35: dependency_failed dependents back
    gate.settle()
    if any(r["now"] == State.PENDING.value for r in rows):
        note_added(s.paths)
    live = is_live(s.paths)
    return {
        "run": str(s.paths.root),
        "tasks": rows,
        "retried": sum(1 for r in rows if r["now"] in deps.BACK),
        "live": live,
        "hint": "" if live or not rows else resume_hint(s.paths),
    }


def _drop_requests(s: Session, tasks: set[str]) -> None:
    """The requests of the tasks a retry requeues (made for an attempt that ended), dropped
    before the tasks are pending again; journaled as such."""
    for req in control.drop_requests(s.paths, tasks):
        more = {"attempt": req.attempt} if req.attempt is not None else {}
        s.ledger.emit(
            Ev.CONTROL,
            request=req.kind,
            task=req.task,
            by=req.by,
            applied_by=s.me,
            **more,
            dropped="too late: the task ended before it was applied; retried since",
        )


def _retry_announce(s: Session, frm: State) -> Callable[[Descriptor], object]:
    def announce(desc: Descriptor) -> None:
        s.ledger.emit(
            Ev.CONTROL,
            request="retry",
            task=desc.id,
            by=s.me,
            applied_by=s.me,
            state=State.PENDING.value,
            frm=frm.value,
        )
        s.ledger.emit(Ev.REQUEUED, task=desc.id, frm=frm.value, reason="retry")

    return announce
