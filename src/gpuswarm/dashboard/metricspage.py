"""The dashboard's ``/metrics`` (issue 37): the same series as ``gpuswarm exporter``
(``gpuswarm.metrics``), of the runs and experiments under the dashboard's PATHs. Made at the
first scrape (NVML is opened then, never at the dashboard's start); one scrape at a time. The
bearer token is checked by ``security.GuardMiddleware``."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuswarm.metrics.exporter import registry_for
from gpuswarm.metrics.gpus import HostGpus


class MetricsPage:
    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = list(roots)
        self._registry: CollectorRegistry | None = None
        self._lock = threading.Lock()

    def scrape(self) -> tuple[bytes, str]:
        with self._lock:
            if self._registry is None:
                self._registry = registry_for(self.roots, gpus=HostGpus())
            return generate_latest(self._registry), CONTENT_TYPE_LATEST
