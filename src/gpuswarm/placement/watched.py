"""What the VRAM sampler (:mod:`.vram`) keeps per watched attempt and hands over: an
attempt's :class:`Usage` at its end, each GPU's :class:`GpuState` at the last look, and the
running tallies of one watched attempt (:class:`Watched`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

PidsOf = Callable[[], Iterable[int]]


@dataclass(frozen=True)
class Usage:
    """What an attempt used, measured. ``peak_mb``/``mean_mb``: memory of its processes."""

    peak_mb: int
    mean_mb: int
    peak_util: int | None
    mean_util: int | None
    samples: int
    energy_j: float | None = None  # issue 37 (placement/energy.py); None: not measured
    energy_mode: str | None = None  # "exclusive" / "shared"


@dataclass(frozen=True)
class GpuState:
    """One GPU at the last look: its memory, what of it is ours (by attempt key), the rest."""

    total_mb: int | None
    used_mb: int | None
    util: int | None
    ours_mb: Mapping[str, int]  # attempt key -> memory its processes hold (releasing ones too)
    foreign_mb: int  # used memory not held by a process of ours
    foreign_pids: tuple[int, ...]
    readable: bool  # its process list could be read (else nothing is attributed on it)


@dataclass
class Watched:
    key: str
    gpus: tuple[int, ...]
    pids_of: PidsOf
    pids: set[int] = field(default_factory=set)  # ever seen on a GPU and attributed to it
    samples: int = 0
    peak: int = 0
    total: int = 0
    util_peak: int | None = None
    util_total: int = 0
    util_samples: int = 0
    readable: bool = False  # at least one look could read a process list of its GPUs
    since: float = field(default_factory=time.monotonic)
    ended_at: float | None = None  # set by end(): releasing from then on
    held: bool = False
    energy_j: float = 0.0  # its share of its GPUs' energy (placement/energy.py)
    energy_known: bool = False
    shared: bool = False  # some interval's energy was split with another attempt


def usage_of(w: Watched) -> Usage | None:
    if not w.readable or w.samples == 0:
        return None
    mean_util = round(w.util_total / w.util_samples) if w.util_samples else None
    energy = round(w.energy_j, 3) if w.energy_known else None
    mode = None if energy is None else ("shared" if w.shared else "exclusive")
    return Usage(
        w.peak, round(w.total / w.samples), w.util_peak, mean_util, w.samples, energy, mode
    )
