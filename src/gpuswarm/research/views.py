"""Compact human output of the research commands (``--json`` bypasses this module)."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Console

from gpuswarm.core.words import counted
from gpuswarm.research import controls, executor, rules, session
from gpuswarm.research.experiment import ExperimentConfig
from gpuswarm.research.figures import figures
from gpuswarm.research.journal import ExperimentState
from gpuswarm.research.loop import LoopOptions, run_loop
from gpuswarm.research.payloads import (
    Configured,
    Decided,
    DriftView,
    Headline,
    Knobs,
    LoopView,
    Made,
    NoiseFigures,
    Queued,
    Replay,
    StatusView,
    Tried,
    VariantView,
    WaitView,
)
from gpuswarm.research.proposers import Proposer
from gpuswarm.ui.table import LiveView, clock, shown
from gpuswarm.ui.watch import Follower


def _metric(value: float | None) -> str:
    return "-" if value is None else f"{float(value):.6f}"


def _short(sha: str | None) -> str:
    return (sha or "")[:7]


def _variant_line(v: VariantView) -> str:
    gpu = f"gpu{v['gpu']}" if v.get("gpu") not in (None, "") else ""
    mem = f"{v['memory_gb']:.1f}GB" if v.get("memory_gb") is not None else ""
    plain = ("baseline", "better than BASE", "best of its round")  # a keep's reason worth saying
    said = v.get("reason") and (v["status"] != "keep" or not str(v["reason"]).startswith(plain))
    reason = f"  ({v['reason']})" if said else ""
    return (
        f"{v['id']}  {_short(v['commit'])}  {v['status']:<8} {_metric(v.get('metric')):>10}  "
        f"{mem:>7}  {gpu:<5} {clock(v.get('seconds')):>6}  {v['description']}{reason}"
    )


def show_init(d: Made) -> None:
    click.echo(f"experiment {d['tag']}: branch {d['branch']} at {_short(d['base'])}")
    click.echo(f"results: {d['results']}")
    click.echo("next: edit the file, then `gpuswarm research try -m '<idea>'` (once per idea)")


def show_queued(d: Queued) -> None:
    for v in d["queued"]:
        click.echo(f"queued {v['id']} ({v['description']}) on BASE {_short(d['base'])}")


def show_try(d: Tried) -> None:
    diff = d["diff"]
    if d.get("rerun"):  # issue 38: `try --rerun ID`
        click.echo(
            f"{d['id']} {_short(d['commit'])} queued: {d['rerun']} again, in full (never pruned;"
            f" +{diff['insertions']} -{diff['deletions']} lines on BASE {_short(d['parent'])})"
        )
        return
    extra = (
        f"; baseline {', '.join(d['baseline_queued'])} queued first" if d["baseline_queued"] else ""
    )
    click.echo(
        f"{d['id']} {_short(d['commit'])} queued (round {d['round']}, +{diff['insertions']} "
        f"-{diff['deletions']} lines){extra}; your files are back at BASE {_short(d['parent'])}"
    )


def show_rerun(d: dict[str, Any]) -> None:
    """``try --rerun ID``'s payload (research/rerun.py's; a Tried once it says so)."""
    keys = ("id", "commit", "parent", "round", "baseline_queued", "diff", "rerun")
    id_, commit, parent, round_, queued, diff, again = (d[k] for k in keys)
    show_try(
        {
            "id": id_,
            "commit": commit,
            "parent": parent,
            "round": round_,
            "baseline_queued": queued,
            "diff": diff,
            "rerun": again,
        }
    )


def _headline(d: Headline) -> str:
    best = _metric(d.get("best"))
    mode = d.get("modes") or d["mode"]
    return f"BASE {_short(d['base'])} ({d['branch']})  best {d['metric']} {best}  mode {mode}"


def _files_line(d: Headline | Decided, always: bool = False) -> None:
    files = d.get("files")
    if files and (always or files["case"] not in ("following", "behind")):
        click.echo(f"files: {files['message']}")


def show_wait(d: WaitView) -> None:
    click.echo(_headline(d))
    for v in d["finished"]:
        click.echo(_variant_line(v))
    if d["waiting"]:
        click.echo(f"still running: {', '.join(d['waiting'])}")
    _files_line(d)


def pruned_text(d: Any) -> str:
    """``, 3 pruned (GPU time saved 4m12s)`` (issue 38), from research/figures.py's numbers;
    "" when nothing was pruned. ``d``: a Figures or its view."""
    n = d["pruned"] if isinstance(d, dict) else d.pruned
    saved = d["gpu_saved_s"] if isinstance(d, dict) else d.gpu_saved_s
    return f", {n} pruned (GPU time saved {clock(saved)})" if n else ""


def show_status(d: StatusView) -> None:
    runner = "runner live" if d["runner"] else "runner idle"
    click.echo(
        f"{_headline(d)}  {counted(d['experiments'], 'experiment')}, "
        f"{counted(d['kept'], 'change')} kept{pruned_text(d)}  ({runner})"
    )
    for v in d["in_flight"]:
        where = str(v["slot"]) if v["slot"] is not None else "queued"
        click.echo(
            f"  {where:<8} {v['id']}  {clock(v['elapsed']):>6}/{clock(d['timeout'])}  "
            f"{v['description']}"
        )
    for u in d["undecided"]:
        click.echo(f"  awaiting decision: {_variant_line(u)}")
    click.echo(noise_line(d))
    for line in drift_lines(d.get("drift") or [], d["metric"]):
        click.echo(line)
    for p in d.get("platforms") or []:
        moves = "moves BASE" if p["moves_base"] else "compared only"
        click.echo(
            f"  platform {p['platform']}: BASE {_metric(p['best'])} ({p['runs']} runs), "
            f"baseline {_metric(p['baseline'])}, {moves}"
        )
    for r in d["last"]:
        cells = (r["id"], r["commit"], f"{_metric(r['metric']):>10}", f"{r['memory_gb']:>5.1f}")
        click.echo(f"  {'  '.join(cells)}  {r['status']:<8} {r['description']}")
    _files_line(d, always=True)
    click.echo(f"results: {d['results']}")


def drift_lines(drifts: list[DriftView], metric: str) -> list[str]:
    """The drift of BASE's control runs where it is beyond the noise (controls.Drift.text)."""
    return [controls.Drift(**d).text(metric) for d in drifts if d["moving"]]


