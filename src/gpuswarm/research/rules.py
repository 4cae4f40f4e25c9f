"""What a decision weighs besides the metric, as pure functions of the replayed state: the
platform a run ran on and BASE's metric there, the noise of repeated runs, peak memory, lines
added and removed, and the verdict of the seed's rules on one variant (policy.py orders the
verdicts into decisions).

The seed's rules (docs/research.md, "Decisions"):

- *noise*: identical code measures differently from run to run; the spread (pooled sample
  standard deviation of every group of runs of one commit on one platform: repeated baselines,
  confirmation runs) says how much. Under ``noise-aware`` a gain of at most ``noise_k`` x that
  spread is *within the noise*: it is re-run before it may move BASE.
- *simplicity*: a change that adds N lines (net) must gain N x ``gain_per_line``; one that
  removes lines and measures equal (within the noise) is a keep ("simplification").
- *VRAM is a soft constraint*: a keep raising peak memory by more than ``vram_share`` must gain
  at least ``vram_gain``.
- *one baseline per platform*: a run is compared with BASE's runs on the same accelerator model;
  wins on other platforms move BASE only as ``base_platform`` says (default: the majority).

Amounts (``gain_per_line``, ``vram_gain``, ``equal_within``) are a share of BASE's metric
(``"0.01%"``) or absolute metric units (``"0.0001"``).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuswarm.research import controls
from gpuswarm.research.amounts import amount as amount
from gpuswarm.research.amounts import parse_amount as parse_amount
from gpuswarm.research.experiment import MEMORY_METRIC
from gpuswarm.research.journal import ExperimentState, Variant
from gpuswarm.research.payloads import NoiseView

if TYPE_CHECKING:
    from gpuswarm.research.experiment import ExperimentConfig

BASELINE_TRIES_PER_PLATFORM = 3  # baseline runs of one BASE before a platform is given up...


# -- runs, platforms, references ----------------------------------------------------------------
def platform_of(v: Variant) -> str:
    """The accelerator model ``v`` ran on ("" where the record has none: an older ledger)."""
    return str((v.finished or {}).get("accelerator") or "")


def ok_metric(v: Variant) -> float | None:
    fin = v.finished or {}
    metric = fin.get("metric")
    if not fin.get("ok") or metric is None:
        return None
    return float(metric)


def peak_mb(v: Variant) -> float | None:
    """Peak GPU memory of a run in MB, as its results row has it (``memory_gb``: the script's
    ``MEMORY_METRIC`` line, else the peak gpuswarm's VRAM sampler measured), else a
    ``MEMORY_METRIC`` of the log's summary block."""
    fin = v.finished or {}
    gb = fin.get("memory_gb")
    if isinstance(gb, int | float) and not isinstance(gb, bool) and gb > 0:
        return float(gb) * 1024
    printed = (fin.get("summary") or {}).get(MEMORY_METRIC)
    return float(printed) if isinstance(printed, int | float) and printed > 0 else None


def platforms(state: ExperimentState) -> list[str]:
    """Every accelerator model the experiment has (its GPUs at init) or ran on, in order."""
    seen = dict.fromkeys(state.gpu_models)
    for v in state.variants.values():
        if v.finished is not None and v.finished.get("ok"):
            seen.setdefault(platform_of(v))
    return [p for p in seen if p] or [""]


def multi_platform(state: ExperimentState) -> bool:
    return len(platforms(state)) > 1


def runs_of(state: ExperimentState, commit: str, platform: str | None) -> list[Variant]:
    """The successful runs of ``commit`` (on ``platform``; None: anywhere)."""
    return [
        v
        for v in state.variants.values()
        if v.commit == commit
        and ok_metric(v) is not None
        and (platform is None or platform_of(v) == platform)
    ]


def reference(state: ExperimentState, commit: str, platform: str) -> float | None:
    """``commit``'s metric on ``platform``: with one platform, what the ledger says it measured
    (the mean of its baselines, of a keep's confirmation runs); with several, the mean of its
    runs on that platform (None until one ran there)."""
    if not multi_platform(state):
        return state.base_metric.get(commit)
    runs = [ok_metric(v) for v in runs_of(state, commit, platform)]
    return statistics.fmean([m for m in runs if m is not None]) if runs else None


def base_memory(state: ExperimentState, commit: str, platform: str) -> float | None:
    """``commit``'s peak memory (MB, mean of its runs) on ``platform``, else anywhere."""
    for where in (platform, None):
        values = [m for v in runs_of(state, commit, where) if (m := peak_mb(v)) is not None]
        if values:
            return statistics.fmean(values)
    return None


def majority_platform(state: ExperimentState) -> str:
    """The platform with the most GPUs (at init, else that ran something); ties: the first."""
    if state.gpu_models:
        counts = Counter(state.gpu_models)
    else:
        slots: dict[str, set[str]] = {}
        for v in state.variants.values():
            if v.finished is not None:
                slots.setdefault(platform_of(v), set()).add(str(v.finished.get("slot")))
        counts = Counter({p: len(s) for p, s in slots.items()})
    if not counts:
        return ""
    order = platforms(state)
    return max(order, key=lambda p: (counts.get(p, 0), -order.index(p)))


def moves_base(cfg: ExperimentConfig, state: ExperimentState, platform: str) -> bool:
    """Whether a win measured on ``platform`` may move BASE (``base_platform``)."""
    if not multi_platform(state) or cfg.base_platform == "any":
        return True
    if cfg.base_platform == "majority":
        return platform == majority_platform(state)
    return platform == cfg.base_platform


def short_platform(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3`` (for the results.tsv tag)."""
    for vendor in ("NVIDIA ", "AMD "):
        name = name.removeprefix(vendor)
    return name


# -- noise --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Noise:
    sigma: float  # pooled sample standard deviation of runs of identical code
    runs: int
    groups: int  # commits (on one platform) with two or more runs
    platform: str  # "" when pooled over every platform

    def view(self) -> NoiseView:
        return {
            "sigma": self.sigma,
            "runs": self.runs,
            "groups": self.groups,
            "platform": self.platform,
            "paired": False,
        }


def _pooled(groups: list[list[float]], platform: str) -> Noise | None:
    groups = [g for g in groups if len(g) >= 2]
    dof = sum(len(g) - 1 for g in groups)
    if dof < 1:
        return None
    sq = sum((x - statistics.fmean(g)) ** 2 for g in groups for x in g)
    return Noise(math.sqrt(sq / dof), sum(len(g) for g in groups), len(groups), platform)


def noise(state: ExperimentState, platform: str | None = None) -> Noise | None:
    """The spread of repeated runs of identical code on ``platform`` (pooled over every
    platform where that one has none yet; None: no commit ran twice)."""
    by_key: dict[tuple[str, str], list[float]] = {}
    for v in state.variants.values():
        m = ok_metric(v)
        if m is not None:
            by_key.setdefault((v.commit, platform_of(v)), []).append(m)
    if platform is not None:
        own = _pooled([g for (_, p), g in by_key.items() if p == platform], platform)
        if own is not None:
            return own
    return _pooled(list(by_key.values()), "")


def noise_view(state: ExperimentState) -> list[NoiseView]:
    """The noise estimate per platform (one entry when there is one platform), for status:
    the paired one (``paired: true``) once control runs give it."""
    out: list[NoiseView] = []
    names = platforms(state)
    paired = controls.in_use(state)
    for p in names if len(names) > 1 else [None]:
        est = noise(state, p)
        pair = controls.paired_noise(state, p or names[0]) if paired else None
        if pair is not None:
            out.append(pair.view(p or ""))
        elif est is not None:
            out.append({**est.view(), "platform": p or est.platform, "paired": False})
    return out


# -- verdicts -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """What the rules say of a variant's runs against a reference commit."""

    kind: str  # win | simplification | noise (a gain within the noise) | lose
    gain: float  # mean gain of its runs (metric units; > 0 is better)
    runs: int
    reason: str
    note: str = ""  # the short form its results.tsv row carries
    lines: int = 0  # net lines added (negative: removed)


def gain_of(cfg: ExperimentConfig, metric: float, ref: float) -> float:
    return ref - metric if cfg.goal == "min" else metric - ref


def fmt_gain(g: float) -> str:
    return f"{g:+.4g}"


def judge(
    cfg: ExperimentConfig, state: ExperimentState, v: Variant, against: str, why: str
) -> Verdict | None:
    """The rules' verdict on ``v`` (with its confirmation runs) against ``against``'s metric on
    the platform of each run (with control runs: against ``against``'s run of each run's own
    period, controls.py); None while ``v``'s platform has no measurement of ``against``."""
    paired = controls.in_use(state)
    own = _reference_for(state, against, v, paired)
    if own is None:
        return None
    gains = []
    for run in [v, *confirmations(state, v)]:
        ref, m = _reference_for(state, against, run, paired), ok_metric(run)
        if paired and ref is None and m is not None:
            return None  # a re-run waits for the control of its own period
        if ref is not None and m is not None:
            gains.append(gain_of(cfg, m, ref))
    g, n = statistics.fmean(gains), len(gains)
    diff = (v.finished or {}).get("diff")
    net = 0 if diff is None else int(diff.get("insertions", 0)) - int(diff.get("deletions", 0))
    est = _noise_for(state, platform_of(v), paired) if cfg.policy == "noise-aware" else None
    if paired and est is None and cfg.policy == "noise-aware":
        return None  # paired: the noise is that of controls over time; two periods are needed
    margin = cfg.noise_k * est.sigma / math.sqrt(n) if est is not None else 0.0
    fewer = cfg.simplify and net < 0
    per_line = amount(cfg.gain_per_line, own)
    verdict: Verdict
    if g > 0 and net > 0 and per_line > 0 and g < net * per_line:
        need = net * per_line
        verdict = Verdict(
            "lose",
            g,
            n,
            f"{fmt_gain(g)} for +{net} lines: a change adding lines must gain {need:.6g} "
            f"({cfg.gain_per_line} per line)",
            f"{fmt_gain(g)} for +{net} lines",
            net,
        )
    elif g > margin:
        verdict = Verdict("win", g, n, why, "", net)
    elif fewer and (g > 0 or -g <= _equal(cfg, est, own, n)):
        within = "the noise" if est is not None else f"{cfg.equal_within}"
        verdict = Verdict(
            "simplification",
            g,
            n,
            f"simplification: {net} lines, {cfg.metric} equal within {within} ({fmt_gain(g)})",
            f"simplification, {net} lines",
            net,
        )
    elif g > 0:
        assert est is not None  # margin > 0 needs a noise estimate
        spread = f"{cfg.noise_k:g} x noise {est.sigma:.6g}" + (f"/sqrt({n})" if n > 1 else "")
        verdict = Verdict(
            "noise", g, n, f"within the noise: {fmt_gain(g)} <= {spread}", "within the noise", net
        )
    else:
        word = "lower" if cfg.goal == "min" else "higher"
        verdict = Verdict("lose", g, n, f"not {word} than {own:.6f}", "", net)
    if verdict.kind in ("win", "simplification"):
        verdict = _memory_check(cfg, state, v, against, own, verdict)
    return verdict


def _reference_for(
    state: ExperimentState, against: str, run: Variant, paired: bool
) -> float | None:
    if paired:
        return controls.paired_reference(state, against, run)
    return reference(state, against, platform_of(run))


def _noise_for(state: ExperimentState, platform: str, paired: bool) -> Noise | None:
    """The noise a verdict uses: paired, the spread of BASE's controls over time (None until
    two periods ran); else the spread of repeated runs."""
    if paired:
        est = controls.paired_noise(state, platform)
        return None if est is None else Noise(est.sigma, est.periods, 1, platform)
    return noise(state, platform)


def _equal(cfg: ExperimentConfig, est: Noise | None, ref: float, n: int) -> float:
    """How far below BASE a simplification may measure and still count as equal."""
    if est is not None:
        return cfg.noise_k * est.sigma / math.sqrt(n)
    return amount(cfg.equal_within, ref)


def _memory_check(
    cfg: ExperimentConfig,
    state: ExperimentState,
    v: Variant,
    against: str,
    ref: float,
    verdict: Verdict,
) -> Verdict:
    mine = peak_mb(v)
    base = base_memory(state, against, platform_of(v))
    if mine is None or base is None or base <= 0:
        return verdict
    share = mine / base - 1
    need = amount(cfg.vram_gain, ref)
    if share <= cfg.vram_share or verdict.gain >= need > 0:
        return verdict
    return Verdict(
        "lose",
        verdict.gain,
        verdict.runs,
        f"peak memory {share:+.0%} ({base / 1024:.1f} -> {mine / 1024:.1f} GB) for "
        f"{fmt_gain(verdict.gain)}: more than {cfg.vram_share:.0%} more memory needs a gain of "
        f"{need:.6g} ({cfg.vram_gain})",
        f"memory {share:+.0%} for {fmt_gain(verdict.gain)}",
        verdict.lines,
    )


def confirmations(state: ExperimentState, v: Variant) -> list[Variant]:
    return [c for c in state.variants.values() if c.kind == "confirm" and c.origin == v.id]


def baseline_wanted(cfg: ExperimentConfig, state: ExperimentState) -> str | None:
    """A platform with results to judge and no run of BASE on it (with several platforms):
    one more baseline run is wanted (pinned to that model by its task's ``accelerator``; tried
    a few times per platform). None: nothing wanted, or one is in flight."""
    if not multi_platform(state):
        return None
    base_runs = baseline_runs(state)
    if any(v.finished is None for v in base_runs):
        return None
    if len(base_runs) >= baseline_tries(state):
        return None
    measured = {platform_of(v) for v in runs_of(state, state.base, None)}
    for v in state.undecided():
        p = platform_of(v)
        # async judges every result against BASE; rounds against its parent (BASE or older)
        against_base = state.mode == "async" or v.parent == state.base
        judged = v.kind in ("variant", "combo") and against_base and ok_metric(v) is not None
        if judged and p not in measured:
            return p
    return None


def baseline_tries(state: ExperimentState) -> int:
    """...or, where there are more GPUs, one more than them (each run is pinned to its model;
    a run that fails or is cancelled there is tried again, this many runs in all)."""
    gpus = sum(state.gpu_models.values())
    return max(BASELINE_TRIES_PER_PLATFORM * len(platforms(state)), gpus + 1)


def baseline_runs(state: ExperimentState) -> list[Variant]:
    return [v for v in state.variants.values() if v.kind == "baseline" and v.commit == state.base]


def baseline_given_up(state: ExperimentState, platform: str) -> bool:
    """Enough baseline runs of BASE landed elsewhere: ``platform`` is not waited for."""
    base_runs = baseline_runs(state)
    done = all(v.finished is not None for v in base_runs)
    many = len(base_runs) >= baseline_tries(state)
    return done and many and not runs_of(state, state.base, platform)


def auto_repeats(cfg: ExperimentConfig, state: ExperimentState) -> int:
    """How many runs the first baseline gets: ``baseline_repeats``, else (noise-aware) two per
    platform where it has two GPUs (a spread on different GPUs), else one."""
    if cfg.baseline_repeats > 0:
        return cfg.baseline_repeats
    if cfg.policy != "noise-aware":
        return max(1, len(state.gpu_models))
    counts = Counter(state.gpu_models)
    if not counts:
        return 2
    return sum(2 for _ in counts)
