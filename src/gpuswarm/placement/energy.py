"""GPU energy per attempt (issue 37), read by the VRAM sampler at each look.

Per GPU, each look gives the energy of the interval since the previous look: the delta of
NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules; Volta and
newer), else, where the counter is not supported, the power draw (``nvmlDeviceGetPowerUsage``)
integrated over the interval (trapezoids between two looks). A counter that goes back (a
driver reload) gives nothing for that interval.

The rule that apportions an interval's energy between the attempts on the GPU then (docs/
monitoring.md, "Energy"): one attempt gets it all; several share it in proportion to the GPU
memory their processes held at that look (equally when none held any). An attempt that got a
share of a GPU it did not have alone is ``shared``, else ``exclusive``. Energy before an
attempt's first look and after its last one (at most one interval: 0.25 s while young, 1 s
later) is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

COUNTER, POWER = "counter", "power"


@dataclass
class _Gpu:
    mj: int | None = None  # the counter at the last look
    mw: int | None = None  # the power at the last look
    t: float | None = None


class EnergyBook:
    """Per-GPU readings between looks (used under the sampler's lock)."""

    def __init__(self) -> None:
        self._gpus: dict[int, _Gpu] = {}

    def look(
        self, gpu: int, now: float, energy_mj: int | None, power_mw: int | None
    ) -> tuple[float, str] | None:
        """Joules of ``gpu`` since its previous look and how they were read; None: unknown."""
        g = self._gpus.setdefault(gpu, _Gpu())
        out: tuple[float, str] | None = None
        if energy_mj is not None:
            if g.mj is not None and energy_mj >= g.mj:
                out = ((energy_mj - g.mj) / 1000.0, COUNTER)
        elif power_mw is not None and g.t is not None and g.mw is not None and now > g.t:
            out = ((power_mw + g.mw) / 2000.0 * (now - g.t), POWER)
        g.mj, g.mw, g.t = energy_mj, power_mw, now
        return out


def split(joules: float, held_mb: Mapping[str, int]) -> dict[str, float]:
    """An interval's energy over the attempts on the GPU: by the memory each held, equally
    when none held any (see the module docstring)."""
    if not held_mb:
        return {}
    total = sum(max(0, mb) for mb in held_mb.values())
    if total <= 0:
        return {key: joules / len(held_mb) for key in held_mb}
    return {key: joules * max(0, mb) / total for key, mb in held_mb.items()}
