"""GPU utilisation and memory for the run page's lanes, through the one NVML door
(:mod:`gpuswarm.placement.nvml`).

Only for runs on real NVIDIA GPUs of this host (simulated GPUs' ids are not the machine's; a
slot of another host is not ours to sample). Sampled at most once a second, whatever the number
of pages; without pynvml, a driver or a GPU, :attr:`GpuStats.works` is False and lanes show none.
A device whose utilisation or memory cannot be read (a MIG instance's utilisation) is left out.
"""

from __future__ import annotations

import threading
import time
from typing import TypedDict

from gpuswarm.placement.nvml import MB, GpuQuery, open_query

SAMPLE_SECONDS = 1.0


class GpuSample(TypedDict):
    """One GPU's look, as a lane of the run page shows it."""

    index: int
    util: int  # %
    mem_used: int  # bytes
    mem_total: int


class GpuStats:
    def __init__(self, vendor: str, host: str) -> None:
        self.host = host
        self._query: GpuQuery | None = open_query("nvidia") if vendor == "nvidia" else None
        self._lock = threading.Lock()
        self._at = 0.0
        self._data: dict[int, GpuSample] = {}

    @property
    def works(self) -> bool:
        return self._query is not None

    def sample(self) -> dict[int, GpuSample]:
        """GPU index -> {util (%), mem_used, mem_total (bytes)}; {} without NVML."""
        if self._query is None:
            return {}
        with self._lock:
            now = time.monotonic()
            if now - self._at < SAMPLE_SECONDS:
                return self._data
            data: dict[int, GpuSample] = {}
            for device in self._query.devices():
                look = self._query.sample(device.index)
                if look.util is None or look.used_mb is None or look.total_mb is None:
                    continue
                data[device.index] = {
                    "index": device.index,
                    "util": look.util,
                    "mem_used": look.used_mb * MB,
                    "mem_total": look.total_mb * MB,
                }
            self._at, self._data = now, data
            return data
