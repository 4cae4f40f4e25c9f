"""A batch agent's prompt built from each task's config, through the real CLIs.

``prompt: {template: prompt.md}`` (the way AgentKernelArena's ``agents/`` build the prompt from a
task's ``config.yaml``): one template in the config's folder, its ``{config.<field>}`` and
``{task_rel}`` rendered per task, then delivered the preset's way: on stdin (Claude Code, with
its AgentKernelArena defaults: ``bypassPermissions``, here as root with ``IS_SANDBOX``) or as
one argument (Gemini CLI). The model is the scripted stub of ``tests/helpers/model_stub.py``;
it records every request, so the test reads the rendered prompt where the model got it, and the
CLI's own edit of each task's kernel shows the run went end to end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_clis import QUIET_ENV, require_cli
from cli_driver import CliResult
from model_stub import EditRule, ModelStub, request_text

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]
PY = sys.executable
API_KEY = "sk-ant-stub-0123456789abcdef"
KERNEL = "BLOCK = 64\nDEPTH = 8\n"
RULE = EditRule(
    file="kernel.py",
    pattern=r"DEPTH = (\d+)",
    replace=lambda m: f"DEPTH = {int(m.group(1)) - 1}",
    description=lambda m: "lowered DEPTH",
)
EVALUATE = """\
import pathlib, re
depth = int(re.search(r"DEPTH = (\\d+)", pathlib.Path("kernel.py").read_text()).group(1))
pathlib.Path("task_result.yaml").write_text(f"pass_correctness: true\\ndepth: {depth}\\n")
"""
TEMPLATE = """\
Optimise the {config.kernel_name} kernel ({config.task_type}) in {config.source_file_path}.
For this optimization, you must iterate up to {config.max_iterations} versions.
Task {task_rel}; report as {{"speedup": x}}.
"""
CONFIG = """\
name: kernels
workspace: runs
tasks:
  - glob: tasks/*/config.yaml
    agent:
      preset: {preset}
      prompt: {{template: prompts/optimise.md}}
      copy_from: "{{task_dir}}"
      timeout: 90s
    command: {py} evaluate.py
    cwd: "{{workspace}}"
    done_when: task_result.yaml
"""
TASKS = {"softmax": ("softmax_fused", 3), "gemm": ("gemm_tiled", 5)}


def project(tmp_path: Path, preset: str) -> Path:
    for folder, (kernel, iterations) in TASKS.items():
        task = tmp_path / "tasks" / folder
        task.mkdir(parents=True)
        (task / "kernel.py").write_text(KERNEL)
        (task / "evaluate.py").write_text(EVALUATE)
        (task / "config.yaml").write_text(
            f"task_type: hip2hip\nkernel_name: {kernel}\nsource_file_path: kernel.py\n"
            f"max_iterations: {iterations}\n"
        )
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts/optimise.md").write_text(TEMPLATE)
    cfg = tmp_path / "kernels.yaml"
    cfg.write_text(CONFIG.format(preset=preset, py=PY))
    return cfg


def expected_prompt(folder: str) -> str:
    kernel, iterations = TASKS[folder]
    return (
        f"Optimise the {kernel} kernel (hip2hip) in kernel.py.\n"
        f"For this optimization, you must iterate up to {iterations} versions.\n"
        f'Task tasks/{folder}; report as {{"speedup": x}}.\n'
    )


def agent_env(cli: str, home: Path, stub: ModelStub) -> dict[str, str]:
    path = require_cli(cli)
    env = {"PATH": f"{path.parent}:/usr/bin:/bin", "HOME": str(home), **QUIET_ENV}
    if cli == "claude":
        return env | {"ANTHROPIC_BASE_URL": stub.url, "ANTHROPIC_API_KEY": API_KEY}
    (home / ".gemini").mkdir()  # an API key through a gateway (the stub): its auth type chosen
    (home / ".gemini/settings.json").write_text(
        '{"security": {"auth": {"selectedType": "gemini-api-key"}}}\n'
    )
    return env | {"GEMINI_API_KEY": "stub-gemini-key", "GOOGLE_GEMINI_BASE_URL": stub.url}


@pytest.mark.parametrize(("cli", "preset"), [("claude", "claude-code"), ("gemini", "gemini")])
@pytest.mark.timeout(180)
def test_template_prompt_rendered_per_task_reaches_the_model(
    gpuswarm: Cli, tmp_path: Path, cli: str, preset: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cfg = project(tmp_path, preset)
    with ModelStub(RULE) as stub:
        env = agent_env(cli, home, stub)
        res = gpuswarm("run", cfg, "--gpus", "sim:2", env=env, timeout=150)
        assert res.returncode == 0, res
        said = [request_text(body) for body in stub.main_requests()]
    (run,) = (tmp_path / "runs/kernels").glob("run_*")
    for folder in TASKS:
        (ws,) = [p for p in (run / "tasks").iterdir() if folder in p.name]
        prompt = expected_prompt(folder)
        assert (ws / ".agent-prompt.md").read_text() == prompt  # the task's own instructions
        assert any(prompt.strip() in text for text in said), (folder, [t[-600:] for t in said])
        assert (ws / "kernel.py").read_text() == "BLOCK = 64\nDEPTH = 7\n"  # the CLI's edit
        assert "depth: 7" in (ws / "task_result.yaml").read_text()
    assert not any("{config." in text for text in said)  # every field was rendered


@pytest.mark.timeout(60)
def test_a_task_config_without_the_field_stops_the_run_before_anything(
    gpuswarm: Cli, tmp_path: Path
) -> None:
    cfg = project(tmp_path, "claude-code")
    (tmp_path / "tasks/gemm/config.yaml").write_text("task_type: hip2hip\nkernel_name: gemm\n")
    res = gpuswarm("run", cfg, "--gpus", "sim:1", timeout=50)
    assert res.returncode == 2, res
    assert str(tmp_path / "tasks/gemm/config.yaml") in res.stderr, res
    assert "has no field 'source_file_path'" in res.stderr, res
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("run_*")), res
    (tmp_path / "prompts/optimise.md").unlink()
    res = gpuswarm("run", cfg, "--gpus", "sim:1", timeout=50)
    assert res.returncode == 2, res
    assert "tasks[0].agent.prompt.template: 'prompts/optimise.md': no such file" in res.stderr
