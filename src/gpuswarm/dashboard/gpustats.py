"""GPU utilisation and memory for the run page's lanes, from NVML where it works.

Only for runs on real NVIDIA GPUs of this host (simulated GPUs' ids are not the machine's; a
slot of another host is not ours to sample). Sampled at most once a second, whatever the number
of pages; without pynvml, a driver or a GPU, :attr:`GpuStats.works` is False and lanes show none.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from typing import Any

SAMPLE_SECONDS = 1.0


class GpuStats:
    def __init__(self, vendor: str, host: str) -> None:
        self.host = host
        self._nvml: Any = None
        self._lock = threading.Lock()
        self._at = 0.0
        self._data: dict[int, dict[str, Any]] = {}
        if vendor == "nvidia":
            try:
                nvml: Any = importlib.import_module("pynvml")
                nvml.nvmlInit()
                self._nvml = nvml
            except Exception:  # no library, no driver, no GPU: the numbers are optional
                self._nvml = None

    @property
    def works(self) -> bool:
        return self._nvml is not None

    def sample(self) -> dict[int, dict[str, Any]]:
        """GPU index -> {util (%), mem_used, mem_total (bytes)}; {} without NVML."""
        if self._nvml is None:
            return {}
        with self._lock:
            now = time.monotonic()
            if now - self._at < SAMPLE_SECONDS:
                return self._data
            data: dict[int, dict[str, Any]] = {}
            with contextlib.suppress(Exception):
                for index in range(int(self._nvml.nvmlDeviceGetCount())):
                    with contextlib.suppress(Exception):
                        h = self._nvml.nvmlDeviceGetHandleByIndex(index)
                        mem = self._nvml.nvmlDeviceGetMemoryInfo(h)
                        data[index] = {
                            "index": index,
                            "util": int(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                            "mem_used": int(mem.used),
                            "mem_total": int(mem.total),
                        }
            self._at, self._data = now, data
            return data
