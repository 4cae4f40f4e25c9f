"""Chaos-test helpers: seeds and trial counts, inputs, reading a run (the CLI driver is shared).

Plain functions and classes only; the fixtures that use them are in ``conftest.py``. Kept in its
own module (not ``conftest``) so that ``tests/chaos`` and ``tests/integration`` can be collected in
one session without their ``conftest`` modules shadowing each other.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
from cli_driver import (
    CliProcess,
    env_processes,
    kill_processes,
    pid_running,
    read_events,
    reap_my_zombies,
    wait_for,
)

PY = sys.executable
HERE = Path(__file__).resolve().parent


# -- trials and seeds --------------------------------------------------------------------------
def trials(default: int) -> int:
    """How many trials a randomized scenario runs: ``GPUSWARM_CHAOS_TRIALS`` or ``default``."""
    raw = os.environ.get("GPUSWARM_CHAOS_TRIALS", "").strip()
    return max(1, int(raw)) if raw else default


def scale(default: int, var: str) -> int:
    raw = os.environ.get(var, "").strip()
    return max(1, int(raw)) if raw else default


def base_seed() -> int:
    """``GPUSWARM_CHAOS_SEED`` or a fresh random one (logged in the report header), the same in
    every xdist worker of a session."""
    raw = os.environ.get("GPUSWARM_CHAOS_SEED", "").strip()
    if raw:
        return int(raw)
    run_uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one per session, the same in every
    if run_uid:  # xdist worker: they must collect the same seeded test ids
        return random.Random(run_uid).randrange(1, 10**6)
    return random.SystemRandom().randrange(1, 10**6)


BASE_SEED = base_seed()  # one per session: conftest logs it, every scenario derives from it


def trial_seeds(default_trials: int, salt: str, base: int) -> list[int]:
    """The seeds of one scenario's trials. ``GPUSWARM_CHAOS_SEEDS=a,b`` replays exactly those."""
    raw = os.environ.get("GPUSWARM_CHAOS_SEEDS", "").strip()
    if raw:
        return [int(s) for s in raw.split(",") if s.strip()]
    rng = random.Random(f"{base}:{salt}")
    return [rng.randrange(1, 10**6) for _ in range(trials(default_trials))]


# -- inputs ------------------------------------------------------------------------------------
def q(path: Path | str) -> str:
    return shlex.quote(str(path))


def write_commands(folder: Path, lines: Iterable[str], name: str = "cmds.txt") -> Path:
    path = folder / name
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def write_config(
    folder: Path, top: dict[str, Any], tasks: list[dict[str, Any]], name: str = "config.yaml"
) -> Path:
    """A YAML config; every value is written as JSON (a JSON value is a YAML flow value)."""
    lines = [f"{k}: {json.dumps(v)}" for k, v in top.items()]
    lines.append("tasks:")
    for task in tasks:
        first = True
        for k, v in task.items():
            lines.append(f"  {'- ' if first else '  '}{k}: {json.dumps(v)}")
            first = False
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def write_script(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def cmd_ids(n: int) -> list[str]:
    return [f"cmd-{i:05d}" for i in range(1, n + 1)]


# -- waiting and reading a run -----------------------------------------------------------------
def summary(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


def running_leases(run_dir: Path) -> list[str]:
    running = run_dir / ".parallel" / "running"  # leases; not a temp file of a write (".tmp-")
    return [p.name for p in running.iterdir() if "@" in p.name and not p.name.startswith(".")]


# -- processes ---------------------------------------------------------------------------------
def run_processes(root: Path, *, under: bool = False) -> list[psutil.Process]:
    return env_processes("GPUSWARM_RUN_DIR", str(root), under=under)


def describe(procs: Iterable[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out.append(f"{p.pid} ppid={p.ppid()} {' '.join(p.cmdline())[:120]}")
    return out


def wait_no_env_processes(var: str, value: str, timeout: float = 10.0) -> float:
    """Wait until no live process carries ``var=value``; return how long it took."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        procs = env_processes(var, value)
        reap_my_zombies({p.pid for p in procs})
        procs = [p for p in procs if pid_running(p.pid)]
        if not procs:
            return time.monotonic() - t0
        if time.monotonic() > deadline:
            raise AssertionError(
                f"processes with {var}={value} still alive after {timeout}s: {describe(procs)}"
            )
        time.sleep(0.05)


def kill_run_processes(root: Path) -> int:
    return kill_processes(run_processes(root, under=True))


def owner_of(proc: CliProcess, run_dir: Path, timeout: float = 20.0) -> str:
    """The owner id (``host:pid:start``) of a supervisor, from its supervisor_started event."""
    event = wait_for(
        lambda: next(
            (
                e
                for e in read_events(run_dir)
                if e.get("ev") == "supervisor_started" and e.get("pid") == proc.pid
            ),
            None,
        ),
        timeout,
        what=f"supervisor {proc.pid} to start",
    )
    return str(event["owner"])


class HeartbeatWatch:
    """Samples, in a thread, how old the heartbeat files of ``owners`` get (while they exist)."""

    def __init__(self, run_dir: Path, owners: list[str]) -> None:
        self.files = [run_dir / ".parallel" / "owners" / o.replace(":", "_") for o in owners]
        self.oldest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> HeartbeatWatch:
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.oldest

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            now = time.time()
            for path in self.files:
                with contextlib.suppress(FileNotFoundError):  # removed when its owner ends
                    self.oldest = max(self.oldest, now - path.stat().st_mtime)
