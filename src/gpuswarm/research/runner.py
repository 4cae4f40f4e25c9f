"""The background runner: ``gpuswarm research _serve``, a detached process holding
``serve.lock`` that serves the experiment's core run (one slot per GPU, timeouts that kill
process trees, crash recovery) and lingers a while when idle.

Whoever queues a variant makes sure a runner is alive; the runner, before it ends, gives the
lock back and looks again, so a variant queued at that moment is never left without one.
"""

from __future__ import annotations

import os
import subprocess
import sys

from gpuswarm.app import api
from gpuswarm.core.errors import ResearchError
from gpuswarm.core.logs import log_tail
from gpuswarm.core.signals import leave
from gpuswarm.research.executor import run_paths
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths, flocked

EXPERIMENT_VAR = "GPUSWARM_EXPERIMENT"
_RUNNERS: list[subprocess.Popen[bytes]] = []


def ensure_runner(paths: ExpPaths, cfg: ExperimentConfig) -> bool:
    """Start the runner unless one holds serve.lock; True when one was started."""
    with flocked(paths.serve_lock, blocking=False) as free:
        if not free:
            return False
    env = {**os.environ, EXPERIMENT_VAR: str(paths.root)}
    env.pop("GPUSWARM_RUN_DIR", None)
    log = os.open(paths.daemon_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for proc in list(_RUNNERS):  # reap runners this process started that have ended
        if proc.poll() is not None:
            _RUNNERS.remove(proc)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuswarm", "research", "_serve", str(paths.root)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            cwd=paths.repo,
            start_new_session=True,
            close_fds=True,
        )
        _RUNNERS.append(proc)  # detached, but ours to reap when a long-lived caller outlives it
    finally:
        os.close(log)
    return True


class RunnerWatch:
    """Re-starts the runner when it is gone; gives up (with its log) when it keeps dying."""

    def __init__(self, paths: ExpPaths, cfg: ExperimentConfig, limit: int = 3) -> None:
        self.paths, self.cfg, self.limit = paths, cfg, limit
        self.starts = 0

    def progressed(self) -> None:
        self.starts = 0

    def check(self) -> None:
        if not ensure_runner(self.paths, self.cfg):
            return
        self.starts += 1
        if self.starts > self.limit:
            tail = log_tail(self.paths.daemon_log, max_lines=8)
            raise ResearchError(
                f"the background runner keeps stopping without running anything; its log "
                f"({self.paths.daemon_log}) ends with:\n{tail}"
            )


def serve(paths: ExpPaths, cfg: ExperimentConfig) -> int:
    """The runner's body: supervise the run until it stays idle for ``linger`` seconds."""
    os.environ.pop(EXPERIMENT_VAR, None)  # (/proc still shows it) tasks must not inherit it
    run = run_paths(paths, cfg)
    while True:
        with flocked(paths.serve_lock, blocking=False) as mine:
            if not mine:
                return 0  # another runner has it
            report = api.serve(run, stream=sys.stderr)  # research writes its own report
            if report.stopped_by is not None:  # its cluster is gone: see core.signals.leave
                leave(report.exit_code, hard=True)
            if report.interrupted:
                return report.exit_code
        # the lock is free: a variant queued before this look is ours, after it, its queuer's
        if not api.has_pending(run):
            return 0


def runner_pids(paths: ExpPaths) -> list[int]:
    """The runner process(es) of this experiment (found by their environment and argv)."""
    return api.processes_with_env(EXPERIMENT_VAR, str(paths.root), argv_has="_serve")


def stop_runner(paths: ExpPaths, *, grace: float = 60.0) -> int:
    """A warm stop of the runner: running variants go back to the queue. Returns how many."""
    return api.stop_processes(runner_pids(paths), grace)
