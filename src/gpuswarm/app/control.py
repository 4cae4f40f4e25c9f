"""A person's changes to a run, live or stopped: add, cancel, retry, requeue, pause, priority.

Each verb is a typed request (:mod:`gpuswarm.core.verbs`, one ``Kind`` each) with one
handler (:data:`HANDLERS`: :mod:`.adding`, :mod:`.cancelling`, :mod:`.requeueing`,
:mod:`.pacing`); :func:`execute` runs it under the run's control lock (:mod:`.controlframe`).
The CLI (``cli/control.py``) and the dashboard build requests and print; the handlers do the
work through the store (``store/queue.py`` for every transition, ``store/control.py`` for requests
and pause flags) and journals what it did (``Ev.CONTROL``, ``Ev.ADDED``, ``Ev.REQUEUED``).
Each command first holds the run's control lock and finishes what a killed earlier command
left (``finish_holds``).

What each does on a live and on a stopped run:

- add: (``DirQueue.add_batch``) writes the new descriptors under hidden names (no fsync each),
  syncs once, journals ``added`` (naming the batch), renames them into pending/ and touches the
  ``added`` marker:
  live supervisors rescan pending/ at their next claim, so priorities hold against the tasks
  they had loaded. A crash in between is finished by the next control command or resume
  (:func:`.controlframe.finish_adds`): a batch the journal names is added, one it does not is
  removed; ids never collide (``<id>-2``, ``-3``...), seqs continue after the run's highest.
- cancel: a pending task ends cancelled at once (this command applies it); a running one gets a
  durable request the supervisor holding it applies on its next tick (``--wait`` blocks until it
  left running/). On a stopped run the request waits for the resume (recovery applies it). A task
  that has ended already is left as it is (a note, exit 0: nothing to do). The request is for
  the attempt under way (``store.control.too_late``): it never cancels a later retry.
- retry: failed / cancelled tasks back to pending with a fresh attempt budget (history kept),
  their cancel requests dropped. Nothing is started: a run without a live supervisor is
  finished with ``gpuswarm resume``.
- requeue: any ended task (done included) back to pending as a fresh attempt series
  (``DirQueue.requeue``: held, saved, journaled, renamed; a cut-short one is finished by
  :func:`.controlframe.finish_adds`).
- pause / unpause: the run's (or one slot's) pause flag; running tasks go on.
- priority: a pending task's new priority (its claim order). A running task's priority cannot
  change (it applies to pending tasks only): exit 2 saying so.

add, retry, unpause and priority touch the run's ``added`` marker: the keeper of every live
supervisor, on any host, stats it four times a second and wakes its loop to claim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, overload

from gpuswarm.app import groups, replies
from gpuswarm.app.adding import add
from gpuswarm.app.cancelling import cancel
from gpuswarm.app.controlframe import Session, in_session
from gpuswarm.app.pacing import pause, priority
from gpuswarm.app.requeueing import requeue, retry
from gpuswarm.config.commands import task_dumps
from gpuswarm.config.load import LoadedConfig
from gpuswarm.core import verbs
from gpuswarm.core.errors import BadInputError
from gpuswarm.core.verbs import Prerequisites as After
from gpuswarm.store.names import PRIORITY_LIMIT


def add_tasks(run_dir: Path, loaded: LoadedConfig, after: After | None = None) -> replies.AddReply:
    """Append ``loaded``'s tasks to a run (live or not; ``after``: prerequisites, issue 35)."""
    source = str(loaded.path) if loaded.path else "<stdin>"
    return execute(run_dir, verbs.Add(tuple(task_dumps(loaded.tasks)), source, **(after or {})))


def cancel_tasks(
    run_dir: Path, args: Sequence[str], *, reason: str, wait: float | None
) -> replies.CancelReply:
    """Cancel tasks: pending ones now, running ones by a request (``wait`` seconds: block
    until they left running/). Each row: task, was, now, note."""
    return execute(run_dir, verbs.Cancel(tuple(args), reason, wait))


def retry_tasks(
    run_dir: Path, args: Sequence[str], *, failed: bool, cancelled: bool
) -> replies.RetryReply:
    """Failed / cancelled tasks (named, or every one with ``failed`` / ``cancelled``) back to
    pending with a fresh attempt budget."""
    return execute(run_dir, verbs.Retry(tuple(args), failed=failed, cancelled=cancelled))


def requeue_tasks(run_dir: Path, args: Sequence[str]) -> replies.RetryReply:
    """Ended tasks back to pending as a fresh attempt series (``verbs.Requeue``)."""
    return execute(run_dir, verbs.Requeue(tuple(args)))


def set_paused(run_dir: Path, slot: str | None, *, paused: bool) -> replies.PauseReply:
    """Pause (or unpause) the run, or one slot (an id as ``status`` shows it)."""
    return execute(run_dir, verbs.Pause(slot) if paused else verbs.Unpause(slot))


def set_priority(run_dir: Path, task: str, priority: int) -> replies.PriorityReply:
    """A pending task's new priority (higher runs first)."""
    if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
        raise BadInputError(
            f"priority {priority}: use -{PRIORITY_LIMIT}..{PRIORITY_LIMIT} (higher runs first)"
        )
    return execute(run_dir, verbs.Priority(task, priority))


# -- the verbs -------------------------------------------------------------------------------
Handler = Callable[[Session, Any], replies.Reply]  # Any: each handler takes its own request

#: one handler per verb (tests: every ``verbs.Kind`` has one)
HANDLERS: dict[verbs.Kind, Handler] = {
    verbs.Kind.ADD: add,
    verbs.Kind.CANCEL: cancel,
    verbs.Kind.RETRY: retry,
    verbs.Kind.REQUEUE: requeue,
    verbs.Kind.PAUSE: pause,
    verbs.Kind.UNPAUSE: pause,
    verbs.Kind.PRIORITY: priority,
}


@overload
def execute(run_dir: Path, req: verbs.Add) -> replies.AddReply: ...
@overload
def execute(run_dir: Path, req: verbs.Cancel) -> replies.CancelReply: ...
@overload
def execute(run_dir: Path, req: verbs.Retry | verbs.Requeue) -> replies.RetryReply: ...
@overload
def execute(run_dir: Path, req: verbs.Pause | verbs.Unpause) -> replies.PauseReply: ...
@overload
def execute(run_dir: Path, req: verbs.Priority) -> replies.PriorityReply: ...
def execute(run_dir: Path, req: verbs.Verb) -> replies.Reply:
    """Apply one typed request to the run at ``run_dir`` by its kind's handler, under the run's
    control lock (what a killed earlier command left is finished first); what the handler
    leaves for later (``cancel --wait``) runs once the lock is released."""
    handler = HANDLERS[req.kind]  # a Cancel's or Retry's --group: its tasks named (issue 35)
    return in_session(run_dir, lambda s: handler(s, groups.named(s.paths, req)))
