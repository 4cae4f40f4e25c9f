"""The supervisor: one process, one event loop that keeps every GPU slot busy.

A slot claims the next task the moment it is free (no rounds, no waiting for the slowest). One
thread (the loop) claims, launches and collects every slot's attempts: it sleeps in one ``poll()``
on every attempt's pidfd and a wake-up pipe, so the common case (a process exits, nothing of it is
left) costs no thread switch. An attempt that needs time (its timeout expires, a stop cancels it,
something of it outlives its main process, or no pidfd is available) is handed to a waiter thread
that runs the blocking path (TERM, grace, KILL, leftovers) and hands the slot back.

The first stop request (Ctrl-C / SIGTERM) is a warm shutdown: no more claims, running attempts are
stopped (SIGTERM, grace, SIGKILL) and handed back to pending/ as interrupted, not as failed
attempts. The second is cold: everything is SIGKILLed at once, then handed back the same way.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import queue as threadq
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.errors import LeaseLostError
from gpuswarm.core.logs import LogPump, cap_log
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.local.process import (
    Attempt,
    AttemptEnd,
    EndKind,
    become_subreaper,
    sweep_orphans,
)
from gpuswarm.exec.plan import (
    Outcome,
    judge,
    launch_spec_for,
    record_of,
    set_aside_stale,
    skipped,
    slot_base_env,
    values_for,
)
from gpuswarm.exec.sandbox import Provision, prepare_home
from gpuswarm.placement.gpus import Slot
from gpuswarm.store.leases import owner_file
from gpuswarm.store.ledger import Ev, Ledger
from gpuswarm.store.queue import Claimed, DirQueue, State, attempts_used, lease_of, task_id_of
from gpuswarm.store.runs import reclaim_dead
from gpuswarm.supervise.breaker import Breaker, quarantine_file, write_quarantine

HEARTBEAT_SECONDS = 5.0
IDLE_POLL_SECONDS = 2.0  # an idle supervisor re-checks a queue other supervisors still work on
MAX_BACKOFF_SECONDS = 600.0
FAST_TICK = 0.02  # the keeper's tick while some log grows past its cap
LINGER_POLL_SECONDS = 0.1  # a lingering idle supervisor looks for new tasks this often
COMMITTERS = 1  # threads that commit outcomes (the loop never waits for a disk)
COMMIT_BATCH = 64  # outcomes committed together (one fsync per destination folder)
MAX_SLEEP_MS = 3_600_000  # poll() takes a C int of milliseconds (24.8 days): re-armed after


@dataclass(frozen=True)
class SupervisorConfig:
    slots: list[Slot]
    base_dir: Path  # default cwd of tasks
    owner: str
    isolate_home: bool = False
    provisions: tuple[Provision, ...] = ()
    heartbeat: float = HEARTBEAT_SECONDS
    lease_ttl: float = 30.0  # a lease whose owner shows no heartbeat for this long is reclaimed
    retry_backoff: float = 1.0  # wait before attempt n+1: backoff * 2**(n-1), 0 = none
    breaker_failures: int = 5  # quarantine a slot whose last N attempts all failed ...
    breaker_window: float = 60.0  # ... within this many seconds; 0 failures = never
    breaker_cooldown: float = 300.0  # a quarantined slot is probed again after this long
    max_log_bytes: int = 256 << 20  # each attempt's output.log is kept under this size
    linger: float = 0.0  # an idle supervisor waits this long for new tasks before it ends


@dataclass
class LiveAttempt:
    """An attempt between its launch and its outcome (what the keeper and views look at)."""

    slot: Slot
    task_id: str
    name: str
    attempt: int
    started: float
    handle: Attempt
    claimed: Claimed
    task: TaskSpec
    gpu_ids: tuple[int, ...]
    values: dict[str, str]
    fd: int | None = None  # the pidfd the loop polls (the attempt closes it once it ends)
    fenced: bool = False  # its lease was renamed away (reclaimed): killed, never committed


# (slot, end, error, slow: from a waiter, task id, neutral: an end the breaker ignores)
Returned = tuple[Slot, AttemptEnd | None, BaseException | None, bool, str, bool]
Committable = tuple[LiveAttempt, AttemptEnd]


class Supervisor:
    def __init__(self, paths: RunPaths, queue: DirQueue, ledger: Ledger, cfg: SupervisorConfig):
        self.paths = paths
        self.queue = queue
        self.ledger = ledger
        self.cfg = cfg
        self.stopping = threading.Event()
        self.cold = False
        self._lock = threading.Lock()
        self._generation = 0  # bumped when tasks may have come back to pending/
        self.live: dict[int, LiveAttempt] = {}
        self.errors: list[BaseException] = []
        self.quarantined: list[dict[str, Any]] = []
        self._delayed: list[tuple[float, int, Claimed]] = []  # retries waiting for their backoff
        self._delay_seq = 0
        self._done_keeping = threading.Event()
        self._log_sizes: dict[Path, int] = {}
        self._reclaimer: threading.Thread | None = None
        self._busy_at = time.monotonic()  # last claim or release (the linger counts from it)
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self._returns: threadq.SimpleQueue[Returned] = threadq.SimpleQueue()
        self._waiters: list[threading.Thread] = []
        self._by_fd: dict[int, LiveAttempt] = {}  # attempts the loop itself watches
        self._slow = 0  # attempts in waiter threads
        self._poller = select.poll()
        self._homes: dict[int, dict[str, str]] = {}  # slot -> its base environment
        self.breaker = Breaker(cfg.breaker_failures, cfg.breaker_window, cfg.breaker_cooldown)
        self._cooling: dict[int, tuple[float, Slot]] = {}  # quarantined: slot -> (probe at, slot)
        self._qfiles: set[int] = set()  # quarantined slots whose file was written (can be lifted)
        self._lifted: threadq.SimpleQueue[int] = threadq.SimpleQueue()  # lifted by hand
        self._commit_queue: threadq.SimpleQueue[list[Committable] | None] = threadq.SimpleQueue()
        self._to_commit: list[Committable] = []  # the loop's outcomes, handed over before it sleeps
        self._commits = 0  # outcomes queued or being committed
        self._pump = LogPump()  # attempts write into pipes; it holds every log's cap

    # -- top level -----------------------------------------------------------------------------
    def run(self) -> None:
        """Run every slot until the queue is drained or a stop is requested."""
        become_subreaper()
        labels = [s.label for s in self.cfg.slots]
        self.ledger.emit(Ev.SUPERVISOR_STARTED, owner=self.cfg.owner, slots=labels, pid=os.getpid())
        loop = threading.Thread(target=self._loop_main, name="slots", daemon=True)
        keeper = threading.Thread(target=self._keep_safely, name="keeper", daemon=True)
        committers = [
            threading.Thread(target=self._committer, name=f"commit-{i}", daemon=True)
            for i in range(COMMITTERS)
        ]
        self._pump.start()
        for thread in (keeper, *committers, loop):
            thread.start()
        while loop.is_alive():
            loop.join(0.5)  # wakes for signal handlers in the main thread
        for _ in committers:
            self._commit_queue.put(None)
        for thread in committers:
            while thread.is_alive():
                thread.join(0.5)
        self._done_keeping.set()
        keeper.join()
        if self._reclaimer is not None:
            self._reclaimer.join()
        self._release_delayed(everything=True)
        sweep_orphans(f"{self.paths.root.name}/")
        self._pump.stop()
        self.ledger.emit(
            Ev.SUPERVISOR_STOPPED, owner=self.cfg.owner, stopped=self.stopping.is_set()
        )
        self.ledger.sync()
        with contextlib.suppress(FileNotFoundError):
            owner_file(self.paths, self.cfg.owner).unlink()
        for index in list(self._cooling):  # summary.json keeps the record; the files are live
            label = self._cooling[index][1].label
            with contextlib.suppress(FileNotFoundError):
                quarantine_file(self.paths, label, self.cfg.owner).unlink()
        fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:  # a stop request from now on must not write into a reused fd number
            os.close(fd)
        if self.errors:
            raise self.errors[0]

    def request_stop(self, *, cold: bool = False) -> None:
        """Warm stop on the first call, cold on the second (or when ``cold``)."""
        first = not self.stopping.is_set()
        self.cold = self.cold or cold or not first
        self.stopping.set()
        with contextlib.suppress(OSError):  # a full disk must not keep the stop from happening
            self.ledger.emit(Ev.SHUTDOWN, mode="cold" if self.cold else "warm")
        for live in list(self.live.values()):
            live.handle.cancel(hard=self.cold)
        self._wakeup()

    def _stop_on_error(self) -> None:
        """A warm stop after an error; more errors (a full disk fails every commit) do not
        turn it into a cold one: the running attempts still get their SIGTERM and grace."""
        if not self.stopping.is_set():
            self.request_stop()

    def _wakeup(self) -> None:
        """Make the loop look again (safe from signal handlers and any thread)."""
        if self._wake_w < 0:  # the run is over
            return
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _more_work(self) -> None:
        """Tasks may have come back to pending/ (a retry, a reclaim): claim again."""
        with self._lock:
            self._generation += 1
        self._wakeup()

    def _keep(self) -> None:
        """Cap logs, release due retries; heartbeat and reclaim less often.

        It ticks once a second, faster (down to 20 ms) while a log grows fast, so a flooding task
        overshoots its cap by little; the heartbeat runs at least four times per lease_ttl.
        """
        beat_every = min(self.cfg.heartbeat, self.cfg.lease_ttl / 4)
        next_beat = next_reclaim = 0.0
        tick = min(1.0, beat_every)
        while not self._done_keeping.wait(tick):
            now = time.monotonic()
            tick = min(1.0, beat_every) if self._cap_logs() else FAST_TICK
            self._release_delayed(everything=self.stopping.is_set())
            self._check_leases()
            if self._cooling:  # a cool-down may be over, or a quarantine lifted by hand
                self._wakeup()
            if now >= next_beat:
                next_beat = now + beat_every
                self.ledger.sync()
                with contextlib.suppress(FileNotFoundError):
                    os.utime(owner_file(self.paths, self.cfg.owner))
            if now >= next_reclaim and not self.stopping.is_set():
                next_reclaim = now + self.cfg.lease_ttl / 3
                if self._reclaimer is None or not self._reclaimer.is_alive():
                    # its own thread: killing a dead owner's stubborn leftovers takes a grace
                    # period, and the heartbeat must not wait for it
                    self._reclaimer = threading.Thread(target=self._reclaim, daemon=True)
                    self._reclaimer.start()

    def _check_leases(self) -> None:
        """Kill every attempt whose lease file is gone (a reclaimer renamed it away while this
        supervisor was stalled): one stat per running attempt, no folder scan. Its outcome is
        never committed (the fenced writes would refuse it anyway)."""
        for live in list(self.live.values()):
            if live.fenced or os.path.lexists(live.claimed.path):
                continue
            if self.live.get(live.slot.index) is not live:
                continue  # it ended meanwhile: its commit is fenced
            live.fenced = True
            self._lease_lost(live.task_id, live.attempt, "its attempt is killed")
            live.handle.cancel(hard=True)

    def _lease_lost(self, task_id: str, attempt: int | None, what: str) -> None:
        self.ledger.emit(
            Ev.LEASE_LOST,
            task=task_id,
            attempt=attempt,
            owner=self.cfg.owner,
            reason=f"lease lost (another supervisor reclaimed the task): {what}",
        )

    def _keep_safely(self) -> None:
        """The keeper, started again after an error (a full disk: a retry that cannot be
        requeued, a journal that cannot be synced): the run stops, keeping goes on."""
        while True:
            try:
                self._keep()
                return
            except Exception as exc:
                if not self.stopping.is_set():
                    self.errors.append(exc)
                    self.request_stop()
                if self._done_keeping.wait(1.0):
                    return

    def _cap_logs(self) -> bool:
        """Cap every live attempt's log; False when one is growing fast (check again soon).

        Attempts launched through the log pump need none of this (the pump holds the cap)."""
        if self._pump is not None:
            return True
        calm = True
        sizes: dict[Path, int] = {}
        for live in list(self.live.values()):
            path = self.paths.attempt_log(live.task_id, live.attempt)
            if cap_log(path, self.cfg.max_log_bytes):
                calm = False
            with contextlib.suppress(FileNotFoundError):
                sizes[path] = path.stat().st_size
                if sizes[path] - self._log_sizes.get(path, 0) > self.cfg.max_log_bytes // 8:
                    calm = False
        self._log_sizes = sizes
        return calm

    def _reclaim(self) -> None:
        owner = self.cfg.owner
        if reclaim_dead(self.queue, self.ledger, owner, lease_ttl=self.cfg.lease_ttl):
            self._more_work()

    def _release_delayed(self, *, everything: bool) -> None:
        """Move retries whose backoff is over (or all of them, on stop) back to pending/."""
        now = time.time()
        while True:
            with self._lock:
                if not self._delayed or (not everything and self._delayed[0][0] > now):
                    return
                _, _, claimed = heapq.heappop(self._delayed)
            claimed.data.pop("retry_at", None)
            try:
                self.queue.move(claimed, State.PENDING, self._requeued(claimed, "retry", "waiting"))
            except LeaseLostError:
                self._lease_lost(claimed.task_id, None, "its retry is left to the reclaimer")
                continue
            self._more_work()

    def _requeued(self, claimed: Claimed, reason: str, frm: str) -> Callable[[], object]:
        return lambda: self.ledger.emit(Ev.REQUEUED, task=claimed.task_id, reason=reason, frm=frm)

    # -- the loop --------------------------------------------------------------------------------
    def _loop_main(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug or a broken disk: stop the run, keep the queue
            self.errors.append(exc)
            self.request_stop()
            self._hand_over()  # outcomes already known are still committed
            with contextlib.suppress(BaseException):
                self._drain()

    def _loop(self) -> None:
        self._poller.register(self._wake_r, select.POLLIN)
        free: deque[Slot] = deque()
        for slot in self.cfg.slots:
            self._homes[slot.index] = slot_base_env(self._prepare_home(slot))
            free.append(slot)
        seen = -1
        while True:
            self._collect_returns(free)
            self._back_in_rotation(free)
            if self.stopping.is_set():
                self._hand_all_to_waiters()
                if self._slow == 0 and not self._committing():
                    return
                self._sleep(None)
                continue
            with self._lock:
                generation = self._generation
            if free and generation != seen:
                seen = generation
                if self._fill(free):
                    seen = -1  # a slot got a task: the next free slot may claim at once
                    continue
            busy = bool(self._by_fd) or self._slow > 0 or self._committing()
            if busy:
                poll = LINGER_POLL_SECONDS if free and self.cfg.linger > 0 else None
            else:
                wait, poll = self._idle_wait()
                if not wait:
                    return
            if self._sleep(self._timeout(poll)):
                seen = -1  # a poll interval is over: look at pending/ again

    def _fill(self, free: deque[Slot]) -> bool:
        """Claim and launch for free slots; True when at least one got a task."""
        got = False
        while free and not self.stopping.is_set():
            slot = free[0]
            claimed = self.queue.claim(self.cfg.owner, slot.index)
            if claimed is None:
                return got
            free.popleft()
            got = True
            self._busy_at = time.monotonic()
            self._start(slot, claimed, free)
        return got

    def _committing(self) -> bool:
        with self._lock:
            return self._commits > 0

    def _idle_wait(self) -> tuple[bool, float | None]:
        """Nothing of ours runs and nothing is claimable: wait (and how long between looks at
        pending/; None = until woken) or end?"""
        with self._lock:
            if self._delayed:
                return True, None  # the keeper wakes us when a retry's backoff is over
        if self._others_running():
            return True, IDLE_POLL_SECONDS  # their retries land in pending/, or they die
        if time.monotonic() - self._busy_at < self.cfg.linger:
            return True, LINGER_POLL_SECONDS  # new tasks may be enqueued
        return False, None

    def _timeout(self, poll: float | None) -> float | None:
        """The poll interval, or sooner when a running attempt's timeout expires."""
        now = time.monotonic()
        deadlines = [d for live in self._by_fd.values() if (d := live.handle.deadline) is not None]
        if deadlines:
            left = max(0.0, min(deadlines) - now)
            return left if poll is None else min(left, poll)
        return poll

    def _hand_over(self) -> None:
        """Give the committer what the loop settled since it last slept: one hand-over (one
        thread wake-up) per loop pass, not one per outcome."""
        if self._to_commit:
            batch, self._to_commit = self._to_commit, []
            self._commit_queue.put(batch)

    def _sleep(self, timeout: float | None) -> bool:
        """Wait for an exit, a wake-up or ``timeout``; handle what happened. True on timeout."""
        self._hand_over()
        ms = None if timeout is None else min(MAX_SLEEP_MS, max(0, int(timeout * 1000 + 0.999)))
        ready = self._poller.poll(ms)
        for fd, _ in ready:
            if fd == self._wake_r:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
            elif fd in self._by_fd:
                self._exited(self._by_fd[fd])
        now = time.monotonic()
        for live in list(self._by_fd.values()):
            deadline = live.handle.deadline
            if deadline is not None and deadline <= now:
                self._to_waiter(live)  # its timeout: TERM, grace, KILL take time
        return not ready

    def _exited(self, live: LiveAttempt) -> None:
        self._unwatch(live)
        end = live.handle.end_if_clean()
        if end is None:
            self._to_waiter(live)  # something of it is left (or a stop cancelled it)
            return
        self._returns.put(self._settle(live, end))

    def _unwatch(self, live: LiveAttempt) -> None:
        """Stop polling the attempt's pidfd (before it is closed: the number may be reused)."""
        fd, live.fd = live.fd, None
        if fd is not None:
            del self._by_fd[fd]
            self._poller.unregister(fd)

    def _to_waiter(self, live: LiveAttempt) -> None:
        """Let a thread run the blocking end of this attempt (stop, grace, leftovers)."""
        self._unwatch(live)
        self._slow += 1
        waiter = threading.Thread(target=self._wait_slow, args=(live,), daemon=True)
        self._waiters = [w for w in self._waiters if w.is_alive()]
        self._waiters.append(waiter)
        waiter.start()

    def _wait_slow(self, live: LiveAttempt) -> None:
        try:
            self._returns.put(self._settle(live, live.handle.wait(), slow=True))
        except BaseException as exc:
            self._returns.put((live.slot, None, exc, True, live.task_id, False))
        self._wakeup()

    def _hand_all_to_waiters(self) -> None:
        for live in list(self._by_fd.values()):
            live.handle.cancel(hard=self.cold)
            self._to_waiter(live)

    def _drain(self) -> None:
        """After a loop error: stop what runs and wait for it (nothing runs unsupervised)."""
        self._hand_all_to_waiters()
        for waiter in self._waiters:
            waiter.join()

    def _collect_returns(self, free: deque[Slot]) -> None:
        """Slots whose attempt has an outcome: back in rotation, unless their breaker trips."""
        while True:
            try:
                slot, end, exc, slow, task_id, neutral = self._returns.get_nowait()
            except threadq.Empty:
                return
            self._slow -= slow
            self._busy_at = time.monotonic()
            if exc is not None:  # a bug or a broken disk: stop the run, keep the queue
                self.errors.append(exc)
                self._stop_on_error()
                continue
            if end is not None and not self._breaker_lets(slot, task_id, end, neutral, free):
                continue
            free.append(slot)
            with self._lock:
                self._generation += 1

    def _others_running(self) -> bool:
        """Whether other supervisors hold tasks (they may requeue them, or die and be reclaimed)."""
        return any(
            (lease := lease_of(name)) is not None and lease[0] != self.cfg.owner
            for name in self.queue.names(State.RUNNING)
        )

    # -- one attempt -----------------------------------------------------------------------------
    def _start(self, slot: Slot, claimed: Claimed, free: deque[Slot]) -> None:
        """Launch the claimed task on ``slot`` and watch it (or settle it at once)."""
        try:
            task = TaskSpec.model_validate(claimed.data["task"])
        except ValidationError as exc:  # parseable JSON, but not a task we can run
            first = str(exc).splitlines()[1:2] or ["invalid"]
            self.queue.quarantine(claimed.path, "invalid-task")
            self.ledger.emit(
                Ev.CORRUPT,
                task=task_id_of(claimed.name),
                file=claimed.name,
                reason=f"invalid task: {first[0]}",
            )
            free.appendleft(slot)
            return
        if self.stopping.is_set():  # a stop came between the claim and the launch
            with contextlib.suppress(LeaseLostError):
                self._hand_back(claimed, task, None)
            free.appendleft(slot)
            return
        number = len(claimed.data["attempts"]) + 1
        gpu_ids = slot.gpu_ids[: task.gpus] if task.gpus else slot.gpu_ids
        values = values_for(self.paths, task, slot, gpu_ids, number)
        spec = launch_spec_for(
            self.paths,
            task,
            slot,
            gpu_ids,
            number,
            values,
            base_env=self._homes[slot.index],
            owner=self.cfg.owner,
            base_dir=self.cfg.base_dir,
        )
        try:
            stale = set_aside_stale(self.paths, task, values, number)
        except OSError as exc:  # judged by its time then (an old file never counts)
            self.ledger.emit(Ev.STALE_RESULT, task=task.id, attempt=number, error=str(exc))
            stale = None
        if stale is not None:
            self.ledger.emit(
                Ev.STALE_RESULT,
                task=task.id,
                attempt=number,
                file=str(stale[0].relative_to(self.paths.root)),
                moved_to=str(stale[1].relative_to(self.paths.root)),
            )
        handle = Attempt.launch(spec, pump=self._pump, max_log_bytes=self.cfg.max_log_bytes)
        live = LiveAttempt(
            slot, task.id, task.name, number, time.time(), handle, claimed, task, gpu_ids, values
        )
        self.live[slot.index] = live
        self.ledger.emit(
            Ev.STARTED,
            task=task.id,
            attempt=number,
            slot=slot.label,
            gpus=list(gpu_ids),
            pid=handle.pid,
            name=task.name,
            timeout=task.timeout,
        )
        if handle.done:  # it could not start: its end is known already
            self._returns.put(self._settle(live, handle.wait()))
        elif self.stopping.is_set() or handle.exit_fd is None:
            if self.stopping.is_set():
                handle.cancel(hard=self.cold)
            self._to_waiter(live)
        else:
            live.fd = handle.exit_fd
            self._by_fd[live.fd] = live
            self._poller.register(live.fd, select.POLLIN)

    def _settle(self, live: LiveAttempt, end: AttemptEnd, slow: bool = False) -> Returned:
        """The attempt has ended: its slot is free; its outcome is committed by a committer
        thread (the loop never waits for a disk), or right here in a waiter thread."""
        self.live.pop(live.slot.index, None)
        if slow:
            self._commit(live, end)
        else:
            with self._lock:
                self._commits += 1
            self._to_commit.append((live, end))
        neutral = skipped(live.task, end)
        return live.slot, end, None, slow, live.task_id, neutral

    def _commit(self, live: LiveAttempt, end: AttemptEnd) -> None:
        """Judge the attempt and move its task on, durably (descriptor, event, rename)."""
        record = record_of(end, live.slot, live.gpu_ids, live.attempt)
        cap_log(self.paths.attempt_log(live.task_id, live.attempt), self.cfg.max_log_bytes)
        if live.fenced:
            return  # reclaimed while it ran: the reclaimer's queue now, nothing of it is written
        try:
            if end.kind is EndKind.CANCELLED:
                self._hand_back(live.claimed, live.task, record)
                return
            outcome = judge(self.paths, live.task, end, live.values, record, live.claimed.data)
            if live.handle.cancelled and not self._done_in_stop(live.task, end, outcome):
                record["kind"] = EndKind.CANCELLED.value
                record["reason"] = f"cancelled ({end.reason}; not done: {outcome.reason})"
                self._hand_back(live.claimed, live.task, record)
                return
            self._finish(live.claimed, live.task, outcome)
        except LeaseLostError:
            self._lease_lost(live.task_id, live.attempt, "its outcome is not committed")

    @staticmethod
    def _done_in_stop(task: TaskSpec, end: AttemptEnd, outcome: Outcome) -> bool:
        """An attempt a stop cancelled counts only when it is done for sure: it exited 0 before
        it was signalled, or its completion file (written by this attempt) parses. Exit 0 after
        the stop's SIGTERM alone proves nothing (a graceful-shutdown handler exits 0 too)."""
        if outcome.state is not State.DONE:
            return False
        return task.done_when is not None or end.reason != "exit 0 during the stop's grace period"

    def _committer(self) -> None:
        """Commit the outcomes the loop queued, in batches: one folder fsync per batch."""
        done = False
        while not done:
            item = self._commit_queue.get()
            batch: list[Committable] = []
            while item is not None:
                batch.extend(item)
                if len(batch) >= COMMIT_BATCH:
                    break
                try:
                    item = self._commit_queue.get_nowait()
                except threadq.Empty:
                    break
            done = item is None
            try:
                with self.queue.batched_dir_syncs():
                    for live, end in batch:
                        self._commit(live, end)
            except BaseException as exc:  # a bug or a broken disk: stop the run, keep the queue
                self.errors.append(exc)  # (what was not committed is re-run after a resume)
                self._stop_on_error()
            with self._lock:
                self._commits -= len(batch)
                last = self._commits == 0
            if last:
                self._wakeup()  # the loop may be waiting for the last commit to end the run

    # -- the breaker -------------------------------------------------------------------------------
    def _breaker_lets(
        self, slot: Slot, task_id: str, end: AttemptEnd, neutral: bool, free: deque[Slot]
    ) -> bool:
        """Feed the breaker; False when ``slot`` is quarantined now (it stays out of rotation).
        Successes elsewhere may incriminate slots that are running something else meanwhile:
        those are quarantined when their attempt ends (or now, when they are free)."""
        verdict = self.breaker.record(slot.label, task_id, end, neutral=neutral)
        if verdict == "lift":
            self._unquarantine(slot, "its probe attempt succeeded")
        elif verdict in ("trip", "again"):
            self._quarantine(slot, end, again=verdict == "again")
            return False
        if end.ok:
            for label in self.breaker.others_tripped():
                other = next((s for s in free if s.label == label), None)
                if other is not None:
                    free.remove(other)
                    self._quarantine(other, None, again=False)
        return True

    def _quarantine(self, slot: Slot, end: AttemptEnd | None, *, again: bool) -> None:
        cooldown = self.breaker.quarantined(slot.label)
        n = self.cfg.breaker_failures
        if again:
            reason = f"its probe attempt failed too ({end.reason if end else '?'})"
        else:
            last = f" (last: {end.reason})" if end is not None else ""
            reason = (
                f"its last {n} attempts failed within {self.cfg.breaker_window:g}s while the "
                f"same work succeeded on other slots{last}; check this GPU and its driver"
            )
        probe_at = time.time() + cooldown
        info = {"gpus": list(slot.gpu_ids), "reason": reason, "probe_at": round(probe_at, 3)}
        with self._lock:
            self._cooling[slot.index] = (time.monotonic() + cooldown, slot)
        open_ = [q for q in self.quarantined if q["slot"] == slot.label and q["lifted"] is None]
        if open_:  # a failed probe: the same quarantine goes on
            open_[-1].update(info, probes=open_[-1].get("probes", 0) + 1)
        else:
            self.quarantined.append({"slot": slot.label, **info, "lifted": None})
        try:
            write_quarantine(self.paths, slot.label, self.cfg.owner, info)
            self._qfiles.add(slot.index)
        except OSError:  # shown in the journal and summary still; probed after the cool-down
            self._qfiles.discard(slot.index)
        self.ledger.emit(
            Ev.QUARANTINED,
            slot=slot.label,
            gpus=list(slot.gpu_ids),
            reason=reason,
            probe_in=round(cooldown, 1),
        )

    def _unquarantine(self, slot: Slot, why: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            quarantine_file(self.paths, slot.label, self.cfg.owner).unlink()
        for q in self.quarantined:
            if q["slot"] == slot.label and q["lifted"] is None:
                q["lifted"] = why
        self.ledger.emit(Ev.UNQUARANTINED, slot=slot.label, reason=why)

    def _back_in_rotation(self, free: deque[Slot]) -> None:
        """Quarantined slots whose cool-down is over claim one probe task; slots lifted by hand
        (their quarantine file removed) come back with a clean slate."""
        with self._lock:
            if not self._cooling:
                return
            cooling = dict(self._cooling)
        now = time.monotonic()
        for index, (due, slot) in cooling.items():
            path = quarantine_file(self.paths, slot.label, self.cfg.owner)
            by_hand = index in self._qfiles and not path.exists()
            if not by_hand and due > now:
                continue
            with self._lock:
                self._cooling.pop(index, None)
            if by_hand:
                self.breaker.lifted(slot.label)
                self._unquarantine(slot, "lifted by hand")
            else:
                self.breaker.probe(slot.label)
                self.ledger.emit(Ev.UNQUARANTINED, slot=slot.label, reason="probe", probe=True)
            free.append(slot)
            self._more_work()

    def _prepare_home(self, slot: Slot) -> dict[str, str]:
        if not self.cfg.isolate_home:
            return {}
        return prepare_home(self.paths.slot_home(slot.label), self.cfg.provisions)

    def _finish(self, claimed: Claimed, task: TaskSpec, outcome: Outcome) -> None:
        data = claimed.data
        data["attempts"].append(outcome.record)
        state = outcome.state
        retry = state is State.FAILED and attempts_used(data) < task.max_attempts
        delay = self._backoff(attempts_used(data)) if retry and not self.stopping.is_set() else 0
        ended = state is State.SKIPPED or (state is State.FAILED and not retry)
        data["reason"] = outcome.reason if ended else None
        if delay > 0:  # wait in running/ under our lease; the keeper requeues it when due
            data["retry_at"] = round(time.time() + delay, 3)
            self.queue.save(claimed)
            with self._lock:  # the loop does not end while a retry waits
                self._delay_seq += 1
                heapq.heappush(self._delayed, (data["retry_at"], self._delay_seq, claimed))
        rec = outcome.record

        def announce() -> None:
            self.ledger.emit(
                Ev.FINISHED,
                task=task.id,
                attempt=rec["n"],
                slot=rec["slot"],
                state="waiting" if delay > 0 else ("pending" if retry else state.value),
                reason=outcome.reason,
                seconds=rec["duration"],
                retry=retry,
                retry_in=round(delay, 3),
                max_attempts=task.max_attempts,
                used=attempts_used(data),  # attempts of the current budget: "used/max_attempts"
            )

        if delay > 0:
            announce()
        else:
            self.queue.move(claimed, State.PENDING if retry else state, announce)
        if retry and delay <= 0:
            self._more_work()

    def _backoff(self, used: int) -> float:
        base = self.cfg.retry_backoff
        return 0.0 if base <= 0 else min(MAX_BACKOFF_SECONDS, base * 2 ** max(0, used - 1))

    def _hand_back(self, claimed: Claimed, task: TaskSpec, record: dict[str, Any] | None) -> None:
        """A stop interrupted this task: back to pending/, not counted as a failed attempt."""
        if record is not None:
            record["interrupted"] = True
            claimed.data["attempts"].append(record)
        claimed.data["interruptions"] = claimed.data.get("interruptions", 0) + 1
        self.queue.move(claimed, State.PENDING, self._requeued(claimed, "interrupted", "running"))
