"""``gpuswarm research ...``: parse, call the research modules, print (compact text, or --json).
The loop, stop and the hidden runner command are ``loop_commands.py``; shared options and error
handling ``clikit.py``."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

import click

from gpuswarm.config.backends import click_options, plugins
from gpuswarm.core.errors import (
    EXIT_UNFINISHED,
    ResearchError,
)
from gpuswarm.research import configure, readouts, rerun, session, views
from gpuswarm.research.clikit import emit, experiment_options, flag_duration, handle_errors
from gpuswarm.research.loop_commands import loop, serve, stop
from gpuswarm.research.payloads import Knobs
from gpuswarm.research.prune import options as prune_options
from gpuswarm.research.ruleopts import RuleSettings, rule_options, rules_into


@click.group()
def research() -> None:
    """Research loops: variants of train.py, one per GPU, kept when the metric improves."""


@research.command()
@click.option("--tag", required=True, help="names the run and its branch, e.g. mar5")
@click.option("--edit", multiple=True, required=True, help="a file variants may change (repeat)")
@click.option("--protect", multiple=True, help="a file no variant may change, e.g. prepare.py")
@click.option(
    "--command", "command", required=True, help="the training command, e.g. 'uv run train.py'"
)
@click.option("--metric", default="val_bpb", show_default=True, help="the metric line's name")
@click.option("--goal", type=click.Choice(["min", "max"]), default="min", show_default=True)
@click.option("--timeout", default="10m", show_default=True, help="per run; a kill is a crash")
@click.option("--gpus", default="auto", show_default=True, help="auto | 0,1,2 | 0-7 | sim:N")
@click.option(
    "--policy",
    type=click.Choice(["greedy", "noise-aware", "manual"]),
    default="noise-aware",
    show_default=True,
)
@click.option("--noise-k", default=2.0, show_default=True, help="noise-aware: k x baseline spread")
@rule_options
@click.option("--confirm", default=0, show_default=True, help="re-runs of a would-be keep")
@click.option("--branch-prefix", default="autoresearch/", show_default=True)
@click.option("--shell", is_flag=True, help="run the command through /bin/sh")
@click.option(
    "--link", multiple=True, help="untracked path to link into each run, besides .venv (repeat)"
)
@click.option("--metric-regex", help="regex whose group 1 is the metric (default '^<metric>:')")
@click.option("--memory-regex", help="regex whose group 1 is peak memory in MB")
@click.option("--metric-progress-regex", help="progress lines: groups elapsed, value (pruning)")
@click.option("--linger", default="2m", show_default=True, help="idle runner waits this long")
@click.option(
    "--mode",
    type=click.Choice(["rounds", "async"]),
    default="rounds",
    show_default=True,
    help="rounds: decide when all variants of a round are in; async: decide each on arrival",
)
@click_options("research init", choose="what runs each variant")
@click.option("--no-checkout", is_flag=True, help="do not switch HEAD to the new branch")
@click.option("--notify", metavar="URL", help="webhook: POST each kept improvement (and failures)")
@click.option("-C", "where", default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def init(where: Path, as_json: bool, **kw: Any) -> None:
    """Create branch <prefix><tag>, the experiment's state and an empty results.tsv."""
    opts = configure.InitOptions(
        tag=kw["tag"],
        edit=list(kw["edit"]),
        command=kw["command"],
        protect=list(kw["protect"]),
        metric=kw["metric"],
        goal=kw["goal"],
        timeout=flag_duration("--timeout", kw["timeout"]) or 600.0,
        gpus=kw["gpus"],
        policy=kw["policy"],
        noise_k=kw["noise_k"],
        confirm=kw["confirm"],
        branch_prefix=kw["branch_prefix"],
        shell=kw["shell"],
        link=list(kw["link"]) or None,
        metric_regex=kw["metric_regex"],
        memory_regex=kw["memory_regex"],
        progress_regex=kw["metric_progress_regex"],
        linger=flag_duration("--linger", kw["linger"]) or 0.0,
        checkout=not kw["no_checkout"],
        mode=kw["mode"],
        rules=rules_into(kw, RuleSettings()),
        notify=kw["notify"],
        **_backend_flags(kw["backend"], kw),
    )
    emit(as_json, configure.init(where, opts), views.show_init)


class _BackendFlags(TypedDict):
    """InitOptions' backend fields."""

    backend: str
    backend_values: dict[str, object]


def _backend_flags(backend: str, kw: Mapping[str, object]) -> _BackendFlags:
    """``--backend NAME`` and the backends' options (among the command's keywords ``kw``) as
    InitOptions' backend fields."""
    init = configure.INIT
    values = {o.dest: kw.get(o.dest) for p in plugins().values() for o in p.options_for(init)}
    return {"backend": backend, "backend_values": values}


@research.command()
@click.option("--repeat", default=1, show_default=True, help="k runs on different GPUs -> noise")
@experiment_options
@handle_errors
def baseline(where: Path, tag: str | None, as_json: bool, repeat: int) -> None:
    """Run BASE unchanged (k times for a noise estimate)."""
    exp = session.Experiment.open(where, tag)
    emit(as_json, session.baseline(exp, repeat), views.show_queued)


