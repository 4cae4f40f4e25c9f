"""Issue 30: configs wrong in thousands of places, characters YAML refuses, and sizes no run can
carry (names, commands, workspaces): each a ConfigError (exit 2) naming the file, the line and
the limit; never a traceback, never work that grows with the square of the problems."""

from __future__ import annotations

import difflib
import gc
from pathlib import Path
from typing import Any

import pytest
from cli_driver import run_cli

from gpuswarm.app.adding import load_source
from gpuswarm.config import errors as config_errors
from gpuswarm.config import load as load_module
from gpuswarm.config import yamlload
from gpuswarm.config.load import load_command_list, load_config
from gpuswarm.config.models import TaskOptions
from gpuswarm.config.values import MAX_ARG_BYTES, MAX_NAME_BYTES
from gpuswarm.core.errors import ConfigError
from gpuswarm.research.experiment import check_command


def _error(tmp_path: Path, text: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


@pytest.fixture
def difflib_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every difflib.get_close_matches the message building makes (the word looked up)."""
    calls: list[str] = []
    real = difflib.get_close_matches

    def counted(word: str, *args: Any, **kwargs: Any) -> list[str]:
        calls.append(word)
        return real(word, *args, **kwargs)

    monkeypatch.setattr(difflib, "get_close_matches", counted)
    return calls


# -- many problems: the first ones, in line order, then a count ----------------------------------
def test_thousands_of_unknown_keys_need_a_few_lookups(
    tmp_path: Path, difflib_calls: list[str]
) -> None:
    keys = "".join(f"bogus_key_{i}: 1\n" for i in range(2000))
    lines = _error(tmp_path, "tasks: [{command: 'true'}]\n" + keys).splitlines()
    assert lines[0] == (
        f"{tmp_path / 'c.yaml'}:2: unknown key 'bogus_key_0' in the top level; allowed keys: "
        "after_all, backend, budget, defaults, docker, gpus, gpus_per_task, grace, groups, halt, "
        "home, name, notify, preflight, pricing, ray, reliability, slurm, tasks, tasks_per_gpu, "
        "tasks_root, workspace"
    )
    assert [line.split(":")[1] for line in lines[:10]] == [str(n) for n in range(2, 12)]
    assert lines[10:] == ["... and 1990 more problems"]
    assert len(difflib_calls) <= config_errors.MAX_REPORTED + 1  # was 2 per unknown key


def test_many_tasks_with_many_unknown_keys(tmp_path: Path, difflib_calls: list[str]) -> None:
    entry = "  - command: 'true'\n" + "".join(f"    xk{j}: 1\n" for j in range(20))
    lines = _error(tmp_path, "tasks:\n" + entry * 100).splitlines()
    assert lines[0].startswith(
        f"{tmp_path / 'c.yaml'}:3: unknown key 'xk0' in tasks[0]; allowed keys: accelerator, "
    )
    assert lines[9].startswith(f"{tmp_path / 'c.yaml'}:12: unknown key 'xk9' in tasks[0]")
    assert lines[-1] == "... and 1990 more problems"
    assert len(difflib_calls) <= config_errors.MAX_REPORTED + 1


def test_the_garbage_collector_is_paused_while_loading_and_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    real = config_errors.config_error

    def spy(*args: Any, **kwargs: Any) -> ConfigError:
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(load_module, "config_error", spy)
    assert gc.isenabled()
    _error(tmp_path, "tasks: [{command: 'true'}]\nbogus: 1\n")
    assert seen == [False]  # collections scanned every live node again: 40% of the time
    assert gc.isenabled()
    gc.disable()
    try:
        _error(tmp_path, "tasks: [{command: 'true'}]\nbogus: 1\n")
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_thousands_of_bad_timeouts(tmp_path: Path) -> None:
    text = "tasks:\n" + "".join(f"  - {{command: 'true', timeout: bad{i}}}\n" for i in range(3000))
    lines = _error(tmp_path, text).splitlines()
    assert lines[0] == (
        f"{tmp_path / 'c.yaml'}:2: tasks[0].timeout: 'bad0' is not a duration; write seconds "
        "(600) or 90s, 10m, 2h, 1h30m; or null for no timeout"
    )
    assert lines[9].startswith(f"{tmp_path / 'c.yaml'}:11: tasks[9].timeout: 'bad9'")
    assert lines[10] == "... and 2990 more problems"


def test_a_typo_of_a_missing_key_is_said_once(tmp_path: Path) -> None:
    many = "".join(f"    junk{j}: 1\n" for j in range(5))
    message = _error(tmp_path, "tasks:\n  - comand: x\n" + many + "  - {command: y, timout: 5}\n")
    lines = message.splitlines()
    assert lines[0].endswith(":2: unknown key 'comand' in tasks[0]; did you mean 'command'?")
    assert not any("missing required key 'command'" in line for line in lines)
    assert any("unknown key 'timout' in tasks[1]; did you mean 'timeout'?" in x for x in lines)


# -- characters YAML refuses -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("tasks: [{command: 'true'}]\nname: a\x01b\n", ":2: invalid YAML: the control character "
         "\\x01 (column 8)"),
        ("tasks:\n  - command: 'true \x1b[2J'\n", ":2: invalid YAML: the control character "
         "\\x1b (column 20)"),
        ("tasks: [{command: 'é \x7f'}]\n", ":1: invalid YAML: the control character \\x7f "
         "(column 22)"),
    ],
    ids=["SOH", "ESC", "DEL"],
)  # fmt: skip
def test_a_control_byte_is_a_located_message(tmp_path: Path, text: str, where: str) -> None:
    message = _error(tmp_path, text)
    assert message.startswith(str(tmp_path / "c.yaml") + where), message
    assert "write it as an escape in double quotes" in message


def test_a_control_byte_in_a_matched_config_yaml(tmp_path: Path) -> None:
    (tmp_path / "tasks" / "a").mkdir(parents=True)
    (tmp_path / "tasks" / "a" / "config.yaml").write_text("x: 1\ny: \x02\n")
    text = "tasks: [{glob: tasks/*/config.yaml, command: 'echo {config.x}'}]\n"
    message = _error(tmp_path, text)
    assert "config.yaml:2: invalid YAML: the control character \\x02 (column 4)" in message


def test_libyaml_and_pyyaml_give_the_same_data_and_lines() -> None:
    text = (
        "defaults: &d {timeout: 1h, env: {A: '1'}}\n"
        "name: x\n"
        "tasks:\n"
        "  - <<: *d\n"
        "    command: [echo, 'a b', \"c\\td\"]\n"
        "  - {command: true, priority: -3, shell: yes, cwd: ~}\n"
        "  - matrix: {lr: [0.1, 1e-3, .inf], seed: [1, 0x10]}\n"
        "    command: 'run {lr}'\n"
        "empty:\n"
        "when: 2024-01-02\n"
    )
    fast = yamlload.load_yaml(text, "c.yaml")
    loader = yamlload.LineLoader(text, "c.yaml")
    try:
        pure = (loader.load_with_lines(), loader.lines)
    finally:
        loader.dispose()
    assert fast == pure
    assert fast[1][("tasks", 2, "matrix")] == 7


# -- sizes: names, commands, workspaces -----------------------------------------------------------
def test_a_task_name_is_bounded(tmp_path: Path) -> None:
    ok = "n" * MAX_NAME_BYTES
    loaded = load_config_text(tmp_path, f"tasks: [{{command: 'true', name: {ok}}}]\n")
    assert loaded.tasks[0].name == ok
    message = _error(tmp_path, f"tasks:\n  - command: 'true'\n    name: {ok}é\n")
    assert message == (
        f"{tmp_path / 'c.yaml'}:3: tasks[0].name: the name is 514 bytes long; a task name can be "
        f"at most {MAX_NAME_BYTES} bytes (it is written in every event, result row and report): "
        "shorten it"
    )


def test_a_name_made_from_values_is_bounded(tmp_path: Path) -> None:
    value = "v" * 10_000_000
    text = f"tasks:\n  - command: 'echo {{v}}'\n    matrix: {{v: [short, {value}]}}\n"
    message = _error(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'c.yaml'}:2: tasks[0]: the name of tasks[0] (v=vvv")
    assert f"bytes long; a task name can be at most {MAX_NAME_BYTES} bytes" in message
    assert len(message) < 1000


def test_a_command_is_bounded(tmp_path: Path) -> None:
    long = "c" * MAX_ARG_BYTES
    message = _error(tmp_path, f"tasks:\n  - command: 'echo {long}'\n")
    assert message.startswith(f"{tmp_path / 'c.yaml'}:2: tasks[0].command: the command is ")
    assert f"can be at most {MAX_ARG_BYTES:,} bytes (Linux's limit on one argument" in message
    argv = ", ".join(["a" * 100_000] * 11)
    message = _error(tmp_path, f"tasks:\n  - command: [echo, {argv}]\n")
    assert "an argv list can be at most 1,048,576 bytes" in message
    message = _error(tmp_path, f"tasks:\n  - command: [echo, '{long}x']\n")
    assert "argument 1 of the command is 131,072 bytes long" in message


def test_a_command_list_line_is_bounded(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^<stdin>:2: the command is 200,005 bytes long; one "):
        load_command_list(None, "true\necho " + "x" * 200_000 + "\n", base_dir=tmp_path)


@pytest.mark.parametrize(
    ("workspace", "expected"),
    [
        ("w" * 256, "is 256 bytes long; a file system allows at most 255 bytes for one name"),
        (("w" * 200 + "/") * 20, "a workspace can be at most 3,072 bytes"),
    ],
    ids=["folder-name", "whole-path"],
)
def test_a_workspace_the_file_system_cannot_hold(
    tmp_path: Path, workspace: str, expected: str
) -> None:
    message = _error(tmp_path, f"workspace: {workspace}\ntasks: [{{command: 'true'}}]\n")
    assert message.startswith(f"{tmp_path / 'c.yaml'}:1: workspace: ")
    assert expected in message
    loaded = load_config_text(tmp_path, "tasks: [{command: 'true'}]\n")
    with pytest.raises(ConfigError, match=r"^--workspace: .*" + expected[-20:]):
        loaded.with_overrides(workspace=Path(workspace))


def load_config_text(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "ok.yaml"
    path.write_text(text)
    return load_config(path)


# -- through the CLI: exit 2, one located line, nothing written -----------------------------------
@pytest.mark.slow  # runs the CLI
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tasks: [{command: 'true'}]\nname: a\x01b\n", "c.yaml:2: invalid YAML: the control"),
        (f"workspace: {'w' * 300}\ntasks: [{{command: 'true'}}]\n", "c.yaml:1: workspace: "),
        (f"tasks: [{{command: 'true', name: {'n' * 100_000}}}]\n", "c.yaml:1: tasks[0].name: "),
    ],
    ids=["control-byte", "long-workspace", "long-name"],
)
def test_the_cli_exits_2_with_a_located_message(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "c.yaml").write_text(text)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_cli("run", "c.yaml", "--gpus", "sim:1", "-q", cwd=tmp_path)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr and expected in result.stderr, result
    assert len(result.stderr) < 1000, result
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"tasks: [{{command: 'true', glob: '{'q' * 300}'}}]\n", ":1: tasks[0].glob: "),
        (
            f"home: {{isolate: true, provision: [{{src: {'q' * 300}, dest: a}}]}}\n"
            "tasks: [{command: 'true'}]\n",
            ":1: home.provision[0].src: ",
        ),
    ],
    ids=["glob", "provision"],
)
def test_a_path_name_too_long_to_exist_is_a_message(
    tmp_path: Path, text: str, expected: str
) -> None:
    message = _error(tmp_path, text)  # was OSError ENAMETOOLONG (a traceback)
    assert message.startswith(str(tmp_path / "c.yaml") + expected), message


def test_gpuswarm_add_reads_through_the_same_limits(tmp_path: Path) -> None:
    (tmp_path / "more.txt").write_text("true\necho " + "x" * 140_000 + "\n")
    with pytest.raises(ConfigError, match=r"more\.txt:2: the command is 140,005 bytes long"):
        load_source(str(tmp_path / "more.txt"), shell=False, defaults=TaskOptions())
    (tmp_path / "more.yaml").write_text(f"tasks: [{{command: 'true', name: {'n' * 600}}}]\n")
    with pytest.raises(ConfigError, match=r"more\.yaml:1: tasks\[0\]\.name: the name is 600 bytes"):
        load_source(str(tmp_path / "more.yaml"), shell=False, defaults=TaskOptions())


def test_a_research_command_is_bounded_too() -> None:
    with pytest.raises(ValueError, match=r"^--command: the command is 200,005 bytes long; one "):
        check_command("echo " + "x" * 200_000, shell=False)
    assert check_command("uv run train.py", shell=False) == "uv run train.py"
