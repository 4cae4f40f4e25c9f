"""``{config_dir}`` through the real CLI (issue 33): a config run from another folder finds the
files beside it, and tasks ``add``-ed from a second config get that config's folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliResult, find_runs

pytestmark = pytest.mark.slow
Cli = Callable[..., CliResult]

CONFIG = """\
name: cd
gpus: sim:1
tasks:
  - name: {name}
    command: sh {{config_dir}}/step.sh
    cwd: "{{config_dir}}"
    env: {{HERE: "{{config_dir}}"}}
"""
STEP = 'echo "$HERE $(pwd)" > "$GPUSWARM_TASK_WORKSPACE/where.txt"\n'


def project(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "step.sh").write_text(STEP)
    config = folder / "c.yaml"
    config.write_text(CONFIG.format(name=name))
    return config


def test_config_dir_from_another_folder_and_from_an_added_config(
    gpuswarm: Cli, tmp_path: Path
) -> None:
    first = project(tmp_path / "proj a", "t-a")  # a space: quoted where it lands
    second = project(tmp_path / "proj b", "t-b")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = gpuswarm("run", "--plain", first, cwd=elsewhere)
    assert res.returncode == 0, res
    (run,) = find_runs(first.parent / "runs")
    text = (run / "tasks" / "t-a" / "where.txt").read_text().strip()
    assert text == f"{first.parent} {first.parent}", text  # $HERE, then the task's cwd
    res = gpuswarm("add", run, second, cwd=elsewhere)
    assert res.returncode == 0, res
    res = gpuswarm("resume", "--plain", run, cwd=elsewhere)
    assert res.returncode == 0, res
    text = (run / "tasks" / "t-b" / "where.txt").read_text().strip()
    assert text == f"{second.parent} {second.parent}", text