@research.command("try")
@click.option("-m", "message", help="what the variant tries, in a few words")
@click.option("--patch", type=click.Path(dir_okay=False, path_type=Path), help="a unified diff")
@click.option("--from", "from_id", help="re-try variant ID's change on the current BASE")
@click.option("--rerun", "rerun_id", help="run variant ID again in full (e.g. a pruned one)")
@experiment_options
@handle_errors
def try_cmd(
    where: Path,
    tag: str | None,
    as_json: bool,
    message: str | None,
    patch: Path | None,
    from_id: str | None,
    rerun_id: str | None,
) -> None:
    """Snapshot your edit as a variant of BASE, restore the files, queue it. Returns at once."""
    exp = session.Experiment.open(where, tag)
    if rerun_id is not None:  # issue 38
        if patch is not None or from_id is not None:
            raise ResearchError("--rerun takes no --patch or --from: it runs ID's own change")
        emit(as_json, rerun.rerun(exp, rerun_id, message), views.show_rerun)
        return
    if message is None:
        raise ResearchError("-m: say in a few words what this variant tries")
    data = session.try_variant(exp, message, patch=patch, from_id=from_id)
    emit(as_json, data, views.show_try)


@research.command()
@click.argument("ids", nargs=-1)
@click.option("--any", "mode", flag_value="any", help="return when one has finished")
@click.option("--all", "mode", flag_value="all", default=True, help="wait for all (default)")
@click.option("--timeout", help="give up after this long (exit 1), e.g. 15m")
@experiment_options
@handle_errors
def wait(
    where: Path,
    tag: str | None,
    as_json: bool,
    ids: tuple[str, ...],
    mode: str,
    timeout: str | None,
) -> None:
    """Block until the variants in flight (or IDS) finish; print their results."""
    exp = session.Experiment.open(where, tag)
    data = readouts.wait(
        exp, mode=mode, timeout=flag_duration("--timeout", timeout), ids=list(ids) or None
    )
    emit(as_json, data, views.show_wait)
    if data["timed_out"] and mode == "all":
        sys.exit(EXIT_UNFINISHED)
    waited = data["finished"]
    if waited and not data["waiting"] and all(v["status"] == "crash" for v in waited):
        click.echo("gpuswarm: every variant waited for crashed", err=True)
        sys.exit(EXIT_UNFINISHED)


@research.command()
@click.option("--last", default=10, show_default=True, help="how many recent results to show")
@experiment_options
@handle_errors
def status(where: Path, tag: str | None, as_json: bool, last: int) -> None:
    """BASE, best metric, variants in flight per GPU, the last results."""
    exp = session.Experiment.open(where, tag)
    emit(as_json, readouts.status(exp, last), views.show_status)


@research.command()
@click.option(
    "--policy",
    "replay",
    help="recompute the decisions with other settings: greedy, or noise-aware,noise_k=3,...",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    help=f"the last N variants (0: all)  [default: all as text, {readouts.LOG_LIMIT} with --json]",
)
@click.option("--since", help="only variants after this one (v0012) or this recent (30m, 2h)")
@click.option(
    "--prune",
    type=click.Choice(["off", "median", "curve"]),
    help="with --policy: what this pruning rule would have stopped (from recorded curves)",
)
@click.option("--prune-grace", default="20%", show_default=True, help="with --prune")
@click.option("--prune-k", type=float, default=3.0, show_default=True, help="with --prune")
@experiment_options
@handle_errors
def log(
    where: Path,
    tag: str | None,
    as_json: bool,
    replay: str | None,
    limit: int | None,
    since: str | None,
    **kw: Any,
) -> None:
    """Every experiment so far (results.tsv, or all fields with --json)."""
    exp = session.Experiment.open(where, tag)
    if kw["prune"] is not None and replay is None:
        replay = exp.cfg.policy  # --prune alone: the experiment's own policy, with pruning
    if replay is not None:
        pruning = prune_options(kw["prune"] or "off", kw["prune_grace"], kw["prune_k"])
        emit(as_json, readouts.replayed(exp, replay, pruning), views.show_replay)
        return
    if since is not None and not re.fullmatch(r"v\d{4,}", since):
        since = str(flag_duration("--since", since))
    if as_json:
        data = readouts.log(exp, readouts.LOG_LIMIT if limit is None else limit, since)
        click.echo(json.dumps(data, indent=1, default=str))
    elif limit is None and since is None:
        click.echo(exp.paths.results_tsv.read_text(), nl=False)
    else:
        click.echo(readouts.log_text(exp, limit, since), nl=False)


@research.command()
@click.argument("variant_id")
@click.option("-m", "reason", default="kept by hand", help="why (goes to the ledger)")
@experiment_options
@handle_errors
def keep(where: Path, tag: str | None, as_json: bool, variant_id: str, reason: str) -> None:
    """Keep a finished variant by hand: it becomes BASE (fast-forward)."""
    exp = session.Experiment.open(where, tag)
    emit(as_json, session.keep(exp, variant_id, reason), views.show_decided)


