"""The command-list options (--timeout, --max-attempts, --gpu-memory, --priority, --shell /
--no-shell) given with a YAML config are exit 2 naming the option and the config's field: they
were silently left unused (a YAML run with --timeout 5m ran without a timeout)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliResult

Cli = Callable[..., CliResult]


@pytest.mark.parametrize(
    ("verb", "option", "field"),
    [
        ("run", ["--timeout", "5m"], "timeout:"),
        ("run", ["--no-shell"], "shell:"),
        ("run", ["--max-attempts", "3"], "max_attempts:"),
        ("add", ["--priority", "3"], "priority:"),
        ("add", ["--gpu-memory", "20G"], "gpu_memory:"),
    ],
)
def test_a_list_option_with_a_yaml_config_is_exit_2_naming_it(
    tmp_path: Path, gpuswarm: Cli, verb: str, option: list[str], field: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f'tasks:\n  - command: ["{sys.executable}", "-c", "pass"]\n')
    target = [config, "--gpus", "sim:1", "--workspace", tmp_path / "ws"]
    if verb == "add":  # a run to add to
        made = gpuswarm("run", *target, "--quiet")
        assert made.returncode == 0, made
        target = [next((tmp_path / "ws" / "c").glob("run_*")), config]
    result = gpuswarm(verb, *target, *option)
    assert result.returncode == 2, result
    assert option[0].lstrip("-").split("-")[-1] in result.stderr  # the option named
    assert "c.yaml is a YAML config" in result.stderr and field in result.stderr
    if verb == "run":
        assert not (tmp_path / "ws").exists()  # nothing half-made
