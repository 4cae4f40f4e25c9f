"""Noise-aware early stopping of losing variants (issue 38): ``research loop --prune``.

While a variant runs, its progress (``progress.py``) at elapsed ``t`` is compared with the
curves BASE's own runs recorded (its baselines, its control runs, the run that made it BASE)
at the same ``t`` (linear interpolation); it is stopped when it is worse by more than ``k`` x
the *noise at t*: the pooled standard deviation at ``t`` of every group of runs of identical
code that recorded a curve (repeated baselines, controls, confirmation re-runs), never less
than that of their last points. Two rules:

- ``median``: the reference is the median of BASE's curves at ``t``; one point worse than
  median + k x noise(t) stops it (quick: Ray Tune's median stopping rule, made noise-aware);
- ``curve``: the reference is the mean of BASE's curves at ``t`` inside a band of k x the noise
  widened to its largest value within 5% of the budget around ``t`` (a run that is a little
  late or early on a steep part of the curve is not "worse"); the variant's last two points
  must both be outside it (slower to decide, for scripts whose intermediate values are noisy).

Never before ``grace`` x the budget (the median length of BASE's curves), never from ``LATE``
x the budget on (a stop there saves under a tenth of the run and loses its metric), never a
baseline, a control, a confirmation re-run or a ``research try --rerun`` (a run in full),
never without ``MIN_RUNS`` runs with curves in groups of identical code (the noise must be
measured: the loop says so while it waits), and never with several GPU models (a running
variant's model is known only once it ends). A stop goes through the queue's cancel (the
process tree dies, the GPU takes the next variant); the run's row says ``pruned``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.core.errors import ResearchError
from gpuswarm.research import executor, progress, rules
from gpuswarm.research.entries import FinishedEntry, PruneVerdict
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths, flocked
from gpuswarm.research.figures import CHANGES
from gpuswarm.research.journal import ExperimentState, Variant, append

RULES = ("off", "median", "curve")
MIN_RUNS = 3  # runs with a curve, in groups of identical code (2 degrees of freedom)
CHECK_SECONDS = 0.5  # the loop looks at running variants this often
WINDOW = 0.05  # curve: the band's width in time, a share of the budget
LATE = 0.9  # never from this share of the budget on: little left to save, the metric is near


@dataclass(frozen=True)
class PruneOptions:
    rule: str = "off"  # off | median | curve
    grace: float = 0.2  # never before this share of the budget
    k: float = 3.0  # worse than the reference by more than k x the noise at t

    @property
    def on(self) -> bool:
        return self.rule != "off"


def parse_grace(text: str) -> float:
    """``--prune-grace``: ``20%`` or ``0.2`` (a share of the budget, 0 up to 1)."""
    raw = text.strip()
    try:
        share = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        share = math.nan
    if not (math.isfinite(share) and 0 <= share < 1):
        raise ResearchError(f"--prune-grace {text!r}: a share of the budget, e.g. 20% or 0.2")
    return share


def options(rule: str, grace: str, k: float) -> PruneOptions:
    if rule not in RULES:
        raise ResearchError(f"--prune {rule!r}: one of {', '.join(RULES)}")
    if not (math.isfinite(k) and k > 0):
        raise ResearchError(f"--prune-k {k:g}: a positive number of noise units, e.g. 3")
    return PruneOptions(rule, parse_grace(grace), float(k))


# -- what BASE's runs say at t -------------------------------------------------------------------
def curve_of(v: Variant) -> progress.Curve:
    fin = v.finished or {}
    return progress.valid_curve(fin.get("curve")) if fin.get("ok") else []


@dataclass(frozen=True)
class Reference:
    curves: list[progress.Curve]  # runs of the compared commit (BASE), with curves
    groups: list[list[progress.Curve]]  # runs of identical code (2 or more), for the noise
    budget: float  # the median length (elapsed) of the reference curves
    full_seconds: float | None  # the median wall time of the reference runs
    end_noise: float = 0.0  # the pooled sd of the groups' last points (the noise's floor)

    @property
    def runs(self) -> int:
        return sum(len(g) for g in self.groups if len(g) >= 2)

    @property
    def dof(self) -> int:
        return sum(len(g) - 1 for g in self.groups if len(g) >= 2)


def reference(
    state: ExperimentState, commit: str, cache: dict[str, progress.Curve] | None = None
) -> Reference | None:
    """BASE's (``commit``'s) curves and the noise groups; None without any curve of it.
    ``cache``: variant id -> its curve, kept by a caller that asks again and again (a recorded
    run's curve never changes)."""
    cache = {} if cache is None else cache
    by_commit: dict[str, list[Variant]] = {}
    for v in state.variants.values():
        if v.finished is None:
            continue
        if v.id not in cache:
            cache[v.id] = curve_of(v)
        if cache[v.id]:
            by_commit.setdefault(v.commit, []).append(v)
    mine = by_commit.get(commit, [])
    if not mine:
        return None
    curves = [cache[v.id] for v in mine]
    seconds = [
        float(s) for v in mine if isinstance(s := (v.finished or {}).get("seconds"), int | float)
    ]
    groups = [[cache[v.id] for v in runs] for runs in by_commit.values() if len(runs) >= 2]
    return Reference(
        curves=curves,
        groups=groups,
        budget=statistics.median(c[-1][0] for c in curves),
        full_seconds=statistics.median(seconds) if seconds else None,
        end_noise=_pooled(groups, lambda c: c[-1][1])[0],
    )


def _pooled(
    groups: list[list[progress.Curve]], values_of: Callable[[progress.Curve], float | None]
) -> tuple[float, int]:
    """The pooled sample sd of each group's values (groups with 2+ values) and its dof."""
    ss, dof = 0.0, 0
    for g in groups:
        vals = [x for c in g if (x := values_of(c)) is not None]
        if len(vals) >= 2:  # plain floats: statistics.variance is exact, and slow
            mean = sum(vals) / len(vals)
            ss += sum((x - mean) ** 2 for x in vals)
            dof += len(vals) - 1
    return (math.sqrt(ss / dof) if dof else 0.0), dof


def noise_at(ref: Reference, t: float) -> float | None:
    """The pooled sd of the groups' values at ``t`` (groups of 2+ runs covering it), floored
    at that of their last points; None with fewer than 2 degrees of freedom."""

    at_t, dof = _pooled(ref.groups, lambda c: progress.at(c, t))
    if dof < MIN_RUNS - 1:
        return None
    return max(at_t, ref.end_noise)


@dataclass(frozen=True)
class Verdict:
    t: float
    value: float
    ref: float
    noise: float
    budget: float

    def record(self, opts: PruneOptions) -> PruneVerdict:
        """The ``pruned`` line's fields (its ``id`` and ``ts`` are the journal's)."""
        return {
            "t": round(self.t, 3),
            "value": self.value,
            "ref": self.ref,
            "noise": self.noise,
            "budget": round(self.budget, 3),
            "rule": opts.rule,
            "k": opts.k,
            "grace": opts.grace,
        }

    def text(self, metric: str, k: float) -> str:
        return (
            f"pruned at {_secs(self.t)} of {_secs(self.budget)}: {metric} {self.value:.6f}, BASE "
            f"{self.ref:.6f} + {k:g} x noise {self.noise:.6f}"
        )


def _secs(t: float) -> str:
    return f"{t:.0f}s" if t >= 100 else f"{t:.3g}s"


def judge(opts: PruneOptions, ref: Reference, curve: progress.Curve, goal: str) -> Verdict | None:
    """The verdict on a running variant's ``curve`` so far: a Verdict to stop it, or None."""
    if not opts.on or not curve:
        return None
    sign = 1.0 if goal == "min" else -1.0
    points = curve[-2:] if opts.rule == "curve" else curve[-1:]
    if opts.rule == "curve" and len(points) < 2:
        return None
    found: Verdict | None = None
    for t, value in points:
        if t < opts.grace * ref.budget:
            return None  # within the grace: too early to tell
        if t >= LATE * ref.budget:
            return None  # nearly done: the full result costs less than what it tells
        values = [x for c in ref.curves if (x := progress.at(c, t)) is not None]
        if not values:
            return None  # no BASE run got that far
        centre = statistics.fmean(values) if opts.rule == "curve" else statistics.median(values)
        if sign * (value - centre) <= opts.k * ref.end_noise:
            return None  # within the noise's floor: no need to measure it at t
        noise = noise_at(ref, t)
        if noise is None:
            return None  # the noise is not measured there
        if opts.rule == "curve":
            w = WINDOW * ref.budget
            near = [n for s in (t - w, t + w) if (n := noise_at(ref, s)) is not None]
            noise = max([noise, *near])
        if sign * (value - centre) <= opts.k * noise:
            return None  # the noise cannot tell it from BASE here
        found = Verdict(t, value, centre, noise, ref.budget)
    return found


def waiting_reason(state: ExperimentState, commit: str, ref: Reference | None = None) -> str | None:
    """Why nothing can be pruned against ``commit`` yet (None: it can be); ``ref``: its
    reference, when the caller has it."""
    if rules.multi_platform(state):
        return "several GPU models: a running variant's model is known only when it ends"
    ref = ref or reference(state, commit)
    have = 0 if ref is None else ref.runs
    if ref is None or ref.dof < MIN_RUNS - 1:
        return (
            f"{have} repeated run(s) with a progress curve; pruning needs {MIN_RUNS} (runs of "
            "identical code: baselines, controls) to measure the noise at each elapsed time"
        )
    return None


def prunable(v: Variant) -> bool:
    return v.kind in CHANGES and v.finished is None and v.pruned is None and not v.meta.get("full")


# -- the loop's check ----------------------------------------------------------------------------
class Pruner:
    """Looks at the running variants a few times a second and stops clear losers."""

    def __init__(
        self, paths: ExpPaths, cfg: ExperimentConfig, opts: PruneOptions, say: Callable[[str], None]
    ) -> None:
        self.paths, self.cfg, self.opts, self.say = paths, cfg, opts, say
        self.next = 0.0
        self.said = ""
        self.curves: dict[str, progress.Curve] = {}  # recorded runs' curves, read once

    def check(self, state: ExperimentState) -> list[str]:
        """Stop the running variants the rule prunes; returns their ids."""
        if not self.opts.on or time.monotonic() < self.next:
            return []
        self.next = time.monotonic() + CHECK_SECONDS
        running = executor.running(self.paths, self.cfg)
        stopped = []
        refs: dict[str, Reference | None] = {}
        for vid, info in running.items():
            v = state.variants.get(vid)
            if v is None or not prunable(v) or not info.get("log"):
                continue
            if v.parent not in refs:
                refs[v.parent] = reference(state, v.parent, self.curves)
            ref = refs[v.parent]
            why = waiting_reason(state, v.parent, ref)
            if why is not None:
                self._tell(f"pruning waits: {why}")
                continue
            curve = progress.tail_curve(Path(str(info["log"])), self.cfg.progress_pattern)
            verdict = None if ref is None else judge(self.opts, ref, curve, self.cfg.goal)
            if verdict is None:
                continue
            self.stop(v, verdict)
            stopped.append(vid)
        return stopped

    def stop(self, v: Variant, verdict: Verdict) -> None:
        text = verdict.text(self.cfg.metric, self.opts.k)
        with flocked(self.paths.lock):
            v.pruned = append(self.paths, "pruned", id=v.id, **verdict.record(self.opts))
        executor.cancel(self.paths, self.cfg, v.id, text)
        self.say(f"{v.id} stopped: {text}")

    def _tell(self, text: str) -> None:
        if text != self.said:
            self.said = text
            self.say(text)


# -- recording a pruned run ----------------------------------------------------------------------
def finished_fields(
    cfg: ExperimentConfig, state: ExperimentState, v: Variant, out: FinishedEntry
) -> FinishedEntry:
    """What a pruned variant's ``finished`` event says: not ok, why, the last value and the GPU
    time saved (a full run of BASE's median length less what this one ran)."""
    rec = v.pruned or {}
    ref = reference(state, v.parent)
    ran = out.get("seconds")
    full = ref.full_seconds if ref is not None else None
    saved = (
        round(max(0.0, full - float(ran)), 3)
        if full is not None and isinstance(ran, int | float)
        else 0.0
    )
    verdict = Verdict(
        float(rec.get("t", 0.0)),
        float(rec.get("value", math.nan)),
        float(rec.get("ref", math.nan)),
        float(rec.get("noise", math.nan)),
        float(rec.get("budget", 0.0)),
    )
    return {
        "ok": False,
        "metric": None,
        "reason": verdict.text(cfg.metric, float(rec.get("k", 0.0))),
        "pruned": rec,
        "saved_s": saved,
    }
