"""Paired BASE controls: decisions that hold on a drifting machine.

On a time-budgeted run the metric depends on how many steps fit, and a shared machine's load
drifts over minutes: the same code measures better when load falls and worse when it rises.
Comparing a variant with BASE's runs from the start of the experiment then confirms no-ops
when load falls and discards real wins when it rises. So, once an experiment has **control
runs** (re-runs of BASE that the loop queues: one in each round, or one every K variants in
async mode), a run is compared with BASE runs *of its own period* on its GPU model:

- **pairing**: a run's reference is the BASE run (a control or a baseline run) on the same
  platform nearest to it in time (by the midpoints of the two runs); the verdict judges the
  mean of those paired differences. A decision waits while a control that could be nearer (one
  that started before the run ended) is still in flight.
- **paired noise**: the spread that matters is that of the difference between two runs of
  identical code at nearby times. It is measured on BASE's control runs over time: runs that
  overlap in time are one *period* (their mean; two simultaneous baseline runs say little about
  the spread across minutes), and the noise is the root mean square of the differences between
  successive periods of one commit on one platform (pooled over BASE commits). It needs two
  periods; before that the unpaired estimate (rules.noise) stands.
- **drift**: when BASE's periods moved from the first to the last by more than ``noise_k`` x
  that noise, status, the live header and the report say so (the decisions are paired anyway).

Pure functions of the replayed state, like the rest of the rules: ``research log --policy``
replays them.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

from gpuswarm.research.journal import ExperimentState, Variant
from gpuswarm.research.payloads import DriftView, NoiseView

CONTROL_KINDS = ("baseline", "control")


def platform_of(v: Variant) -> str:
    return str((v.finished or {}).get("accelerator") or "")


def _metric(v: Variant) -> float | None:
    fin = v.finished or {}
    metric = fin.get("metric")
    if not fin.get("ok") or metric is None:
        return None
    return float(metric)


def _span(v: Variant) -> tuple[float, float] | None:
    fin = v.finished or {}
    started, ended = fin.get("started"), fin.get("ended")
    if not isinstance(started, int | float) or not isinstance(ended, int | float):
        return None
    return float(started), float(ended)


def _mid(v: Variant) -> float | None:
    span = _span(v)
    return None if span is None else (span[0] + span[1]) / 2


def in_use(state: ExperimentState) -> bool:
    """Whether decisions are paired: a loop with controls turned it on (a ``controls`` event:
    from then on, for good), or the experiment has control runs."""
    return state.paired or any(v.kind == "control" for v in state.variants.values())


def base_runs(state: ExperimentState, commit: str, platform: str) -> list[Variant]:
    """``commit``'s finished, successful control and baseline runs on ``platform``, in time."""
    runs = [
        v
        for v in state.variants.values()
        if v.kind in CONTROL_KINDS
        and v.commit == commit
        and platform_of(v) == platform
        and _metric(v) is not None
        and _span(v) is not None
    ]
    return sorted(runs, key=lambda v: _span(v) or (0.0, 0.0))


def paired_reference(state: ExperimentState, commit: str, run: Variant) -> float | None:
    """The metric of ``commit``'s BASE run nearest in time to ``run`` on its platform; None
    until one of them ran beside or after it (a BASE run that ended before ``run`` started is
    of an earlier period: :func:`wanted` asks for a control then), or while a control of
    ``commit`` that could be nearer is in flight."""
    mid = _mid(run)
    span = _span(run)
    if mid is None or span is None:
        return None
    for v in state.in_flight():
        if v.kind == "control" and v.commit == commit and v.created <= span[1]:
            return None  # queued or running within the run's time: it is the better pair
    runs = base_runs(state, commit, platform_of(run))
    if not any((_span(v) or (0.0, 0.0))[1] >= span[0] for v in runs):
        return None
    nearest = min(runs, key=lambda v: abs((_mid(v) or 0.0) - mid))
    return _metric(nearest)


def waits_for_control(state: ExperimentState, v: Variant) -> bool:
    """``v`` finished, undecided, and its decision waits for a control run of BASE (one in
    flight, or none of its period yet)."""
    if not in_use(state) or v.finished is None or v.decision is not None:
        return False
    if v.kind not in ("variant", "combo") or not v.finished.get("ok"):
        return False
    if any(c.kind in CONTROL_KINDS and c.commit == state.base for c in state.in_flight()):
        return True
    span = _span(v)
    runs = base_runs(state, state.base, platform_of(v))
    return span is not None and not any((_span(r) or (0.0, 0.0))[1] >= span[0] for r in runs)


