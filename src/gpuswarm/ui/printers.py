"""The CLI's printed output (rich): status, ls, check, demo. ``--json`` bypasses this
module entirely; the end-of-run report is ui/endreport.py (no rich)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuswarm.core.redact import inert
from gpuswarm.core.words import counted
from gpuswarm.outputs.slurmview import slurm_lines
from gpuswarm.outputs.spend import spend_line
from gpuswarm.ui.endreport import counts_text
from gpuswarm.ui.table import clock

if TYPE_CHECKING:
    from gpuswarm.outputs.statusjson import (
        FailureLine,
        PausedJson,
        RunLine,
        RunningLine,
        StatusJson,
    )

if TYPE_CHECKING:
    from gpuswarm.outputs.check import CheckReport


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


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
    con.print(f"{counted(data['total'], 'task')}: {counts_text(data['counts'])}")
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
