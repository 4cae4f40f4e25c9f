"""Issue 28 items 1, 8 and 9, through the CLI.

Item 1: a command list ran each line without a shell, so ``echo hello | tr a-z A-Z > out.txt``
ended done having only echoed its words, and ``sleep 2 #1`` failed. Now a command-list line (a
file, stdin, ``gpuswarm add``) runs through ``/bin/sh -c`` like GNU parallel's; ``--no-shell``
keeps the argv split; a YAML ``command:`` string with shell syntax and no ``shell:`` is exit 2.

Item 8: a second glob entry that selected a folder the first had selected was silently ignored
(its settings never applied). Now the same task twice is one task, a folder one entry excludes
is the other's, and other settings are exit 2 naming both entries.

Item 9: ``{config.<field>|default}``: the docs/docker.md example runs on a tree whose configs
lack the field.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_driver import find_runs, run_cli

from gpuswarm.core.models.kinds import State

pytestmark = pytest.mark.slow  # CLI processes: part of CI, not of the fast suite

ROOT = Path(__file__).resolve().parents[2]
QUIET = ("-q", "--no-report")


def _descriptors(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Task id -> its descriptor, from every state folder (each task in exactly one)."""
    out: dict[str, dict[str, Any]] = {}
    for state in State:
        for path in (run_dir / ".parallel" / state.value).glob("*.json"):
            data = json.loads(path.read_text())
            assert data["id"] not in out, data["id"]
            out[data["id"]] = data
    return out


def _states(run_dir: Path) -> dict[str, str]:
    return {k: str(d["state"]) for k, d in _descriptors(run_dir).items()}


# -- item 1: command lists through a shell --------------------------------------------------------
def test_a_command_list_line_runs_through_a_shell(tmp_path: Path) -> None:
    (tmp_path / "cmds.txt").write_text("echo hello | tr a-z A-Z > out.txt\nsleep 0.1 #1\n")
    res = run_cli("run", "--gpus", "sim:2", *QUIET, "--workspace", "ws", "cmds.txt", cwd=tmp_path)
    assert res.returncode == 0, res
    assert (tmp_path / "out.txt").read_text() == "HELLO\n"  # was: never written
    (run_dir,) = find_runs(tmp_path / "ws")
    assert _states(run_dir) == {"cmd-00001": "done", "cmd-00002": "done"}  # was: sleep failed


def test_no_shell_keeps_the_argv_split(tmp_path: Path) -> None:
    (tmp_path / "cmds.txt").write_text("echo a > made.txt\nsleep 0.1 #1\n")
    args = ("run", "--gpus", "sim:1", *QUIET, "--no-shell", "--workspace", "ws", "cmds.txt")
    res = run_cli(*args, cwd=tmp_path)
    assert res.returncode == 1, res  # sleep gets '#1' as an argument
    assert not (tmp_path / "made.txt").exists()
    (run_dir,) = find_runs(tmp_path / "ws")
    assert _states(run_dir) == {"cmd-00001": "done", "cmd-00002": "failed"}
    log = (run_dir / "tasks/cmd-00001/attempt-1/output.log").read_text()
    assert "a > made.txt" in log


def test_values_substituted_into_a_shell_line_stay_one_word(tmp_path: Path) -> None:
    """{workspace} of a run under a folder named like shell code is quoted, not run."""
    (tmp_path / "cmds.txt").write_text("echo hi > {workspace}/f.txt; echo {run_dir} > here.txt\n")
    hostile = "w s $(touch PWNED) `touch PWNED2`"
    res = run_cli(
        "run", "--gpus", "sim:1", *QUIET, "--workspace", hostile, "cmds.txt", cwd=tmp_path
    )
    assert res.returncode == 0, res
    (run_dir,) = find_runs(tmp_path / hostile)
    assert (run_dir / "tasks/cmd-00001/f.txt").read_text() == "hi\n"
    assert (tmp_path / "here.txt").read_text() == f"{run_dir}\n"
    assert not list(tmp_path.rglob("PWNED*"))


def test_add_from_stdin_runs_through_the_shell(tmp_path: Path) -> None:
    (tmp_path / "first.txt").write_text("true\n")
    res = run_cli("run", "--gpus", "sim:1", *QUIET, "--workspace", "ws", "first.txt", cwd=tmp_path)
    assert res.returncode == 0, res
    (run_dir,) = find_runs(tmp_path / "ws")
    piped = "echo hello | tr a-z A-Z > {workspace}/out.txt\n"
    res = run_cli("add", run_dir, "-", cwd=tmp_path, input=piped)
    assert res.returncode == 0, res
    res = run_cli("add", run_dir, "--no-shell", "-", cwd=tmp_path, input="echo a > {workspace}/x\n")
    assert res.returncode == 0, res
    res = run_cli("resume", run_dir, *QUIET, cwd=tmp_path)
    assert res.returncode == 0, res
    assert (run_dir / "tasks/cmd-00001-2/out.txt").read_text() == "HELLO\n"
    assert not (run_dir / "tasks/cmd-00001-3/x").exists()
    assert set(_states(run_dir).values()) == {"done"}


