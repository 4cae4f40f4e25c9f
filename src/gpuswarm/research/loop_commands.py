"""``gpuswarm research loop | stop | _serve``: the autonomous loop, stopping the background
runner, and the runner itself (hidden: started by the other commands)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from gpuswarm.config.budget import TOKENS_HELP
from gpuswarm.core.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_UNFINISHED,
    GpuswarmError,
    ResearchError,
)
from gpuswarm.core.words import counted
from gpuswarm.research import runner, session, views
from gpuswarm.research.agent import AgentOptions, AgentProposer, check_agent, load_preset
from gpuswarm.research.clikit import (
    emit,
    experiment_options,
    flag_duration,
    flag_tokens,
    handle_errors,
)
from gpuswarm.research.experiment import ExpPaths, load_settings
from gpuswarm.research.loop import LoopOptions, run_loop
from gpuswarm.research.looplock import ensure_free
from gpuswarm.research.proposers import MutateProposer, Proposer
from gpuswarm.research.prune import options as prune_options
from gpuswarm.ui.terminal import is_terminal


@click.command()
@experiment_options
@handle_errors
def stop(where: Path, tag: str | None, as_json: bool) -> None:
    """Stop the background runner; running variants go back to the queue (next command resumes)."""
    exp = session.Experiment.open(where, tag)
    n = runner.stop_runner(exp.paths)
    emit(
        as_json, {"stopped": n}, lambda d: click.echo(f"stopped {counted(d['stopped'], 'runner')}")
    )


@click.command()
@click.option(
    "--proposer",
    type=click.Choice(["mutate", "agent"]),
    help="where variants come from  [default: agent with --agent/--agent-command, else mutate]",
)
@click.option("--mode", type=click.Choice(["async", "rounds"]), default="async", show_default=True)
@click.option("--max-experiments", type=int, help="stop after starting this many variants")
@click.option("--for", "duration", help="stop proposing after this long, e.g. 8h")
@click.option("--lookahead", type=int, help="async: variants queued ahead (default: --proposers)")
@click.option("--proposers", default=1, show_default=True, help="proposals made at once (agents)")
@click.option(
    "--controls",
    default="auto",
    show_default=True,
    metavar="auto|off|N",
    help="BASE control runs that decisions are paired with: one per round; async: every N "
    "variants (auto: one per GPU slot's worth)",
)
@click.option(
    "--prune",
    type=click.Choice(["off", "median", "curve"]),
    default="off",
    show_default=True,
    help="stop a variant whose progress is worse than BASE's curve by more than k x the noise "
    "(docs/research.md, Pruning)",
)
@click.option("--prune-grace", default="20%", show_default=True, help="never before this share")
@click.option("--prune-k", type=float, default=3.0, show_default=True, help="k x noise at t")
@click.option("--seed", type=int, help="mutate: random seed (reproducible proposals)")
@click.option(
    "--mutate",
    "mutate",
    multiple=True,
    metavar="NAME",
    help="mutate: only these settings (repeat; globs: 'lr*', 'betas', 'GPTConfig.n_layer')",
)
@click.option(
    "--mutate-exclude",
    multiple=True,
    metavar="NAME",
    help="mutate: never these settings (repeat; globs: 'seed', '*_interval')",
)
@click.option(
    "--agent",
    "agent_name",
    metavar="PRESET|FILE",
    help="agent: a preset (claude-code, codex, cursor, gemini, opencode, aider) or a YAML file "
    "of a preset's fields (see docs/agents.md)",
)
@click.option("--agent-model", help="agent: the model the preset passes to its CLI")
@click.option("--agent-effort", help="agent: the effort/reasoning level, where the CLI has one")
@click.option("--agent-command", help="agent: command run in a scratch copy of BASE; {prompt}")
@click.option("--agent-shell", is_flag=True, help="agent: run --agent-command through /bin/sh")
@click.option("--program", type=click.Path(dir_okay=False, path_type=Path), help="program.md")
@click.option("--agent-timeout", help="agent: per proposal  [default: the preset's, else 15m]")
@click.option("--agent-max-failures", default=5, show_default=True)
@click.option(
    "--budget-usd",
    type=click.FloatRange(min=0, min_open=True, max=1e7),
    help="agent: end the loop once the proposals cost this much (USD, as the CLI reports it)",
)
@click.option(
    "--budget-tokens",
    help=f"agent: end the loop once the proposals used this many tokens: {TOKENS_HELP}",
)
@click.option("--plain", is_flag=True, help="one line per decision, even on a terminal")
@experiment_options
@handle_errors
def loop(where: Path, tag: str | None, as_json: bool, **kw: Any) -> None:
    """Run autonomously: propose, run one variant per GPU, keep what improves. Ctrl-C stops."""
    exp = session.Experiment.open(where, tag)
    ensure_free(exp.paths)  # one loop per experiment: refused before anything is checked
    proposer: Proposer
    kind = kw["proposer"] or ("agent" if kw["agent_name"] or kw["agent_command"] else "mutate")
    if kind == "agent":
        proposer = AgentProposer(exp.paths, exp.cfg, agent_options(kw))
    else:
        proposer = MutateProposer(
            exp.paths,
            exp.cfg,
            kw["seed"],
            include=tuple(kw["mutate"]),
            exclude=tuple(kw["mutate_exclude"]),
        )
        proposer.check(exp.settle())  # nothing to propose: exit 2 saying why, before anything
    loop_opts = LoopOptions(
        mode=kw["mode"],
        max_experiments=kw["max_experiments"],
        duration=flag_duration("--for", kw["duration"]),
        lookahead=None if kw["lookahead"] is None else max(0, kw["lookahead"]),
        proposers=max(1, kw["proposers"]),
        controls=_controls(kw["controls"]),
        prune=prune_options(kw["prune"], kw["prune_grace"], kw["prune_k"]),
    )
    if as_json:
        data = run_loop(exp, proposer, loop_opts, lambda _: None)
    elif kw["plain"] or not is_terminal(sys.stderr):
        data = run_loop(
            exp, proposer, loop_opts, lambda text: click.echo(f"{views.stamp()} {text}")
        )
    else:
        data = views.run_loop_live(exp, proposer, loop_opts)
    emit(as_json, data, views.show_loop)
    if data["made"] == 0 and data.get("exhausted"):
        raise ResearchError(f"the loop started nothing: {data['exhausted']}")
    if data["left_running"]:
        sys.exit(EXIT_INTERRUPTED)


def _controls(text: str) -> int | None:
    """``--controls``: auto -> None, off -> 0, N -> every N variants (N >= 1)."""
    if text == "auto":
        return None
    if text == "off":
        return 0
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ResearchError(f"--controls {text!r}: auto, off, or a number of variants (1 or more)")


def agent_options(kw: dict[str, Any]) -> AgentOptions:
    """The agent proposer's options from the flags; a preset is checked installed and logged
    in now (exit 2 saying what is missing)."""
    timeout = flag_duration("--agent-timeout", kw["agent_timeout"])
    common = {
        "program": kw["program"],
        "max_failures": kw["agent_max_failures"],
        "budget_usd": kw["budget_usd"],
        "budget_tokens": flag_tokens("--budget-tokens", kw["budget_tokens"]),
    }
    if kw["agent_name"] and kw["agent_command"]:
        raise ResearchError("give --agent (a preset) or --agent-command, not both")
    if kw["agent_name"] and kw["agent_shell"]:
        raise ResearchError("--agent-shell goes with --agent-command (a preset runs no shell)")
    if kw["agent_name"]:
        preset = load_preset(kw["agent_name"], model=kw["agent_model"], effort=kw["agent_effort"])
        check_agent(preset)
        return AgentOptions(preset=preset, timeout=timeout or preset.timeout, **common)
    if not kw["agent_command"]:
        raise ResearchError(
            "--proposer agent needs --agent PRESET (claude-code, codex, cursor, gemini, opencode, "
            "aider) or --agent-command (an LLM agent's CLI)"
        )
    if kw["agent_model"] or kw["agent_effort"]:
        raise ResearchError("--agent-model and --agent-effort go with --agent PRESET")
    return AgentOptions(
        command=kw["agent_command"], timeout=timeout or 900.0, shell=kw["agent_shell"], **common
    )


@click.command("_serve", hidden=True)
@click.argument("root", type=click.Path(file_okay=False, path_type=Path))
def serve(root: Path) -> None:
    """The background runner of an experiment (started by the other commands)."""
    root = root.resolve()
    paths = ExpPaths(root.parents[2], root)
    try:
        sys.exit(runner.serve(paths, load_settings(paths)))
    except GpuswarmError as exc:
        click.echo(f"gpuswarm research runner: error: {exc}", err=True)
        sys.exit(exc.exit_code if exc.exit_code != EXIT_BAD_INPUT else EXIT_UNFINISHED)
