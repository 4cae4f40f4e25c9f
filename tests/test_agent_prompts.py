"""The presets' defaults (what AgentKernelArena's runner runs each agent with) and a batch
agent's prompt built from the task's config: ``prompt: {template: prompt.md}`` (a file of the
config's folder) and ``{config.<field>}`` in a prompt, rendered per task by the launch's
placeholder rendering and run by /bin/sh against a stand-in agent that records its stdin.

The real CLIs with a template prompt: tests/integration/test_agents_real.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from gpuswarm.agents.preset import AgentUse, shipped_preset
from gpuswarm.config.agents import MAX_TEMPLATE_BYTES
from gpuswarm.config.load import load_config
from gpuswarm.config.render import render_command
from gpuswarm.core.errors import ConfigError

PRESETS = ["aider", "claude-code", "codex", "cursor", "gemini", "opencode"]


# -- the presets' defaults -----------------------------------------------------------------------
def test_claude_code_runs_as_agentkernelarena_runs_it() -> None:
    claude = shipped_preset("claude-code")
    assert claude.args[:3] == ["-p", "--permission-mode", "bypassPermissions"]
    assert "--no-session-persistence" in claude.args and claude.prompt_via == "stdin"
    # bypassPermissions as root (a container) needs IS_SANDBOX; no learned memory headless
    assert claude.env["IS_SANDBOX"] == "1"
    assert claude.env["CLAUDE_CODE_DISABLE_AUTO_MEMORY"] == "1"
    assert claude.timeout == 3600.0


def test_codex_runs_as_agentkernelarena_runs_it() -> None:
    codex = shipped_preset("codex")
    for flag in (
        "--dangerously-bypass-approvals-and-sandbox",
        "--skip-git-repo-check",
        "--ephemeral",
        "features.memories=false",
    ):
        assert flag in codex.args, flag
    assert "--sandbox" not in codex.args
    assert codex.args[-2:] == ["--", "-"] and codex.prompt_via == "stdin"
    assert codex.timeout == 3600.0


def test_cursor_runs_as_agentkernelarena_runs_it() -> None:
    cursor = shipped_preset("cursor")
    assert {"-p", "--force", "--trust"} <= set(cursor.args)
    assert cursor.args[-2:] == ["--", "{prompt}"]  # a prompt starting with - is no option
    assert cursor.timeout == 3600.0


def test_every_agent_is_bounded_by_the_hour_of_agentkernelarena() -> None:
    for name in PRESETS:
        assert shipped_preset(name).timeout == 3600.0, name
    custom = AgentUse(program="mine", args=["{prompt}"]).resolved()
    assert custom.timeout == 3600.0
    assert AgentUse.model_validate({"preset": "codex", "timeout": "45m"}).resolved().timeout == 2700


def test_the_headless_approval_flags_of_the_others() -> None:
    assert "--yolo" in shipped_preset("gemini").args
    assert "--auto" in shipped_preset("opencode").args
    assert "--yes-always" in shipped_preset("aider").args


# -- prompt templates ----------------------------------------------------------------------------
TEMPLATE = (
    "# Optimise {config.kernel} ({task_rel})\n"
    "Files: {config.source}; iterate up to {config.iterations} versions.\n"
    "Keep {{braces}} and ${HOME} as they are.\n"
)
STAND_IN = """#!/bin/sh
cat > "$GS_TEST_OUT/stdin-$(basename "$PWD")"
"""


def make_tree(
    tmp_path: Path,
    configs: dict[str, str],
    *,
    agent: str = "{preset: claude-code, prompt: {template: prompt.md}}",
    template: str = TEMPLATE,
    head: str = "",
) -> Path:
    for name, body in configs.items():
        folder = tmp_path / "tasks" / name
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(body)
    (tmp_path / "prompt.md").write_text(template)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"{head}tasks:\n  - glob: tasks/*/config.yaml\n    agent: {agent}\n    command: 'true'\n"
    )
    return cfg


GOOD = {
    "softmax": "kernel: softmax\nsource: softmax.hip\niterations: 3\n",
    "gemm": 'kernel: "$(touch pwned) it\'s `x`"\nsource: gemm.hip\niterations: 5\n',
}


def run_tasks(tmp_path: Path, cfg: Path) -> dict[str, str]:
    """Each task's launch command, rendered and run by /bin/sh; what the agent read on stdin."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    agent = bin_dir / "claude"
    agent.write_text(STAND_IN)
    agent.chmod(agent.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "GS_TEST_OUT": str(out)}
    for task in load_config(cfg).tasks:
        ws = tmp_path / "ws" / task.id
        ws.mkdir(parents=True)
        argv = render_command(task, {"workspace": str(ws), "task_id": task.id})
        proc = subprocess.run(
            argv, cwd=ws, env=env, capture_output=True, text=True, timeout=30, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return {p.name.removeprefix("stdin-"): p.read_text() for p in out.iterdir()}


def test_a_template_is_rendered_per_task_from_its_config(tmp_path: Path) -> None:
    cfg = make_tree(tmp_path, GOOD)
    seen = run_tasks(tmp_path, cfg)
    assert seen == {
        "tasks-softmax": (
            "# Optimise softmax (tasks/softmax)\n"
            "Files: softmax.hip; iterate up to 3 versions.\n"
            "Keep {braces} and ${HOME} as they are.\n"
        ),
        "tasks-gemm": (
            "# Optimise $(touch pwned) it's `x` (tasks/gemm)\n"
            "Files: gemm.hip; iterate up to 5 versions.\n"
            "Keep {braces} and ${HOME} as they are.\n"
        ),
    }, seen
    assert not list(tmp_path.rglob("pwned"))  # a config's value is text, never shell code
    # the exact instructions of each task are kept in its workspace
    kept = (tmp_path / "ws").glob("*/.agent-prompt.md")
    assert sorted(p.read_text().splitlines()[0] for p in kept) == [
        "# Optimise $(touch pwned) it's `x` (tasks/gemm)",
        "# Optimise softmax (tasks/softmax)",
    ]


def test_config_fields_in_a_prompt_string_and_the_agents_folders(tmp_path: Path) -> None:
    agent = (
        '{preset: claude-code, prompt: "tune {config.kernel} of {config.source}", '
        'copy_from: "{task_dir}", workdir: "{workspace}/{config.kernel}"}'
    )
    cfg = make_tree(tmp_path, GOOD, agent=agent)
    seen = run_tasks(tmp_path, cfg)  # keyed by the folder the agent ran in
    assert seen == {
        "$(touch pwned) it's `x`": "tune $(touch pwned) it's `x` of gemm.hip\n",
        "softmax": "tune softmax of softmax.hip\n",
    }, seen
    assert (tmp_path / "ws/tasks-softmax/softmax/config.yaml").is_file()  # copied in
    assert not list(tmp_path.rglob("pwned"))


def test_a_field_some_configs_lack_takes_its_fallback_in_a_template(tmp_path: Path) -> None:
    """``{config.field|default}`` (issue 28 item 9) in a prompt template: AgentKernelArena's
    configs do not all have every field."""
    template = "Optimise {config.kernel} in {config.iterations|10} versions.\n"
    configs = {**GOOD, "relu": "kernel: relu\nsource: relu.hip\n"}  # no iterations
    cfg = make_tree(tmp_path, configs, template=template)
    seen = run_tasks(tmp_path, cfg)
    assert seen["tasks-relu"] == "Optimise relu in 10 versions.\n"
    assert seen["tasks-softmax"] == "Optimise softmax in 3 versions.\n"


def test_a_template_in_defaults_serves_every_entry(tmp_path: Path) -> None:
    head = "defaults:\n  agent: {preset: claude-code, prompt: {template: prompt.md}}\n"
    cfg = make_tree(tmp_path, GOOD, agent="{model: opus}", head=head)
    seen = run_tasks(tmp_path, cfg)
    assert len(seen) == 2 and all(s.startswith("# Optimise ") for s in seen.values())


def test_a_task_whose_config_lacks_a_field_is_refused_naming_both(tmp_path: Path) -> None:
    cfg = make_tree(tmp_path, {**GOOD, "relu": "kernel: relu\nsource: relu.hip\n"})
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    message = str(info.value)
    assert str(tmp_path / "tasks/relu/config.yaml") in message, message
    assert "has no field 'iterations'" in message and "{config.iterations}" in message, message
    assert info.value.exit_code == 2


def make_template_case(tmp_path: Path, case: str) -> str:
    """Set up one bad template; returns what ``template:`` says."""
    outside = tmp_path.parent / f"{tmp_path.name}-outside.md"
    outside.write_text("secret")
    if case == "escape":
        return f"../{outside.name}"
    if case == "absolute":
        return str(outside)
    if case == "link":
        (tmp_path / "link.md").symlink_to(outside)
        return "link.md"
    if case == "fifo":
        os.mkfifo(tmp_path / "pipe.md")  # a template that would block a reader forever
        return "pipe.md"
    if case == "big":
        (tmp_path / "big.md").write_text("x" * (MAX_TEMPLATE_BYTES + 1))
        return "big.md"
    if case == "binary":
        (tmp_path / "bin.md").write_bytes(b"\xff\xfe prompt")
        return "bin.md"
    if case == "placeholder":
        return "'{task_dir}/prompt.md'"
    return {"missing": "nope.md", "folder": "tasks", "empty": "' '"}[case]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "'nope.md': no such file"),
        ("escape", "is outside the config's folder"),
        ("absolute", "relative to the config's folder"),
        ("link", "is outside the config's folder"),
        ("fifo", "is not a regular file"),
        ("folder", "is not a regular file"),
        ("big", f"is larger than {MAX_TEMPLATE_BYTES >> 10} KiB"),
        ("binary", "is not UTF-8 text"),
        ("placeholder", "its path takes no placeholders"),
        ("empty", "is empty"),
    ],
)
@pytest.mark.timeout(30)
def test_bad_template_files_are_refused_naming_the_field(
    tmp_path: Path, case: str, message: str
) -> None:
    name = make_template_case(tmp_path, case)
    agent = f"{{preset: claude-code, prompt: {{template: {name}}}}}"
    cfg = make_tree(tmp_path, GOOD, agent=agent)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(cfg)
    assert "run.yaml:3: tasks[0].agent.prompt.template" in str(info.value), info.value
    assert info.value.exit_code == 2