@pytest.mark.parametrize(
    ("command", "construct"),
    [
        ("echo hello | tr a-z A-Z > out.txt", "a pipe |"),
        ("sleep 2 #1", "a comment #"),
        ("make && ./run", "the operator &&"),
        ("echo $(date) > now.txt", "the expansion $(...)"),
    ],
)
def test_a_yaml_string_with_shell_syntax_needs_shell_true(
    tmp_path: Path, command: str, construct: str
) -> None:
    cfg = tmp_path / "x.yaml"
    body = {"tasks": [{"command": "true"}, {"name": "piped", "command": command}]}
    cfg.write_text("name: x\nworkspace: ws\n" + yaml.safe_dump(body, sort_keys=False))
    line = next(n for n, t in enumerate(cfg.read_text().splitlines(), 1) if "piped" in t) + 1
    res = run_cli("run", "--gpus", "sim:1", *QUIET, cfg, cwd=tmp_path)
    assert res.returncode == 2, res
    assert f"x.yaml:{line}: tasks[1].command: " in res.stderr, res.stderr
    assert construct in res.stderr and "shell: true" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "ws").exists() and not (tmp_path / "out.txt").exists()
    ok = body["tasks"][1] | {"shell": True, "command": "echo 'a|b' | tr a A > out.txt"}
    cfg.write_text("workspace: ws\n" + yaml.safe_dump({"tasks": [ok]}, sort_keys=False))
    res = run_cli("run", "--gpus", "sim:1", *QUIET, cfg, cwd=tmp_path)
    assert res.returncode == 0, res
    assert (tmp_path / "out.txt").read_text() == "A|b\n"


# -- item 8: overlapping glob entries -------------------------------------------------------------
def _tree(tmp_path: Path, folders: dict[str, str]) -> None:
    for rel, text in folders.items():
        folder = tmp_path / "tasks" / rel
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(text)


def test_a_second_glob_entry_with_other_settings_is_exit_2_naming_both(tmp_path: Path) -> None:
    _tree(tmp_path, {"a/GELU": "k: 1\n", "a/softmax": "k: 2\n"})
    cfg = tmp_path / "g.yaml"
    cfg.write_text(
        "workspace: ws\ntasks_root: tasks\ntasks:\n"
        "  - glob: 'tasks/**/config.yaml'\n"  # line 4
        "    command: 'true'\n"
        "  - glob: tasks/a/GELU/config.yaml\n"  # line 6: its timeout was never applied
        "    command: 'true'\n"
        "    timeout: 5s\n"
    )
    res = run_cli("run", "--gpus", "sim:1", *QUIET, cfg, cwd=tmp_path)
    assert res.returncode == 2, res
    assert (
        "g.yaml:6: tasks[1]: the task folder a/GELU is selected already by tasks[0] (line 4)"
        in (res.stderr)
    ), res.stderr
    assert "(timeout)" in res.stderr and "exclude:" in res.stderr, res.stderr
    assert not (tmp_path / "ws").exists()


def test_a_folder_one_glob_entry_excludes_is_the_others(tmp_path: Path) -> None:
    _tree(tmp_path, {"a/GELU": "k: 1\n", "a/softmax": "k: 2\n"})
    cfg = tmp_path / "g.yaml"
    cfg.write_text(
        "workspace: ws\ntasks_root: tasks\ntasks:\n"
        "  - {glob: 'tasks/**/config.yaml', exclude: [tasks/a/GELU], command: 'true'}\n"
        "  - {glob: tasks/a/GELU/config.yaml, command: 'true', timeout: 5s}\n"
        "  - {glob: 'tasks/a/*/config.yaml', exclude: [tasks/a/GELU], command: 'true'}\n"
    )
    res = run_cli("run", "--gpus", "sim:1", *QUIET, cfg, cwd=tmp_path)
    assert res.returncode == 0, res
    (run_dir,) = find_runs(tmp_path / "ws")
    tasks = _descriptors(run_dir)
    assert {k: (d["state"], d["task"]["timeout"]) for k, d in tasks.items()} == {
        "a-GELU": ("done", 5.0),  # the second entry's task, not the first's skipped one
        "a-softmax": ("done", None),  # the same task from entries 1 and 3: one task
    }


