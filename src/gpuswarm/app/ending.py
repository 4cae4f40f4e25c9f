"""A supervised run's end: summary.json's words on how the session stopped (the supervisor's
extras over the aggregated rows), the after_all step once every task ended, and the budget's
line when it was spent."""

from __future__ import annotations

import time

from gpuswarm.app.output import Output, say
from gpuswarm.app.setup import Setup
from gpuswarm.config.backends import plugin_of
from gpuswarm.core.events import Ev
from gpuswarm.core.fsutil import atomic_write_json
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import Backend
from gpuswarm.outputs.aggregate import write_outputs
from gpuswarm.outputs.summaryjson import RunSummary, SessionEnd
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runinfo import RunRecord
from gpuswarm.store.runs import open_record
from gpuswarm.supervise.after_all import run_once
from gpuswarm.supervise.budget import Budget
from gpuswarm.supervise.supervisor import Supervisor


def budget_line(budget: Budget) -> str | None:
    """``budget: $1.20 spent of budget.usd $1.00; raise it: gpuswarm resume RUN --budget-usd
    1.6`` once the run's budget is spent (None: it is not)."""
    return None if budget.reason is None else f"{budget.reason}; {budget.how}"


def aggregate(
    paths: RunPaths, queue: DirQueue, ledger: Ledger, sup: Supervisor, started: float
) -> tuple[RunSummary, RunRecord]:
    """summary.json and results.tsv of the run as the supervisor left it, and its run.json."""
    _, info = open_record(paths.root)  # a late Ctrl-C must not cut the summary
    extra: SessionEnd = {"quarantined": sup.quarantined, "stopped": sup.stopping.is_set()}
    if sup.shared.ended_by:
        extra["stopped_by"] = sup.shared.ended_by  # the backend's reason (a head lost)
    elif sup.halt.reason:  # issue 28: the halt rule was met ("halt: 3 tasks failed ...")
        extra["stopped"], extra["stopped_by"] = True, sup.halt.reason
    elif (spent := budget_line(sup.budget)) is not None:  # issue 34: the budget was spent
        extra["stopped"], extra["stopped_by"] = True, spent
    elif sup.stopping.is_set() and sup.shared.stop_cause:
        extra["stopped_by"] = sup.shared.stop_cause  # Ctrl-C (SIGINT), SIGTERM
    if sup.stopping.is_set():
        extra["requeued"] = sup.shared.requeued  # running tasks the stop put back
    summary = write_outputs(paths, queue, info, (started, time.time()), extra)
    ledger.emit(Ev.AGGREGATED, counts=summary["counts"], complete=summary["complete"])
    return summary, info


def after_all(
    paths: RunPaths,
    ledger: Ledger,
    setup: Setup,
    output: Output,
    sup: Supervisor,
    summary: RunSummary,
    backend: Backend,
) -> None:
    """The after_all step, once every task ended; its result goes into summary.json."""
    assert setup.after_all is not None
    say(output, f"after_all: {setup.after_all}")
    after = run_once(
        paths,
        setup.after_all,
        cwd=setup.base_dir,
        stop=sup.stopping,
        base_env=sup.cfg.base_env,
        backend=backend,
        # a container has no HOME but a private one (the host's is not mounted)
        home=paths.slot_home("after_all") if plugin_of(setup.backend).isolates_home else None,
    )
    if after is not None:
        fields = {k: v for k, v in after.items() if k != "command"}
        ledger.emit(Ev.AFTER_ALL, **fields)
        summary["after_all"] = after
        atomic_write_json(paths.summary_json, summary)


def all_ended(queue: DirQueue) -> bool:
    counts = queue.counts()
    return not counts[State.PENDING] + counts[State.RUNNING] + counts[State.BLOCKED]  # issue 35
