"""``gpuswarm pause`` / ``unpause`` and ``priority`` (:mod:`gpuswarm.app.control`'s handlers):
whether pending tasks start (the run's, a slot's or a group's pause flag; running tasks go on)
and which starts next (a pending task's priority, its claim order). No task changes state.
"""

from __future__ import annotations

from gpuswarm.app import groups, replies
from gpuswarm.app.controlframe import NotApplicableError, Session, resolve
from gpuswarm.core import verbs
from gpuswarm.core.errors import BadInputError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import Descriptor, State
from gpuswarm.store import control
from gpuswarm.store.leases import is_live, registered_slot_ids
from gpuswarm.store.queuebase import note_added


def pause(s: Session, req: verbs.Pause | verbs.Unpause) -> replies.PauseReply:
    """The ``pause`` and ``unpause`` verbs' handler."""
    slot, paused = req.slot, req.kind is verbs.Kind.PAUSE
    if req.group is not None:  # issue 35: the group's flag
        return groups.set_group_paused(s.paths, req.group, paused=paused)
    if slot is not None:
        slots = registered_slot_ids(s.paths)
        if slots and slot not in slots and slot not in control.paused(s.paths).slots:
            raise BadInputError(
                f"slot {slot!r}: this run has no such slot; its slots: {', '.join(slots)}"
            )
    try:
        changed = (control.pause if paused else control.unpause)(s.paths, slot)
    except ValueError as exc:
        raise BadInputError(f"--slot: {exc}") from None
    if changed and not paused:
        note_added(s.paths)  # live supervisors look again now, not at their next tick
    if changed:  # a whole-run pause names no slot (a null slot is a line readers skip)
        where = {"slot": slot} if slot is not None else {}
        s.ledger.emit(Ev.CONTROL, request=req.kind.value, **where, by=s.me, applied_by=s.me)
    now = control.paused(s.paths)
    return {
        "run": str(s.paths.root),
        "slot": slot,
        "changed": changed,
        "paused": now.run,
        "paused_slots": sorted(now.slots),
        "live": is_live(s.paths),
    }


def priority(s: Session, req: verbs.Priority) -> replies.PriorityReply:
    """The ``priority`` verb's handler."""
    new = req.priority
    known, (tid,) = resolve(s, [req.task])
    state, name = known[tid]
    desc = s.queue.read_desc(state, name)
    was = desc.priority if desc is not None else None

    def announce(d: Descriptor) -> None:
        s.ledger.emit(
            Ev.CONTROL,
            request="priority",
            task=tid,
            priority=new,
            by=s.me,
            applied_by=s.me,
            state=State.PENDING.value,
        )

    if state is not State.PENDING or s.queue.reprioritize(tid, new, announce) is None:
        now = State.RUNNING.value if state is State.PENDING else state.value
        raise NotApplicableError(
            f"task {tid!r} is {now}: a priority applies to pending tasks only (it decides "
            "which starts next); a running task keeps its place"
        )
    note_added(s.paths)
    return {"run": str(s.paths.root), "task": tid, "priority": new, "was": was}
