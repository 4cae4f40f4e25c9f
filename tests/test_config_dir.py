"""``{config_dir}``: the folder of the file the tasks come from, absolute (issue 33)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuswarm.config.load import load_command_list, load_config
from gpuswarm.config.render import render_command, render_cwd, render_env
from gpuswarm.core.errors import ConfigError

CONFIG = """\
tasks:
  - name: uses
    command: 'python {config_dir}/train.py --out "{config_dir}/out"'
    shell: true
    cwd: "{config_dir}/work"
    env: {DATA: "{config_dir}/data"}
  - name: argv
    command: [python, "{config_dir}/train.py"]
  - name: plain
    command: "true"
"""


def test_a_config_task_gets_its_config_folder_everywhere(tmp_path: Path) -> None:
    folder = tmp_path / "my project"  # a space: the shell command quotes it
    folder.mkdir()
    (folder / "c.yaml").write_text(CONFIG)
    loaded = load_config(folder / ".." / "my project" / "c.yaml")
    tasks = {t.name: t for t in loaded.tasks}
    where = str(folder.resolve())
    uses = tasks["uses"]
    assert uses.vars["config_dir"] == where
    argv = render_command(uses, {})
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[2] == f"python '{where}'/train.py --out \"{where}/out\""
    assert render_cwd(uses, {}, loaded.base_dir) == folder.resolve() / "work"
    assert render_env(uses, {}) == {"DATA": f"{where}/data"}
    assert render_command(tasks["argv"], {}) == ["python", f"{where}/train.py"]
    assert "config_dir" not in tasks["plain"].vars  # a task that does not use it: unchanged


def test_a_command_list_gets_its_file_folder_and_stdin_the_current_one(tmp_path: Path) -> None:
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "jobs.txt").write_text("true\necho {config_dir}\n")
    here = tmp_path / "elsewhere"
    loaded = load_command_list(lists / "jobs.txt", base_dir=here)
    assert [render_command(t, {})[2] for t in loaded.tasks] == ["true", f"echo {lists.resolve()}"]
    piped = load_command_list(None, "echo {config_dir}\n", base_dir=here)
    assert render_command(piped.tasks[0], {})[2] == f"echo {here.resolve()}"
    bare = load_command_list(None, "true\n", base_dir=here)
    assert "config_dir" not in bare.tasks[0].vars


def test_config_dir_is_a_known_placeholder_and_not_a_matrix_key(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("tasks:\n  - command: echo {nope}\n")
    with pytest.raises(ConfigError, match=r"known placeholders: .*\{config_dir\}"):
        load_config(config)
    config.write_text("tasks:\n  - command: echo {config_dir}\n    matrix: {config_dir: [a]}\n")
    with pytest.raises(ConfigError, match="clashes with a placeholder gpuswarm supplies"):
        load_config(config)