def wanted(state: ExperimentState) -> str | None:
    """With paired decisions: the platform of a finished result that waits for a BASE run of
    its own period while none is in flight (a control run of BASE is wanted there now)."""
    if not in_use(state):
        return None
    if any(v.kind in CONTROL_KINDS and v.commit == state.base for v in state.in_flight()):
        return None  # one run of BASE at a time: a baseline wanted on a model is one too
    for v in state.undecided():
        span = _span(v)
        if v.finished is None or v.kind not in ("variant", "combo", "confirm") or span is None:
            continue
        if not v.finished.get("ok"):
            continue
        against = state.base if state.mode == "async" else v.parent
        if against != state.base:
            continue
        runs = base_runs(state, state.base, platform_of(v))
        if not any((_span(r) or (0.0, 0.0))[1] >= span[0] for r in runs):
            return platform_of(v)
        if paired_noise(state, platform_of(v)) is None:
            return platform_of(v)  # one more period of BASE gives the paired noise
    return None


def periods(runs: list[Variant]) -> list[float]:
    """The mean metric of each period of ``runs`` (time-ordered; overlapping runs are one)."""
    out: list[list[float]] = []
    last_end = -math.inf
    for v in runs:
        span, m = _span(v), _metric(v)
        assert span is not None and m is not None
        if out and span[0] < last_end:
            out[-1].append(m)
            last_end = max(last_end, span[1])
        else:
            out.append([m])
            last_end = span[1]
    return [statistics.fmean(p) for p in out]


@dataclass(frozen=True)
class PairedNoise:
    sigma: float  # the spread of a paired difference (RMS of successive period differences)
    periods: int
    platform: str

    def view(self, platform: str) -> NoiseView:
        """As ``rules.noise_view`` shows it (on ``platform``): its periods are its runs, of one
        group."""
        return {
            "sigma": self.sigma,
            "periods": self.periods,
            "platform": platform,
            "paired": True,
            "runs": self.periods,
            "groups": 1,
        }


def paired_noise(state: ExperimentState, platform: str) -> PairedNoise | None:
    """The noise of a paired difference on ``platform`` (None: fewer than two periods of any
    BASE commit there)."""
    diffs: list[float] = []
    count = 0
    for commit in dict.fromkeys(v.commit for v in state.variants.values() if v.kind == "control"):
        means = periods(base_runs(state, commit, platform))
        diffs += [b - a for a, b in itertools.pairwise(means)]
        count += len(means) if len(means) >= 2 else 0
    if not diffs:
        return None
    return PairedNoise(math.sqrt(statistics.fmean(d * d for d in diffs)), count, platform)


def noise_words(n: NoiseView) -> str:
    """What a noise estimate (an entry of rules.noise_view) was measured on, for the views:
    repeated runs of identical code, or (paired) successive periods of BASE's control runs."""
    if n.get("paired"):
        return f" paired ({n['runs']} periods of BASE's runs)"
    return f" ({n['runs']} runs of {n['groups']} commit{'s' if n['groups'] != 1 else ''})"


@dataclass(frozen=True)
class Drift:
    commit: str
    platform: str
    change: float  # last period's mean minus the first's
    seconds: float  # from the first period's start to the last's end
    periods: int
    noise: float | None
    moving: bool  # |change| beyond noise_k x the paired noise

    def view(self) -> DriftView:
        return {
            "commit": self.commit,
            "platform": self.platform,
            "change": self.change,
            "seconds": round(self.seconds, 1),
            "periods": self.periods,
            "noise": self.noise,
            "moving": self.moving,
        }

    def text(self, metric: str) -> str:
        where = f" on {self.platform}" if self.platform else ""
        noise = "" if self.noise is None else f" (paired noise sd {self.noise:.6f})"
        return (
            f"drift: BASE's controls{where} moved {self.change:+.6f} {metric} over "
            f"{self.seconds / 60:.0f} min, {self.periods} periods{noise}; decisions are paired "
            "with controls of their own period"
        )


def drift(state: ExperimentState, noise_k: float) -> list[Drift]:
    """How BASE's control runs moved, per platform (only with controls): those of BASE, or
    while BASE has fewer than two periods (a keep just moved it), of the latest BASE before it
    that has two."""
    if not in_use(state):
        return []
    out = []
    bases = [*dict.fromkeys(v.commit for v in state.variants.values() if v.kind in CONTROL_KINDS)]
    order = [state.base, *reversed([c for c in bases if c != state.base])]
    for platform in dict.fromkeys(platform_of(v) for v in state.variants.values()):
        commit, runs, means = state.base, [], []
        for commit in order:
            runs = base_runs(state, commit, platform)
            means = periods(runs)
            if len(means) >= 2:
                break
        if len(means) < 2:
            continue
        first, last = _span(runs[0]), _span(runs[-1])
        assert first is not None and last is not None
        est = paired_noise(state, platform)
        change = means[-1] - means[0]
        moving = est is not None and abs(change) > noise_k * est.sigma
        out.append(
            Drift(
                commit,
                platform,
                change,
                last[1] - first[0],
                len(means),
                None if est is None else est.sigma,
                moving,
            )
        )
    return out