def noise_line(d: NoiseFigures) -> str:
    """``noise: sd 0.0031 (4 runs of 2 commits), policy noise-aware``."""
    parts = [
        f"sd {n['sigma']:.6f}"
        + (f" on {n['platform']}" if n["platform"] else "")
        + controls.noise_words(n)
        for n in d.get("noise") or []
    ]
    estimate = "; ".join(parts) or "not estimated yet (no code has run twice)"
    return f"noise: {estimate}; policy {d.get('policy')}"


def show_replay(d: Replay) -> None:
    """``research log --policy``: each variant's recorded and replayed decision."""
    click.echo(f"replay of {d['tag']} with {d['spec']} (nothing is changed)")
    for r in d["variants"]:
        if r["kind"] in ("baseline", "confirm"):
            continue
        rec, new = r["recorded"] or "-", r["replayed"] or "-"
        mark = "  " if rec == new else "* "
        why = f"  ({r['replayed_reason']})" if rec != new and r["replayed_reason"] else ""
        click.echo(
            f"{mark}{r['id']}  {_metric(r['metric']):>10}  {rec:<8} -> {new:<8} "
            f"{r['description']}{why}"
        )
    click.echo(f"kept:       {', '.join(d['kept']) or 'none'}")
    click.echo(f"would keep: {', '.join(d['would_keep']) or 'none'}  (best {_metric(d['best'])})")
    p = d.get("pruning")
    if p:  # issue 38: what the pruning rule would have changed
        click.echo(
            f"pruning {p['rule']} (k {p['k']:g}, grace {p['grace']:.0%}) would stop "
            f"{len(p['would_prune'])}: {', '.join(p['would_prune']) or 'none'}; GPU time saved "
            f"{clock(p['gpu_saved_s'])}; best {_metric(p['best'])} with it, "
            f"{_metric(p['best_unpruned'])} without"
            + (" (the best changes)" if p["best_changed"] else " (the best is the same)")
        )
        if not p.get("curves"):
            click.echo(
                "  no run recorded a progress curve (the script prints no line that "
                "metric_progress_regex matches): there was nothing to prune on"
            )
        for vid, run in p["runs"].items():
            click.echo(
                f"  {vid} stopped at {run['t']:.0f}s of {run['budget']:.0f}s: {run['value']:.6f} "
                f"vs BASE {run['ref']:.6f} (noise {run['noise']:.6f}); it ended at "
                f"{_metric(run['metric'])}"
            )


