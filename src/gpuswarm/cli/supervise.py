"""``gpuswarm run``, ``resume``, ``work`` and ``demo``: the commands that supervise (the engine,
the config loader and the backends load with them, not with every ``gpuswarm`` call)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from gpuswarm.app.engine import (
    resume_run,
    start_run,
    work_run,
)
from gpuswarm.app.output import Output
from gpuswarm.cli.support import SHELL_OPTION, refuse_list_options, stoppable
from gpuswarm.config.backends import click_options
from gpuswarm.config.budget import TOKENS_HELP, BudgetConfig, parse_tokens
from gpuswarm.config.commands import CommandTasks, through_shell
from gpuswarm.config.halt import HALT_HELP, canonical_halt
from gpuswarm.config.load import LoadedConfig, load_command_list, load_config, read_stdin
from gpuswarm.config.models import TaskOptions
from gpuswarm.config.notify import with_notify
from gpuswarm.core.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
)
from gpuswarm.core.signals import leave
from gpuswarm.outputs.runreport import RunReport
from gpuswarm.store import runindex
from gpuswarm.store.runs import latest_run
from gpuswarm.ui.terminal import is_terminal

YAML_SUFFIXES = (".yaml", ".yml")


_F = TypeVar("_F", bound=Callable[..., Any])


def _halt_flag(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--halt SPEC`` checked now (exit 2 naming the flag); ``never`` is kept as such."""
    if value is None:
        return None
    try:
        return canonical_halt(value) or "never"
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


_SUPERVISING = (  # the options of every command that supervises a run, in their help order
    click.option("-q", "--quiet", is_flag=True, help="no per-task lines, only the summary"),
    click.option("--plain", is_flag=True, help="one line per event, even on a terminal"),
    click.option("--no-report", is_flag=True, help="skip report.html and timeline.png"),
    click.option("--json", "as_json", is_flag=True, help="print the final summary as JSON"),
    click.option("--strict", is_flag=True, help="exit 1 when a task was cancelled too"),
    click.option("--share-gpus", is_flag=True, help="run even on GPUs another live run holds"),
    click.option(
        "--halt",
        callback=_halt_flag,
        help=f"stop early, as GNU parallel's --halt ({HALT_HELP}); over the run's halt:",
    ),
)


_BUDGET_USD = click.option(
    "--budget-usd",
    type=click.FloatRange(min=0, min_open=True, max=1e7),
    help="what the agents may spend (USD); once spent no task starts (over budget.usd)",
)


