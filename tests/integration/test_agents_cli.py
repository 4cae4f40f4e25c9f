"""``gpuswarm agents``: the presets listed, one shown expanded, and checked ready or not (against
a stand-in ``claude`` that prints what the real ``claude auth status`` prints)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliResult

pytestmark = pytest.mark.slow
Cli = Callable[..., CliResult]

LOGGED_IN = '{\n  "loggedIn": true,\n  "authMethod": "api_key"\n}'
LOGGED_OUT = '{\n  "loggedIn": false,\n  "authMethod": "none"\n}'


def fake_claude(folder: Path, output: str, rc: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "claude"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {rc}\n")
    path.chmod(0o755)


def test_agents_list_show_and_check(gpuswarm: Cli, tmp_path: Path) -> None:
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude/settings.json").write_text("{}")
    fake_claude(bin_dir, LOGGED_IN, 0)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home)}
    res = gpuswarm("agents", "--json", env=env)
    assert res.returncode == 0, res
    rows = {r["preset"]: r for r in json.loads(res.stdout)["presets"]}
    assert sorted(rows) == ["aider", "claude-code", "codex", "cursor", "gemini", "opencode"]
    assert rows["claude-code"]["found"] == "claude"

    res = gpuswarm("agents", "show", "claude-code", "--model", "opus", env=env)
    assert res.returncode == 0, res
    assert res.stdout.startswith("claude-code: claude -p --permission-mode bypassPermissions")
    assert "--model opus" in res.stdout
    assert "login file (copied): ~/.claude/settings.json" in res.stdout
    assert "login file (absent): ~/.claude/.credentials.json" in res.stdout

    res = gpuswarm("agents", "check", "claude-code", env=env)
    assert res.returncode == 0, res
    assert "agent claude-code: logged in" in res.stdout
    fake_claude(bin_dir, LOGGED_OUT, 1)
    res = gpuswarm("agents", "check", "claude-code", "codex", "--json", env=env)
    assert res.returncode == 2, res
    ready = {r["agent"]: r for r in json.loads(res.stdout)["agents"]}
    assert (
        not ready["claude-code"]["ready"] and "claude auth login" in ready["claude-code"]["report"]
    )
    assert "codex is not installed" in ready["codex"]["report"]

    res = gpuswarm("agents", "show", "gemini", "--effort", "max", env=env)
    assert res.returncode == 2 and "gemini has no effort option" in res.stderr, res


def preflight_block(stderr: str) -> list[str]:
    """stderr from the preflight error on (the lines before it are the run's own)."""
    lines = stderr.splitlines()
    (start,) = [i for i, line in enumerate(lines) if "preflight failed" in line]
    return lines[start:]


def test_a_missing_or_logged_out_agent_cli_is_two_lines(gpuswarm: Cli, tmp_path: Path) -> None:
    """Issue 33: the agent's check fails in two lines (its message, the log's path); the
    twenty-line check script is only in the log."""
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    home.mkdir()
    config = tmp_path / "c.yaml"
    config.write_text(
        "gpus: sim:2\ntasks:\n  - name: t1\n"
        "    agent: {preset: claude-code, prompt: fix the bug}\n    command: 'true'\n"
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home)}  # no claude anywhere
    res = gpuswarm("run", config, "--plain", env=env)
    assert res.returncode == 2, res
    block = preflight_block(res.stderr)
    assert len(block) <= 2, res
    assert (
        "claude is not installed" in block[0]
        and "npm install -g @anthropic-ai/claude-code" in block[0]
    )
    log = Path(block[1].split()[1])
    assert log.is_file() and log.parent.name == "preflight", res
    assert "gs_prog=" in log.read_text() and "gs_prog" not in res.stderr  # the script: log only
    assert "claude is not installed" in log.read_text()

    fake_claude(bin_dir, LOGGED_OUT, 1)  # installed, not logged in: its output, then the message
    res = gpuswarm("resume", log.parent.parent, "--plain", env=env)
    assert res.returncode == 2, res
    block = preflight_block(res.stderr)
    assert len(block) <= 2 and "claude auth login" in block[0], res
    assert "loggedIn" not in res.stderr and "loggedIn" in log.read_text(), res
