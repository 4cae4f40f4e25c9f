"""The CLI's printed output (rich): status, ls, report, check, demo. ``--json`` bypasses this
module entirely."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuswarm.core.redact import inert
from gpuswarm.core.words import counted
from gpuswarm.outputs.gpumem import gpu_memory_lines
from gpuswarm.outputs.slurmview import slurm_lines
from gpuswarm.outputs.spend import spend_line
from gpuswarm.ui.table import clock

if TYPE_CHECKING:
    from gpuswarm.outputs.statusjson import (
        FailureLine,
        PausedJson,
        RunLine,
        RunningLine,
        StatusJson,
    )
    from gpuswarm.outputs.summaryjson import FieldStats

if TYPE_CHECKING:
    from gpuswarm.outputs.check import CheckReport
    from gpuswarm.outputs.runreport import RunReport


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _counts(counts: dict[str, int]) -> str:
    order = ("done", "failed", "running", "pending")
    text = "  ".join(f"{k} {counts.get(k, 0)}" for k in order)
    for apart in ("skipped", "cancelled", "blocked", "dependency_failed"):  # (issue 35)
        if counts.get(apart):
            text += f"  {apart} {counts[apart]}"
    return text + (f"  corrupt {counts['corrupt']}" if counts.get("corrupt") else "")


def paused_text(paused: PausedJson | None) -> str:
    """``paused: the run`` / ``paused: slots a, b`` ("" when nothing is paused)."""
    if not paused:
        return ""
    if paused.get("run"):
        return "paused: the run"
    slots = paused.get("slots") or []
    return inert("paused: slots " + ", ".join(str(s) for s in slots)) if slots else ""


def _running_table(running: list[RunningLine]) -> Table:
    table = Table("slot", "owner", "task", "attempt", "elapsed", "timeout", box=None)
    for r in running:
        waits = r.get("retry_at") is not None  # a retry waiting out its backoff runs nowhere
        table.add_row(
            f"({r['slot']}: retry waits)" if waits else str(r["slot"]),
            str(r.get("owner") or "?").rsplit(":", 1)[0],  # host:pid
            inert(r["task"]),
            str(r["attempt"]),
            clock(r["elapsed"]),
            clock(r["timeout"]),
        )
    return table


def _held_gpus(con: Console, data: StatusJson) -> None:
    """GPUs an ended attempt still holds (issue 19): skipped until their memory is freed."""
    for held in data.get("gpus_held", []):
        con.print(f"[red]GPU HELD[/] {escape(inert(str(held.get('reason', ''))))}")
    for wait in data.get("waiting_for_gpu", [])[:5]:
        con.print(f"[yellow]waiting[/] {escape(inert(str(wait.get('reason', ''))))}")


def _slurm(con: Console, data: StatusJson) -> None:
    for line in slurm_lines(data.get("slurm")):
        con.print(escape(inert(line)))


def print_status(data: StatusJson) -> None:
    con = _console()
    state = data.get("state") or ("live" if data["live"] else "not running")
    color = {"live": "green", "complete": "green", "crashed": "red"}.get(state, "yellow")
    name, run = escape(inert(data["name"])), escape(inert(data["run"]))
    con.print(f"[bold]{name}[/]  {run}  ([{color}]{state}[/])")
    con.print(f"{counted(data['total'], 'task')}: {_counts(data['counts'])}")
    if data.get("hint"):
        con.print(f"[{color}]{escape(data['hint'])}[/]")
    if paused := paused_text(data.get("paused")):
        con.print(f"[yellow]{escape(paused)}[/] (no new starts; gpuswarm unpause RUN)")
    _eta_and_cost(con, data)
    _slurm(con, data)  # issue 36: the worker jobs, the allocation
    if data["running"]:
        con.print(_running_table(data["running"]))
    shown, failed = len(data["failures"]), data["counts"].get("failed", 0)
    if failed > shown:
        con.print(f"latest {shown} of {failed} failures:")
    for f in data["failures"]:
        con.print(
            f"[red]failed[/] {escape(inert(f['task']))}: {escape(inert(f['reason']))} "
            f"({counted(f['attempts'], 'attempt')}{_interrupted(f)})"
        )
        if f["log_tail"]:
            for line in f["log_tail"].splitlines()[-5:]:
                con.print("    " + inert(line), style="dim", markup=False)  # task output
    if data["corrupt"]:
        con.print(f"[yellow]{counted(len(data['corrupt']), 'corrupt descriptor')} moved aside[/]")
    _held_gpus(con, data)
    for q in data.get("quarantined", []):
        slot, why = escape(str(q.get("slot"))), escape(inert(q.get("reason", "")))
        con.print(f"[red]QUARANTINED[/] {slot}: {why}")
        if data["live"]:
            probe = q.get("probe_at")
            when = time.strftime("%H:%M:%S", time.localtime(probe)) if probe else "-"
            con.print(
                f"    probed again at {when}; lift now: gpuswarm unquarantine "
                f"{escape(data['run'])} {escape(str(q.get('slot')))}",
                markup=False,
            )


def _eta_and_cost(con: Console, data: StatusJson) -> None:
    eta = data.get("eta")
    if eta and eta.get("eta_seconds") is not None:
        con.print(f"ETA {clock(eta['eta_seconds'])} (mean task {eta['mean_seconds']:.1f}s)")
    if data.get("cost"):  # issue 34: what the agents spent
        con.print(escape(spend_line(data["cost"])))


def _interrupted(failure: FailureLine) -> str:
    """`` + 1 interrupted``: attempts a stop handed back (numbered, not counted)."""
    n = int(failure.get("interrupted") or 0)
    return f" + {n} interrupted" if n else ""


def print_ls(rows: list[RunLine], where: Path | str) -> None:
    """One line per run; the path comes last and is never shortened."""
    if not rows:
        print(f"no runs under {where}")
        return
    print(f"{'state':<23}{'tasks':>7}{'done':>7}{'failed':>7}{'cancel':>7}{'left':>7}  run")
    for r in rows:
        c = r["counts"]
        state = r.get("state") or ("live" if r["live"] else "unfinished")
        left = c["pending"] + c["running"]
        cancelled = c.get("cancelled", 0)
        print(
            f"{state:<23}{r['total']:>7}{c['done']:>7}{c['failed']:>7}{cancelled:>7}{left:>7}"
            f"  {r['run']}"
        )


def print_report(report: RunReport) -> None:
    con = Console(stderr=True, highlight=False, soft_wrap=True)
    s = report.summary
    counts = s["counts"]
    con.print(f"[bold]{escape(s['name'])}[/]: {counted(s['total'], 'task')}  {_counts(counts)}")
    for line in field_lines(s.get("fields", {})) + gpu_memory_lines(s.get("gpu_memory")):
        con.print("  " + line, markup=False)
    for reason, n in s.get("failure_reasons", [])[:5]:
        con.print(inert(f"  {n} failed: {reason}"), markup=False)
    failed = [f for f in s["failures"] if f["state"] == "failed"]  # left ones: one line below
    for f in failed[:10]:
        con.print(inert(f"  {f['state']} {f['task']}: {f['reason']}"), markup=False)
    if int(counts.get("failed", len(failed))) > 10:  # the true count, not the list's
        con.print(f"  ... and {int(counts['failed']) - 10} more (see results.tsv)")
    for q in s.get("quarantined", []):
        con.print(inert(f"  quarantined {q['slot']}: {q['reason']}"), markup=False)
    after = s.get("after_all")
    if isinstance(after, dict):
        log = report.paths.after_all_log
        how = "ok" if after.get("ok") else f"FAILED ({after.get('reason', '?')})"
        con.print(inert(f"after_all {how}: {log}"), markup=False)
    con.print(f"results: {report.paths.results_tsv}")
    html = report.paths.report_html
    if html.is_file():
        con.print(f"report:  {html}")
    if line := end_line(report):
        con.print(inert(line), markup=False)


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


def print_check(report: CheckReport) -> None:
    verdict = "consistent" if report["consistent"] else "INCONSISTENT"
    live = " (live)" if report["live"] else ""
    print(f"{report['run']}{live}: {counted(report['tasks'], 'task')}, {verdict}")
    for f in report["findings"]:
        mark = "repaired" if f["repaired"] else "problem"
        task = f" {f['task']}:" if f["task"] else ""
        print(f"  {mark:<9}{f['kind']}{task} {f['detail']}")


def print_demo(d: dict[str, Any]) -> None:
    con = _console()
    best, base = d.get("best"), d.get("baseline")
    if best is not None and base is not None:
        gain = (base - best) / base * 100 if base else 0.0
        con.print(
            f"[bold]best val_bpb {best:.6f}[/] (baseline {base:.6f}, {gain:.1f}% lower) after "
            f"{counted(d['experiments'], 'experiment')}, {counted(d['kept'], 'change')} kept"
        )
    else:
        con.print(
            f"{counted(d['experiments'], 'experiment')}, {counted(d['kept'], 'change')} kept "
            "(no baseline metric)"
        )
    con.print(f"repository: {d['repo']}  (branch {d['branch']} holds every kept change)")
    con.print(f"results:    {d['results']}")
    con.print(f"progress:   {d['plot']}")
    con.print(f"report:     {d['report']}")