def show_loop(d: LoopView) -> None:
    click.echo(
        f"{_headline(d)}  {counted(d['experiments'], 'experiment')}, "
        f"{counted(d['kept'], 'change')} kept{pruned_text(d)} "
        f"({d['made']} started by this loop)"
    )
    if d.get("exhausted"):
        click.echo(f"stopped: {d['exhausted']}")
    if d["left_running"]:
        click.echo(
            f"left running in the background: {', '.join(d['left_running'])} "
            "(the next research command records them; `research stop` cancels)"
        )
    click.echo(f"results:  {d['results']}\nprogress: {d['plot']}\nreport:   {d['report']}")


def show_config(d: Configured) -> None:
    for key, (old, new) in d["changed"].items():
        click.echo(f"changed {key}: {old!r} -> {new!r}")
    for key, value in d["settings"].items():
        click.echo(f"{key:<17} {value}")
    click.echo(f"settings: {d['file']}")


def show_knobs(d: Knobs) -> None:
    """``research mutate --list``: one line per setting, the knobs first."""
    rows = sorted(d["settings"], key=lambda r: (not r["knob"], r["file"], r["line"]))
    width = max((len(r["name"]) for r in rows), default=4)
    knobs = sum(r["knob"] for r in rows)
    click.echo(f"BASE {_short(d['base'])}: {knobs} of {len(rows)} numeric settings are knobs")
    for r in rows:
        where = f"{r['file']}:{r['line']}"
        if r["knob"]:
            tries = ", ".join(r["tries"][:4]) + (", ..." if len(r["tries"]) > 4 else "")
            click.echo(f"  knob  {r['name']:<{width}} = {r['value']:<10} {where}  -> {tries}")
        else:
            click.echo(f"  skip  {r['name']:<{width}} = {r['value']:<10} {where}  {r['why']}")


def show_decided(d: Decided) -> None:
    click.echo(f"{d['id']}: {d['status']}; BASE is {_short(d['base'])}")
    _files_line(d, always="files" in d)


def run_loop_live(exp: session.Experiment, proposer: Proposer, opts: LoopOptions) -> LoopView:
    """``research loop`` with the live table: the runner's slots (followed through the core
    run's journal) under a header with BASE, the best metric and the experiment count."""
    run = executor.run_paths(exp.paths, exp.cfg)
    follower = Follower(run)
    header = {"text": ""}

    def tick(s: ExperimentState) -> None:
        follower.poll()
        header["text"] = live_header(exp.cfg, s, opts.mode)

    view = LiveView(
        follower.view,
        run.attempt_log,
        title=f"research {exp.cfg.tag}",
        header=lambda: header["text"],
    )
    console = Console(stderr=True, highlight=False)
    with shown(view, console):
        return run_loop(
            exp,
            proposer,
            opts,
            lambda text: console.print(f"{stamp()} {text}", markup=False),
            tick=tick,
        )


def live_header(cfg: ExperimentConfig, s: ExperimentState, mode: str) -> str:
    """The live view's header: BASE, the best metric, the counts (research/figures.py), the
    noise and, where BASE's controls moved beyond it, the drift."""
    f = figures(s)
    best = "-" if f.best is None else f"{f.best:.6f}"
    est = rules.noise_view(s) if cfg.policy == "noise-aware" else []
    paired = " paired" if est and est[0].get("paired") else ""
    noise = f"  noise sd {est[0]['sigma']:.6f}{paired}" if est else ""
    moved = [d for d in controls.drift(s, cfg.noise_k) if d.moving]
    if moved:
        noise += f"  DRIFT {moved[0].change:+.6f} (decisions paired)"
    return (
        f"BASE {s.base[:7]} ({cfg.branch})  best {cfg.metric} {best}  "
        f"{counted(f.experiments, 'experiment')}, {counted(f.kept, 'change')} kept"
        f"{pruned_text(f)}  mode {mode}{noise}"
    )


def stamp() -> str:
    return time.strftime("%H:%M:%S")
