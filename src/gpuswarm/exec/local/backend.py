"""The ``local`` backend: each attempt a process session on this host (see :mod:`.process`).

It owns what is process-wide: the child subreaper (so escapees come back to us), the log pump
(every attempt writes into a pipe it drains, holding the log's cap) and the sweep of this run's
strays at the end; and it finds a dead supervisor's attempts by their environment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

import psutil

from gpuswarm.core.logs import LogPump
from gpuswarm.exec.base import BackendOptions, LaunchSpec, Leftovers
from gpuswarm.exec.local import keeper
from gpuswarm.exec.local.keeper import LogKeeper
from gpuswarm.exec.local.process import Attempt
from gpuswarm.exec.local.tree import (
    become_subreaper,
    find_by_env,
    find_by_envs,
    kill_tree,
    sweep_orphans,
)
from gpuswarm.exec.sandbox import Provision, prepare_home

RUN_VAR = "GPUSWARM_RUN_DIR"  # set in every attempt's environment (exec.plan.launch_spec_for)
OWNER_VAR = "GPUSWARM_OWNER"
TASK_VAR = "GPUSWARM_TASK_ID"


class LocalBackend:
    """Processes in their own sessions, watched through pidfds (see :class:`Attempt`)."""

    name = "local"
    caps_logs = True  # the log pump holds every log's cap while the task writes

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        self._pump: LogPump | None = None
        self._keeper: LogKeeper | None = None

    @property
    def pump(self) -> LogPump | None:
        """The log pump once open() started it (a backend built on this one shares it)."""
        return self._pump

    def check(self) -> None:
        """Nothing to check: this host runs the attempts (missing programs are found earlier)."""

    def open(self) -> None:
        become_subreaper()
        if self._pump is None:
            opts = self.options
            if opts.run_dir and opts.owner:  # a supervisor: its logs outlive it (keeper.py)
                self._keeper = LogKeeper(opts.run_dir, opts.owner)
            self._pump = LogPump(self._keeper)
            self._pump.start()

    def prepare_slot(self, home: Path | None, provisions: Sequence[Provision]) -> dict[str, str]:
        return {} if home is None else prepare_home(home, provisions)

    def launch(self, spec: LaunchSpec) -> Attempt:
        return Attempt.launch(spec, pump=self._pump, max_log_bytes=self.options.max_log_bytes)

    def end_leftovers(
        self, *, run_dir: str | None = None, owner: str | None = None, grace: float = 10.0
    ) -> Leftovers:
        """Attempts of a crashed supervisor run on in their own sessions, re-parented away
        from us: their environment is what still ties them to their run and owner."""
        var, value = (RUN_VAR, run_dir) if run_dir is not None else (OWNER_VAR, owner)
        keeper_var = keeper.RUN_VAR if run_dir is not None else keeper.OWNER_VAR
        if value is None:
            raise ValueError("end_leftovers: give run_dir or owner")
        found = find_by_envs({var: value, keeper_var: value})
        pids, keepers = found[var], found[keeper_var]
        tasks = task_ids_of(pids)  # before the kill: which attempts were still running
        killed = kill_tree(pids, grace) if pids else 0
        keeper.settle_keepers(keepers)  # what the attempts printed meanwhile is in their logs
        return Leftovers(list(pids), tasks, killed)

    def settle_keepers(self, *, run_dir: str | None = None, owner: str | None = None) -> None:
        """Wait for the log keepers of run ``run_dir``'s (or of ``owner``'s) dead supervisors
        once their attempts were ended another way (docker: the containers removed)."""
        var, value = (keeper.RUN_VAR, run_dir) if run_dir is not None else (keeper.OWNER_VAR, owner)
        if value is not None:
            keeper.settle_keepers(find_by_env(var, value))

    def leftovers(self, run_dir: str) -> list[int | str]:
        return list(find_by_env(RUN_VAR, run_dir))

    def close(self) -> None:
        if self.options.scope:
            sweep_orphans(self.options.scope)
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.stop()
        kept, self._keeper = self._keeper, None
        if kept is not None:
            kept.close()


def task_ids_of(pids: Sequence[int]) -> frozenset[str]:
    """The task id of each of ``pids`` that is still alive (its attempt runs on)."""
    out: set[str] = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error, OSError):
            task = psutil.Process(pid).environ().get(TASK_VAR)
            if task:
                out.add(task)
    return frozenset(out)
