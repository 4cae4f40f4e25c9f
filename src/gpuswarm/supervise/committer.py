"""Committing outcomes: judge each ended attempt, move its task on durably, retry or hand back.

The loop never waits for a disk: it hands its outcomes over once per pass, and a committer thread
commits them in batches: the batch's saved descriptors are made durable together (one syncfs
for several, ``DirQueue.grouped_commit``), then each is journaled and renamed in order, and each
destination folder is fsynced once. A waiter thread commits its own attempt's
outcome itself. A failed attempt with attempts left waits out its backoff in running/, under
our lease (:mod:`.retries`); the keeper releases it when it is due.

An attempt a person cancelled (``gpuswarm cancel``, :mod:`.controls`) ends its task
``cancelled``: never retried, not a failure, even when a stop came too; only an attempt that was
done for sure before the cancel took effect stays done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue as threadq
import time
from collections.abc import Callable

from gpuswarm.agents.pricing import usage_fields
from gpuswarm.agents.spend import event_fields
from gpuswarm.config.models import TaskSpec
from gpuswarm.core import faults
from gpuswarm.core.errors import LeaseLostError
from gpuswarm.core.events import Ev
from gpuswarm.core.logs import cap_log
from gpuswarm.core.models import AttemptRecord, EndKind, State
from gpuswarm.exec.base import AttemptEnd
from gpuswarm.exec.plan import Outcome, judge, record_of
from gpuswarm.store.queue import Claimed
from gpuswarm.store.release import released
from gpuswarm.supervise.context import LiveAttempt, Shared
from gpuswarm.supervise.controls import drop_late, move_cancelled
from gpuswarm.supervise.oom import sized_oom_retry, with_usage
from gpuswarm.supervise.retries import DelayedRetries, requeued

MAX_BACKOFF_SECONDS = 600.0
COMMITTERS = 1  # threads that commit outcomes (the loop never waits for a disk)
COMMIT_BATCH = 64  # outcomes committed together (one fsync per destination folder)

Committable = tuple[LiveAttempt, AttemptEnd]


class Committer:
    def __init__(
        self,
        run: Shared,
        on_ended: Callable[[State, str], None] | None = None,
        on_attempt: Callable[[AttemptRecord], None] | None = None,
    ) -> None:
        self.run = run
        self._on_ended = on_ended  # a task ended (done, failed, skipped): the halt counts
        self._on_attempt = on_attempt  # an attempt recorded: the budget counts (issue 34)
        self._queue: threadq.SimpleQueue[list[Committable] | None] = threadq.SimpleQueue()
        self._to_commit: list[Committable] = []  # the loop's outcomes, handed over before it sleeps
        self._commits = 0  # outcomes queued or being committed
        self.retries = DelayedRetries(run, self.after_end)  # retries waiting out their backoff

    # -- the loop's side ---------------------------------------------------------------------------
    def add(self, live: LiveAttempt, end: AttemptEnd) -> None:
        """Queue an outcome (loop thread); it is handed over at :meth:`hand_over`."""
        with self.run.lock:
            self._commits += 1
        self._to_commit.append((live, end))

    def hand_over(self) -> None:
        """Give the committer what the loop settled since it last slept: one hand-over (one
        thread wake-up) per loop pass, not one per outcome."""
        if self._to_commit:
            batch, self._to_commit = self._to_commit, []
            self._queue.put(batch)

    def busy(self) -> bool:
        with self.run.lock:
            return self._commits > 0

    def uncommitted(self) -> int:
        """Outcomes the loop handed over (or is about to) that are not committed yet."""
        with self.run.lock:
            return self._commits

    def end_threads(self, count: int) -> None:
        for _ in range(count):
            self._queue.put(None)

    # -- the committer thread ----------------------------------------------------------------------
    def serve(self) -> None:
        """Commit the outcomes the loop queued, in batches: one folder fsync per batch."""
        try:
            self._serve()
        finally:
            with contextlib.suppress(OSError):
                self.run.queue.drop_spares()  # the files its group commits kept

    def _serve(self) -> None:
        done = False
        while not done:
            item = self._queue.get()
            batch: list[Committable] = []
            while item is not None:
                batch.extend(item)
                if len(batch) >= COMMIT_BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except threadq.Empty:
                    break
            done = item is None
            try:  # one flush of the batch's saved descriptors, one fsync per folder
                with self.run.queue.batched_dir_syncs(), self.run.queue.grouped_commit():
                    for live, end in batch:
                        self.commit(live, end)
            except BaseException as exc:  # a bug or a broken disk: stop the run, keep the queue
                self.run.fail(exc)  # (what was not committed is re-run after a resume)
            with self.run.lock:
                self._commits -= len(batch)
                last = self._commits == 0
            if last:
                self.run.wakeup()  # the loop may be waiting for the last commit to end the run

    # -- one outcome -------------------------------------------------------------------------------
    def commit(self, live: LiveAttempt, end: AttemptEnd) -> None:
        """Judge the attempt and move its task on, durably (descriptor, event, rename)."""
        run = self.run
        record = with_usage(record_of(end, live.slot, live.gpu_ids, live.attempt), live.usage)
        cap_log(run.paths.attempt_log(live.task_id, live.attempt), run.cfg.max_log_bytes)
        if live.fenced:
            return  # reclaimed while it ran: the reclaimer's queue now, nothing of it is written
        if live.stalled is not None and end.kind is EndKind.CANCELLED:  # issue 34: its own end
            end = dataclasses.replace(end, kind=EndKind.STALLED, reason=live.stalled)
            record = record.but(kind=EndKind.STALLED.value, reason=live.stalled)
        if live.over_usd is not None and end.kind is EndKind.CANCELLED:  # max_usd (issue 34)
            end = dataclasses.replace(end, kind=EndKind.SIGNALED, reason=live.over_usd)
        try:
            if live.stopped_by is not None:
                self._cancelled(live, end, record)
                return
            if end.kind is EndKind.CANCELLED or _lost_again(live, end):
                why = "lost" if end.kind is EndKind.LOST else "interrupted"
                self.hand_back(live.claimed, live.task, record, why)
                return
            outcome = self._judge(live, end, record)
            stopped = live.handle.cancelled and live.stalled is None and live.over_usd is None
            if stopped and not _done_in_stop(live.task, end, outcome):
                why = f"cancelled ({end.reason}; not done: {outcome.reason})"
                record = outcome.record.but(kind=EndKind.CANCELLED.value, reason=why)
                self.hand_back(live.claimed, live.task, record)
                return
            self._finish(live.claimed, live.task, outcome, live.reserved_mb)
        except LeaseLostError:
            run.lease_lost(live.task_id, live.attempt, "its outcome is not committed")

    def _judge(self, live: LiveAttempt, end: AttemptEnd, record: AttemptRecord) -> Outcome:
        run = self.run
        data = live.claimed.data
        return judge(
            run.paths, live.task, end, live.values, record, data, base_dir=run.cfg.base_dir
        )

    def _cancelled(self, live: LiveAttempt, end: AttemptEnd, record: AttemptRecord) -> None:
        """A person cancelled this attempt: its task ends cancelled, the attempt recorded;
        unless it was done for sure before the cancel took effect (then done stands)."""
        run = self.run
        reqs = live.stopped_by
        assert reqs is not None
        if end.kind is not EndKind.CANCELLED:
            outcome = self._judge(live, end, record)
            if _done_in_stop(live.task, end, outcome):
                self._finish(live.claimed, live.task, outcome, grouped=False)  # journaled first
                why = f"too late: attempt {live.attempt} was done before the cancel took effect"
                for req in reqs:  # applied to nothing: the task was done already
                    drop_late(run.queue, run.ledger, req, why, run.cfg.owner)
                return
            why = f"cancelled ({end.reason}; not done: {outcome.reason})"
            record = outcome.record.but(kind=EndKind.CANCELLED.value, reason=why)
        faults.point("committer.cancel.ended", task=live.task_id)
        live.claimed.desc.add_attempt(record)
        move_cancelled(run.queue, run.ledger, live.claimed, reqs, run.cfg.owner, live.slot.label)
        self.after_end(live.task_id, State.CANCELLED)

    def _finish(
        self,
        claimed: Claimed,
        task: TaskSpec,
        outcome: Outcome,
        reserved: int | None = None,
        *,
        grouped: bool = True,
    ) -> None:
        """The task moves on (done, failed, skipped, a retry); ``grouped``: inside a
        committer's batch, its move is made durable with the batch's others (see
        ``DirQueue.grouped_commit``)."""
        run = self.run
        desc = claimed.desc
        state = outcome.state
        retry = state is State.FAILED and desc.attempts_used + 1 < task.max_attempts
        retry = retry and not outcome.final  # issue 34: over max_usd: no retry
        if retry and outcome.record.oom:  # issue 19: the retry reserves more GPU memory
            outcome = sized_oom_retry(desc, outcome, reserved)
        desc.add_attempt(outcome.record)
        if self._on_attempt is not None:
            self._on_attempt(outcome.record)
        used = desc.attempts_used
        delay = self.backoff(used) if retry and not run.stopping.is_set() else 0
        ended = state is State.SKIPPED or (state is State.FAILED and not retry)
        desc.reason = outcome.reason if ended else None
        if delay > 0:  # wait in running/ under our lease; the keeper requeues it when due
            at = desc.retry_at = round(time.time() + delay, 3)
            run.queue.save(claimed)
            self.retries.add(at, claimed)
        rec = outcome.record
        target = State.PENDING if retry else state

        def announce() -> None:
            run.ledger.emit(
                Ev.FINISHED,
                task=task.id,
                attempt=rec.n,
                slot=rec.slot,
                state="waiting" if delay > 0 else ("pending" if retry else state.value),
                reason=outcome.reason,
                seconds=rec.duration,
                retry=retry,
                retry_in=round(delay, 3),
                max_attempts=task.max_attempts,
                used=used,  # attempts of the current budget: "used/max_attempts"
                **event_fields(rec),  # issue 34: an agent's tokens and cost
            )

        def moved() -> None:  # the outcome is in place (after its group's flush, when grouped)
            if retry and delay <= 0:
                run.more_work()
            if not retry:
                self.after_end(task.id, state)  # issue 35: its dependents released
            if not retry and self._on_ended is not None:
                self._on_ended(state, task.id)

        def lost() -> None:  # in a group commit, the lease found gone at its flush
            run.lease_lost(task.id, rec.n, "its outcome is not committed")

        if delay > 0:
            announce()
            moved()
        elif grouped:  # in a committer's batch: made durable with the others
            run.queue.move(claimed, target, announce, after=moved, lost=lost)
        else:
            run.queue.move(claimed, target, announce)
            moved()

    def after_end(self, task_id: str, state: State) -> None:
        """Issue 35: a task ended, its dependents are released (or end) now."""
        if released(self.run.queue, self.run.ledger, task_id, state):
            self.run.more_work()

    def backoff(self, used: int) -> float:
        base = self.run.cfg.retry_backoff
        return 0.0 if base <= 0 else min(MAX_BACKOFF_SECONDS, base * 2 ** max(0, used - 1))

    def hand_back(
        self,
        claimed: Claimed,
        task: TaskSpec,
        record: AttemptRecord | None,
        reason: str = "interrupted",
    ) -> None:
        """A stop interrupted this task (or its node left: ``lost``): back to pending/, not
        counted as a failed attempt."""
        if record is not None:
            if task.usage is not None:  # an agent stopped midway spent too (issue 34)
                record = record.but(**usage_fields(self.run.paths.attempt_log(task.id, record.n),
                                                   task.usage))  # fmt: skip
                if self._on_attempt is not None:
                    self._on_attempt(record)
            claimed.desc.add_attempt(record.but(interrupted=True, reason=self._why(record)))
        claimed.desc.note_interrupted()
        announce = requeued(self.run.ledger, claimed, reason, "running")
        self.run.queue.move(claimed, State.PENDING, announce)
        with self.run.lock:
            self.run.requeued += 1

    def _why(self, record: AttemptRecord) -> str | None:
        """An interrupted attempt's reason: what stopped it, never "cancelled" (its task is
        back in the queue, not cancelled): ``interrupted by Ctrl-C (SIGINT) (stopped by
        SIGTERM); back in the queue``."""
        cause = self.run.stop_cause
        if cause is None or not self.run.stopping.is_set():
            return record.reason  # a node that left (lost): its own reason
        how = (record.reason or "").removeprefix("cancelled").strip(" ()")
        return f"interrupted by {cause}{f' ({how})' if how else ''}; back in the queue"


def _lost_again(live: LiveAttempt, end: AttemptEnd) -> bool:
    """Whether a ``lost`` attempt (its node left the cluster: backend ray) goes back to
    pending/ without counting against ``max_attempts``: the rule resume and reclaim keep too
    (``Descriptor.lost_is_free``); otherwise it is judged a failed attempt."""
    return end.kind is EndKind.LOST and live.claimed.desc.lost_is_free()


def _done_in_stop(task: TaskSpec, end: AttemptEnd, outcome: Outcome) -> bool:
    """An attempt a stop cancelled counts only when it is done for sure: it exited 0 before it
    was signalled, or its completion file (written by this attempt) parses. Exit 0 after the
    stop's SIGTERM alone proves nothing (a graceful-shutdown handler exits 0 too)."""
    if outcome.state is not State.DONE:
        return False
    return task.done_when is not None or end.reason != "exit 0 during the stop's grace period"
