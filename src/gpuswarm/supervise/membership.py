"""Slots that come and go while the loop runs: a backend whose slots are its own (a cluster).

A backend with a :class:`~gpuswarm.exec.base.Membership` (``ray``) reports slot changes; the
loop applies them once per pass (:meth:`SlotSync.sync`, on its own thread, so ``free`` needs no
lock): a new slot gets its registration in ``.parallel/slots/`` (the timeline's lanes), its
base environment and a place among the free slots; a retired slot (its node left) leaves the
free slots and never comes back, while its running attempt ends ``lost`` through its handle;
each change is one ``slots`` event. Local and docker have no membership: nothing happens here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from gpuswarm.core.events import Ev
from gpuswarm.exec.base import Backend, membership_of
from gpuswarm.placement.gpus import Slot
from gpuswarm.store.leases import register_named_slots
from gpuswarm.supervise.context import Shared


class SlotSync:
    def __init__(
        self,
        run: Shared,
        backend: Backend,
        homes: dict[int, dict[str, str]],
        slot_env: Callable[[Slot], dict[str, str]],
    ) -> None:
        self.run = run
        self.membership = membership_of(backend)
        self.homes = homes
        self.slot_env = slot_env
        self.retired: set[str] = set()
        self.slots: dict[str, Slot] = {s.label: s for s in run.cfg.slots}

    def watch(self) -> None:
        """Start noticing changes (the backend wakes the loop when there are some)."""
        if self.membership is not None:
            self.membership.watch(self.run.wakeup)

    def sync(self, free: deque[Slot]) -> None:
        """Apply what changed since the last pass to ``free`` (the loop's thread)."""
        if self.membership is None:
            return
        changes = self.membership.changes()
        run = self.run
        if changes.added:
            cfg = run.cfg
            register_named_slots(run.paths, cfg.owner, changes.added, cfg.lease_ttl)
            for slot in changes.added:
                self.homes[slot.index] = self.slot_env(slot)
                self.slots[slot.label] = slot
                free.append(slot)
        self.retired.update(changes.retired)
        for note in changes.notes:
            run.ledger.emit(Ev.SLOTS, **note)
        if self.retired:
            for slot in [s for s in free if s.label in self.retired]:
                free.remove(slot)
        if changes.added or changes.retired:
            run.more_work()
