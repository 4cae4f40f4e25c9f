"""Waiting for variants and looking at an experiment: wait (any / all, reporting each finished
variant once), status, the full log, progress.png and report.html. Plain data back, as the
other research commands."""

from __future__ import annotations

import re
import time
from pathlib import Path

from gpuswarm.core.errors import ResearchError
from gpuswarm.research import controls, executor, proposercost, rules, runner, variants
from gpuswarm.research.entries import DecidedEntry, ResultRow, metric_of
from gpuswarm.research.experiment import ExperimentConfig, flocked
from gpuswarm.research.figures import CHANGES, energy_figures, figures, rebased
from gpuswarm.research.journal import ExperimentState, Variant, append, replay
from gpuswarm.research.payloads import (
    BestRecorded,
    Headline,
    InFlightView,
    LoggedDecision,
    LoggedVariant,
    LogView,
    PlatformView,
    Replay,
    StatusView,
    VariantView,
    WaitView,
)
from gpuswarm.research.plot import PlotRow
from gpuswarm.research.prune import PruneOptions
from gpuswarm.research.session import Experiment, files_of
from gpuswarm.research.settle import seal_round, settle_locked

WAIT_POLL_SECONDS = 0.2
RUNNER_CHECK_SECONDS = 2.0


def wait(
    exp: Experiment,
    *,
    mode: str = "all",
    timeout: float | None = None,
    ids: list[str] | None = None,
) -> WaitView:
    """Block until any / all of the variants in flight (or ``ids``) are recorded; report them,
    and those recorded since the last wait, once."""
    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        round_open = state.round
        seal_round(exp.paths, state)  # the agent's round ends with its wait
        if state.round != round_open:  # decide the round just sealed (its runs may be in)
            state = settle_locked(exp.paths, exp.cfg)
    fresh = [v.id for v in state.variants.values() if v.finished is None or not v.seen]
    targets = ids or fresh
    for vid in targets:
        if vid not in state.variants:
            raise ResearchError(f"no variant {vid} in experiment {exp.cfg.tag}")
    deadline = None if timeout is None else time.monotonic() + timeout
    looked = 0.0
    watch = runner.RunnerWatch(exp.paths, exp.cfg)
    while True:
        done = [t for t in targets if _settled(state, state.variants[t])]
        if (mode == "any" and done) or len(done) == len(targets):
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        if time.monotonic() - looked > RUNNER_CHECK_SECONDS:
            watch.check()  # e.g. after `research stop` or a crash
            looked = time.monotonic()
        time.sleep(WAIT_POLL_SECONDS)
        if executor.finished_ids(exp.paths, exp.cfg) & _awaited(state, targets):
            state = exp.settle()
            watch.progressed()
    state = exp.settle()
    settled = [t for t in targets if _settled(state, state.variants[t])]
    finished = [shown(state, state.variants[t]) for t in settled]
    if finished:
        append(exp.paths, "seen", ids=[v["id"] for v in finished])
    return {
        **_headline(exp, state),
        "finished": finished,
        "waiting": [t for t in targets if t not in settled],
        "timed_out": len(settled) < len(targets),
    }


def _settled(state: ExperimentState, v: Variant) -> bool:
    """Finished, and not waiting for its confirmation re-runs: a would-be keep's wait ends
    when the re-runs decided it, not when its first run ended."""
    if v.finished is None:
        return False
    if v.decision is not None or v.kind == "confirm":
        return True
    if controls.waits_for_control(state, v):
        return False  # paired: decided once the control of its period is in
    if any(c.kind in controls.CONTROL_KINDS for c in state.in_flight()):
        return False  # BASE is being measured (a baseline on its GPU model, say): its reference
    return all(c.finished is not None for c in rules.confirmations(state, v))


def _awaited(state: ExperimentState, targets: list[str]) -> set[str]:
    """The runs whose end a wait for ``targets`` is waiting for: the targets, their
    confirmation re-runs and BASE's runs (baselines, controls) still in flight."""
    out = {t for t in targets if state.variants[t].finished is None}
    for t in targets:
        out.update(c.id for c in rules.confirmations(state, state.variants[t]) if not c.finished)
    out.update(c.id for c in state.in_flight() if c.kind in controls.CONTROL_KINDS)
    return out


def shown(state: ExperimentState, v: Variant) -> VariantView:
    """``v.view()``; a finished variant waiting for its confirmation re-runs, or (paired) for
    a run of BASE of its period, says so."""
    out = v.view()
    runs = rules.confirmations(state, v)
    if v.decision is None and v.finished is not None and runs and v.kind != "confirm":
        done = sum(1 for c in runs if c.finished is not None)
        out["reason"] = (
            f"confirming: {done}/{len(runs)} re-runs in ({', '.join(c.id for c in runs)})"
        )
    elif controls.waits_for_control(state, v):
        base = [c.id for c in state.in_flight() if c.kind in controls.CONTROL_KINDS]
        out["reason"] = "paired: waiting for a run of BASE of its period" + (
            f" ({', '.join(base)})" if base else ""
        )
    return out


