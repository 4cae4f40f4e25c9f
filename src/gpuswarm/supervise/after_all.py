"""``after_all:``: one post-processing command once every task of the run has ended.

It runs after the supervisor's slots are done and results.tsv / summary.json are written (so it
can read them), through ``/bin/sh -c`` in the run's base folder, as one attempt of the run's
backend (for docker: one post-processing container, as the seed has), with ``GPUSWARM_RUN_DIR``,
``GPUSWARM_RESULTS`` and ``GPUSWARM_SUMMARY`` in its environment. Its output goes to
``<run>/after_all.log``; its outcome lands in summary.json (``after_all``) and a failure makes
the exit code 1. It does not run when the run was stopped or tasks are left (a resume that
finishes the run runs it then); a stop while it runs kills it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import AttemptEnd, Backend, LaunchSpec
from gpuswarm.supervise.preflight import SHELL


class _Ran(TypedDict):
    command: str
    log: str  # the file of its output, in the run folder


class AfterAllRecord(_Ran, total=False):
    """summary.json's ``after_all`` (and the ``after_all`` event's fields, but ``command``)."""

    ok: bool
    exit: int | None
    seconds: float
    reason: str | None  # stopped, its wait failed, or why it failed


def run_once(
    paths: RunPaths,
    command: str,
    *,
    cwd: Path,
    stop: threading.Event,
    base_env: Mapping[str, str],
    backend: Backend,
    home: Path | None = None,
) -> AfterAllRecord | None:
    """Run ``command`` unless another supervisor of the run already did for the run as it is
    now (its log is newer than the last task that ended); None when skipped. Supervisors that
    finish together take turns on a flock, so it runs once."""
    lock = paths.after_all_lock
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _ran_since_last_end(paths):
            return None
        return run_after_all(
            paths, command, cwd=cwd, stop=stop, base_env=base_env, backend=backend, home=home
        )
    finally:
        os.close(fd)


def _ran_since_last_end(paths: RunPaths) -> bool:
    try:
        ran = paths.after_all_log.stat().st_mtime
    except FileNotFoundError:
        return False
    last = 0.0
    for state in State.terminal():
        with contextlib.suppress(FileNotFoundError):
            last = max(last, paths.state_dir(state.value).stat().st_mtime)
    return ran >= last


def run_after_all(
    paths: RunPaths,
    command: str,
    *,
    cwd: Path,
    stop: threading.Event,
    base_env: Mapping[str, str],
    backend: Backend,
    home: Path | None = None,
) -> AfterAllRecord:
    """Run ``command`` as one attempt of the run's ``backend`` (a container of its own, for
    docker, that sees the run folder but its queue); return its record for summary.json
    (``ok``, ``exit``, ``log``...). ``base_env``: the supervisor's environment; ``home``: a
    private HOME of its own (a container has no other)."""
    env = {
        **base_env,
        **(backend.prepare_slot(home, ()) if home is not None else {}),
        "GPUSWARM_RUN_DIR": str(paths.root),
        "GPUSWARM_RESULTS": str(paths.results_tsv),
        "GPUSWARM_SUMMARY": str(paths.summary_json),
    }
    own = paths.after_all_output  # the launch makes its folder afresh
    spec = LaunchSpec(
        argv=[SHELL, "-c", command],
        env=env,
        cwd=cwd,
        log_path=own,
        grace=10.0,
        token=f"{paths.root.name}/after_all/0",
        binds=(paths.root,) if home is None else (paths.root, home),
        own_env=frozenset(k for k, v in env.items() if base_env.get(k) != v),
        identity={"kind": "after_all"},
    )
    record: AfterAllRecord = {"command": command, "log": paths.after_all_log.name}
    with contextlib.suppress(FileNotFoundError):
        own.unlink()  # a run cut short left it: this run's output starts afresh
    t0 = time.time()
    handle = backend.launch(spec)
    ends: list[AttemptEnd] = []
    waiter = threading.Thread(target=lambda: ends.append(handle.wait()), daemon=True)
    waiter.start()
    stopped = False
    while waiter.is_alive():
        waiter.join(0.2)
        if stop.is_set() and not stopped:
            stopped = True
            handle.cancel()  # TERM, grace, KILL: nothing of it outlives it
    with contextlib.suppress(OSError):
        os.replace(own, paths.after_all_log)
        own.parent.rmdir()
    if not ends:
        return {**record, "ok": False, "exit": None, "reason": "its wait failed"}
    end = ends[0]
    record.update({"ok": end.ok, "exit": end.returncode, "seconds": round(time.time() - t0, 3)})
    if stopped:
        record["reason"] = "stopped"
    elif not end.ok:
        record["reason"] = end.reason
    return record
