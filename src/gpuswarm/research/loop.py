"""The autonomous loop: propose, queue, wait, decide, forever (or for a budget).

``rounds`` is the seed's procedure: one variant per GPU from one BASE, wait for all, the best
improving one is kept. ``async``: whenever a GPU frees up it gets the next variant of the
current BASE (plus ``lookahead`` queued ahead, so no GPU waits for the proposer); no GPU waits
for the slowest. The loop holds no state of its own: everything is in the experiment's journal
and core run, so after a crash (even SIGKILL) running ``research loop`` again goes on where it
was, and the runner keeps running variants meanwhile.

Stops: the first SIGINT/SIGTERM stops proposing and waits for the variants in flight; the
second leaves at once (the runner finishes them; the next research command records them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuswarm.errors import ResearchError
from gpuswarm.research import api, executor
from gpuswarm.research.experiment import State, append, flocked
from gpuswarm.research.proposers import Proposer
from gpuswarm.research.settle import seal_round, settle_locked
from gpuswarm.signals import on_stop_signals

POLL_SECONDS = 0.1
IDLE_PROPOSER_SECONDS = 5.0  # a proposer with nothing to offer is asked again after this


@dataclass(frozen=True)
class LoopOptions:
    mode: str = "async"  # async | rounds
    max_experiments: int | None = None
    duration: float | None = None  # seconds
    lookahead: int = 1  # async: variants queued beyond one per GPU


@dataclass
class LoopStop:
    soft: threading.Event
    hard: threading.Event

    def request(self) -> None:
        (self.hard if self.soft.is_set() else self.soft).set()


def run_loop(
    exp: api.Experiment,
    proposer: Proposer,
    opts: LoopOptions,
    say: Callable[[str], None],
    stop: LoopStop | None = None,
    tick: Callable[[State], None] | None = None,
) -> dict[str, Any]:
    """Run until stopped or the budget is spent; ``tick(state)`` is called a few times a second
    (the live view follows the runner's journal with it)."""
    tick = tick or (lambda state: None)
    stop = stop or LoopStop(threading.Event(), threading.Event())
    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        if state.mode != opts.mode:
            append(exp.paths, "mode", mode=opts.mode)
    slots = executor.slot_count(exp.paths, exp.cfg)
    deadline = None if opts.duration is None else time.monotonic() + opts.duration
    already = _started(state)
    made = 0
    seen = _recorded(state)
    idle_until = 0.0
    watch = executor.RunnerWatch(exp.paths, exp.cfg)
    with on_stop_signals(stop.request):
        while not stop.hard.is_set():
            state = exp.settle()
            made = _started(state) - already  # re-based combinations count too
            seen = _report(exp, state, seen, say)
            tick(state)
            _check_baseline(exp, state)
            budget = _budget(opts, made, deadline)
            if not stop.soft.is_set() and budget != 0 and time.monotonic() >= idle_until:
                for _ in range(_wanted(opts, state, slots, budget)):
                    if stop.soft.is_set() or not _propose_one(exp, proposer, state, say):
                        idle_until = time.monotonic() + IDLE_PROPOSER_SECONDS
                        break
                    state = exp.settle()
                    made = _started(state) - already
                if opts.mode == "rounds":
                    with flocked(exp.paths.lock):
                        seal_round(exp.paths, settle_locked(exp.paths, exp.cfg))
            if not state.in_flight():
                if stop.soft.is_set() or budget == 0 or time.monotonic() < idle_until:
                    break  # stopped, budget spent, or the proposer has nothing more
                continue
            deadline_news = time.monotonic() + IDLE_PROPOSER_SECONDS
            _wait_for_news(exp, state, stop, watch, deadline_news, tick)
    state = exp.settle()
    _report(exp, state, seen, say)
    files = api.report(exp)
    return {
        **api.status(exp, last=0),
        "made": made,
        "plot": files["plot"],
        "report": files["report"],
        "stopped": stop.soft.is_set() or stop.hard.is_set(),
        "left_running": [v.id for v in state.in_flight()],
    }


def _check_baseline(exp: api.Experiment, state: State) -> None:
    """Without a metric for BASE nothing can be judged: a crashed baseline ends the loop."""
    if state.best is not None:
        return
    runs = [v for v in state.variants.values() if v.kind == "baseline" and v.commit == state.base]
    if runs and all(v.decision is not None and v.decision["status"] == "crash" for v in runs):
        fin = runs[-1].finished or {}
        raise ResearchError(
            f"the baseline run of BASE {runs[-1].commit[:7]} crashed ({fin.get('reason')}); "
            f"fix the command or the code, then run the loop again. Log: "
            f"{exp.paths.root / str(fin.get('log'))}\n{fin.get('tail', '')}"
        )


def _budget(opts: LoopOptions, made: int, deadline: float | None) -> int | None:
    """Experiments this loop may still start (None = unlimited; 0 = none)."""
    if deadline is not None and time.monotonic() >= deadline:
        return 0
    if opts.max_experiments is None:
        return None
    return max(0, opts.max_experiments - made)


def _wanted(opts: LoopOptions, state: State, slots: int, budget: int | None) -> int:
    in_flight = len(state.in_flight())
    if opts.mode == "rounds":
        want = 0 if in_flight else slots
    else:
        want = max(0, slots + opts.lookahead - in_flight)
    return want if budget is None else min(want, budget)


def _propose_one(
    exp: api.Experiment, proposer: Proposer, state: State, say: Callable[[str], None]
) -> bool:
    proposal = proposer.propose(state)
    if proposal is None:
        return False
    try:
        data = api.try_variant(
            exp,
            proposal.description,
            files=proposal.files,
            base=proposal.base,
            source=proposer.name,
            meta=proposal.meta,
        )
    except ResearchError as exc:  # e.g. it conflicts with a keep made while it was proposed
        say(f"proposal not queued: {exc}")
        return True
    extra = (
        f" (baseline {', '.join(data['baseline_queued'])} first)" if data["baseline_queued"] else ""
    )
    say(f"queued {data['id']} {data['commit'][:7]}: {proposal.description}{extra}")
    return True


def _started(state: State) -> int:
    """Experiments made so far (variants and re-based combinations; baselines are extra)."""
    return sum(1 for v in state.variants.values() if v.kind != "baseline")


def _recorded(state: State) -> set[str]:
    return {v.id for v in state.variants.values() if v.decision is not None}


def _report(
    exp: api.Experiment, state: State, seen: set[str], say: Callable[[str], None]
) -> set[str]:
    for v in state.variants.values():
        if v.decision is None or v.id in seen:
            continue
        row = v.decision["row"]
        new_base = " -> new BASE" if row[3] == "keep" and v.kind != "baseline" else ""
        say(f"{v.id} {row[3]:<7} {row[1]} {row[4]}{new_base}")
        seen.add(v.id)
    return seen


def _wait_for_news(
    exp: api.Experiment,
    state: State,
    stop: LoopStop,
    watch: executor.RunnerWatch,
    deadline: float,
    tick: Callable[[State], None],
) -> None:
    """Sleep until a variant in flight finishes (or a stop, or ``deadline``)."""
    flying = {v.id for v in state.in_flight()}
    if not flying:
        return
    looked = time.monotonic()
    while not stop.hard.is_set() and time.monotonic() < deadline:
        if executor.finished_ids(exp.paths, exp.cfg) & flying:
            watch.progressed()
            return
        if time.monotonic() - looked > api.RUNNER_CHECK_SECONDS:
            watch.check()
            looked = time.monotonic()
        tick(state)
        time.sleep(POLL_SECONDS)
