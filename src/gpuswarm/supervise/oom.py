"""An attempt's GPU memory in its outcome (issue 19): what the sampler measured on its record,
and the retry of a CUDA out-of-memory end sized up (the committer's side of
:mod:`.packing`)."""

from __future__ import annotations

import math

from gpuswarm.core.models import AttemptRecord, Descriptor
from gpuswarm.exec.plan import Outcome
from gpuswarm.placement.vram import Usage

OOM_FACTOR = 1.25  # an out-of-memory retry reserves 1.25x the peak it reached

__all__ = ["gib", "oom_retry_need", "sized_oom_retry", "with_usage"]


def with_usage(record: AttemptRecord, usage: Usage | None) -> AttemptRecord:
    """The record with what the sampler measured (unchanged when nothing was)."""
    if usage is None:
        return record
    return record.but(
        peak_vram_mb=usage.peak_mb,
        mean_vram_mb=usage.mean_mb,
        peak_gpu_util=usage.peak_util,
        mean_gpu_util=usage.mean_util,
        energy_j=usage.energy_j,  # issue 37
        energy_mode=usage.energy_mode,
    )


def oom_retry_need(record: AttemptRecord, reserved_mb: int | None) -> int | None:
    """What the retry of an out-of-memory attempt reserves: 1.25x its observed peak (or of its
    reservation where nothing was measured), never less than it had; None: no figure at all."""
    base = max(record.peak_vram_mb or 0, reserved_mb or 0)
    if base <= 0:
        return None
    return max(math.ceil(base * OOM_FACTOR), reserved_mb or 0)


def sized_oom_retry(desc: Descriptor, outcome: Outcome, reserved: int | None) -> Outcome:
    """A CUDA out-of-memory end with attempts left: its retry reserves :func:`oom_retry_need`
    (saved in the descriptor: it waits for a GPU with that much room), and its reason says so."""
    record = outcome.record
    need = oom_retry_need(record, reserved or desc.gpu_memory_mb)
    if need is None:
        return outcome
    desc.gpu_memory_mb = need
    if record.peak_vram_mb:
        seen = f"{OOM_FACTOR:g}x its measured peak of {gib(record.peak_vram_mb)}"
    else:
        seen = f"{OOM_FACTOR:g}x its reservation of {gib(reserved or 0)}: no peak measured"
    why = f"{outcome.reason}: the retry reserves {gib(need)} of GPU memory ({seen})"
    return Outcome(outcome.state, why, record.but(reason=why))


def gib(mb: int) -> str:
    return f"{mb / 1024:.1f} GiB"
