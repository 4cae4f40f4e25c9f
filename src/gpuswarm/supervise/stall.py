"""Stalls, distinct from timeouts (issue 34): an attempt that does nothing for ``stall_after``.

An attempt of a task with ``stall_after: 10m`` is *quiet* while, since the quiet began,
its log has not grown, its processes (the backend's ``Handle.pids()``, the same set and no new
one) used under :data:`CPU_SHARE` of one core, and its GPUs (through the one NVML door,
:mod:`gpuswarm.placement.nvml`) showed no utilisation and no change of used memory. Any of them
moving starts the quiet again: a silent but busy task (a long compile on the CPU, a training
step on the GPU) is never ended. Quiet for ``stall_after``: the attempt is stopped (TERM, grace,
KILL, as a cancel does) and committed as ``stalled`` (its own end kind: retried per
``max_attempts``, never counted by the circuit breaker), the reason naming its last output
line (an agent waiting at a question prints it last).

:class:`StallWatch` is the keeper's: :meth:`tick` once a tick, over the live attempts. CPU time
is read from ``/proc/<pid>/stat`` (no psutil: the backends own processes; this only reads).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.core.events import Ev
from gpuswarm.core.logs import log_tail
from gpuswarm.core.redact import inert, redact_text
from gpuswarm.placement.devices import Vendor
from gpuswarm.placement.nvml import GpuQuery, open_query
from gpuswarm.supervise.context import LiveAttempt, Shared

CPU_SHARE = 0.01  # under 1 % of one core is idle
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
CPU_SLACK = 2.0 / CLOCK_TICKS  # /proc counts in clock ticks: two of them are noise


@dataclass
class _Quiet:
    """Where an attempt stood when its quiet began."""

    since: float
    log_size: int
    cpu: float
    pids: frozenset[int]
    gpu_used: tuple[int | None, ...]


def cpu_seconds(pids: frozenset[int]) -> tuple[float, bool]:
    """User + system CPU seconds of ``pids`` and their reaped children (``/proc/<pid>/stat``),
    and whether one of them still lives (a zombie has ended: its attempt is ending); a pid that
    is gone counts nothing."""
    total = 0
    alive = False
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/stat").read_bytes()[:4096]
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        with contextlib.suppress(IndexError, ValueError):
            alive = alive or fields[0] not in (b"Z", b"X")
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return total / CLOCK_TICKS, alive


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return -1


class StallWatch:
    """The stall detector of one supervisor's live attempts (the keeper's thread only)."""

    def __init__(
        self,
        run: Shared,
        *,
        query: Callable[[], GpuQuery | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run = run
        self._clock = clock
        self._open = query or self._default_query
        self._query: GpuQuery | None = None
        self._opened = False
        self._quiet: dict[tuple[str, int], _Quiet] = {}

    def _default_query(self) -> GpuQuery | None:
        slots = self.run.cfg.slots
        vendor = slots[0].vendor if slots else Vendor.SIM
        return None if vendor is Vendor.SIM else open_query(vendor.value)

    def _gpu(self, live: LiveAttempt) -> tuple[tuple[int | None, ...], bool]:
        """Used MiB of the attempt's GPUs, and whether one shows utilisation."""
        if not live.gpu_ids:
            return (), False
        if not self._opened:
            self._opened = True
            self._query = self._open()
        if self._query is None:
            return (), False
        used: list[int | None] = []
        busy = False
        for gpu in live.slot.devices_of(live.gpu_ids):
            sample = self._query.sample(gpu.uuid or gpu.index)
            used.append(sample.used_mb)
            busy = busy or bool(sample.util)
        return tuple(used), busy

    def tick(self) -> None:
        """Look at every live attempt whose task has ``stall_after``; stop the stalled ones."""
        now = self._clock()
        seen: set[tuple[str, int]] = set()
        for live in list(self.run.live.values()):
            limit = live.task.stall_after
            if limit is None or live.stalled is not None or live.handle.done:
                continue
            key = (live.task_id, live.attempt)
            seen.add(key)
            if self._moved(key, live, now):
                continue
            quiet = self._quiet[key]
            if now - quiet.since >= limit:
                self._stall(live, limit)
        for key in set(self._quiet) - seen:
            del self._quiet[key]  # ended attempts

    def _moved(self, key: tuple[str, int], live: LiveAttempt, now: float) -> bool:
        """Whether the attempt did anything since its quiet began (then its quiet starts now)."""
        log = _size(self.run.paths.attempt_log(live.task_id, live.attempt))
        pids = frozenset(live.handle.pids())
        if not pids:
            return True  # ended (or not started yet): nothing to stall
        cpu, alive = cpu_seconds(pids)
        if not alive:
            self._quiet.pop(key, None)
            return True  # its processes have exited: it is ending, not stalled
        used, gpu_busy = self._gpu(live)
        quiet = self._quiet.get(key)
        moved = (
            quiet is None
            or log != quiet.log_size
            or pids != quiet.pids
            or gpu_busy
            or used != quiet.gpu_used
            or cpu - quiet.cpu > CPU_SHARE * (now - quiet.since) + CPU_SLACK
        )
        if moved:
            self._quiet[key] = _Quiet(now, log, cpu, pids, used)
        return moved

    def _stall(self, live: LiveAttempt, limit: float) -> None:
        log = self.run.paths.attempt_log(live.task_id, live.attempt)
        last = ""
        with contextlib.suppress(OSError):
            lines = log_tail(log, max_lines=1, max_bytes=4096).strip().splitlines()
            env = {**self.run.cfg.base_env, **live.task.env}  # its secrets, by name and shape
            last = inert(redact_text(lines[-1][:200], env)) if lines else ""
        said = f"; its last output: {last!r}" if last else "; it printed nothing"
        live.stalled = (
            f"stalled: no output, under 1% of a core and no GPU activity for {limit:g}s{said}"
        )
        with contextlib.suppress(OSError):
            self.run.ledger.emit(
                Ev.STALLED, task=live.task_id, attempt=live.attempt, reason=live.stalled
            )
        live.handle.cancel()
        self.run.wakeup()  # the loop hands it to a waiter: TERM, grace, KILL