def _tokens_flag(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """``--budget-tokens 20M``: a count of tokens, as ``budget.tokens`` takes it (exit 2 else)."""
    try:
        return None if value is None else parse_tokens(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


_BUDGET_TOKENS = click.option(
    "--budget-tokens",
    callback=_tokens_flag,
    help=f"tokens (in + out) the agents may use: {TOKENS_HELP}; over budget.tokens",
)


def _supervising(command: _F) -> _F:
    for option in reversed(_SUPERVISING):
        command = option(command)
    return command


def with_budget_usd(
    loaded: LoadedConfig, usd: float | None, tokens: int | None = None
) -> LoadedConfig:
    """``run --budget-usd`` / ``--budget-tokens``: the config's ``budget.usd`` / ``.tokens``
    (its other settings kept)."""
    old = loaded.config.budget
    given = {k: v for k, v in (("usd", usd), ("tokens", tokens)) if v is not None}
    budget = old.model_copy(update=given) if old is not None else BudgetConfig.model_validate(given)
    config = loaded.config.model_copy(update={"budget": budget})
    return dataclasses.replace(loaded, config=config)


def _load_source(
    source: str, *, shell: bool, name: str | None, workspace: str | None, defaults: TaskOptions
) -> LoadedConfig:
    if source != "-" and Path(source).suffix in YAML_SUFFIXES:
        loaded = load_config(Path(source), repeats=defaults.repeats)
    elif source == "-":
        loaded = load_command_list(
            None,
            read_stdin(),
            shell=shell,
            base_dir=Path.cwd(),
            name=name,
            defaults=defaults,
            direct=True,
        )
    else:
        loaded = load_command_list(
            Path(source),
            shell=shell,
            base_dir=Path.cwd(),
            name=name,
            defaults=defaults,
            direct=True,
        )
    return loaded.with_overrides(name=name, workspace=Path(workspace) if workspace else None)


@click.command()
@click.argument("source")
@click.option("--gpus", help="auto | 0,1,2 | 0-3 | sim:N  (default: the config's, else auto)")
@click.option("--name", help="run name (default: the config's name or the file's stem)")
@click.option("--workspace", help="folder runs go to: <workspace>/<name>/run_<timestamp>/")
@click.option("--suffix", help="appended to the run folder's name")
@SHELL_OPTION
@click.option("--timeout", help="command list: per-task timeout (90s, 10m, 2h)")
@click.option("--max-attempts", type=int, help="command list: attempts per task (default 1)")
@click.option("--gpu-memory", help="command list: GPU memory per task (20G): packs GPUs by it")
@click.option(
    "--repeats",
    type=click.IntRange(1, 1000),
    help="run each task this many independent times ({repeat}: 1..N; over defaults.repeats)",
)
@_supervising
@click_options("run", choose="what runs each attempt")
@_BUDGET_USD
@_BUDGET_TOKENS
@click.option(
    "--notify",
    "notify_url",
    metavar="URL",
    help="webhook: POST the run's events there (over notify:'s url; docs/notifications.md)",
)
def run(
    source: str,
    gpus: str | None,
    name: str | None,
    workspace: str | None,
    suffix: str | None,
    shell: bool,
    timeout: str | None,
    max_attempts: int | None,
    gpu_memory: str | None,
    repeats: int | None,
    quiet: bool,
    plain: bool,
    no_report: bool,
    as_json: bool,
    strict: bool,
    share_gpus: bool,
    halt: str | None,
    budget_usd: float | None,
    budget_tokens: int | None,
    backend: str | None,
    notify_url: str | None = None,
    **backend_values: Any,
) -> None:
    """Run the tasks of SOURCE over the GPUs.

    SOURCE is a YAML config (.yaml/.yml) or a command list: one command per line, '-' for stdin,
    each line run with /bin/sh -c (--no-shell: split into arguments, no shell).
    Exit code: 0 when every task is done (or skipped, or cancelled by hand: with --strict a
    cancelled task is 1), 1 when any is failed or unfinished, 2 for bad input, 130 when
    stopped by Ctrl-C / SIGTERM (resume with 'gpuswarm resume').
    """
    with stoppable():
        refuse_list_options(source, YAML_SUFFIXES, "shell", "timeout", "max_attempts", "gpu_memory")
        defaults = TaskOptions.from_cli(
            timeout=timeout, max_attempts=max_attempts, gpu_memory=gpu_memory, repeats=repeats
        )
        loaded = (
            _load_source(source, shell=shell, name=name, workspace=workspace, defaults=defaults)
        ).with_backend(backend, backend_values)
        if loaded.config.backend != "local" and isinstance(loaded.tasks, CommandTasks):
            loaded = dataclasses.replace(loaded, tasks=through_shell(loaded.tasks))  # its PATH
        if halt is not None:  # the run's own from now on (run.json): a resume keeps it
            config = loaded.config.model_copy(update={"halt": canonical_halt(halt)})
            loaded = dataclasses.replace(loaded, config=config)
        if notify_url is not None:  # issue 37: run.json keeps it, a resume notifies too
            loaded = dataclasses.replace(loaded, config=with_notify(loaded.config, notify_url))
        if budget_usd is not None or budget_tokens is not None:  # issue 34: over the config's
            loaded = with_budget_usd(loaded, budget_usd, budget_tokens)  # (run.json keeps it)
        output = Output(quiet=quiet, live=not plain, report=not no_report)
        report = start_run(loaded, gpus, suffix=suffix, output=output, share_gpus=share_gpus)
    _finish(report, as_json, strict)


@click.command()
@click.argument("run_dir", required=False, type=click.Path(path_type=Path))
@click.option(
    "--latest",
    is_flag=True,
    help="resume the newest of your runs (./runs and the index of your runs; with --workspace: "
    "of those under it), of any name unless --name is given",
)
@click.option("--name", help="with --latest: only runs of this name")
@click.option(
    "--workspace",
    help="where runs are (for --latest or a bare run name; default ./runs, then the index)",
)
@click.option("--gpus", help="GPUs to use now (default: the run's)")
@click.option("--no-retry-failed", is_flag=True, help="leave failed tasks failed")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="a changed config")
@click.option("--allow-config-change", is_flag=True, help="apply --config to unfinished tasks")
@_supervising
@click_options("resume")
@_BUDGET_USD
@_BUDGET_TOKENS
def resume(
    run_dir: Path | None,
    latest: bool,
    name: str | None,
    workspace: str | None,
    gpus: str | None,
    no_retry_failed: bool,
    config_path: Path | None,
    allow_config_change: bool,
    quiet: bool,
    plain: bool,
    no_report: bool,
    as_json: bool,
    strict: bool,
    share_gpus: bool,
    halt: str | None,
    budget_usd: float | None,
    budget_tokens: int | None,
    **backend_values: Any,
) -> None:
    """Finish a run: skip done tasks, requeue interrupted and (by default) failed ones.

    RUN_DIR is the run folder, any path inside it, its bare name (run_20260702_041903) or the
    run's name (its newest run), looked up under --workspace, then in the index of your runs.
    """
    if (run_dir is None) == (not latest):
        click.echo("gpuswarm: error: give a RUN_DIR or --latest (not both)", err=True)
        sys.exit(EXIT_BAD_INPUT)
    with stoppable():
        if latest:  # an explicit --workspace: its runs only; else also the index's
            target = (
                latest_run(Path(workspace), name)
                if workspace
                else runindex.newest_run(Path("runs"), name, batch=True)
            )
            if not quiet:  # --latest without --name takes the newest run of any name: say which
                what = f"runs named {name!r}" if name else "runs of any name (--name to choose)"
                shown = target.resolve()
                click.echo(f"gpuswarm: resuming {shown}, the newest of the {what}", err=True)
        else:
            assert run_dir is not None
            target = runindex.resolve(run_dir, Path(workspace or "runs"))  # also a bare name
        new_config = load_config(config_path) if config_path else None
        report = resume_run(
            target,
            gpus,
            retry_failed=not no_retry_failed,
            new_config=new_config,
            allow_change=allow_config_change,
            output=Output(quiet=quiet, live=not plain, report=not no_report),
            share_gpus=share_gpus,
            backend_options=backend_values,
            halt=halt,
            budget_usd=budget_usd,
            budget_tokens=budget_tokens,
        )
    _finish(report, as_json, strict)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--gpus", required=True, help="the GPUs this supervisor adds (auto | 4,5 | sim:N)")
@_supervising
def work(
    run_dir: Path,
    gpus: str,
    quiet: bool,
    plain: bool,
    no_report: bool,
    as_json: bool,
    strict: bool,
    share_gpus: bool,
    halt: str | None,
) -> None:
    """Attach more GPUs to a run (live or not), or another host on a shared filesystem.

    The new supervisor claims from the same queue and takes over tasks of supervisors that died
    (their leases expire). It stops when nothing is left to claim.
    """
    with stoppable():
        output = Output(quiet=quiet, live=not plain, report=not no_report)
        report = work_run(run_dir, gpus, output=output, share_gpus=share_gpus, halt=halt)
    _finish(report, as_json, strict)


def _finish(report: RunReport, as_json: bool, strict: bool = False) -> NoReturn:
    report.strict = strict  # cancelled tasks: exit 0 unless --strict
    if as_json:
        payload: dict[str, Any] = {
            **report.summary,
            "path": str(report.paths.root.resolve()),
            "exit_code": report.exit_code,
        }
        click.echo(json.dumps(payload, indent=1))
    else:
        from gpuswarm.ui.endreport import print_report

        print_report(report)
    leave(report.exit_code, hard=report.stopped_by is not None)


@click.command()
@click.option(
    "--dir",
    "where",
    type=click.Path(file_okay=False, path_type=Path),
    help="where to make the demo repository (default: a new temp folder)",
)
@click.option("--experiments", default=20, show_default=True, help="variants to try")
@click.option("--budget", default=4.0, show_default=True, help="training seconds per run")
@click.option("--gpus", default="sim:4", show_default=True, help="sim:N, or real GPUs")
@click.option("--seed", type=int, help="the mutate proposer's seed")
@click.option("--plain", is_flag=True, help="one line per decision, even on a terminal")
@click.option("--json", "as_json", is_flag=True, help="print the outcome as JSON")
def demo(
    where: Path | None,
    experiments: int,
    budget: float,
    gpus: str,
    seed: int | None,
    plain: bool,
    as_json: bool,
) -> None:
    """The whole product in a minute or two: an autonomous research loop on simulated GPUs.

    A scratch git repo with a tiny numpy language model; the built-in mutate proposer tries
    variants of its hyper-parameters, one per GPU, and keeps those that lower val_bpb.
    """
    with stoppable():
        live = not (plain or as_json) and is_terminal(sys.stderr)
        say = (lambda _: None) if as_json else (lambda text: click.echo(text, err=True))
        from gpuswarm.cli.demo import DemoOptions, run_demo  # loaded only when asked for

        opts = DemoOptions(where, experiments, budget, gpus, seed, live)
        data = run_demo(opts, say)
    if as_json:
        click.echo(json.dumps(data, indent=1, default=str))
    else:
        from gpuswarm.ui.printers import print_demo  # rich, loaded only to print

        print_demo(data)
    sys.exit(EXIT_INTERRUPTED if data["left_running"] else 0)


COMMANDS = (run, resume, work, demo)
