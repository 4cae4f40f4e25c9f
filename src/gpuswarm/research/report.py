"""The research report: report.html next to results.tsv, with progress.png, the best result,
and every experiment (commit, metric, memory, status, description, diff summary, reason)."""

from __future__ import annotations

from pathlib import Path

from gpuswarm.core.fsutil import atomic_write_text
from gpuswarm.core.words import counted
from gpuswarm.outputs.html import esc, html_page, html_table, png_data_uri
from gpuswarm.research import controls, rules
from gpuswarm.research.entries import DecidedEntry, ResultRow
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths
from gpuswarm.research.figures import energy_figures, figures, shown_status
from gpuswarm.research.journal import ExperimentState
from gpuswarm.research.proposercost import COLUMNS, any_spent, spent
from gpuswarm.ui.table import clock

ROW_CLASS = {"keep": "keep", "crash": "failed", "discard": "", "re-based": "", "pruned": ""}


def write_research_report(
    paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState, plot: Path | None
) -> Path:
    rows: list[dict[str, object]] = []
    classes = []
    crashes: list[str] = []
    paid = any_spent(state)
    for v in state.variants.values():
        fin = v.finished or {}
        dec: DecidedEntry = v.decision or {}
        diff = fin.get("diff")
        status = shown_status(state, v) if dec else ("finished" if v.finished else "running")
        metric = fin.get("metric")
        seconds = fin.get("seconds")
        row: dict[str, object] = {
            "id": v.id,
            "commit": v.commit[:7],
            "metric": "" if metric is None else f"{float(metric):.6f}",  # as results.tsv
            "memory_gb": fin.get("memory_gb"),
            "status": status,
            "description": ResultRow.of(cells).description
            if (cells := dec.get("row"))
            else v.description,
            "diff": f"+{diff.get('insertions', 0)} -{diff.get('deletions', 0)}" if diff else "",
            "gpu": fin.get("gpu"),
            "seconds": "" if seconds is None else round(float(seconds)),
            "reason": dec.get("reason") or fin.get("reason") or "",
            "energy_j": "" if (joules := fin.get("energy_j")) is None else round(float(joules)),
        }
        if paid:  # issue 34: the proposer's tokens, USD
            row.update(spent(v))
        rows.append(row)
        classes.append(ROW_CLASS.get(status, ""))
        if status == "crash" and fin.get("log"):
            crashes.append(
                f'<li><a href="{esc(str(fin["log"]))}">{esc(v.id)} log</a>: '
                f"{esc(str(fin.get('reason') or 'crash'))}</li>"
            )
    columns = {"id": "id", "commit": "commit", "metric": cfg.metric, "memory_gb": "memory_gb"}
    for c in ("status", "description", "diff", "gpu", "seconds", "reason", "energy_j"):
        columns[c] = c
    columns.update({c: c for c in (COLUMNS if paid else ())})
    f = figures(state)
    best = "-" if f.best is None else f"{f.best:.6f}"
    gain = ""
    if f.baseline is not None and f.best is not None:
        gain = f" (baseline {f.baseline:.6f}, change {f.best - f.baseline:+.6f})"
    image = (
        f'<img class="timeline" alt="progress" src="{png_data_uri(plot)}">'
        if plot is not None and plot.is_file()
        else ""
    )
    body = (
        f"<h1>autoresearch {esc(cfg.tag)}</h1>\n"
        f"<p>branch <code>{esc(cfg.branch)}</code> at <code>{esc(state.base[:7])}</code>; "
        f"best {esc(cfg.metric)} <b>{esc(best)}</b>{esc(gain)}; "
        f"{counted(f.experiments, 'experiment')}, "
        f"{counted(f.kept, 'change')} kept, {f.crashed} crashed"
        + (f", {f.rebased} re-based" if f.rebased else "")
        + (f", {f.pruned} pruned (GPU time saved {clock(f.gpu_saved_s)})" if f.pruned else "")
        + f"; goal {esc(cfg.goal)}; policy {esc(cfg.policy)}, mode {esc(f.modes)}</p>\n"
        + _energy_html(state)
        + _rules_html(cfg, state)
        + f"<p class=note>command <code>{esc(cfg.command)}</code>; editable "
        f"{esc(', '.join(cfg.edit))}; protected {esc(', '.join(cfg.protect) or '-')}; "
        f"results in {esc(paths.results_tsv.name)}, every field in {esc(paths.ledger.name)}</p>\n"
        f"{image}\n<h2>Experiments</h2>\n"
        + html_table(columns, rows, row_classes=classes)
        + (f"\n<h2>Crashes</h2>\n<ul>{''.join(crashes)}</ul>" if crashes else "")
    )
    out = paths.root / "report.html"
    atomic_write_text(out, html_page(f"autoresearch {cfg.tag}", body))
    return out


def _energy_html(state: ExperimentState) -> str:
    """Issue 37: the experiments' GPU energy and what each kept improvement cost."""
    e = energy_figures(state)
    if e["energy_j"] is None:
        return ""
    per = e["energy_per_kept_j"]
    cost = f"; {per:,.0f} J per kept improvement" if per is not None else ""
    return (
        f"<p>GPU energy: {e['energy_j']:,.0f} J over {e['energy_measured']} measured "
        f"experiments{cost}</p>\n"
    )


def _rules_html(cfg: ExperimentConfig, state: ExperimentState) -> str:
    """The noise estimate, the decision rules' settings and, with several GPU models, BASE's
    metric on each."""
    noise = rules.noise_view(state)
    spread = "; ".join(
        f"sd {n['sigma']:.6f}{' on ' + n['platform'] if n['platform'] else ''}"
        + controls.noise_words(n)
        for n in noise
    )
    text = (
        f"<p>noise: {esc(spread or 'not estimated (no code ran twice)')}; noise_k "
        f"{cfg.noise_k:g}, re-runs within the noise {cfg.noise_confirm}; gain per added line "
        f"{esc(cfg.gain_per_line)}; simplifications {'kept' if cfg.simplify else 'off'} "
        f"(equal within {esc(cfg.equal_within)} without a noise estimate); more than "
        f"{cfg.vram_share:.0%} more peak memory needs a gain of {esc(cfg.vram_gain)}</p>\n"
    )
    for d in controls.drift(state, cfg.noise_k):
        if d.moving:
            text += f"<p class=warn>{esc(d.text(cfg.metric))}</p>\n"
    if not rules.multi_platform(state):
        return text
    rows = []
    for p in rules.platforms(state):
        best = rules.reference(state, state.base, p)
        rows.append(
            {
                "platform": p,
                "base": "-" if best is None else f"{best:.6f}",
                "runs": len(rules.runs_of(state, state.base, p)),
                "moves": "yes" if rules.moves_base(cfg, state, p) else "no",
            }
        )
    columns = {
        "platform": "platform",
        "base": f"BASE {cfg.metric}",
        "runs": "runs of BASE",
        "moves": "moves BASE",
    }
    return text + "<h2>Platforms</h2>\n" + html_table(columns, rows) + "\n"
