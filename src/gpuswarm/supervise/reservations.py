"""What our attempts take of each GPU and the room left there (issue 19, :mod:`.packing`'s
arithmetic): each attempt's reservation from its claim, the larger of it and what its
processes hold (plus :data:`MARGIN`), memory foreign processes hold, and what the host's other
supervisors reserve (:class:`~gpuswarm.placement.hostbook.HostBook`), published to them."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence

from gpuswarm.core.models import Descriptor
from gpuswarm.placement.devices import Gpu
from gpuswarm.placement.hostbook import HostBook
from gpuswarm.placement.vram import GpuState, VramSampler

MARGIN = 0.10  # an attempt holding more than it reserved counts with 10% more than it holds

__all__ = ["Reservations", "declared_of", "need_of"]


class Reservations:
    """Our reservations per GPU and attempt, and the room they leave (thread safe)."""

    def __init__(
        self,
        gpus: dict[int, Gpu],
        share: int,
        sampler: VramSampler | None,
        book: HostBook | None,
    ) -> None:
        self.gpus = gpus
        self.share = share  # an undeclared task takes 1/share of its GPU
        self.sampler = sampler
        self.book = book  # other supervisors' reservations on this host
        self._lock = threading.Lock()
        self._reserved: dict[int, dict[str, int]] = {g: {} for g in gpus}
        self._need: dict[str, int | None] = {}  # attempt key -> its declared/raised need
        self._totals: dict[int, int] = {}  # GPU -> its memory as NVML says (MiB)

    # -- booking -----------------------------------------------------------------------------
    def reserve(self, key: str, gpu_ids: Sequence[int], need: int | None, declared: bool) -> None:
        """Book attempt ``key``'s need (or, undeclared, its GPU share) on ``gpu_ids``."""
        with self._lock:
            self._need[key] = need
            for gpu in gpu_ids:
                total = self.total(gpu)
                share = total // self.share if total and not declared else 0
                self._reserved.setdefault(gpu, {})[key] = max(need or 0, share)
        self.publish(gpu_ids)

    def need(self, key: str) -> int | None:
        """What attempt ``key`` reserved (None: no figure, or not reserved)."""
        with self._lock:
            return self._need.get(key)

    def drop(self, key: str, gpus: Sequence[int]) -> None:
        with self._lock:
            for gpu in gpus:
                self._reserved.get(gpu, {}).pop(key, None)
            self._need.pop(key, None)
        self.publish(gpus)

    def publish_now(self) -> None:
        """After a look (sampler thread): what ours hold now, unless the guard is busy."""
        self.publish(None, wait=False)

    def publish(self, gpus: Iterable[int] | None = None, *, wait: bool = True) -> None:
        """Tell the host's other supervisors what ours take on ``gpus`` (all: None)."""
        if self.book is None:
            return
        states = self.states()
        for gpu in self.gpus if gpus is None else gpus:
            state = states.get(gpu)
            held = dict(state.ours_mb) if state is not None else {}
            with self._lock:
                reserved = dict(self._reserved.get(gpu, {}))
            self.book.publish(gpu, _taken(reserved, held), sum(held.values()), wait=wait)

    # -- room ----------------------------------------------------------------------------------
    def fits(self, gpu_ids: Sequence[int], need: int | None, declared: bool = True) -> bool:
        """Whether a task needing ``need`` MiB (None: no figure) fits on ``gpu_ids`` now. An
        undeclared task (``declared`` False) also takes its ``1/gpu_share`` of each GPU from
        our reservations; a need (declared, or raised after an OOM) must fit the room left."""
        rooms = self.rooms(gpu_ids)
        largest = max((t for g in self.gpus if (t := self.total(g))), default=0)
        with self._lock:
            for gpu in gpu_ids:
                total = self.total(gpu)
                if total is None:
                    continue
                reserved = self._reserved.get(gpu, {})
                if not declared and sum(reserved.values()) + total // self.share > total:
                    return False
                if need is None:
                    continue
                if need > largest:  # larger than every GPU: alone on one, or not at all
                    if reserved:
                        return False
                    continue
                if rooms.get(gpu, total) < need:
                    return False
        return True

    def could_fit(self, gpu_ids: Sequence[int], need: int | None) -> bool:
        """Whether ``need`` would fit ``gpu_ids`` once our attempts there ended (their whole
        memory but what foreign processes hold)."""
        if need is None:
            return True
        states = self.states()
        for gpu in gpu_ids:
            total = self.total(gpu)
            foreign = states[gpu].foreign_mb if gpu in states else 0
            if total is not None and need > total - foreign:
                return False
        return True

    def rooms(self, gpus: Iterable[int] | None = None) -> dict[int, int]:
        """GPU -> MiB a declared need may still take: total - foreign - ours (each attempt of
        ours with the larger of its reservation and what it holds + margin), of ``gpus``
        (all: None)."""
        states = self.states()
        out: dict[int, int] = {}
        with self._lock:
            for gpu in self.gpus if gpus is None else gpus:
                total = self.total(gpu)
                if total is None:
                    continue
                state = states.get(gpu)
                held = dict(state.ours_mb) if state is not None else {}
                ours = _taken(self._reserved.get(gpu, {}), held)
                foreign = state.foreign_mb if state is not None else 0
                out[gpu] = total - foreign - ours
        if self.book is not None:
            for gpu in out:
                taken, theirs = self.book.others(gpu)  # theirs: part of "foreign" above
                foreign = states[gpu].foreign_mb if gpu in states else 0
                out[gpu] += foreign - max(0, foreign - theirs) - taken
        return out

    def blocked(self) -> set[int]:
        """GPUs that take no task now: an ended attempt's processes still hold memory there."""
        if self.sampler is None:
            return set()
        return {g for g in self.gpus if self.sampler.releasing(g)}

    def total(self, gpu: int) -> int | None:
        """The GPU's memory: NVML's figure once seen (kept: it never changes), else
        discovery's (None: unknown)."""
        known = self._totals.get(gpu)
        if known is not None:
            return known
        state = self.states().get(gpu)
        if state is not None and state.total_mb:
            self._totals[gpu] = state.total_mb
            return state.total_mb
        found = self.gpus.get(gpu)
        return found.memory_mb if found is not None else None

    def states(self) -> dict[int, GpuState]:
        return self.sampler.snapshot() if self.sampler is not None else {}


def _taken(reserved: dict[str, int], held: dict[str, int]) -> int:
    """What our attempts take on a GPU: each the larger of its reservation and what its
    processes hold (+ the margin); an ended one still holding memory counts with that."""
    total = 0
    for key in reserved.keys() | held.keys():
        now = held.get(key, 0)
        total += max(reserved.get(key, 0), math.ceil(now * (1 + MARGIN)) if now else 0)
    return total


def need_of(desc: Descriptor) -> int | None:
    """What a task's next attempt reserves: the raised need after an OOM, else declared."""
    raised = desc.gpu_memory_mb
    if raised is not None:
        return raised
    declared = desc.task.get("gpu_memory_mb")
    return declared if isinstance(declared, int) and declared > 0 else None


def declared_of(desc: Descriptor) -> bool:
    """Whether the task itself declares ``gpu_memory`` (else it takes its GPU share)."""
    declared = desc.task.get("gpu_memory_mb")
    return isinstance(declared, int) and declared > 0
