"""Slots that come and go while the loop runs: a backend whose slots are its own (a cluster).

A backend with a :class:`~gpuswarm.exec.base.Membership` (``ray``) reports slot changes; the
loop applies them once per pass (:meth:`SlotSync.sync`, on its own thread, so ``free`` needs no
lock): a new slot gets its registration in ``.parallel/slots/`` (the timeline's lanes), its
base environment and a place among the free slots; a retired slot (its node left) leaves the
free slots and never comes back, while its running attempt ends ``lost`` through its handle;
each change is one ``slots`` event. With ``preflight:``, a slot that joins runs it first (on a
thread: the loop goes on) and joins the free slots only once it passed. A backend that cannot
go on (``fatal``: the cluster's head is gone) stops the run warm, with its reason
(``Shared.ended_by``). Local and docker have no membership: nothing happens here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from gpuswarm.core.errors import PreflightError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import Lease, State
from gpuswarm.exec.base import Adopted, Backend, membership_of
from gpuswarm.exec.plan import values_for
from gpuswarm.placement.gpus import Slot
from gpuswarm.store.leases import add_owner_slots, register_named_slots
from gpuswarm.store.names import task_id_of
from gpuswarm.supervise.context import LiveAttempt, Shared
from gpuswarm.supervise.launch import task_of
from gpuswarm.supervise.preflight import run_preflight


class SlotSync:
    def __init__(
        self,
        run: Shared,
        backend: Backend,
        homes: dict[int, dict[str, str]],
        slot_env: Callable[[Slot], dict[str, str]],
        adopt: Callable[[LiveAttempt], None],
    ) -> None:
        self.run = run
        self.membership = membership_of(backend)
        self.homes = homes
        self.slot_env = slot_env
        self.adopt = adopt
        self.retired: set[str] = set()
        self.slots: dict[str, Slot] = {s.label: s for s in run.cfg.slots}
        self.backend = backend
        self._checked: list[tuple[Slot, str | None]] = []  # preflight ends: (slot, failure)
        self._checked_lock = threading.Lock()
        self.checking: set[str] = set()  # joined slots whose preflight runs
        self._waiting = False  # a `waiting` event was written (no slot left)

    def _adopt(self, found: Adopted, free: deque[Slot]) -> None:
        """Wait for an attempt a dead supervisor started (recovery left its task in running/
        under our lease); one whose task is not ours any more is ended."""
        run = self.run
        mine = Lease.owner_mark(run.cfg.owner)
        name = next(
            (
                n
                for n in run.queue.names(State.RUNNING)
                if mine in n and task_id_of(n) == found.task_id
            ),
            None,
        )
        task = None
        if name is not None:
            claimed = run.queue.adopt_running(name)
            task = task_of(run, claimed)
        if name is None or task is None or claimed.desc.next_attempt != found.attempt:
            found.handle.cancel(hard=True)
            threading.Thread(target=found.handle.wait, daemon=True).start()
            return
        slot = found.slot
        gpu_ids = slot.gpu_ids[: task.gpus] if task.gpus else slot.gpu_ids
        values = values_for(run.paths, task, slot, gpu_ids, found.attempt)
        live = LiveAttempt(
            slot,
            task.id,
            task.name,
            found.attempt,
            time.time(),
            found.handle,
            claimed,
            task,
            gpu_ids,
            values,
        )
        if slot in free:
            free.remove(slot)
        run.ledger.emit(
            Ev.SLOTS, change="adopted", task=task.id, attempt=found.attempt, slots=[slot.label]
        )
        self.adopt(live)

    def watch(self) -> None:
        """Start noticing changes (the backend wakes the loop when there are some)."""
        if self.membership is not None:
            self.membership.watch(self.run.wakeup)

    def sync(self, free: deque[Slot]) -> list[Slot]:
        """Apply what changed since the last pass to ``free`` (the loop's thread); returns the
        slots added."""
        if self.membership is None:
            return []
        changes = self.membership.changes()
        run = self.run
        if run.cfg.preflight and changes.added:
            self._preflight(changes.added)  # they join the free slots once it passed
            added = []
        else:
            added = changes.added
        added = [*added, *self._passed()]
        if added:
            self._waiting = False
            cfg = run.cfg
            register_named_slots(run.paths, cfg.owner, added, cfg.lease_ttl)
            add_owner_slots(run.paths, cfg.owner, added)  # a lease names its slot
            for slot in added:
                self.homes[slot.index] = self.slot_env(slot)
                self.slots[slot.label] = slot
                free.append(slot)
        for found in changes.adopted:
            self._adopt(found, free)
        self.retired.update(changes.retired)
        for note in changes.notes:
            run.ledger.emit(Ev.SLOTS, **note)
        if self.retired:
            for slot in [s for s in free if s.label in self.retired]:
                free.remove(slot)
        if changes.fatal and run.ended_by is None:
            run.ended_by = changes.fatal
            run.request_stop()  # warm: what still runs ends (lost) and goes back to the queue
            run.ledger.emit(Ev.SLOTS, change="backend_lost", reason=changes.fatal)
        if added or changes.retired:
            run.more_work()
        return added

    def waiting_for_slots(self) -> bool:
        """A cluster's run with tasks to do and none of its slots left (every node gone, the
        head still there): it waits for a node to join instead of ending (one ``slots`` event
        ``waiting`` says so) -- a GPU that drops out must not end the run."""
        run = self.run
        if self.membership is None or run.ended_by is not None or run.stopping.is_set():
            return False
        if set(self.slots) - self.retired or self.checking:
            return False
        may_grow = getattr(self.membership, "may_grow", None)
        if may_grow is not None and not may_grow():
            return False  # (a live node whose actors died gets no new ones: the run ends)
        if run.queue.counts()[State.PENDING] == 0:
            return False
        if not self._waiting:
            self._waiting = True
            run.ledger.emit(
                Ev.SLOTS,
                change="waiting",
                reason="no slot left (every node of the run is gone): waiting for one to join",
            )
        return True

    # -- preflight of the slots that join ------------------------------------------------------
    def _preflight(self, slots: list[Slot]) -> None:
        """The ``preflight:`` commands on each joined slot, on a thread of its own (a node's
        checks never hold the loop); the slot claims nothing until they passed, and a slot
        that failed them never does (one ``slots`` event ``preflight_failed`` says why)."""
        for slot in slots:
            self.checking.add(slot.label)
            threading.Thread(
                target=self._check, args=(slot,), name=f"preflight-{slot.label}", daemon=True
            ).start()

    def _check(self, slot: Slot) -> None:
        cfg = self.run.cfg
        failure: str | None = None
        try:
            run_preflight(
                self.run.paths,
                [slot],
                cfg.preflight,
                cwd=cfg.base_dir,
                isolate=cfg.isolate_home,
                provisions=cfg.provisions,
                base_env=cfg.base_env,
                backend=self.backend,
                max_log_bytes=cfg.max_log_bytes,
            )
        except PreflightError as exc:
            said, _, log = str(exc).partition("\nlog: ")
            log = log.split(" (no task was started", 1)[0]  # (untrue here: the run goes on)
            failure = f"{said} (log: {log})" if log else said
        except Exception as exc:  # its node died meanwhile: the slot is gone anyway
            failure = f"preflight on {slot.label} could not run: {exc}"
        with self._checked_lock:
            self._checked.append((slot, failure))
        self.run.wakeup()

    def _passed(self) -> list[Slot]:
        """The joined slots whose preflight ended since the last pass that passed it (and
        are still there); a ``slots`` event for every one."""
        with self._checked_lock:
            done, self._checked = self._checked, []
        passed = []
        for slot, failure in done:
            self.checking.discard(slot.label)
            if failure is not None:
                self.run.ledger.emit(
                    Ev.SLOTS, change="preflight_failed", slots=[slot.label], reason=failure
                )
            elif slot.label not in self.retired:
                self.run.ledger.emit(Ev.PREFLIGHT, ok=True, slots=[slot.label])
                passed.append(slot)
        return passed
