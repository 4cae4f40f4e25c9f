"""The ``prometheus_client`` Collector behind every ``/metrics``: each scrape refreshes the
sources once (:meth:`Sources.refresh`: the journals' new lines, newly ended tasks, ledgers that
grew), then builds every family from what they hold. No series scans anything of its own.

Label policy (what a label may hold, so that no series set grows with the work done):

- ``run``: ``<name>/<run folder>`` of a run under the PATHs (one per run followed);
- ``state``, ``outcome``, ``kind``, ``mode``, ``status``, ``token``: small fixed sets (queue
  states, :data:`~gpuswarm.metrics.runstats.OUTCOMES`, end kinds, exclusive/shared, keep/
  discard/crash, in/cached/out);
- ``slot``: a run's slot ids (one per GPU, or per share of one); ``gpu``, ``uuid``, ``name``:
  this host's devices; ``experiment``: a research experiment's tag; ``group``: a task group's
  name (a config's groups: bounded by the config, never by the tasks);
- never a task id, a task name, an attempt number or a variant id: per-task figures (VRAM peak,
  energy, tokens, cost) are histograms or sums over tasks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpuswarm.core.models import State
from gpuswarm.core.runview import RunView
from gpuswarm.metrics.gpus import HostGpus
from gpuswarm.metrics.research import ExperimentStats
from gpuswarm.metrics.runstats import OUTCOMES, TOKEN_FIELDS, RunStats
from gpuswarm.metrics.sources import Sources

P = "gpuswarm_"
MIB = 1 << 20
STATES = tuple(s.value for s in State)


def group_counts(view: RunView) -> Mapping[str, Mapping[str, int]]:
    """Tasks per group and state, once the RunView keeps them (issue 35's groups): the place
    ``gpuswarm_group_tasks`` reads; empty until then."""
    groups = getattr(view, "group_counts", None)
    return groups if isinstance(groups, Mapping) else {}


class SwarmCollector(Collector):
    """Every gpuswarm series of the runs and experiments under ``sources`` and this host's
    GPUs (``gpus``: None reports none)."""

    def __init__(self, sources: Sources, gpus: HostGpus | None = None) -> None:
        self.sources = sources
        self.gpus = gpus

    def describe(self) -> list[Metric]:
        return []  # built at scrape time: registering must not scrape

    def collect(self) -> Iterator[Metric]:
        self.sources.refresh()
        runs = sorted(self.sources.runs.values(), key=lambda r: r.label)
        yield from _run_families(runs)
        yield from _record_families(runs)
        yield from _research_families(list(self.sources.experiments.values()))
        if self.gpus is not None:
            yield from _gpu_families(self.gpus)
        errors = GaugeMetricFamily(
            P + "source_errors", "runs or experiments under the PATHs that could not be read"
        )
        errors.add_metric([], len(self.sources.errors))
        yield errors


def _run_families(runs: list[RunStats]) -> Iterator[Metric]:
    tasks = GaugeMetricFamily(P + "tasks", "tasks per queue state", labels=["run", "state"])
    groups = GaugeMetricFamily(
        P + "group_tasks", "tasks per group and queue state", labels=["run", "group", "state"]
    )
    depth = GaugeMetricFamily(
        P + "queue_depth", "tasks waiting to start (pending/)", labels=["run"]
    )
    live = GaugeMetricFamily(P + "run_live", "1 while a supervisor serves the run", labels=["run"])
    started = CounterMetricFamily(P + "attempts_started", "attempts started", labels=["run"])
    ended = CounterMetricFamily(
        P + "attempts_ended", "attempts ended, by the journal's outcome", labels=["run", "outcome"]
    )
    busy = CounterMetricFamily(
        P + "slot_busy_seconds", "seconds a slot ran an attempt", labels=["run", "slot"]
    )
    ratio = GaugeMetricFamily(
        P + "slot_busy_ratio",
        "busy share of the slot's life (first seen to now, or to the run's end)",
        labels=["run", "slot"],
    )
    idle = HistogramMetricFamily(
        P + "slot_idle_gap_seconds",
        "time a slot stood free between the end of an attempt and the start of the next",
        labels=["run"],
    )
    quarantines = CounterMetricFamily(P + "quarantines", "slot quarantines", labels=["run"])
    quarantined = GaugeMetricFamily(
        P + "slots_quarantined", "slots quarantined now", labels=["run"]
    )
    for r in runs:
        view, j, now = r.view, r.journal, r.now()
        with view.lock:
            counts = dict(view.counts)
            held = sum(1 for why in view.quarantined.values() if why != "probe")
            per_group = {g: dict(c) for g, c in group_counts(view).items()}
        for state in STATES:
            tasks.add_metric([r.label, state], counts.get(state, 0))
        for group, by_state in sorted(per_group.items()):
            for state, n in sorted(by_state.items()):
                groups.add_metric([r.label, group, state], n)
        depth.add_metric([r.label], counts.get(State.PENDING.value, 0))
        live.add_metric([r.label], 1 if r.live else 0)
        started.add_metric([r.label], j.started)
        for outcome in OUTCOMES:
            ended.add_metric([r.label, outcome], j.ended[outcome])
        for slot in sorted(j.slots):
            busy.add_metric([r.label, slot], round(j.busy_seconds(slot, now), 3))
            ratio.add_metric([r.label, slot], round(j.busy_ratio(slot, now), 4))
        idle.add_metric([r.label], j.idle.buckets(), round(j.idle.total, 6))
        quarantines.add_metric([r.label], j.quarantines)
        quarantined.add_metric([r.label], held)
    yield from (tasks, groups, depth, live, started, ended, busy, ratio, idle)
    yield from (quarantines, quarantined)


def _record_families(runs: list[RunStats]) -> Iterator[Metric]:
    kinds = CounterMetricFamily(
        P + "attempt_ends",
        "attempts of ended tasks by end kind (exited, signaled, timeout, ...)",
        labels=["run", "kind"],
    )
    vram = HistogramMetricFamily(
        P + "attempt_peak_vram_mib",
        "measured peak GPU memory of each attempt of an ended task (MiB)",
        labels=["run"],
    )
    energy = CounterMetricFamily(
        P + "energy_joules",
        "GPU energy of attempts of ended tasks (mode: exclusive GPUs, or a shared GPU's "
        "apportioned share)",
        labels=["run", "mode"],
    )
    tokens = CounterMetricFamily(
        P + "agent_tokens", "agent tokens of attempts of ended tasks", labels=["run", "token"]
    )
    cost = CounterMetricFamily(
        P + "agent_cost_usd", "agent cost (USD) of attempts of ended tasks", labels=["run"]
    )
    for r in runs:
        rec = r.records
        for kind, n in sorted(rec.by_kind.items()):
            kinds.add_metric([r.label, kind], n)
        vram.add_metric([r.label], rec.vram.buckets(), rec.vram.total)
        for mode in ("exclusive", "shared"):
            energy.add_metric([r.label, mode], round(rec.energy.get(mode, 0.0), 3))
        for name in TOKEN_FIELDS:
            tokens.add_metric([r.label, name.removeprefix("tokens_")], rec.tokens[name])
        cost.add_metric([r.label], round(rec.cost_usd, 6))
    yield from (kinds, vram, energy, tokens, cost)


def _research_families(exps: list[ExperimentStats]) -> Iterator[Metric]:
    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(P + "research_" + name, doc, labels=["experiment"])

    by_status = GaugeMetricFamily(
        P + "research_experiments",
        "recorded experiments (results.tsv rows) by status",
        labels=["experiment", "status"],
    )
    base = gauge("base_metric", "BASE's metric (what the policy kept)")
    baseline = gauge("baseline_metric", "the first BASE's metric")
    best = gauge("best_metric", "the best metric any run measured")
    sigma = gauge("noise_sigma", "the noise estimate: pooled spread of runs of identical code")
    kept = CounterMetricFamily(P + "research_kept", "kept improvements", labels=["experiment"])
    flight = gauge("in_flight", "variants queued or running, not recorded yet")
    energy = gauge("energy_joules", "GPU energy of the experiments' recorded runs")
    for exp in sorted(exps, key=lambda e: e.figures.tag):
        f = exp.figures
        for status, n in sorted(f.by_status.items()):
            by_status.add_metric([f.tag, status], n)
        for family, value in (
            (base, f.base_metric),
            (baseline, f.baseline_metric),
            (best, f.best_metric),
            (sigma, f.noise_sigma),
            (energy, f.energy_j),
        ):
            if value is not None:
                family.add_metric([f.tag], value)
        kept.add_metric([f.tag], f.kept)
        flight.add_metric([f.tag], f.in_flight)
    yield from (by_status, base, baseline, best, sigma, kept, flight, energy)


def _gpu_families(gpus: HostGpus) -> Iterator[Metric]:
    labels = ["gpu", "uuid", "name"]
    used = GaugeMetricFamily(P + "gpu_memory_used_bytes", "GPU memory in use", labels=labels)
    total = GaugeMetricFamily(P + "gpu_memory_total_bytes", "GPU memory", labels=labels)
    util = GaugeMetricFamily(P + "gpu_utilization_ratio", "GPU utilisation (0-1)", labels=labels)
    power = GaugeMetricFamily(P + "gpu_power_watts", "GPU power draw", labels=labels)
    energy = CounterMetricFamily(
        P + "gpu_energy_joules",
        "the GPU's total-energy counter (since the driver loaded)",
        labels=labels,
    )
    for g in gpus.read():
        key = [str(g.index), g.uuid, g.name]
        pairs: list[tuple[Any, float | None]] = [
            (used, None if g.used_mb is None else g.used_mb * MIB),
            (total, None if g.total_mb is None else g.total_mb * MIB),
            (util, None if g.util is None else g.util / 100),
            (power, None if g.power_mw is None else g.power_mw / 1000),
            (energy, None if g.energy_mj is None else g.energy_mj / 1000),
        ]
        for family, value in pairs:
            if value is not None:
                family.add_metric(key, value)
    yield from (used, total, util, power, energy)
