"""``after_all:``: one post-processing command once every task of the run has ended.

It runs after the supervisor's slots are done and results.tsv / summary.json are written (so it
can read them), through ``/bin/sh -c`` in the run's base folder, with ``GPUSWARM_RUN_DIR``,
``GPUSWARM_RESULTS`` and ``GPUSWARM_SUMMARY`` in its environment. Its output goes to
``<run>/after_all.log``; its outcome lands in summary.json (``after_all``) and a failure makes
the exit code 1. It does not run when the run was stopped or tasks are left (a resume that
finishes the run runs it then); a stop while it runs kills it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuswarm.core.paths import RunPaths
from gpuswarm.supervise.preflight import start_shell

LOG_NAME = "after_all.log"


def run_once(
    paths: RunPaths,
    command: str,
    *,
    cwd: Path,
    stop: threading.Event,
    base_env: Mapping[str, str],
) -> dict[str, Any] | None:
    """Run ``command`` unless another supervisor of the run already did for the run as it is
    now (its log is newer than the last task that ended); None when skipped. Supervisors that
    finish together take turns on a flock, so it runs once."""
    lock = paths.parallel / "after_all.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _ran_since_last_end(paths):
            return None
        return run_after_all(paths, command, cwd=cwd, stop=stop, base_env=base_env)
    finally:
        os.close(fd)


def _ran_since_last_end(paths: RunPaths) -> bool:
    try:
        ran = (paths.root / LOG_NAME).stat().st_mtime
    except FileNotFoundError:
        return False
    last = 0.0
    for state in ("done", "failed", "skipped"):
        with contextlib.suppress(FileNotFoundError):
            last = max(last, paths.state_dir(state).stat().st_mtime)
    return ran >= last


def run_after_all(
    paths: RunPaths,
    command: str,
    *,
    cwd: Path,
    stop: threading.Event,
    base_env: Mapping[str, str],
) -> dict[str, Any]:
    """Run ``command``; return its record for summary.json (``ok``, ``exit``, ``log``...).
    ``base_env``: the supervisor's environment, passed in like its tasks'."""
    env = {
        **base_env,
        "GPUSWARM_RUN_DIR": str(paths.root),
        "GPUSWARM_RESULTS": str(paths.results_tsv),
        "GPUSWARM_SUMMARY": str(paths.summary_json),
    }
    log = paths.root / LOG_NAME
    record: dict[str, Any] = {"command": command, "log": LOG_NAME}
    t0 = time.time()
    with log.open("wb") as out:
        try:
            proc = start_shell(command, env, cwd, out)
        except OSError as exc:
            return {**record, "ok": False, "exit": None, "reason": f"could not start: {exc}"}
        code: int | None = None
        while code is None:
            try:
                code = proc.wait(0.2)
            except subprocess.TimeoutExpired:
                if stop.is_set():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        code = proc.wait(10)
                    except subprocess.TimeoutExpired:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(proc.pid, signal.SIGKILL)
                        code = proc.wait()
                    record["reason"] = "stopped"
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # nothing of it outlives it
    record.update(ok=code == 0, exit=code, seconds=round(time.time() - t0, 3))
    if code != 0 and "reason" not in record:
        record["reason"] = f"killed by signal {-code}" if code < 0 else f"exit {code}"
    return record
