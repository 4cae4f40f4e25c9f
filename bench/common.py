"""Shared pieces of the benchmark harness: result rows, sizes, peers, processes, statistics.

Every benchmark module exposes ``run(cfg: Config) -> list[Row]``; ``bench/run.py`` calls them in
one process, one after the other, and renders the rows (``report.py``).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import psutil

from gpuswarm.store.ledger import EventTail as EventTail  # re-exported
from gpuswarm.store.ledger import read_events as read_events

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
GPUSWARM = [sys.executable, "-m", "gpuswarm"]
NOT_INSTALLED = "skipped (not installed)"


@dataclass
class Row:
    """One line of the results table."""

    bench: str  # "1 throughput"
    metric: str  # what is measured, with its size
    tool: str  # gpuswarm, xargs, GNU parallel, simple_gpu_scheduler, Ray
    value: float | None  # None: not measured (see note)
    unit: str = ""
    target: str = ""  # the target, in words ("< 5 s", "gpuswarm >= 3x")
    ok: bool | None = None  # None: no target on this row, or not measured
    ratio: str = ""  # gpuswarm / this peer (for rates: higher is better; for times: lower)
    note: str = ""
    shown: str | None = None  # overrides the formatted value (e.g. "1.2 / 8.4")
    extra: dict[str, Any] = field(default_factory=dict)  # more numbers, JSON only

    def status(self) -> str:
        if self.value is None and self.shown is None:
            for word in ("skipped", "n/a"):
                if self.note.startswith(word):
                    return word
            return "not measured"
        if self.ok is None:
            return ""
        return "met" if self.ok else "NOT met"


@dataclass(frozen=True)
class Config:
    """Sizes of one benchmark run (full, or --quick for a smoke run)."""

    quick: bool
    work: Path  # scratch folder (removed at the end unless --keep)
    throughput_tasks: int = 2000
    throughput_slots: int = 8
    repeats: int = 3
    scale_tasks: int = 100_000
    scale_small: int = 1_000
    claims: int = 500
    rss_tasks_run: int = 5_000  # tasks the supervisor runs off the big queue before the stop
    gap_tasks: int = 400
    gap_slots: int = 4
    gap_sleep: float = 0.05
    cpu_seconds: float = 60.0
    cpu_slots: int = 8
    research_experiments: int = 24  # async beside rounds, same count: experiments/hour
    research_long: int = 100  # async alone, the seed's overnight session: the busy target
    research_slots: int = 4
    research_scale: float = 1.0  # multiplies the 5-15 s train and 1-3 s proposer times
    docker_tasks: int = 40  # attempts of each docker-backend run (and bare docker runs)
    control_cancels: int = 20  # cancels of a running task (and as many with --wait)
    control_add: int = 10_000  # tasks one `gpuswarm add` appends to a live run
    control_requests: int = 1_000  # control request files present while a supervisor claims
    control_repeats: int = 5  # runs of each case (with / without control files), alternating

    @classmethod
    def make(cls, quick: bool, work: Path) -> Config:
        if not quick:
            return cls(quick, work)
        return cls(
            quick,
            work,
            throughput_tasks=500,
            repeats=1,
            scale_tasks=10_000,
            claims=200,
            rss_tasks_run=1_000,
            gap_tasks=160,
            cpu_seconds=15.0,
            research_experiments=8,
            research_long=16,
            research_scale=0.1,
            docker_tasks=15,
            control_cancels=5,
            control_repeats=1,
        )


# -- peers -------------------------------------------------------------------------------------
def have_parallel() -> bool:
    exe = shutil.which("parallel")
    if exe is None:
        return False
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    return "GNU parallel" in out.stdout


def have_sgs() -> bool:
    return shutil.which("simple_gpu_scheduler") is not None


def have_ray() -> bool:
    return find_spec("ray") is not None


def skipped(bench: str, metric: str, tool: str, why: str = NOT_INSTALLED) -> Row:
    return Row(bench, metric, tool, None, note=why)


def failed(bench: str, metric: str, tool: str, exc: BaseException) -> Row:
    text = str(exc).strip().splitlines()
    detail = text[-1][:160] if text else ""
    return Row(bench, metric, tool, None, note=f"error: {type(exc).__name__}: {detail}")


# -- processes ---------------------------------------------------------------------------------
def env_for_bench(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSWARM_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def timed(
    argv: list[str] | str,
    *,
    stdin: Path | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    shell: bool = False,
    timeout: float = 600.0,
) -> float:
    """Wall seconds of one command (output discarded); raises if it fails."""
    fh = stdin.open("rb") if stdin is not None else subprocess.DEVNULL
    try:
        start = time.perf_counter()
        proc = subprocess.run(
            argv,
            stdin=fh,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env or env_for_bench(),
            shell=shell,
            timeout=timeout,
            check=False,
        )
        elapsed = time.perf_counter() - start
    finally:
        if stdin is not None and not isinstance(fh, int):
            fh.close()
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{argv!r} exited {proc.returncode}: {' | '.join(tail)}")
    return elapsed


def stop_tree(proc: subprocess.Popen[bytes], sig: int = signal.SIGINT, wait: float = 300.0) -> None:
    """Send ``sig`` to a process we started; SIGKILL its tree if it outlives ``wait``."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.wait()


def kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


class PeakRss:
    """Samples one process's RSS every ``every`` seconds in a thread; keeps the peak (bytes)."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        self.proc = psutil.Process(pid)
        self.every = every
        self.peak = 0
        self.current = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.current = self.proc.memory_info().rss
                self.peak = max(self.peak, self.current)
                self.samples += 1
            except psutil.Error:
                return
            self._stop.wait(self.every)


# -- run folders and journals ------------------------------------------------------------------
def wait_for(predicate: Callable[[], bool], timeout: float, every: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def the_run(workspace: Path) -> Path | None:
    """The one run folder under ``workspace`` (``<workspace>/<name>/run_*``), if it exists."""
    runs = [p for p in workspace.glob("*/run_*") if p.is_dir()]
    return runs[0] if len(runs) == 1 else None


# -- statistics --------------------------------------------------------------------------------
def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ratio_text(ours: float, theirs: float, what: str = "gpuswarm") -> str:
    if theirs <= 0:
        return ""
    return f"{what} {ours / theirs:.2f}x"


def say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)
