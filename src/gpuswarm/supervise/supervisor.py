"""The supervisor: one process, one event loop that keeps every GPU slot busy.

A slot claims the next task the moment it is free (no rounds, no waiting for the slowest). One
thread (the loop) claims, launches and collects every slot's attempts: it sleeps in one ``poll()``
on every attempt's wake-up fd (a pidfd, for the local backend) and a wake-up pipe, so the common
case (a process exits, nothing of it is left) costs no thread switch. An attempt that needs time
(its timeout expires, a stop cancels it, something of it outlives its main process, or its
backend offers no wake-up fd) is handed to a waiter thread that runs the blocking path (TERM,
grace, KILL, leftovers) and hands the slot back.

The loop talks to attempts through :class:`gpuswarm.exec.base.Handle` only; what runs them is a
:class:`~gpuswarm.exec.base.Backend`. The other roles are their own modules: committing and
retries (:mod:`.committer`), the periodic duties (:mod:`.keeper`), quarantines (:mod:`.quarantine`).

The first stop request (Ctrl-C / SIGTERM) is a warm shutdown: no more claims, running attempts are
stopped (SIGTERM, grace, SIGKILL) and handed back to pending/ as interrupted, not as failed
attempts. The second is cold: everything is SIGKILLed at once, then handed back the same way.

Control (:mod:`.controls`, applied by the keeper): a cancelled attempt goes to a waiter like a
stopped one and its task ends ``cancelled``; a paused slot (``gpuswarm pause [--slot S]``) claims
nothing while its running attempt goes on. A supervisor with nothing running, some of whose
slots are paused while pending/ still holds tasks, waits (it does not end as if the run were
done) until the pause is lifted (the keeper wakes it), pending/ is empty (it looks every few
seconds) or it is stopped: a person who paused a run expects to unpause it and see it go on.
The halt (:mod:`.halt`): ``soon`` claims nothing more and ends once what runs has ended;
``now`` is a warm stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue as threadq
import select
import threading
import time
from collections import deque

from gpuswarm.core.errors import LeaseLostError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import EndKind, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import AttemptEnd, Backend, BackendOptions, create_backend, membership_of
from gpuswarm.exec.plan import skipped, slot_base_env
from gpuswarm.placement.gpus import Slot
from gpuswarm.store.leases import owner_file
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.names import lease_of
from gpuswarm.store.queue import Claimed, DirQueue
from gpuswarm.supervise.allocation_end import AllocationEnd
from gpuswarm.supervise.budget import Budget
from gpuswarm.supervise.committer import COMMITTERS, Committer
from gpuswarm.supervise.context import LiveAttempt, Shared, SupervisorConfig
from gpuswarm.supervise.groups import gate_of
from gpuswarm.supervise.halt import Halt
from gpuswarm.supervise.heartbeat import Heartbeat
from gpuswarm.supervise.keeper import Keeper
from gpuswarm.supervise.launch import plan_attempt, task_of
from gpuswarm.supervise.membership import SlotSync
from gpuswarm.supervise.outside_stop import ended, from_outside
from gpuswarm.supervise.packing import GpuPlacement
from gpuswarm.supervise.quarantine import Quarantine

__all__ = ["LiveAttempt", "Supervisor", "SupervisorConfig"]

IDLE_POLL_SECONDS = 2.0  # an idle supervisor re-checks a queue other supervisors still work on
LINGER_POLL_SECONDS = 0.1  # a lingering idle supervisor looks for new tasks this often
MAX_SLEEP_MS = 3_600_000  # poll() takes a C int of milliseconds (24.8 days): re-armed after

# (slot, end, error, slow: from a waiter, task id, neutral: an end the breaker ignores)
Returned = tuple[Slot, AttemptEnd | None, BaseException | None, bool, str, bool]


class Supervisor:
    def __init__(
        self,
        paths: RunPaths,
        queue: DirQueue,
        ledger: Ledger,
        cfg: SupervisorConfig,
        backend: Backend | None = None,
    ):
        self.paths = paths
        self.queue = queue
        self.ledger = ledger
        self.cfg = cfg
        options = BackendOptions(max_log_bytes=cfg.max_log_bytes, scope=f"{paths.root.name}/")
        self.backend = backend or create_backend(cfg.backend, options)
        self.shared = Shared(paths, queue, ledger, cfg, self._wakeup, self._more_work, self._stop)
        self.stopping = self.shared.stopping
        self.live = self.shared.live
        self.errors = self.shared.errors
        self.cold = False
        self._lock = self.shared.lock
        self._generation = 0  # bumped when tasks may have come back to pending/
        self.halt = Halt(cfg.halt, queue, ledger, on_soon=self._wakeup, on_now=self._stop)
        self._gated = False  # the halt held a claim back until outcomes are committed
        self.budget = Budget(  # issue 34: what the agents may spend
            cfg.budget_usd, cfg.budget_tokens, cfg.budget_on_exceed, paths, ledger,
            on_soon=self._wakeup, on_now=self._stop,
        )  # fmt: skip
        self.committer = Committer(
            self.shared, on_ended=self.halt.ended, on_attempt=self.budget.spent
        )
        self.quarantine = Quarantine(self.shared)
        self.keeper = Keeper(self.shared, self.backend, self.committer, self.quarantine.cooling)
        # a cluster's GPUs are on its nodes: this host's NVML knows none of them (issue 16)
        query = membership_of(self.backend) is None
        self.gpus = GpuPlacement(self.shared, cfg.slots, query)  # VRAM sampler, reservations (19)
        self.groups = gate_of(paths)  # issue 35: max_parallel, pause --group
        self.quarantined = self.quarantine.quarantined  # store.quarantines.Quarantined each
        self.until = AllocationEnd(queue, cfg.claim_until)  # a Slurm allocation's end (36)
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
        self.slot_sync = SlotSync(
            self.shared, self.backend, self._homes, self._slot_env, self._adopt
        )

    # -- top level -----------------------------------------------------------------------------
    def run(self) -> None:
        """Run every slot until the queue is drained or a stop is requested."""
        self.backend.open()
        self.slot_sync.watch()  # a cluster's nodes join and leave (issue 16)
        self.gpus.start()
        self.keeper.control.refresh_pause()  # a paused run claims nothing from the start
        labels = [s.label for s in self.cfg.slots]
        self.ledger.emit(Ev.SUPERVISOR_STARTED, owner=self.cfg.owner, slots=labels, pid=os.getpid())
        loop = threading.Thread(target=self._loop_main, name="slots", daemon=True)
        keeper = threading.Thread(target=self.keeper.serve, name="keeper", daemon=True)
        committers = [
            threading.Thread(target=self.committer.serve, name=f"commit-{i}", daemon=True)
            for i in range(COMMITTERS)
        ]
        beat = Heartbeat(self.shared)  # its own thread: no duty and no shutdown delays it
        beat.start()
        for thread in (keeper, *committers, loop):
            thread.start()
        while loop.is_alive():
            loop.join(0.5)  # wakes for signal handlers in the main thread
        self.committer.end_threads(len(committers))
        for thread in committers:
            while thread.is_alive():
                thread.join(0.5)
        self.keeper.stop(keeper)
        self.committer.release_delayed(everything=True)
        self.backend.close()
        self.gpus.close()
        self.ledger.emit(
            Ev.SUPERVISOR_STOPPED, owner=self.cfg.owner, stopped=self.stopping.is_set()
        )
        self.ledger.sync()
        beat.stop()  # beating until the owner file goes: never taken for dead while closing
        with contextlib.suppress(FileNotFoundError):
            owner_file(self.paths, self.cfg.owner).unlink()
        self.quarantine.remove_files()
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

    def _stop(self, cause: str | None = None) -> None:
        if cause is not None:  # halt now: the warm stop a Ctrl-C takes, the halt its cause
            self.shared.stopped_by(cause)
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

    # -- the loop --------------------------------------------------------------------------------
    def _loop_main(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug or a broken disk: stop the run, keep the queue
            self.errors.append(exc)
            self.request_stop()
            self.committer.hand_over()  # outcomes already known are still committed
            with contextlib.suppress(BaseException):
                self._drain()

    def _loop(self) -> None:
        self._poller.register(self._wake_r, select.POLLIN)
        free: deque[Slot] = deque()
        for slot in self.cfg.slots:
            self._homes[slot.index] = self._slot_env(slot)
            free.append(slot)
        seen = -1
        while True:
            self._collect_returns(free)
            self.quarantine.back_in_rotation(free)
            self.gpus.add_slots(self.slot_sync.sync(free))
            if self.stopping.is_set() or self.halt.draining or self.budget.draining:
                if self.stopping.is_set():
                    self._hand_all_to_waiters()
                if not self._by_fd and self._slow == 0 and not self.committer.busy():
                    return
                self._sleep(self._timeout(None))
                continue
            with self._lock:
                generation = self._generation
            if free and (generation != seen or self._gated):
                seen = generation
                if self._fill(free):
                    seen = -1  # a slot got a task: the next free slot may claim at once
                    continue
            busy = bool(self._by_fd) or self._slow > 0 or self.committer.busy()
            if busy:
                poll = LINGER_POLL_SECONDS if free and self.cfg.linger > 0 else None
            else:
                wait, poll = self._idle_wait()
                if not wait and not self._changed_since(generation):
                    return
                if not wait:
                    continue  # tasks came back meanwhile (a retry released): claim them
            if self._sleep(self._timeout(poll)):
                seen = -1  # a poll interval is over: look at pending/ again

    def _fill(self, free: deque[Slot]) -> bool:
        """Claim and launch for free slots; True when at least one got a task. Which slots
        may claim what (GPU memory, a GPU still releasing) is :mod:`.packing`'s."""
        got = self._gated = False
        self.gpus.begin_pass()
        while free and not self.stopping.is_set():
            uncommitted = self.committer.uncommitted()
            if not (self.halt.may_claim(uncommitted) and self.budget.may_claim(uncommitted)):
                self._gated = True  # the committer wakes the loop once they are committed
                return got
            claimed = None
            with self.gpus.claiming():  # this host's other supervisors wait meanwhile
                for slot in self.gpus.candidates(free, self.shared.holds):
                    accept = self.until.wrap(self.groups.wrap(self.gpus.accept(slot)))  # 35, 36
                    claimed = self.queue.claim(self.cfg.owner, slot.index, accept)
                    if claimed is not None:
                        self.gpus.reserve(slot, claimed)  # before its CUDA context exists
                        break
            if claimed is None:
                self.gpus.none_fit()
                self._gated = self.groups.take_refused()  # issue 35: look again once woken
                return got
            free.remove(slot)
            got = True
            self._busy_at = time.monotonic()
            self._start(slot, claimed, free)
        return got

    def _changed_since(self, generation: int) -> bool:
        with self._lock:
            return self._generation != generation

    def _idle_wait(self) -> tuple[bool, float | None]:
        """Nothing of ours runs and nothing is claimable: wait (and how long between looks at
        pending/; None = until woken) or end?"""
        if self.committer.waiting():
            return True, None  # the keeper wakes us when a retry's backoff is over
        if self._others_running():
            return True, IDLE_POLL_SECONDS  # their retries land in pending/, or they die
        if time.monotonic() - self._busy_at < self.cfg.linger:
            return True, LINGER_POLL_SECONDS  # new tasks may be enqueued
        if self.queue.paths.enqueue_spool.exists():  # a streamed enqueue: more are coming
            return True, LINGER_POLL_SECONDS
        if self._paused_with_work():  # the keeper wakes us when the pause changes; the
            return True, IDLE_POLL_SECONDS  # look: other supervisors may empty pending/
        if self.gpus.waiting():  # tasks wait for GPU memory (the sampler wakes us on room)
            return True, IDLE_POLL_SECONDS
        if self.slot_sync.checking and self.queue.counts()[State.PENDING] > 0:
            return True, IDLE_POLL_SECONDS  # joined slots run their preflight (then wake us)
        if self.slot_sync.waiting_for_slots():  # a cluster's nodes all gone: one may join
            return True, IDLE_POLL_SECONDS
        return False, None

    def _paused_with_work(self) -> bool:
        """Some of our slots are paused and pending/ still holds tasks (they would claim)."""
        if not any(self.shared.holds(s) for s in self.cfg.slots):
            return False
        return self.queue.counts()[State.PENDING] > 0

    def _timeout(self, poll: float | None) -> float | None:
        """The poll interval, or sooner when a running attempt's timeout expires."""
        now = time.monotonic()
        deadlines = [d for live in self._by_fd.values() if (d := live.handle.deadline) is not None]
        if deadlines:
            left = max(0.0, min(deadlines) - now)
            return left if poll is None else min(left, poll)
        return poll

    def _sleep(self, timeout: float | None) -> bool:
        """Wait for an exit, a wake-up or ``timeout``; handle what happened. True on timeout."""
        self.committer.hand_over()
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
            if live.ending:  # a cancel, a stall, max_usd crossed (issue 34)
                self._to_waiter(live)  # a person cancelled it: TERM, grace, KILL take time
                continue
            deadline = live.handle.deadline
            if deadline is not None and deadline <= now:
                self._to_waiter(live)  # its timeout: TERM, grace, KILL take time
        return not ready

    def _exited(self, live: LiveAttempt) -> None:
        self._unwatch(live)
        if (end := live.handle.end_if_clean()) is None or from_outside(live, end):
            self._to_waiter(live)  # something of it is left, a stop cancelled it, or a stop
            return  # signal from outside killed it: its supervisor's may follow (.outside_stop)
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
            self._returns.put(self._settle(live, ended(live, self.stopping), slow=True))
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
                self.shared.fail(exc)
                continue
            if end is not None and not self.quarantine.lets(slot, task_id, end, neutral, free):
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
        task = task_of(self.shared, claimed)
        if task is None or self.stopping.is_set():
            self.gpus.unreserve(slot, claimed)
        if task is None:
            free.appendleft(slot)
            return
        if self.stopping.is_set():  # a stop came between the claim and the launch
            with contextlib.suppress(LeaseLostError):
                self.committer.hand_back(claimed, task, None)
            free.appendleft(slot)
            return
        plan = plan_attempt(self.shared, task, slot, claimed, self._homes[slot.index], self.backend)
        handle = self.backend.launch(plan.spec)
        live = LiveAttempt(
            slot,
            task.id,
            task.name,
            plan.number,
            time.time(),
            handle,
            claimed,
            task,
            plan.gpu_ids,
            plan.values,
        )
        self.live[slot.index] = live
        self.gpus.launched(live)
        self.ledger.emit(
            Ev.STARTED,
            task=task.id,
            attempt=plan.number,
            slot=slot.label,
            gpus=list(plan.gpu_ids),
            pid=handle.pid,
            name=task.name,
            timeout=task.timeout,
        )
        if handle.done:  # it could not start: its end is known already
            self._returns.put(self._settle(live, handle.wait()))
        elif self.stopping.is_set() or handle.exit_fd is None:
            if self.stopping.is_set():
                handle.cancel(hard=self.cold)
            self._to_waiter(live)  # no wake-up fd: the blocking wait in a thread
        else:
            live.fd = handle.exit_fd
            self._by_fd[live.fd] = live
            self._poller.register(live.fd, select.POLLIN)

    def _adopt(self, live: LiveAttempt) -> None:
        """An attempt a dead supervisor started, still known to the backend: waited for."""
        self.live[live.slot.index] = live
        self._to_waiter(live)

    def _settle(self, live: LiveAttempt, end: AttemptEnd, slow: bool = False) -> Returned:
        """The attempt has ended: its slot is free; its outcome is committed by a committer
        thread (the loop never waits for a disk), or right here in a waiter thread."""
        self.live.pop(live.slot.index, None)
        live.usage = self.gpus.ended(live)
        if slow:
            self.committer.commit(live, end)
        else:
            self.committer.add(live, end)
        neutral = skipped(live.task, end)
        if live.stopped_by is not None and not end.ok:  # a person's cancel: never the device's
            end = dataclasses.replace(end, kind=EndKind.CANCELLED)  # (what the breaker sees)
        return live.slot, end, None, slow, live.task_id, neutral

    def _slot_env(self, slot: Slot) -> dict[str, str]:
        """The slot's base environment: the supervisor's, with its private home over it."""
        home = self.paths.slot_home(slot.label) if self.cfg.isolate_home else None
        return slot_base_env(
            self.cfg.base_env, self.backend.prepare_slot(home, self.cfg.provisions)
        )
