"""What a supervisor inside a Slurm allocation does besides supervising (the engine calls it).

- :func:`allocation_for` the allocation to honour (None outside one): its end bounds claims;
- :func:`check_nodes_see` the shared-filesystem check before anything is created;
- :class:`Session` starts the workers on the other nodes (the head only: ``run``/``resume``,
  never a ``work`` that srun started) and ends them with the run;
- :func:`end_stops` the allocation's end stops the run warm: Slurm's end signal
  (``--signal=B:USR1@N``), or ``stop_before`` seconds before the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gpuswarm.core.fsutil import atomic_write_json
from gpuswarm.exec.slurm.allocation import Allocation, current
from gpuswarm.exec.slurm.workers import Workers, check_shared

WORKER_VAR = "GPUSWARM_SLURM_WORKER"  # set for the workers srun starts: they start none


def allocation_for(stop_before: float | None = None) -> Allocation | None:
    """``stop_before``: the run's ``slurm.stop_before`` (None: the default, 60 s)."""
    return current(os.environ, stop_before)


def is_head(mode: str) -> bool:
    return mode in ("run", "resume") and os.environ.get(WORKER_VAR) != "1"


def check_nodes_see(folder: Path, stop_before: float | None = None) -> Allocation | None:
    """Inside a multi-node allocation: every other node reads ``folder`` (exit 2 otherwise)."""
    alloc = allocation_for(stop_before)
    if alloc is not None and alloc.others and os.environ.get(WORKER_VAR) != "1":
        folder.mkdir(parents=True, exist_ok=True)
        check_shared(alloc, folder)
    return alloc


class Session:
    def __init__(self, alloc: Allocation | None, run_dir: Path, mode: str) -> None:
        self.alloc = alloc
        self.run_dir = run_dir
        self.head = is_head(mode)
        self.workers = (
            Workers(alloc, run_dir)
            if alloc is not None and alloc.others and is_head(mode)
            else None
        )

    def start(self) -> list[str]:
        """Start the workers; the nodes they run on. The head records the allocation in
        ``slurm/allocation.json`` (what ``status`` shows)."""
        alloc = self.alloc
        if alloc is None or not self.head:
            return []
        folder = self.run_dir / "slurm"
        folder.mkdir(exist_ok=True)
        record = {"job": alloc.job_id, "nodes": list(alloc.nodes), "head": alloc.node,
                  "workers": list(alloc.others), "ends_at": alloc.ends_at}  # fmt: skip
        atomic_write_json(folder / "allocation.json", record)
        if self.workers is None:
            return []
        self.workers.start()
        return list(alloc.others)

    def close(self) -> None:
        if self.workers is not None:
            self.workers.stop(warm=True)


@contextlib.contextmanager
def end_stops(stop: Callable[[str], None], alloc: Allocation | None) -> Iterator[None]:
    """The allocation's end calls ``stop`` once: SIGUSR1 (Slurm's ``--signal=B:USR1@N``, or srun
    passing it on) or its ``stop_at`` reached (``stop_before`` seconds before its end)."""
    if alloc is None:
        yield
        return
    fired = threading.Lock()

    def once(cause: str) -> None:
        if fired.acquire(blocking=False):
            stop(cause)

    def handler(signum: int, frame: object) -> None:
        once("SIGUSR1 (the allocation ends)")

    timer = None
    if alloc.stop_at is not None:
        when = time.strftime("%H:%M:%S", time.localtime(alloc.stop_at))
        cause = f"the allocation ends (stopped warm at {when})"
        timer = threading.Timer(max(0.0, alloc.stop_at - time.time()), once, (cause,))
        timer.daemon = True
        timer.start()
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, old)
        if timer is not None:
            timer.cancel()