def _headline(exp: Experiment, state: ExperimentState) -> Headline:
    return {
        "tag": exp.cfg.tag,
        "branch": exp.cfg.branch,
        "base": state.base,
        "best": state.best,
        "metric": exp.cfg.metric,
        "goal": exp.cfg.goal,
        "mode": state.mode,  # the setting (what a manual `try` joins)
        "modes": figures(state).modes,  # what the variants ran in (views print this)
        "round": state.round,
        "files": variants.files_case(exp.paths, exp.cfg, state),
    }


def status(exp: Experiment, last: int = 10) -> StatusView:
    state = exp.settle()
    now = time.time()
    live = executor.running(exp.paths, exp.cfg)
    in_flight: list[InFlightView] = []
    for v in state.in_flight():
        run = live.get(v.id)
        in_flight.append(
            {
                **v.view(),
                "status": "running" if run else "queued",  # one state field, never two
                "slot": run["slot"] if run else None,
                "elapsed": round(now - run["since"], 1) if run else None,
            }
        )
    undecided = [shown(state, v) for v in state.undecided() if v.finished is not None]
    return {
        **_headline(exp, state),
        "best_recorded": best_recorded(exp.cfg, state),
        **figures(state).view(),  # baseline, best, experiments, kept, ...: one definition
        "in_flight": in_flight,
        "undecided": undecided,
        "last": [
            {
                "id": vid,
                "commit": r.commit,
                "metric": float(r.metric) if r.measured else None,  # as in the TSV
                "memory_gb": float(r.memory_gb),
                "status": "re-based" if rebased(state, state.variants[vid]) else r.status,
                "description": r.description,
            }
            for vid, r in list(zip(state.row_ids, map(ResultRow.of, state.rows), strict=False))[
                -last:
            ]
            if last > 0
        ],
        "runner": bool(runner.runner_pids(exp.paths)),
        "timeout": exp.cfg.timeout,
        "policy": exp.cfg.policy,
        "noise": rules.noise_view(state),
        "drift": [d.view() for d in controls.drift(state, exp.cfg.noise_k)],
        "platforms": platform_view(exp.cfg, state),
        **files_of(exp.paths),
    }


def platform_view(cfg: ExperimentConfig, state: ExperimentState) -> list[PlatformView]:
    """With several GPU models: per model, BASE's metric there, its first baseline and
    whether its wins move BASE (empty with one model)."""
    if not rules.multi_platform(state):
        return []
    out: list[PlatformView] = []
    for p in rules.platforms(state):
        baselines = [v for v in state.variants.values() if v.kind == "baseline"]
        firsts = [rules.ok_metric(v) for v in baselines if rules.platform_of(v) == p]
        first = next((m for m in firsts if m is not None), None)
        out.append(
            {
                "platform": p,
                "best": rules.reference(state, state.base, p),
                "baseline": first,
                "runs": len(rules.runs_of(state, state.base, p)),
                "moves_base": rules.moves_base(cfg, state, p),
            }
        )
    return out


def replayed(exp: Experiment, spec: str, pruning: PruneOptions | None = None) -> Replay:
    """``research log --policy SPEC``: the decisions SPEC's settings would have made (with
    ``pruning``, issue 38: also what that rule would have stopped, and the best without it)."""
    from gpuswarm.app.api import read_journal as api_journal
    from gpuswarm.research.prune_replay import summary
    from gpuswarm.research.replay import parse_spec, replay_decisions

    exp.settle()
    cfg = parse_spec(exp.cfg, spec)
    data = replay_decisions(exp.paths, cfg, pruning)
    if pruning is not None and pruning.on:
        best = replay_decisions(exp.paths, cfg)["best"]
        curves = sum(1 for e in api_journal(exp.paths.ledger) if e.get("curve"))
        data["pruning"] = summary(pruning, data["pruned"], data["best"], best, curves)
    return {"tag": exp.cfg.tag, "spec": spec, **data}


def best_recorded(cfg: ExperimentConfig, state: ExperimentState) -> BestRecorded | None:
    """The best metric any run measured (kept or not): BASE's metric is what the policy kept,
    this is what was seen (a lucky re-run, a discarded winner under noise-aware)."""
    runs = [v for v in state.variants.values() if v.finished and v.finished.get("ok")]
    runs = [v for v in runs if v.finished and v.finished.get("metric") is not None]
    if not runs:
        return None
    sign = 1.0 if cfg.goal == "min" else -1.0
    top = min(runs, key=lambda v: sign * metric_of(v.finished))
    return {
        "id": top.id,
        "metric": metric_of(top.finished),
        "status": top.status,
        "commit": top.commit,
    }


