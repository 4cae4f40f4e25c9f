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
retries (:mod:`.committer`), the periodic duties (:mod:`.keeper`), quarantines (:mod:`.quarantine`),
the poll set and the waiter threads (:mod:`.watch`), whether an idle loop waits (:mod:`.idle`).

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
import threading
import time
from collections import deque

from gpuswarm.core.errors import LeaseLostError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import EndKind
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import AttemptEnd, Backend, BackendOptions, create_backend, membership_of
from gpuswarm.exec.plan import skipped, slot_base_env
from gpuswarm.placement.gpus import Slot
from gpuswarm.store.leases import owner_file
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import Claimed, DirQueue
from gpuswarm.supervise.allocation_end import AllocationEnd
from gpuswarm.supervise.budget import Budget
from gpuswarm.supervise.committer import COMMITTERS, Committer
from gpuswarm.supervise.context import LiveAttempt, Shared, SupervisorConfig
from gpuswarm.supervise.groups import gate_of
from gpuswarm.supervise.halt import Halt
from gpuswarm.supervise.heartbeat import Heartbeat
from gpuswarm.supervise.idle import LINGER_POLL_SECONDS, IdleRule
from gpuswarm.supervise.keeper import Keeper
from gpuswarm.supervise.launch import plan_attempt, task_of
from gpuswarm.supervise.membership import SlotSync
from gpuswarm.supervise.packing import GpuPlacement
from gpuswarm.supervise.quarantine import Quarantine
from gpuswarm.supervise.watch import Returned, Watch

__all__ = ["LiveAttempt", "Supervisor", "SupervisorConfig"]


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
        self.attempts = Watch(self._settle, self.stopping)  # pidfds, the wake-up pipe, waiters
        self._homes: dict[int, dict[str, str]] = {}  # slot -> its base environment
        self.slot_sync = SlotSync(
            self.shared, self.backend, self._homes, self._slot_env, self._adopt
        )
        self.idle = IdleRule(self.shared, self.committer, self.gpus, self.slot_sync)

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
        self.committer.retries.release_delayed(everything=True)
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
        self.attempts.close()  # a stop request from now on writes into no reused fd number
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
        self.attempts.wakeup()

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
                self.attempts.drain(cold=self.cold)

    def _loop(self) -> None:
        self.attempts.listen()
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
                    self.attempts.hand_all_to_waiters(cold=self.cold)
                if not self.attempts.busy() and not self.committer.busy():
                    return
                self._sleep(self.attempts.timeout(None))
                continue
            with self._lock:
                generation = self._generation
            if free and (generation != seen or self._gated):
                seen = generation
                if self._fill(free):
                    seen = -1  # a slot got a task: the next free slot may claim at once
                    continue
            busy = self.attempts.busy() or self.committer.busy()
            if busy:
                poll = LINGER_POLL_SECONDS if free and self.cfg.linger > 0 else None
            else:
                wait, poll = self.idle.wait(self._busy_at)
                if not wait and not self._changed_since(generation):
                    return
                if not wait:
                    continue  # tasks came back meanwhile (a retry released): claim them
            if self._sleep(self.attempts.timeout(poll)):
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

    def _sleep(self, timeout: float | None) -> bool:
        """Wait for an exit, a wake-up or ``timeout``; handle what happened. True on timeout."""
        self.committer.hand_over()
        return self.attempts.sleep(timeout)

    def _collect_returns(self, free: deque[Slot]) -> None:
        """Slots whose attempt has an outcome: back in rotation, unless their breaker trips."""
        while (back := self.attempts.take()) is not None:
            slot, end, exc, _, task_id, neutral = back
            self._busy_at = time.monotonic()
            if exc is not None:  # a bug or a broken disk: stop the run, keep the queue
                self.shared.fail(exc)
                continue
            if end is not None and not self.quarantine.lets(slot, task_id, end, neutral, free):
                continue
            free.append(slot)
            with self._lock:
                self._generation += 1

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
            self.attempts.returned(self._settle(live, handle.wait()))
        elif self.stopping.is_set() or handle.exit_fd is None:
            if self.stopping.is_set():
                handle.cancel(hard=self.cold)
            self.attempts.to_waiter(live)  # no wake-up fd: the blocking wait in a thread
        else:
            self.attempts.watch(live, handle.exit_fd)

    def _adopt(self, live: LiveAttempt) -> None:
        """An attempt a dead supervisor started, still known to the backend: waited for."""
        self.live[live.slot.index] = live
        self.attempts.to_waiter(live)

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