# -- item 9: {config.field|default} and the docs example ------------------------------------------
def _docs_example() -> str:
    text = (ROOT / "docs" / "docker.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "kernels.yaml" in b]
    return str(block)


def test_the_docker_docs_example_runs_on_a_tree_whose_configs_lack_the_field(
    tmp_path: Path,
) -> None:
    """The docs example, its host paths pointed into tmp_path and run with --backend local; a
    stand-in `claude` writes the result. 2 of 3 kernels' configs have no performance_timeout
    (as 422 of AgentKernelArena's 426): they get the fallback, 1h."""
    _tree(
        tmp_path,
        {
            "hip2hip/gpumode/GELU": "task_type: hip2hip\nperformance_timeout: 90s\n",
            "hip2hip/gpumode/softmax": "task_type: hip2hip\n",
            "hip2hip/ops/add": "task_type: hip2hip\ncompile_timeout: 60\n",
            "hip2hip/legacy/old": "task_type: hip2hip\n",  # excluded
        },
    )
    agents = tmp_path / "agents"
    (agents / "bin").mkdir(parents=True)
    claude = agents / "bin" / "claude"
    claude.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && exit 0\n'
        'ws="${2##* to }"; echo "pass_correctness: true" > "$ws/task_result.yaml"\n'
        'echo "speedup: 1.5"\n'
    )
    claude.chmod(0o755)
    (tmp_path / "data").mkdir()
    (tmp_path / "claude.json").write_text("{}\n")
    (tmp_path / "claude").mkdir()
    config: dict[str, Any] = yaml.safe_load(_docs_example())
    assert config["defaults"]["timeout"] == "{config.performance_timeout|1h}"
    config["docker"]["mounts"] = [
        {"src": str(agents), "dest": "/opt/agents", "read_only": True},
        {"src": str(tmp_path / "data"), "dest": "/data/kernels", "read_only": True},
    ]
    config["home"]["provision"] = [
        {"src": str(tmp_path / "claude.json"), "dest": ".claude.json"},
        {"src": str(tmp_path / "claude"), "dest": ".claude"},
    ]
    config["defaults"]["env"]["PATH"] = config["defaults"]["env"]["PATH"].replace(
        "/opt/agents", str(agents)
    )
    config["preflight"] = [c for c in config["preflight"] if "torch" not in c]  # no GPU here
    del config["after_all"]  # tools/aggregate.py is the user's
    cfg = tmp_path / "kernels.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    path = f"{agents / 'bin'}:{os.environ['PATH']}"  # the preflight's: the image's PATH
    args = ("run", "--gpus", "sim:2", "--backend", "local", *QUIET, cfg)
    res = run_cli(*args, cwd=tmp_path, env={"PATH": path})
    assert res.returncode == 0, res
    (run_dir,) = find_runs(tmp_path / "runs")
    tasks = _descriptors(run_dir)
    assert {k: (d["state"], d["task"]["timeout"]) for k, d in tasks.items()} == {
        "hip2hip-gpumode-GELU": ("done", 90.0),
        "hip2hip-gpumode-softmax": ("done", 3600.0),  # was: exit 2, "has no field"
        "hip2hip-ops-add": ("done", 3600.0),
        "hip2hip-legacy-old": ("skipped", 3600.0),
    }
    assert "\t1.5" in (run_dir / "results.tsv").read_text()


def test_a_fallback_and_a_list_field_in_a_command(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {"a": "files: [x.py, 'y z.py']\nlevel: 3\n", "b": "level: 1\n", "c": "files: []\n"},
    )
    cfg = tmp_path / "f.yaml"
    cfg.write_text(
        "workspace: ws\ntasks_root: tasks\ntasks:\n"
        "  - glob: 'tasks/*/config.yaml'\n"
        "    shell: true\n"
        "    command: printf '%s|' {config.files|none} {config.level|0} > {workspace}/out\n"
    )
    res = run_cli("run", "--gpus", "sim:1", *QUIET, cfg, cwd=tmp_path)
    assert res.returncode == 0, res
    (run_dir,) = find_runs(tmp_path / "ws")
    outs = {t: (run_dir / "tasks" / t / "out").read_text() for t in ("a", "b", "c")}
    # a list is its items joined with spaces, one quoted word in a shell command
    assert outs == {"a": "x.py y z.py|3|", "b": "none|1|", "c": "|0|"}