LOG_LIMIT = 20  # `log --json` shows this many variants unless --limit says otherwise


def log_selection(
    state: ExperimentState, limit: int | None, since: str | None, now: float | None = None
) -> tuple[list[Variant], int]:
    """The variants ``research log`` shows (experiment order) and how many it leaves out:
    those after ``since`` (a variant id, or a duration back from now in seconds as text),
    then the last ``limit`` of them (None or 0: all)."""
    chosen = list(state.variants.values())
    if since is not None:
        if re.fullmatch(r"v\d{4,}", since):
            if since not in state.variants:
                raise ResearchError(f"--since {since}: no variant {since} in this experiment")
            ids = list(state.variants)
            chosen = chosen[ids.index(since) + 1 :]
        else:
            start = (time.time() if now is None else now) - float(since)
            chosen = [v for v in chosen if v.created >= start]
    total = len(chosen)
    if limit:
        chosen = chosen[-limit:]
    return chosen, total - len(chosen)


def log(exp: Experiment, limit: int | None = LOG_LIMIT, since: str | None = None) -> LogView:
    """The variants (the last ``limit``, those after ``since``) with every field the ledger
    has: host, times, the summary block, diff stats, the log tail and path, the decision and
    its reason, the proposer's notes; ``left_out`` counts the rest."""
    state = exp.settle()
    chosen, left_out = log_selection(state, limit, since)
    out: list[LoggedVariant] = []
    for v in chosen:
        fin = v.finished or {}
        out.append(
            {
                **v.view(),
                "source": v.source,
                "origin": v.origin,
                "meta": v.meta,
                **proposercost.spent(v),  # issue 34: proposer_tokens, proposer_usd
                "host": fin.get("host"),
                "accelerator": fin.get("accelerator"),
                "started": fin.get("started"),
                "ended": fin.get("ended"),
                "exit": fin.get("exit"),
                "summary": fin.get("summary") or {},
                "diff": fin.get("diff"),
                "tail": fin.get("tail") or "",
                "energy_j": fin.get("energy_j"),  # issue 37
                "decision": None if v.decision is None else _logged(v.decision),
            }
        )
    return {
        **_headline(exp, state),
        **energy_figures(state),
        "variants": out,
        "total": len(state.variants),
        "left_out": left_out,
    }


def _logged(d: DecidedEntry) -> LoggedDecision:
    return {
        "status": d.get("status"),
        "reason": d.get("reason"),
        "row": d.get("row"),
        "ts": d.get("ts"),
    }


def log_text(exp: Experiment, limit: int | None, since: str | None) -> str:
    """results.tsv's header and the rows of the variants ``log_selection`` picks."""
    state = exp.settle()
    chosen = {v.id for v in log_selection(state, limit, since)[0]}
    lines = exp.paths.results_tsv.read_text().splitlines(keepends=True)[:1]
    lines += ["\t".join(row) + "\n" for row in proposercost.tsv_rows(state, chosen)]
    return "".join(lines)


def plot_rows(state: ExperimentState) -> list[PlotRow]:
    """progress.png's points: results.tsv's rows in experiment order, each with BASE's metric
    once it was decided (the running best) and whether it is a change."""
    rows: list[PlotRow] = []
    with_rows = set(state.row_ids)
    for v in (v for vid, v in state.variants.items() if vid in with_rows):
        dec: DecidedEntry = v.decision or {}
        r = ResultRow.of(dec.get("row") or [])
        after = dec.get("base_metric")
        rows.append(
            PlotRow(
                metric=float(r.metric) if r.measured else None,
                status=r.status,
                description=re.sub(
                    r"^\[[^\]]*\]\s*", "", r.description
                ),  # without the [R3 gpu2] tag
                base=None if after is None else float(after["value"]),
                change=v.kind in CHANGES,
            )
        )
    return rows


def plot(exp: Experiment, output: Path | None = None) -> Path:
    from gpuswarm.research.plot import progress_png

    state = exp.settle()
    return progress_png(
        plot_rows(state),
        output or exp.paths.progress_png,
        metric=exp.cfg.metric,
        goal=exp.cfg.goal,
        title=f"autoresearch/{exp.cfg.tag}",
        best=state.best,  # as the report and status say it (the mean of repeated baselines)
    )


def report(exp: Experiment) -> dict[str, str]:
    """progress.png and report.html of the experiment as it stands."""
    from gpuswarm.research.report import write_research_report

    png = plot(exp)
    state = replay(exp.paths)
    html = write_research_report(exp.paths, exp.cfg, state, png)
    return {"plot": str(png), "report": str(html), "results": str(exp.paths.results_tsv)}
