"""``gpuswarm cancel`` (:mod:`gpuswarm.app.control`'s ``cancel`` handler): a pending task ends
cancelled at once; a running one gets a durable request the supervisor holding it applies
(``--wait``: until it left running/, outside the control lock); a blocked one ends with its
dependents (issue 35); an ended one is left as it is.
"""

from __future__ import annotations

import time

from gpuswarm.app import deps, replies
from gpuswarm.app.controlframe import Session, resolve
from gpuswarm.core import verbs
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store import control
from gpuswarm.store.leases import is_live
from gpuswarm.store.names import task_id_of
from gpuswarm.store.queue import DirQueue


def cancel(s: Session, req: verbs.Cancel) -> replies.CancelReply:
    """The ``cancel`` verb's handler."""
    known, ids = resolve(s, req.tasks)
    live = is_live(s.paths)
    rows: list[replies.TaskRow] = []
    for tid in ids:
        state, name = known[tid]
        row: replies.TaskRow = {"task": tid, "was": state.value, "now": state.value, "note": ""}
        gone, state, name = deps.cancel_blocked(s.queue, s.ledger, state, name, req.reason, s.me)
        if gone:
            rows.append({**row, "now": State.CANCELLED.value})  # issue 35: dependents follow
            continue  # (else: where it is now, a release moved it this instant: issue 35)
        state, attempt = control.request_cancel(
            s.queue, tid, state, name, req.reason, s.announce_cancel
        )
        row["was"] = State.PENDING.value if state is State.CANCELLED else state.value
        if state is State.CANCELLED:
            deps.cancelled(s.queue, s.ledger, tid)  # issue 35: its dependents follow
            row["now"] = State.CANCELLED.value
        elif state is State.RUNNING:
            row["now"] = "cancel requested"
            row["attempt"] = attempt
            which = f"attempt {attempt}" if attempt is not None else "it"
            row["note"] = (
                f"its supervisor stops {which} within about a second"
                if live
                else f"no supervisor is live: {which} ends cancelled when the run is resumed"
            )
        else:
            row["note"] = f"already {state.value}: nothing to do"
        rows.append(row)
    result = replies.CancelReply(run=str(s.paths.root), tasks=rows, live=live, timed_out=False)
    asked = [r for r in rows if r["now"] == "cancel requested"]
    if req.wait is not None and asked and live:
        wait, paths = req.wait, s.paths

        def wait_left() -> None:  # outside the control lock: other commands go on meanwhile
            result["timed_out"] = not _wait_left_running(paths, asked, wait)

        s.after.append(wait_left)
    return result


def _wait_left_running(paths: RunPaths, rows: list[replies.TaskRow], timeout: float) -> bool:
    """Poll until every row's task has left running/ (its row's ``now`` updated)."""
    queue = DirQueue(paths)
    deadline = time.monotonic() + timeout
    left = {r["task"]: r for r in rows}
    while True:
        where = {task_id_of(n): st for st in State for n in queue.names(st)}
        for tid in list(left):
            state = where.get(tid)
            if state is not State.RUNNING:
                left.pop(tid)["now"] = state.value if state else "gone"
        if not left:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
