"""``gpuswarm status | ls | check | unquarantine | report | watch | logs | clean``: the commands
that look at (or repair, or remove) runs another command made. Registered on the top-level group
by ``cli.py``."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from gpuswarm.cli.support import fail, stoppable
from gpuswarm.core.errors import EXIT_INTERRUPTED, BadInputError, GpuswarmError, RunDirError
from gpuswarm.core.models import State
from gpuswarm.core.redact import LineRedactor
from gpuswarm.outputs.status import lift_quarantine, list_runs, run_status
from gpuswarm.outputs.tasklog import (
    Hop,
    LogTarget,
    Unreadable,
    follow,
    iter_log,
    log_redactor,
    read_text,
    task_log,
)
from gpuswarm.store.lookup import task_ended
from gpuswarm.store.runindex import batch_workspaces, index_dir, newest_run

if TYPE_CHECKING:  # `clean` only: its modules (pydantic's duration parser) load when it runs
    from gpuswarm.outputs.clean import Candidate


@click.command()
@click.argument("run_dir", required=False, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--group", help="only this group's progress: counts, percent, ETA (issue 35)")
def status(run_dir: Path | None, as_json: bool, group: str | None) -> None:
    """Counts per state, what each GPU runs, failures with log tails, ETA.

    RUN_DIR is a run folder, a path inside one, a bare run name or a run's name, looked up
    under ./runs, then in the index of your runs; without it, the newest of your runs."""
    if group is not None:
        _group_status(run_dir, group, as_json)
        return
    try:
        data = run_status(run_dir if run_dir is not None else newest_run(Path("runs")))
    except GpuswarmError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(data, indent=1))
    else:
        from gpuswarm.ui.printers import print_status  # rich, loaded only to print

        print_status(data)


def _group_status(run_dir: Path | None, group: str, as_json: bool) -> None:
    from gpuswarm.outputs.groups import group_lines, group_status

    try:
        data = group_status(run_dir if run_dir is not None else newest_run(Path("runs")), group)
    except GpuswarmError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(data, indent=1))
    else:
        click.echo("\n".join(group_lines({group: data})))


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
        from gpuswarm.app.inspection import (
            check_run_dir,  # the engine's pieces: only for the commands that use them
        )

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
@click.argument("workspace", required=False, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def ls_cmd(workspace: Path | None, as_json: bool) -> None:
    """List your runs: those under ./runs and those in the index of your runs, wherever they
    are (oldest first). With WORKSPACE: the runs under it only."""
    if workspace is None:
        rows = list_runs(Path("runs"), indexed=True)
        where = f"./runs or in the index of your runs ({index_dir()})"
    else:
        rows, where = list_runs(workspace), str(workspace)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    else:
        from gpuswarm.ui.printers import print_ls  # rich, loaded only to print

        print_ls(rows, where)


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--json", "as_json", is_flag=True, help="print what it shows: cost, repeats (pass@k), counts"
)
def report_cmd(run_dir: Path, as_json: bool) -> None:
    """Write RUN_DIR/report.html (self-contained) and timeline.png from the run as it is now."""
    with stoppable():
        from gpuswarm.app.inspection import write_run_report

        path = write_run_report(run_dir)
    if as_json:  # issue 34: the numbers of the page (summary.json's, as the report read them)
        summary = json.loads((path.parent / "summary.json").read_text())
        keys = ("counts", "state", "fields", "cost", "repeats")
        shown = {k: summary[k] for k in keys if k in summary}
        click.echo(json.dumps({"report": str(path), **shown}, indent=1))
        return
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


@click.command("logs")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.argument("task")
@click.option("-f", "--follow", is_flag=True, help="follow the log as it grows, and retries")
@click.option("--attempt", type=click.IntRange(min=1), help="attempt N's log (default: the last)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def logs_cmd(run_dir: Path, task: str, follow: bool, attempt: int | None, as_json: bool) -> None:
    """Print the output of TASK: its last attempt's output.log (--attempt N: attempt N's).

    RUN_DIR is the run folder, any path inside it, or its bare name (looked up under ./runs).
    TASK is a task id, or an unambiguous prefix of a task id or name. -f follows the log as it
    grows, hops to the next attempt when the task is retried (one marker line between) and ends
    once the task has ended; Ctrl-C ends it (exit 130). --json: task, attempt, log and state,
    with the log's last MiB as "text" (with -f: one such line per attempt, without the text).
    Exit 1 when the task has not started yet (without -f).
    """
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # like Ctrl-C: exit 130, quietly
    try:
        target = task_log(run_dir, task, attempt)
        if follow:
            _follow(target, as_json)
        _print_log(target, as_json)
    except GpuswarmError as exc:
        fail(exc)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:  # `gpuswarm logs ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


def _print_log(target: LogTarget, as_json: bool) -> NoReturn:
    if target.log is None:
        if as_json:
            click.echo(json.dumps({**target.as_json(), "text": None}, indent=1))
        click.echo(f"gpuswarm: task {target.task} has not started yet ({target.state})", err=True)
        sys.exit(1)
    try:
        lines = LineRedactor(log_redactor(target))  # as status and the report: no secrets
        if as_json:
            text, cut = read_text(target.log)
            payload = {**target.as_json(), "text": lines.redactor.text(text), "truncated": cut}
            click.echo(json.dumps(payload, indent=1))
        else:
            out = sys.stdout.buffer
            for chunk in iter_log(target.log):
                out.write(lines.feed(chunk))
            out.write(lines.flush())
            out.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:  # gone, or no regular file (a task may replace it)
        why = exc.strerror or exc
        click.echo(f"gpuswarm: the log of task {target.task}: {target.log}: {why}", err=True)
        sys.exit(1)
    sys.exit(0)


def _follow(target: LogTarget, as_json: bool) -> NoReturn:
    printer = _JsonFollow(target) if as_json else _PlainFollow(target)
    if not target.live and not task_ended(State(target.state)):
        click.echo(
            f"gpuswarm: {target.paths.root} is not live: waiting for it to be resumed "
            "(Ctrl-C to stop)",
            err=True,
        )
    for item in follow(target):
        if isinstance(item, bytes):
            printer.data(item)
        elif isinstance(item, Hop):
            printer.hop(item)
        elif isinstance(item, Unreadable):
            click.echo(
                f"gpuswarm: the log of task {target.task} (attempt {item.attempt}), {item.log}, "
                f"{item.why}: it is not read (the task replaced its log)",
                err=True,
            )
            sys.exit(1)
        else:
            printer.ended(item.state)
            if not printer.started:
                msg = f"gpuswarm: task {target.task} ended ({item.state}) without starting"
                click.echo(msg, err=True)
                sys.exit(1)
            sys.exit(0)
    sys.exit(0)


class _PlainFollow:
    """``logs -f``: the log's bytes as they come, a marker line before each later attempt's."""

    def __init__(self, target: LogTarget) -> None:
        self.task = target.task
        self.first = target.attempt  # already named by the command: no marker for it
        self.started = target.attempt is not None
        self.at_line_start = True
        self.out = sys.stdout.buffer
        self.lines = LineRedactor(log_redactor(target))
        if not self.started:
            click.echo(f"gpuswarm: waiting for task {self.task} to start", err=True)

    def data(self, data: bytes) -> None:
        self._write(self.lines.feed(data))

    def _write(self, data: bytes) -> None:
        if data:
            self.out.write(data)
            self.out.flush()
            self.at_line_start = data.endswith((b"\n", b"\r"))

    def hop(self, hop: Hop) -> None:
        self._write(self.lines.flush())  # the last line of the attempt before, without newline
        if hop.attempt != self.first:
            lead = b"" if self.at_line_start else b"\n"
            mark = f"==> gpuswarm: task {self.task}, attempt {hop.attempt} <==\n"
            self._write(lead + mark.encode())
        self.first, self.started = None, True

    def ended(self, state: str) -> None:
        self._write(self.lines.flush())


class _JsonFollow:
    """``logs -f --json``: one JSON line per attempt followed and one at the end, no text."""

    def __init__(self, target: LogTarget) -> None:
        self.record = target.as_json()
        self.first = target.attempt
        self.started = target.attempt is not None
        click.echo(json.dumps(self.record))

    def data(self, data: bytes) -> None:
        pass

    def hop(self, hop: Hop) -> None:
        self.record = {**self.record, "attempt": hop.attempt, "log": str(hop.log)}
        if hop.attempt != self.first:
            click.echo(json.dumps({**self.record, "state": "running"}))
        self.first, self.started = None, True

    def ended(self, state: str) -> None:
        click.echo(json.dumps({**self.record, "state": state, "ended": True}))


@click.command("clean")
@click.argument("workspace", default="runs", type=click.Path(path_type=Path))
@click.option("--older-than", "older_than", required=True, help="idle for longer (30d, 12h)")
@click.option("--yes", is_flag=True, help="remove them (without: only list what would go)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def clean_cmd(workspace: Path, older_than: str, yes: bool, as_json: bool) -> None:
    """Remove the finished runs under WORKSPACE (default ./runs) idle for longer than
    --older-than: a dry run listing them and their sizes, unless --yes.

    Finished: no supervisor on it and no task in running/ (complete, with failures, stopped or
    unfinished); a crashed run is kept (its supervisor died: see 'gpuswarm status'), and a live
    run is never removed (checked right before each removal). Idle: since the newest change of
    its summary.json or events.jsonl. Only real folders inside WORKSPACE are removed: a run
    that is a symbolic link, or under a name folder that is one, is listed as kept and left
    alone. Exit 1 when a run could not be removed.
    """
    try:
        from gpuswarm.config.values import parse_duration  # pydantic: only for clean
        from gpuswarm.outputs.clean import find_candidates, finish_half_removed, remove_candidates

        seconds = parse_duration(older_than)
    except ValueError as exc:
        fail(BadInputError(f"--older-than: {exc}"))
    if not workspace.is_dir():
        spaces = batch_workspaces() if workspace == Path("runs") else []  # where ls's runs are
        where = f" (your runs are under: {', '.join(map(str, spaces))})" if spaces else ""
        fail(RunDirError(f"{workspace}: no such folder; pass the workspace runs are under{where}"))
    with stoppable():
        found = find_candidates(workspace, seconds)
        if yes:
            finish_half_removed(workspace)
            remove_candidates(found, seconds)
    if as_json:
        click.echo(json.dumps([c.as_json() for c in found], indent=1))
    else:
        _print_clean(found, workspace, older_than, yes)
    sys.exit(1 if yes and any(not c.removed for c in found) else 0)


def _print_clean(found: list[Candidate], workspace: Path, older_than: str, yes: bool) -> None:
    if not found:
        click.echo(f"no finished run under {workspace} has been idle for longer than {older_than}")
        return
    total = sum(c.bytes for c in found)
    if not yes:
        what = f"{_runs(len(found))} finished and idle for longer than {older_than}"
        click.echo(f"{what} ({_size(total)}):")
    for c in found:
        line = f"{c.run}  {c.state}  idle {_age(c.age_s)}  {_size(c.bytes)}"
        if yes:
            line = f"removed {line}" if c.removed else f"kept {line}: {c.kept_because}"
        if not yes and c.kept_because:
            line = f"{line}: kept, {c.kept_because}"
        click.echo(line if yes else f"  {line}")
    if yes:
        freed = sum(c.bytes for c in found if c.removed)
        click.echo(f"removed {_runs(sum(c.removed for c in found))}, {_size(freed)} freed")
    else:
        click.echo("dry run: nothing removed; add --yes to remove them")


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
