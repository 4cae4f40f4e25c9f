"""GPU memory in the claim path (issue 19): the VRAM sampler's owner, the reservations of our
attempts, and the placement predicate the slot loop hands :meth:`DirQueue.claim`.

- **Measured.** Every launched attempt is watched by the sampler
  (:class:`gpuswarm.placement.vram.VramSampler`) with its handle's ``pids``; its end hands the
  attempt's :class:`~gpuswarm.placement.vram.Usage` to the committer (its record).
- **Reserved from launch.** A task reserves its need on its GPUs the moment it is claimed,
  before its CUDA context exists, so tasks claimed in the same pass never double-book: claims
  happen one after the other in the loop thread, each seeing the ones before. The other
  supervisors of this host see them too (:class:`~gpuswarm.placement.hostbook.HostBook`: each
  publishes what it takes per GPU; a whole claim is made under the host's guard lock). The
  need is the descriptor's raised ``gpu_memory_mb`` (after an out-of-memory end), else the
  task's declared ``gpu_memory``; a running attempt whose processes hold more than its
  reservation counts with what it holds (plus :data:`.reservations.MARGIN`). A task that
  declares nothing reserves ``1/gpu_share`` of its GPU (``gpu_share`` = the ``tasks_per_gpu``
  the config set; 1: the whole GPU, today's one task per GPU) and ignores foreign memory, as
  before.
- **Fits.** A declared need fits a GPU when ``total - foreign - ours >= need``: memory held by
  processes that are not this run's counts as used; a task that fits nowhere waits (the loop
  claims again when room appears: an attempt ends, a GPU is released, a foreign process exits).
  A need larger than the GPU's whole memory waits for nothing: it fits when the GPU is empty of
  ours (it may run alone and fail, never wait forever).
- **Released before reuse.** A GPU with an ended attempt whose processes still hold memory
  takes no task until NVML shows them gone; past the sampler's ``release_timeout`` it is
  reported held (event ``gpu_held``) and skipped until it is free (``gpu_freed``).
- **OOM.** :func:`.oom.oom_retry_need` sizes the next attempt of a task that ended in CUDA
  out-of-memory: 1.25x its observed peak (or its reservation), never less than it had.

Without a GPU query (simulated GPUs, no driver) nothing is measured, totals come from discovery
(``memory_mb``, where known), and a GPU of unknown size fits every need.

The booking and its arithmetic (room per GPU, what the host's other supervisors are told) are
:class:`.reservations.Reservations`'; this module decides which slot claims what, and when.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from gpuswarm.core.events import Ev
from gpuswarm.core.models import Descriptor, State
from gpuswarm.placement.devices import Gpu, Vendor, model_matches
from gpuswarm.placement.gpus import Slot
from gpuswarm.placement.hostbook import HostBook
from gpuswarm.placement.nvml import GpuQuery, open_query
from gpuswarm.placement.vram import GpuState, Usage, VramSampler
from gpuswarm.store.queue import Claimed
from gpuswarm.supervise.oom import gib
from gpuswarm.supervise.reservations import Reservations, declared_of, need_of

if TYPE_CHECKING:
    from gpuswarm.supervise.context import LiveAttempt, Shared

BACKFILL_LIMIT_SECONDS = 120.0  # a task passed over this long holds back the ones behind it

__all__ = ["GpuPlacement"]


def attempt_key(task_id: str, attempt: int) -> str:
    return f"{task_id}/{attempt}"


class GpuPlacement:
    """The run's GPUs as the slot loop places tasks on them (see the module docstring)."""

    def __init__(
        self, run: Shared, slots: Sequence[Slot], query: GpuQuery | bool | None = True
    ) -> None:
        self.run = run
        self.gpus: dict[int, Gpu] = {}
        for slot in slots:
            for gpu in slot.devices_of(slot.gpu_ids):
                self.gpus.setdefault(gpu.index, gpu)
        self.vendor = slots[0].vendor if slots else Vendor.SIM
        self._refused = False  # the last fill pass found tasks that fit nowhere now
        self._waiting: dict[str, float] = {}  # pending name -> when it first found no room
        self._head: tuple[Descriptor, int | None] | None = None  # this pass's first refused
        self.sampler: VramSampler | None = None
        self.book: HostBook | None = None  # other supervisors' reservations on this host
        if query is True:
            query = _query_for(self.vendor, run.cfg.vram)
        self._packing = any(g.memory_mb for g in self.gpus.values())
        # several GPU models: a task's ``accelerator:`` picks its slots (every claim asks)
        self._models = {g.name.casefold() for g in self.gpus.values()}
        self.mixed = len(self._models) > 1
        if not (isinstance(query, bool) or query is None):
            self.sampler = VramSampler(
                query,
                list(self.gpus.values()),
                release_timeout=run.cfg.release_timeout,
                on_change=run.more_work,
                on_held=self._held,
                on_freed=self._freed,
                on_tick=self._publish_now,
            )
            self.book = HostBook.open(self.vendor.value, sorted(self.gpus))
            self._packing = True
        self.room = Reservations(self.gpus, max(1, run.cfg.gpu_share), self.sampler, self.book)

    # -- life ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.sampler is not None:
            self.sampler.start()

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
        if self.book is not None:
            self.book.close()

    def _held(self, gpu: int, key: str, pids: tuple[int, ...], mb: int) -> None:
        task, _, attempt = key.rpartition("/")
        timeout = self.run.cfg.release_timeout
        self.run.ledger.emit(
            Ev.GPU_HELD,
            gpu=gpu,
            task=task,
            attempt=int(attempt),
            pids=list(pids),
            mb=mb,
            reason=(
                f"GPU {gpu} still holds {mb} MiB of {key} ({len(pids)} process(es)) "
                f"{timeout:.0f}s after it ended: skipped until it is freed"
            ),
        )

    def _freed(self, gpu: int, key: str) -> None:
        task, _, attempt = key.rpartition("/")
        self.run.ledger.emit(Ev.GPU_FREED, gpu=gpu, task=task, attempt=int(attempt))
        self.run.more_work()

    # -- the loop's side --------------------------------------------------------------------------
    def candidates(self, free: Iterable[Slot], holds: Callable[[Slot], bool]) -> list[Slot]:
        """Free slots to claim for, best first: not paused, not on a GPU still releasing an
        ended attempt (or held), one per GPU group (its siblings would see the same room)."""
        if not self.packing and not self.mixed and self.sampler is None:
            # nothing to place by (sim:N, a cluster of one model): the first free slot
            # that is not paused, as the loop claimed before placement existed
            return next(([s] for s in free if not holds(s)), [])
        out: list[Slot] = []
        seen: set[tuple[str, tuple[int, ...]]] = set()  # (its node: a cluster's, GPUs)
        blocked = self.room.blocked()
        for slot in free:
            group = (slot.host, slot.gpu_ids)
            if holds(slot) or group in seen or blocked.intersection(slot.gpu_ids):
                continue
            seen.add(group)
            out.append(slot)
        if blocked and not out:
            self._refused = True  # a slot waits for a release: the loop must not end
        if not self.packing:
            return out if self.mixed else out[:1]  # mixed: each model's slot asks in turn
        room = self.room.rooms()
        out.sort(key=lambda s: -min(room.get(g, math.inf) for g in s.gpu_ids))
        return out

    def add_slots(self, slots: Iterable[Slot]) -> None:
        """Slots that joined (a cluster's node): a node of another model makes the run mixed,
        so ``accelerator:`` is asked from then on."""
        for slot in slots:
            self._models.update(g.name.casefold() for g in slot.devices)
        self.mixed = len(self._models) > 1

    @property
    def packing(self) -> bool:
        """Whether claims ask :meth:`accept`: GPU memory is known (NVML, or a size given).
        Otherwise (``sim:N``, no driver) the loop claims as it always did, nothing reserved."""
        return self._packing

    def begin_pass(self) -> None:
        self._refused = False
        self._head = None

    def none_fit(self) -> None:
        """No free slot could take a task this pass: say why the first in line waits (once per
        task: the live table shows it until it starts)."""
        head, self._head = self._head, None
        if head is not None:
            self._tell_waiting(*head)

    def waiting(self) -> bool:
        """The last fill pass left tasks pending that fit nowhere now (or a GPU releasing):
        the loop waits for room instead of ending."""
        return self._refused and self.run.queue.counts()[State.PENDING] > 0

    def accept(self, slot: Slot) -> Callable[[str], bool] | None:
        """The claim predicate of ``slot`` for one claim: does pending task ``name`` fit its
        GPUs now? Tasks that do not are passed over (a smaller one behind may fit), unless one
        has waited :data:`BACKFILL_LIMIT_SECONDS` for room on a GPU of this slot it could fit:
        then nothing behind it is placed there (the GPU drains until it fits: no starvation)."""
        if not self.packing and not self.mixed:
            return None
        held_back = False
        names = [g.name for g in slot.devices_of(slot.gpu_ids)]

        def fits(name: str) -> bool:
            nonlocal held_back
            if held_back:
                return False
            desc = self.run.queue.read_desc(State.PENDING, name)
            if desc is None:
                return True  # gone (another claimer) or unreadable: the claim deals with it
            wanted = accelerator_of(desc)
            if wanted and not all(model_matches(n, wanted) for n in names):
                return False  # another model's slot takes it (not a wait for room)
            if not self.packing:
                return True
            need = need_of(desc)
            if self.room.fits(slot.gpu_ids, need, declared_of(desc)):
                self._waiting.pop(name, None)
                if self._head is not None and self._head[0].id == desc.id:
                    self._head = None  # it found room on another GPU after all
                return True
            self._refused = True
            now = time.monotonic()
            if self._head is None and name not in self._waiting:
                self._head = (desc, need)  # journaled if no slot of this pass takes anything
            since = self._waiting.setdefault(name, now)
            if len(self._waiting) > 10_000:  # names claimed elsewhere meanwhile: start afresh
                self._waiting = {name: since}
            held_back = now - since >= BACKFILL_LIMIT_SECONDS and self.room.could_fit(
                slot.gpu_ids, need
            )
            return False

        return fits

    def _tell_waiting(self, desc: Descriptor, need: int | None) -> None:
        """Journal once that a task first in line fits no GPU now (the live table shows it)."""
        rooms = self.room.rooms()
        best = max(rooms.values(), default=0)
        what = f"{gib(need)} of GPU memory" if need else "a whole GPU"
        self.run.ledger.emit(
            Ev.GPU_WAIT,
            task=desc.id,
            need_mb=need,
            room_mb=best,
            reason=f"{desc.id} waits for {what} (the most free now: {gib(max(0, best))})",
        )

    def claiming(self) -> AbstractContextManager[object]:
        """Hold while claiming and reserving: no other supervisor of this host places a task
        between this one's look at the room and its reservation."""
        return self.book.guard() if self.book is not None else contextlib.nullcontext()

    def reserve(self, slot: Slot, claimed: Claimed) -> None:
        """Reserve the claimed task's need on ``slot``'s GPUs now, before anything runs (its
        CUDA context comes later): the next claim, here or in another supervisor, sees it."""
        if not self._packing:
            return  # nothing to place by: no reservation (the hot path of sim runs)
        desc = claimed.desc
        key = attempt_key(claimed.task_id, desc.next_attempt)
        self.room.reserve(key, slot.gpu_ids, need_of(desc), declared_of(desc))

    def unreserve(self, slot: Slot, claimed: Claimed) -> None:
        """The claimed task did not start (a stop came first, it did not parse)."""
        self.room.drop(attempt_key(claimed.task_id, claimed.desc.next_attempt), slot.gpu_ids)

    def launched(self, live: LiveAttempt) -> None:
        """Watch ``live`` (reserved at its claim) with its handle's pids."""
        key = attempt_key(live.task_id, live.attempt)
        live.reserved_mb = self.room.need(key)
        if self.sampler is not None:
            self.sampler.watch(key, live.gpu_ids, live.handle.pids)

    def ended(self, live: LiveAttempt) -> Usage | None:
        """``live`` ended: its reservation is dropped (what its processes still hold counts
        until the sampler sees it released); what it used."""
        key = attempt_key(live.task_id, live.attempt)
        usage = self.sampler.end(key) if self.sampler is not None else None
        self.room.drop(key, live.slot.gpu_ids)
        return usage

    def reserved(self, task_id: str, attempt: int) -> int | None:
        return self.room.need(attempt_key(task_id, attempt))

    def _publish_now(self) -> None:
        """After a look (sampler thread): what ours hold now, unless the guard is busy."""
        self.room.publish_now()

    # -- views -----------------------------------------------------------------------------------
    def slot_stats(self) -> dict[str, str]:
        """Slot label -> ``util% used/total`` of its GPUs and what its attempt holds (the
        live table's gpu column); empty without a sampler."""
        if self.sampler is None:
            return {}
        states = self.sampler.snapshot()
        live = {i: attempt_key(a.task_id, a.attempt) for i, a in list(self.run.live.items())}
        out: dict[str, str] = {}
        for slot in self.run.cfg.slots:
            parts = [gpu_text(states[g]) for g in slot.gpu_ids if g in states]
            key = live.get(slot.index)
            mb = self.sampler.current_mb(key) if key is not None else None
            if mb:
                parts.append(f"task {mb / 1024:.1f}G")
            out[slot.label] = " ".join(p for p in parts if p)
        return out


def gpu_text(state: GpuState) -> str:
    """``42% 12.3/80G`` (utilisation where known, memory used / total)."""
    if state.used_mb is None or not state.total_mb:
        return ""
    util = f"{state.util}% " if state.util is not None else ""
    return f"{util}{state.used_mb / 1024:.1f}/{state.total_mb / 1024:.0f}G"


def accelerator_of(desc: Descriptor) -> str | None:
    """The GPU model the task asks for (``accelerator:``), or None."""
    wanted = desc.task.get("accelerator")
    return wanted if isinstance(wanted, str) and wanted.strip() else None


def _query_for(vendor: Vendor, enabled: bool) -> GpuQuery | None:
    if not enabled or vendor is Vendor.SIM:
        return None
    return open_query(vendor.value)
