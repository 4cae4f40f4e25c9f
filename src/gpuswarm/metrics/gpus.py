"""This host's GPUs for ``/metrics``, through the one NVML door (``placement.nvml``): memory,
utilisation, power and the total-energy counter, read at scrape time (at most once a second,
whatever the number of scrapers). Without a driver or a GPU nothing is reported."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gpuswarm.placement.nvml import DeviceInfo, GpuQuery, open_query

SAMPLE_SECONDS = 1.0


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    uuid: str
    used_mb: int | None
    total_mb: int | None
    util: int | None
    power_mw: int | None
    energy_mj: int | None


class HostGpus:
    def __init__(self, query: GpuQuery | bool | None = True) -> None:
        self._query: GpuQuery | None = open_query() if query is True else query or None
        self._devices: list[DeviceInfo] = self._query.devices() if self._query else []
        self._lock = threading.Lock()
        self._at = -1e9
        self._last: list[GpuReading] = []

    def read(self) -> list[GpuReading]:
        if self._query is None:
            return []
        with self._lock:
            if time.monotonic() - self._at >= SAMPLE_SECONDS:
                self._last = [self._one(self._query, d) for d in self._devices]
                self._at = time.monotonic()
            return self._last

    @staticmethod
    def _one(query: GpuQuery, d: DeviceInfo) -> GpuReading:
        key: str | int = d.uuid or d.index
        look = query.sample(key)
        return GpuReading(
            d.index,
            d.name,
            d.uuid or "",
            look.used_mb,
            look.total_mb,
            look.util,
            query.power_mw(key),
            query.energy_mj(key),
        )

    def close(self) -> None:
        if self._query is not None:
            self._query.close()