@research.command()
@click.argument("variant_id")
@click.option("-m", "reason", default="discarded by hand", help="why (goes to the ledger)")
@experiment_options
@handle_errors
def discard(where: Path, tag: str | None, as_json: bool, variant_id: str, reason: str) -> None:
    """Discard a finished, undecided variant by hand."""
    exp = session.Experiment.open(where, tag)
    emit(as_json, session.discard(exp, variant_id, reason), views.show_decided)


@research.command()
@click.option("-o", "output", type=click.Path(dir_okay=False, path_type=Path), help="PNG path")
@experiment_options
@handle_errors
def plot(where: Path, tag: str | None, as_json: bool, output: Path | None) -> None:
    """progress.png: discards grey, keeps green, the running best as a step line."""
    exp = session.Experiment.open(where, tag)
    path = readouts.plot(exp, output)
    emit(as_json, {"plot": str(path)}, lambda d: click.echo(d["plot"]))


@research.command()
@experiment_options
@handle_errors
def report(where: Path, tag: str | None, as_json: bool) -> None:
    """Write progress.png and a self-contained report.html of every experiment."""
    exp = session.Experiment.open(where, tag)
    emit(as_json, readouts.report(exp), lambda d: click.echo(d["report"]))


@research.command()
@experiment_options
@handle_errors
def restore(where: Path, tag: str | None, as_json: bool) -> None:
    """Put the editable files back to BASE (drops your uncommitted edits of them)."""
    exp = session.Experiment.open(where, tag)
    emit(as_json, session.restore(exp), lambda d: click.echo(f"restored {', '.join(d['files'])}"))


@research.command("mutate")
@click.option("--list", "listing", is_flag=True, required=True, help="the settings mutate finds")
@click.option("--mutate", "include", multiple=True, help="only these settings (as loop's)")
@click.option("--mutate-exclude", "exclude", multiple=True, help="never these (as loop's)")
@experiment_options
@handle_errors
def mutate_cmd(
    where: Path,
    tag: str | None,
    as_json: bool,
    listing: bool,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
) -> None:
    """The numeric settings of BASE's editable files: which mutate would change (and to
    what), and why each other one is skipped (state, logging, the time budget, ...)."""
    from gpuswarm.research.proposers import MutateProposer

    exp = session.Experiment.open(where, tag)
    proposer = MutateProposer(exp.paths, exp.cfg, include=include, exclude=exclude)
    state = exp.settle()
    knobs: Knobs = {"base": state.base, "settings": proposer.survey(state)}
    emit(as_json, knobs, views.show_knobs)


@research.command("config")
@click.option("--command", "command", help="the training command (new variants)")
@click.option("--shell/--no-shell", default=None, help="run the command through /bin/sh")
@click.option("--timeout", help="per run, e.g. 10m (new variants)")
@click.option("--link", multiple=True, help="untracked paths linked into each run (replaces)")
@click.option("--policy", type=click.Choice(["greedy", "noise-aware", "manual"]))
@click.option("--noise-k", type=float, help="noise-aware: k x baseline spread")
@click.option("--confirm", type=int, help="re-runs of a would-be keep")
@click.option("--linger", help="idle runner waits this long (its next start)")
@click.option("--metric-regex", help="regex whose group 1 is the metric")
@click.option("--memory-regex", help="regex whose group 1 is peak memory in MB")
@click.option("--metric-progress-regex", help="progress lines: groups elapsed, value ('': default)")
@rule_options
@experiment_options
@handle_errors
def config_cmd(where: Path, tag: str | None, as_json: bool, **kw: Any) -> None:
    """Show the experiment's settings, or change them (journaled; for new variants)."""
    emit(as_json, configure.configure(where, tag, _setting_changes(kw)), views.show_config)


def _setting_changes(kw: dict[str, Any]) -> configure.SettingChanges:
    """``research config``'s flags as the settings they change (rules first, as given)."""
    changes = rules_into(kw, configure.SettingChanges())
    if kw["command"] is not None:
        changes["command"] = kw["command"]
    if kw["shell"] is not None:
        changes["shell"] = kw["shell"]
    if kw["policy"] is not None:
        changes["policy"] = kw["policy"]
    if kw["noise_k"] is not None:
        changes["noise_k"] = kw["noise_k"]
    if kw["confirm"] is not None:
        changes["confirm"] = kw["confirm"]
    if (timeout := flag_duration("--timeout", kw["timeout"])) is not None:
        changes["timeout"] = timeout
    if (linger := flag_duration("--linger", kw["linger"])) is not None:
        changes["linger"] = linger
    if kw["link"]:
        changes["link"] = list(dict.fromkeys(kw["link"]))
    if kw["metric_regex"] is not None:
        changes["metric_pattern"] = kw["metric_regex"]
    if kw["memory_regex"] is not None:
        changes["memory_pattern"] = kw["memory_regex"]
    if kw["metric_progress_regex"] is not None:  # issue 38
        changes["metric_progress_regex"] = kw["metric_progress_regex"]
    return changes


for _command in (loop, stop, serve):
    research.add_command(_command)
