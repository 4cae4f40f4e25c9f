"""``gpuswarm status | ls | check | unquarantine | report | watch``: the commands that look at
(or repair) a run another command made. Registered on the top-level group by ``cli.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from gpuswarm.cli_support import fail, stoppable
from gpuswarm.core.errors import GpuswarmError
from gpuswarm.engine import check_run_dir, write_run_report
from gpuswarm.outputs.status import lift_quarantine, list_runs, run_status


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def status(run_dir: Path, as_json: bool) -> None:
    """Counts per state, what each GPU runs, failures with log tails, ETA."""
    try:
        data = run_status(run_dir)
    except GpuswarmError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(data, indent=1))
    else:
        from gpuswarm.ui.printers import print_status  # rich, loaded only to print

        print_status(data)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.argument("slot", required=False)
def unquarantine(run_dir: Path, slot: str | None) -> None:
    """Put a quarantined SLOT (e.g. gpu2; every slot when omitted) of a live run back in
    rotation. Its supervisor notices within a second; a resume starts with no quarantine."""
    try:
        lifted = lift_quarantine(run_dir, slot)
    except GpuswarmError as exc:
        fail(exc)
    if not lifted:
        what = f"slot {slot}" if slot else "no slot"
        click.echo(f"gpuswarm: {what} is not quarantined in {run_dir}", err=True)
        sys.exit(1)
    for q in lifted:
        click.echo(f"lifted the quarantine of {q['slot']} (owner {q.get('owner', '?')})")


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--repair", is_flag=True, help="repair what resume would (not on a live run)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def check(run_dir: Path, repair: bool, as_json: bool) -> None:
    """Verify a run: each task in exactly one state, attempts match events, nothing lost.

    Exit code 0 when the run is consistent (after --repair, if given), 1 when problems remain.
    """
    try:
        report = check_run_dir(run_dir, repair=repair)
    except GpuswarmError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        from gpuswarm.ui.printers import print_check  # rich, loaded only to print

        print_check(report)
    sys.exit(0 if report["consistent"] else 1)


@click.command(name="ls")
@click.argument("workspace", default="runs", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def ls_cmd(workspace: Path, as_json: bool) -> None:
    """List the runs under WORKSPACE (default ./runs)."""
    rows = list_runs(workspace)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    else:
        from gpuswarm.ui.printers import print_ls  # rich, loaded only to print

        print_ls(rows, workspace)


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path))
def report_cmd(run_dir: Path) -> None:
    """Write RUN_DIR/report.html (self-contained) and timeline.png from the run as it is now."""
    with stoppable():
        path = write_run_report(run_dir)
    click.echo(str(path))


@click.command("watch")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--plain", is_flag=True, help="one line per event, even on a terminal")
def watch_cmd(run_dir: Path, plain: bool) -> None:
    """Follow a run that another gpuswarm process supervises (live table on a terminal).

    Ctrl-C ends the watching (exit 130), never the run."""
    with stoppable(viewer=True):
        from gpuswarm.ui.watch import watch

        code = watch(run_dir, stream=sys.stderr, plain=plain)
    sys.exit(code)
