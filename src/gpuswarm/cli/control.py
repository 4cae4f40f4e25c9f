"""``gpuswarm add | cancel | retry | requeue | pause | unpause | priority``: a person's changes to
a run, live or stopped. Each command builds its typed request (:mod:`gpuswarm.core.verbs`)
and prints what :func:`gpuswarm.app.control.execute` did; ``cli.py`` lists them by ``Kind``.

Exit codes: 0 done (a task that had ended already is a note, nothing to do), 1 ``cancel --wait``
timed out, 2 bad input (an unknown or ambiguous task, a request that does not apply to the
task's state, a task that does not fit the run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from gpuswarm.app.adding import YAML_SUFFIXES, load_source
from gpuswarm.app.control import add_tasks, execute, set_priority
from gpuswarm.app.deps import run_task_ids
from gpuswarm.app.replies import PauseReply, Reply
from gpuswarm.cli.support import SHELL_OPTION, refuse_list_options, stoppable
from gpuswarm.config.models import TaskOptions
from gpuswarm.core import verbs
from gpuswarm.core.words import counted

_RUN = click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
_JSON = click.option("--json", "as_json", is_flag=True, help="machine-readable output")


def _emit(data: Reply, as_json: bool, lines: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    for line in lines:
        click.echo(line)
    if hint := data.get("hint", ""):  # add, retry, requeue: what to run
        click.echo(f"gpuswarm: {hint}", err=True)


@click.command()
@_RUN
@click.argument("source")
@SHELL_OPTION
@click.option("--timeout", help="command list: per-task timeout (90s, 10m, 2h)")
@click.option("--max-attempts", type=int, help="command list: attempts per task (default 1)")
@click.option("--priority", type=int, help="command list: the tasks' priority (higher first)")
@click.option("--gpu-memory", help="command list: GPU memory per task (20G): packs GPUs by it")
@click.option("--after", multiple=True, metavar="TASK", help="start once TASK is done (repeat)")
@click.option("--after-any", multiple=True, metavar="TASK", help="start once TASK has ended")
@click.option("--after-failed", multiple=True, metavar="TASK", help="start only if TASK failed")
@_JSON
def add(
    run_dir: Path,
    source: str,
    shell: bool,
    timeout: str | None,
    max_attempts: int | None,
    priority: int | None,
    gpu_memory: str | None,
    after: tuple[str, ...],
    after_any: tuple[str, ...],
    after_failed: tuple[str, ...],
    as_json: bool,
) -> None:
    """Append the tasks of SOURCE to RUN, live or stopped.

    SOURCE is a YAML config (only its tasks: are used), a command list, or '-' for stdin (each
    line of a list run with /bin/sh -c unless --no-shell).
    Ids that the run has already get a suffix (-2, -3, ...); live supervisors see the new tasks
    at their next claim, in priority order.
    """
    with stoppable():
        refuse_list_options(
            source, YAML_SUFFIXES, "shell", "timeout", "max_attempts", "priority", "gpu_memory"
        )
        defaults = TaskOptions.from_cli(
            timeout=timeout, max_attempts=max_attempts, priority=priority, gpu_memory=gpu_memory
        )
        loaded = load_source(source, shell=shell, defaults=defaults, known=run_task_ids(run_dir))
        prerequisites = verbs.Prerequisites(
            after=after, after_any=after_any, after_failed=after_failed
        )
        data = add_tasks(run_dir, loaded, prerequisites)
    lines = [f"added {counted(data['added'], 'task')} to {data['run']}"]
    if data["renamed_count"]:
        shown = ", ".join(f"{a} -> {b}" for a, b in list(data["renamed"].items())[:5])
        more = f", and {data['renamed_count'] - 5} more" if data["renamed_count"] > 5 else ""
        taken = counted(data["renamed_count"], "new task")
        lines.append(f"{taken} got a new id (the run has tasks of those ids): {shown}{more}")
    _emit(data, as_json, lines)


@click.command()
@_RUN
@click.argument("tasks", nargs=-1)
@click.option("--group", help="every pending, blocked or running task of this group")
@click.option("--reason", default="cancelled by hand", show_default=True, help="recorded")
@click.option("--wait", is_flag=True, help="block until running tasks have stopped")
@click.option(
    "--timeout", "wait_timeout", default=30.0, show_default=True, help="--wait: seconds at most"
)
@_JSON
def cancel(
    run_dir: Path,
    tasks: tuple[str, ...],
    group: str | None,
    reason: str,
    wait: bool,
    wait_timeout: float,
    as_json: bool,
) -> None:
    """Cancel TASKS (ids or unambiguous name prefixes) of RUN.

    A pending task ends cancelled at once; a running one is stopped by its supervisor within
    about a second (--wait blocks until then). A task that has ended already is left as it is
    (exit 0). Cancelled tasks are never retried and count as no failure.
    """
    if not (tasks or group):
        click.echo("gpuswarm: error: give TASKS or --group", err=True)
        sys.exit(2)
    with stoppable():
        data = execute(
            run_dir, verbs.Cancel(tasks, reason, wait_timeout if wait else None, group=group)
        )
    lines = []
    for row in data["tasks"]:
        note = f" ({row['note']})" if row["note"] else ""
        lines.append(f"{row['task']}: {row['was']} -> {row['now']}{note}")
    _emit(data, as_json, lines)
    if data["timed_out"]:
        click.echo(f"gpuswarm: still running after {wait_timeout:g}s", err=True)
        sys.exit(1)


@click.command()
@_RUN
@click.argument("tasks", nargs=-1)
@click.option("--failed", is_flag=True, help="every failed task")
@click.option("--cancelled", is_flag=True, help="every cancelled task")
@click.option("--group", help="only this group's tasks (with --failed / --cancelled)")
@_JSON
def retry(
    run_dir: Path,
    tasks: tuple[str, ...],
    failed: bool,
    cancelled: bool,
    group: str | None,
    as_json: bool,
) -> None:
    """Put failed or cancelled TASKS of RUN back in the queue with a fresh attempt budget
    (their earlier attempts are kept). Nothing is started: a run no supervisor serves is
    finished with 'gpuswarm resume RUN'."""
    if not (tasks or failed or cancelled):
        click.echo("gpuswarm: error: give TASKS, --failed or --cancelled", err=True)
        sys.exit(2)
    with stoppable():
        data = execute(run_dir, verbs.Retry(tasks, failed=failed, cancelled=cancelled, group=group))
    lines = [f"{r['task']}: {r['was']} -> {r['now']}" for r in data["tasks"]]
    if not data["tasks"]:
        lines.append("nothing to retry")
    _emit(data, as_json, lines)


@click.command()
@_RUN
@click.argument("tasks", nargs=-1, required=True)
@_JSON
def requeue(run_dir: Path, tasks: tuple[str, ...], as_json: bool) -> None:
    """Put ended TASKS of RUN (done, failed, cancelled or skipped) back in the queue as a fresh
    attempt series: a fresh attempt budget, no reason and no result; their earlier attempts are
    kept. A task still pending or running is left as it is (exit 0). Nothing is started: a run
    no supervisor serves is finished with 'gpuswarm resume RUN'."""
    with stoppable():
        data = execute(run_dir, verbs.Requeue(tasks))
    lines = []
    for row in data["tasks"]:
        note = f" ({row['note']})" if row["note"] else ""
        lines.append(f"{row['task']}: {row['was']} -> {row['now']}{note}")
    _emit(data, as_json, lines)


def _pause_lines(data: PauseReply, verb: str) -> list[str]:
    what = f"slot {data['slot']}" if data["slot"] else "the run"
    if not data["changed"]:
        return [f"{what} was {'already' if verb == 'paused' else 'not'} paused"]
    return [f"{verb} {what}" + ("" if verb != "paused" else ": running tasks go on")]


_GROUP = click.option("--group", help="only this group's tasks (issue 35)")


def _group_pause(run_dir: Path, group: str, as_json: bool, *, paused: bool) -> None:
    with stoppable():
        data = execute(run_dir, (verbs.Pause if paused else verbs.Unpause)(group=group))
    verb = "paused" if paused else "unpaused"
    line = f"{verb} group {group}" if data["changed"] else f"group {group} was not changed"
    _emit(data, as_json, [line + (": running tasks go on" if paused and data["changed"] else "")])


@click.command()
@_RUN
@click.option("--slot", help="only this slot (an id as 'gpuswarm status' shows it)")
@_GROUP
@_JSON
def pause(run_dir: Path, slot: str | None, group: str | None, as_json: bool) -> None:
    """No new task starts on RUN (or on one slot, or of one group); running tasks go on."""
    if group is not None:
        _group_pause(run_dir, group, as_json, paused=True)
        return
    with stoppable():
        data = execute(run_dir, verbs.Pause(slot))
    _emit(data, as_json, _pause_lines(data, "paused"))


@click.command()
@_RUN
@click.option("--slot", help="only this slot (an id as 'gpuswarm status' shows it)")
@_GROUP
@_JSON
def unpause(run_dir: Path, slot: str | None, group: str | None, as_json: bool) -> None:
    """Lift a pause of RUN (or of one slot, or of one group)."""
    if group is not None:
        _group_pause(run_dir, group, as_json, paused=False)
        return
    with stoppable():
        data = execute(run_dir, verbs.Unpause(slot))
    _emit(data, as_json, _pause_lines(data, "unpaused"))


@click.command()
@_RUN
@click.argument("task")
@click.argument("priority", type=int, metavar="N")
@_JSON
def priority(run_dir: Path, task: str, priority: int, as_json: bool) -> None:
    """Give pending TASK of RUN priority N (higher starts first; -4999..4999).

    It applies to pending tasks only: a running task is exit 2."""
    with stoppable():
        data = set_priority(run_dir, task, priority)
    _emit(data, as_json, [f"{data['task']}: priority {data['was']} -> {data['priority']}"])


COMMANDS = (add, cancel, retry, requeue, pause, unpause, priority)
