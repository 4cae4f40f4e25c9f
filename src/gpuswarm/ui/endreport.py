"""The end-of-run report on stderr: the counts, the measured fields, the failures, where the
results are and how the run ended. Plain lines through click, no rich: ``gpuswarm run`` prints
this after every run, and loading rich only for it cost a short run's end ~30 ms (issue 31).
Every line is made inert (task names, reasons and paths reach a terminal as text, never as
escape sequences); the run's name is bold on a terminal."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from gpuswarm.core.inert import inert
from gpuswarm.core.words import counted
from gpuswarm.outputs.gpumem import gpu_memory_lines

if TYPE_CHECKING:
    from gpuswarm.outputs.runreport import RunReport
    from gpuswarm.outputs.summaryjson import FieldStats

SHOWN_FAILURES = 10  # failed tasks named one per line; the rest counted
SHOWN_REASONS = 5


def counts_text(counts: Mapping[str, int]) -> str:
    """``done 3  failed 1  running 0  pending 0`` (+ the states apart, when any)."""
    order = ("done", "failed", "running", "pending")
    text = "  ".join(f"{k} {counts.get(k, 0)}" for k in order)
    for apart in ("skipped", "cancelled", "blocked", "dependency_failed"):  # (issue 35)
        if counts.get(apart):
            text += f"  {apart} {counts[apart]}"
    return text + (f"  corrupt {counts['corrupt']}" if counts.get("corrupt") else "")


def report_lines(report: RunReport) -> list[str]:
    """The report's lines after the first (the name and counts: :func:`print_report`)."""
    s = report.summary
    counts = s["counts"]
    lines = ["  " + line for line in field_lines(s.get("fields", {}))]
    lines += ["  " + line for line in gpu_memory_lines(s.get("gpu_memory"))]
    lines += [
        f"  {n} failed: {reason}" for reason, n in s.get("failure_reasons", [])[:SHOWN_REASONS]
    ]
    failed = [f for f in s["failures"] if f["state"] == "failed"]  # left ones: the end line
    lines += [f"  {f['state']} {f['task']}: {f['reason']}" for f in failed[:SHOWN_FAILURES]]
    if int(counts.get("failed", len(failed))) > SHOWN_FAILURES:  # the true count, not the list's
        more = int(counts["failed"]) - SHOWN_FAILURES
        lines.append(f"  ... and {more} more (see results.tsv)")
    lines += [f"  quarantined {q['slot']}: {q['reason']}" for q in s.get("quarantined", [])]
    after = s.get("after_all")
    if isinstance(after, dict):
        how = "ok" if after.get("ok") else f"FAILED ({after.get('reason', '?')})"
        lines.append(f"after_all {how}: {report.paths.after_all_log}")
    lines.append(f"results: {report.paths.results_tsv}")
    if report.paths.report_html.is_file():
        lines.append(f"report:  {report.paths.report_html}")
    if line := end_line(report):
        lines.append(line)
    return lines


def print_report(report: RunReport) -> None:
    s = report.summary
    name = click.style(inert(str(s["name"])), bold=True)  # plain where stderr is no terminal
    click.echo(f"{name}: {counted(s['total'], 'task')}  {counts_text(s['counts'])}", err=True)
    for line in report_lines(report):
        click.echo(inert(line), err=True)


def end_line(report: RunReport) -> str:
    """The run's last line: how it ended and what to do (one block, never one per task)."""
    s, root = report.summary, report.paths.root
    counts = s.get("counts") or {}
    pending, failed = int(counts.get("pending", 0)), int(counts.get("failed", 0))
    resume = f"gpuswarm resume {root}"
    back = int(s.get("requeued") or 0)
    halted = report.halted if pending + back else None  # met by the last task: all ran
    if report.budget and pending + back:  # issue 34: the pending tasks wait for more budget
        return (
            f"stopped by {report.budget} ({counted(pending, 'task')} left pending, reason budget)"
        )
    if report.stopped_by or halted or report.interrupted:
        why = report.stopped_by or halted or s.get("stopped_by") or "a stop"
        put = f"{back} running task{'s' if back != 1 else ''} put back in the queue, "
        put = put if back else ""
        return f"stopped by {why}: {put}{max(0, pending - back)} pending; finish with: {resume}"
    state = s.get("state")
    if state == "finished with failures":  # every task ran: nothing is unfinished
        return (
            f"finished with failures: {failed} failed (see the reasons above); run them "
            f"again with: {resume}"
        )
    if not s.get("complete"):
        return f"unfinished: {pending} pending; finish with: {resume}"
    return ""


def field_lines(fields: Mapping[str, FieldStats], limit: int = 8) -> list[str]:
    """The best point of each field that names its best end (``best final_loss 0.0049:
    lr0.5-steps200-s1``), then one line per measured field: pass rates over done and over all
    tasks, or mean/median/p90 and the tasks at both ends. A field that only repeats the
    tasks' inputs (``result.lr`` of a matrix over ``lr``) is not averaged: not shown."""
    measured = [(k, st) for k, st in fields.items() if st.get("kind") in ("bool", "number")]
    lines = [
        f"best {key} {st['best']['value']:.4g}: {st['best']['task']} ({st['best']['by']})"
        for key, st in measured
        if isinstance(st.get("best"), dict)
    ][:3]
    for key, st in measured[:limit]:
        if st["kind"] == "bool":
            done = f"{st['true']}/{st['of_done']} done"
            lines.append(f"{key}: {done}, {st['true']}/{st['of_total']} of all tasks")
        else:
            ends = (
                f"  min {st['min']:.4g} ({st['min_task']})  max {st['max']:.4g} ({st['max_task']})"
                if "min_task" in st
                else ""
            )
            lines.append(
                f"{key}: mean {st['mean']:.4g}  median {st['median']:.4g}  p90 {st['p90']:.4g}"
                f"{ends}  (n={st['n']})"
            )
    return lines
