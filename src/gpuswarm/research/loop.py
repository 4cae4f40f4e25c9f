"""The autonomous loop: propose, queue, wait, decide, forever (or for a budget).

``rounds`` is the seed's procedure: one variant per GPU from one BASE, wait for all, the best
improving one is kept. ``async``: whenever a GPU frees up it gets the next variant of the
current BASE (plus ``lookahead`` queued ahead, so no GPU waits for the proposer); no GPU waits
for the slowest. The loop holds no state of its own: everything is in the experiment's journal
and core run, so after a crash (even SIGKILL) running ``research loop`` again goes on where it
was, and the runner keeps running variants meanwhile.

One loop per experiment (``looplock.py``): a second is refused, exit 2, naming the first.

Stops: the first SIGINT/SIGTERM stops proposing and waits for the variants in flight; the
second leaves at once (the runner finishes them; the next research command records them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from gpuswarm.core.errors import ResearchError
from gpuswarm.core.signals import on_stop_signals
from gpuswarm.research import executor, readouts, runner, session
from gpuswarm.research.entries import ResultRow
from gpuswarm.research.experiment import flocked
from gpuswarm.research.figures import CHANGES, shown_status
from gpuswarm.research.journal import ExperimentState, append
from gpuswarm.research.looplock import one_loop
from gpuswarm.research.payloads import LoopView
from gpuswarm.research.proposers import Proposal, Proposer
from gpuswarm.research.prune import PruneOptions, Pruner
from gpuswarm.research.settle import queue_control, seal_round, settle_locked

POLL_SECONDS = 0.1
IDLE_PROPOSER_SECONDS = 5.0  # a proposer with nothing to offer is asked again after this
SLOT_COUNT_SECONDS = 10.0  # async: the run's slots counted again this often (a cluster's change)


@dataclass(frozen=True)
class LoopOptions:
    mode: str = "async"  # async | rounds
    max_experiments: int | None = None
    duration: float | None = None  # seconds
    lookahead: int | None = None  # async: variants queued beyond one per GPU (None: proposers)
    proposers: int = 1  # proposals made at the same time (e.g. several LLM agents)
    controls: int | None = None  # BASE control runs: async every N variants (None: one per GPU
    # slot's worth, i.e. every `slots` variants; 0: none); rounds: one per round unless 0
    prune: PruneOptions = field(default_factory=PruneOptions)  # issue 38: prune.py


@dataclass
class LoopStop:
    soft: threading.Event
    hard: threading.Event

    def request(self) -> None:
        (self.hard if self.soft.is_set() else self.soft).set()


def run_loop(
    exp: session.Experiment,
    proposer: Proposer,
    opts: LoopOptions,
    say: Callable[[str], None],
    stop: LoopStop | None = None,
    tick: Callable[[ExperimentState], None] | None = None,
) -> LoopView:
    """Run until stopped or the budget is spent; ``tick(state)`` is called a few times a second
    (the live view follows the runner's journal with it)."""
    with one_loop(exp.paths, opts.mode):
        return _run_loop(exp, proposer, opts, say, stop, tick)


def _run_loop(
    exp: session.Experiment,
    proposer: Proposer,
    opts: LoopOptions,
    say: Callable[[str], None],
    stop: LoopStop | None,
    tick: Callable[[ExperimentState], None] | None,
) -> LoopView:
    tick = tick or (lambda state: None)
    stop = stop or LoopStop(threading.Event(), threading.Event())
    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        previous = state.mode
        if state.mode != opts.mode:
            append(exp.paths, "mode", mode=opts.mode)
        if opts.controls != 0 and not state.paired:  # from now on, decisions are paired
            append(exp.paths, "controls", paired=True, every=opts.controls)
        if opts.prune.on:  # issue 38: what this loop prunes by, on the record
            append(exp.paths, "pruning", **vars(opts.prune))
    run = _Run(exp, proposer, opts, say, stop, tick, state)
    try:
        with on_stop_signals(stop.request):
            while not stop.hard.is_set() and run.step():
                pass
    finally:
        run.close()
        if previous != opts.mode:  # the mode of a loop applies to that loop only
            with flocked(exp.paths.lock):
                seal_round(exp.paths, settle_locked(exp.paths, exp.cfg))
                append(exp.paths, "mode", mode=previous)
    made, seen = run.made, run.seen
    state = exp.settle()
    _report(exp, state, seen, say)
    files = readouts.report(exp)
    return {
        **readouts.status(exp, last=0),
        "made": made,
        "plot": files["plot"],
        "report": files["report"],
        "stopped": stop.soft.is_set() or stop.hard.is_set(),
        "left_running": [v.id for v in state.in_flight()],
        "exhausted": (
            f"the {proposer.name} proposer has nothing new to propose (every change it can make "
            "was tried already)"
            if run.exhausted
            else None
        ),
    }


class _Run:
    """One ``research loop``: proposals in flight, the open round, the budget."""

    def __init__(
        self,
        exp: session.Experiment,
        proposer: Proposer,
        opts: LoopOptions,
        say: Callable[[str], None],
        stop: LoopStop,
        tick: Callable[[ExperimentState], None],
        state: ExperimentState,
    ) -> None:
        self.exp, self.proposer, self.opts, self.say = exp, proposer, opts, say
        self.stop = stop
        self.pruner = Pruner(exp.paths, exp.cfg, opts.prune, say)
        self.view_tick = tick
        self.slots = executor.slot_count(exp.paths, exp.cfg)
        self.slots_at = time.monotonic()
        self.deadline = None if opts.duration is None else time.monotonic() + opts.duration
        self.already = _started(state)
        self.made = 0
        self.seen = _recorded(state)
        self.idle_until = 0.0
        self.watch = runner.RunnerWatch(exp.paths, exp.cfg)
        self.pool = ThreadPoolExecutor(max(1, opts.proposers), thread_name_prefix="propose")
        self.proposing: set[Future[Proposal | None]] = set()
        self.round_left = 0  # rounds: proposals still to start for the open round
        self.round_open = False  # rounds: the open round has proposals made or queued
        self.exhausted = False  # the proposer had nothing (new) to offer

    def tick(self, state: ExperimentState) -> None:
        self.pruner.check(state)  # issue 38: running variants are looked at while they run
        self.view_tick(state)

    def step(self) -> bool:
        """Settle, queue what proposers made, ask for more, wait for news; False = done."""
        exp, stop = self.exp, self.stop
        state = exp.settle()
        self.made = _started(state) - self.already  # re-based combinations count too
        self.seen = _report(exp, state, self.seen, self.say)
        self.tick(state)
        _check_baseline(exp, state)
        if _harvest(exp, self.proposer, self.proposing, self.say, queue=not stop.soft.is_set()):
            self.idle_until = time.monotonic() + IDLE_PROPOSER_SECONDS
            self.exhausted = True
        state = exp.settle()
        self.made = _started(state) - self.already
        budget = _budget(self.opts, self.made + len(self.proposing), self.deadline)
        can = not stop.soft.is_set() and budget != 0 and time.monotonic() >= self.idle_until
        if can and self.opts.mode == "async" and self._control_due(state):
            self._control("every " + str(self.control_every()) + " variants")
        self._propose(state, budget, can)
        if not state.in_flight() and not self.proposing:
            # stopped, budget spent, or the proposer has nothing more: the loop is over
            return not (stop.soft.is_set() or budget == 0 or time.monotonic() < self.idle_until)
        deadline = time.monotonic() + IDLE_PROPOSER_SECONDS
        _wait_for_news(exp, state, stop, self.watch, deadline, self.tick, self.proposing)
        return True

    def _propose(self, state: ExperimentState, budget: int | None, can: bool) -> None:
        rounds = self.opts.mode == "rounds"
        if rounds and can and not self.round_open and not state.in_flight():
            self._count_slots(every=0.0)  # a round as wide as the GPUs there are now
            self.round_left = self.slots if budget is None else min(self.slots, budget)
            self.round_open = self.round_left > 0  # a new round: the last one is decided
            if self.round_open and self.opts.controls != 0 and state.best is not None:
                self._control(f"round {state.round}")  # BASE beside the round's variants
                self.round_left = max(1, min(self.round_left, self.slots - 1))
        if not can:
            self.round_left = 0  # stopped, out of budget or ideas: the round is what it is
        room = self.opts.proposers - len(self.proposing)
        if not rounds:
            self._count_slots(every=SLOT_COUNT_SECONDS)
        want = self.round_left if rounds else _wanted(self.opts, state, self.slots)
        if not rounds:
            want -= len(self.proposing)
        for _ in range(max(0, min(room, want, _cap(budget))) if can else 0):
            self.proposing.add(self.pool.submit(self.proposer.propose, state))
            self.round_left = max(0, self.round_left - 1)
        if self.round_open and not self.proposing and not self.round_left:
            with flocked(self.exp.paths.lock):  # the round is complete: decide it when in
                seal_round(self.exp.paths, settle_locked(self.exp.paths, self.exp.cfg))
            self.round_open = False

    def control_every(self) -> int:
        return self.opts.controls or max(2, self.slots)

    def _control_due(self, state: ExperimentState) -> bool:
        """Async: a control run of BASE every ``control_every`` variants (the baselines are the
        first period's); none before BASE has a metric, none with ``controls`` 0."""
        if self.opts.controls == 0 or state.best is None:
            return False
        since = 0
        for v in reversed(list(state.variants.values())):
            if v.kind in ("control", "baseline"):
                break
            since += v.kind in CHANGES
        return since >= self.control_every()

    def _control(self, why: str) -> None:
        with flocked(self.exp.paths.lock):
            state = settle_locked(self.exp.paths, self.exp.cfg)
            v = queue_control(self.exp.paths, self.exp.cfg, state, why)
        self.say(f"queued {v.id} {v.commit[:7]}: {v.description}")

    def _count_slots(self, every: float) -> None:
        """The run's slots again (a cluster's nodes join and leave), at most every ``every``
        seconds (it reads the run's journal)."""
        if time.monotonic() - self.slots_at >= every:
            self.slots = executor.slot_count(self.exp.paths, self.exp.cfg)
            self.slots_at = time.monotonic()

    def close(self) -> None:
        for f in self.proposing:
            f.cancel()
        close = getattr(self.proposer, "close", None)
        if close is not None:
            close()  # e.g. stop agent processes still thinking
        self.pool.shutdown(wait=not self.stop.hard.is_set(), cancel_futures=True)


def _check_baseline(exp: session.Experiment, state: ExperimentState) -> None:
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


def _wanted(opts: LoopOptions, state: ExperimentState, slots: int) -> int:
    """Async: variants to have queued or running (one per GPU plus the lookahead)."""
    ahead = opts.proposers if opts.lookahead is None else opts.lookahead
    return max(0, slots + ahead - len(state.in_flight()))


def _cap(budget: int | None) -> int:
    return 1 << 30 if budget is None else budget


def _harvest(
    exp: session.Experiment,
    proposer: Proposer,
    proposing: set[Future[Proposal | None]],
    say: Callable[[str], None],
    *,
    queue: bool,
) -> bool:
    """Queue the proposals that are ready; True when a proposer had nothing to offer."""
    empty = False
    for future in [f for f in proposing if f.done()]:
        proposing.discard(future)
        proposal = future.result()  # a proposer that gives up raises here and ends the loop
        if proposal is None:
            empty = True
        elif queue:
            _queue_proposal(exp, proposer, proposal, say)
    return empty


def _queue_proposal(
    exp: session.Experiment, proposer: Proposer, proposal: Proposal, say: Callable[[str], None]
) -> None:
    try:
        data = session.try_variant(
            exp,
            proposal.description,
            files=proposal.files,
            base=proposal.base,
            source=proposer.name,
            meta=proposal.meta,
        )
    except ResearchError as exc:  # e.g. it conflicts with a keep made while it was proposed
        say(f"proposal not queued: {exc}")
        append(
            exp.paths,
            "proposal",
            proposer=proposer.name,
            outcome="refused",
            reason=str(exc),
            description=proposal.description,
        )
        return
    first = data["baseline_queued"]
    extra = f" (baseline {', '.join(first)} first)" if first else ""
    say(f"queued {data['id']} {data['commit'][:7]}: {proposal.description}{extra}")


def _started(state: ExperimentState) -> int:
    """Experiments made so far (variants, re-runs and re-based combinations; baselines and
    BASE's control runs are extra)."""
    return sum(1 for v in state.variants.values() if v.kind not in ("baseline", "control"))


def _recorded(state: ExperimentState) -> set[str]:
    return {v.id for v in state.variants.values() if v.decision is not None}


def _report(
    exp: session.Experiment, state: ExperimentState, seen: set[str], say: Callable[[str], None]
) -> set[str]:
    shown: list[str] = []
    for v in state.variants.values():
        if v.decision is None or v.id in seen:
            continue
        row = ResultRow.of(v.decision.get("row") or ["", "-", "", v.status, v.description])
        new_base = " -> new BASE" if row.status == "keep" and v.kind in CHANGES else ""
        say(f"{v.id} {shown_status(state, v):<8} {row.metric} {row.description}{new_base}")
        seen.add(v.id)
        shown.append(v.id)
    if shown:  # reported here: a later `research wait` does not print them again
        append(exp.paths, "seen", ids=shown)
    return seen


def _wait_for_news(
    exp: session.Experiment,
    state: ExperimentState,
    stop: LoopStop,
    watch: runner.RunnerWatch,
    deadline: float,
    tick: Callable[[ExperimentState], None],
    proposing: set[Future[Proposal | None]],
) -> None:
    """Sleep until a variant in flight finishes (or a stop, or ``deadline``)."""
    flying = {v.id for v in state.in_flight()}
    if not flying and not proposing:
        return
    looked = time.monotonic()
    while not stop.hard.is_set() and time.monotonic() < deadline:
        if any(f.done() for f in proposing):
            return
        if executor.finished_ids(exp.paths, exp.cfg) & flying:
            watch.progressed()
            return
        # a runner is needed only while variants are queued: an idle one ends after its
        # linger while a slow agent thinks, and restarting it then is no progress to wait for
        if flying and time.monotonic() - looked > readouts.RUNNER_CHECK_SECONDS:
            watch.check()
            looked = time.monotonic()
        tick(state)
        time.sleep(POLL_SECONDS)