def test_unknown_placeholders_of_a_template_name_its_line(tmp_path: Path) -> None:
    cfg = make_tree(tmp_path, GOOD, template="# task\n\nuse {nope} here\n")
    with pytest.raises(ConfigError, match=r"prompt\.md:3: unknown placeholder \{nope\}") as info:
        load_config(cfg)
    assert "tasks[0].agent.prompt.template" in str(info.value)


def test_config_fields_need_a_glob_entry(tmp_path: Path) -> None:
    (tmp_path / "prompt.md").write_text("tune {config.kernel}\n")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "tasks:\n  - name: one\n    command: 'true'\n"
        "    agent: {preset: codex, prompt: {template: prompt.md}}\n"
    )
    with pytest.raises(ConfigError, match=r"prompt\.md:1: .*only glob tasks have it"):
        load_config(cfg)


def test_a_template_of_defaults_is_located_in_defaults(tmp_path: Path) -> None:
    head = "defaults:\n  agent: {preset: claude-code, prompt: {template: nope.md}}\n"
    cfg = make_tree(tmp_path, GOOD, agent="{model: opus}", head=head)
    with pytest.raises(ConfigError, match=r"defaults\.agent\.prompt\.template: 'nope\.md'"):
        load_config(cfg)


@pytest.mark.parametrize("prompt", ["{templat: prompt.md}", "{template: a.md, extra: 1}"])
def test_a_prompt_mapping_is_a_template_or_refused(tmp_path: Path, prompt: str) -> None:
    cfg = make_tree(tmp_path, GOOD, agent=f"{{preset: codex, prompt: {prompt}}}")
    with pytest.raises(ConfigError, match=r"prompt is the text, or \{template: FILE\}"):
        load_config(cfg)
