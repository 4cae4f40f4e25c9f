"""Config loading: the schema, task expansion, placeholders, and every bad-input message."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuswarm.config.load import (
    LoadedConfig,
    config_fingerprint,
    expand_tasks,
    load_command_list,
    load_config,
    spec_hash,
)
from gpuswarm.config.models import RunConfig, TaskOptions, TaskSpec
from gpuswarm.config.render import render_command, render_cwd, render_env
from gpuswarm.config.tasks import task_id_for
from gpuswarm.config.values import parse_duration
from gpuswarm.config.yamlload import load_yaml
from gpuswarm.core.errors import ConfigError
from gpuswarm.core.paths import check_task_id
from gpuswarm.core.placeholders import (
    PLACEHOLDERS_AT_LAUNCH,
    escape_braces,
    find_placeholders,
    render,
)

DATA = Path(__file__).parent / "data" / "config"


def write(tmp_path: Path, text: str, name: str = "kernels.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str, name: str = "kernels.yaml") -> LoadedConfig:
    return load_config(write(tmp_path, text, name))


def error(tmp_path: Path, text: str, name: str = "kernels.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, name)
    return str(info.value)


def by_id(loaded: LoadedConfig) -> dict[str, TaskSpec]:
    return {task.id: task for task in loaded.tasks}


@pytest.fixture
def kernel_tree(tmp_path: Path) -> Path:
    for name in ("softmax", "gemm"):
        folder = tmp_path / "tasks" / "hip2hip" / "gpumode" / name
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(f"kernel: {name}\n")
    return tmp_path


# -- the documented schema -------------------------------------------------------------------------
def test_full_example() -> None:
    loaded = load_config(DATA / "kernels.yaml")
    config, tasks = loaded.config, by_id(loaded)
    assert loaded.name == "kernels"
    assert loaded.base_dir == DATA.resolve()
    assert loaded.workspace == DATA.resolve() / "runs"
    assert (config.gpus, config.gpus_per_task, config.tasks_per_gpu, config.grace) == (
        "auto",
        2,
        1,
        30.0,
    )
    assert config.home.isolate and config.home.provision[0].dest == ".codex/auth.json"
    assert list(tasks) == [
        "baseline",
        "shelly",
        "argv",
        "gpumode-gemm",
        "gpumode-softmax",
        "lr0.1-s1",
        "lr0.1-s2",
        "lr0.01-s1",
        "lr0.01-s2",
    ]

    base = tasks["baseline"]
    assert base.command == ["python", "train.py", "--lr", "0.1"] and not base.shell
    assert base.env == {"OMP_NUM_THREADS": "4", "MODE": "slow"}  # merged, the task wins
    assert (base.timeout, base.max_attempts, base.priority, base.grace) == (7200.0, 2, 5, 30.0)
    assert base.done_when == "task_result.yaml" and base.cwd is None

    shelly = tasks["shelly"]
    assert shelly.shell and shelly.command == "python a.py | tee out.txt"
    assert shelly.timeout is None  # an explicit null beats the default 2h

    argv = tasks["argv"]
    assert argv.command == ["python", "train.py", "--lr", "0.2"]
    assert argv.cwd == str(DATA.resolve() / "sub") and argv.gpus == 2

    softmax = tasks["gpumode-softmax"]
    assert softmax.name == "gpumode/softmax"
    folder = DATA.resolve() / "tasks" / "hip2hip" / "gpumode" / "softmax"
    assert softmax.vars == {
        "task_file": str(folder / "config.yaml"),
        "task_dir": str(folder),
        "task_rel": "gpumode/softmax",
    }
    assert softmax.command == ["agent", "--task", "{task_dir}", "--out", "{workspace}"]
    assert softmax.cwd == "{workspace}" and softmax.metrics == {"speedup": "speedup=([0-9.]+)"}

    cell = tasks["lr0.01-s2"]
    assert cell.vars == {"lr": "0.01", "seed": "2"} and cell.grace == 5.0
    assert render_command(cell, {}) == ["python", "train.py", "--lr", "0.01", "--seed", "2"]


def test_defaults_and_minimal_config(tmp_path: Path) -> None:
    loaded = load(tmp_path, "tasks:\n  - command: python train.py\n", name="my exp.yaml")
    task = loaded.tasks[0]
    assert loaded.name == "my-exp"  # the stem, made a safe folder name
    assert loaded.workspace == tmp_path.resolve() / "runs"
    assert loaded.path == tmp_path / "my exp.yaml"
    assert (task.id, task.name) == ("python-train.py", "python train.py")
    assert (task.timeout, task.max_attempts, task.grace, task.priority, task.gpus) == (
        None,
        1,
        10.0,
        0,
        None,
    )
    assert loaded.config.gpus is None and not loaded.config.home.isolate


def test_absolute_and_home_workspace(tmp_path: Path) -> None:
    loaded = load(tmp_path, f"workspace: {tmp_path / 'w'}\ntasks: [{{command: a}}]\n")
    assert loaded.workspace == tmp_path / "w"
    loaded = load(tmp_path, "workspace: ~/runs\ntasks: [{command: a}]\n")
    assert loaded.workspace == Path("~/runs").expanduser()


@pytest.mark.parametrize(
    ("value", "expected"),
    [("auto", "auto"), ("sim:4", "sim:4"), ("0,1,2", "0,1,2"), ("3", "3"), ("[0, 2]", "0,2")],
)
def test_gpus_stays_a_plain_string(tmp_path: Path, value: str, expected: str) -> None:
    assert load(tmp_path, f"gpus: {value}\ntasks: [{{command: a}}]\n").config.gpus == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (600, 600.0),
        (2.5, 2.5),
        ("600", 600.0),
        ("90s", 90.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("1d", 86400.0),
        ("1h 2m 3s", 3723.0),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["10 minutes", "", "h", "30m1h", "1h1h", -1, 0, "0s", True, None, [1], "inf", "nan"]
)
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError, match="duration; write seconds"):
        parse_duration(text)


def test_task_fields_in_defaults_are_overridden(tmp_path: Path) -> None:
    text = """
defaults:
  timeout: 1h
  max_attempts: 3
  priority: -2
  shell: true
  env: {A: "1", B: 2.5}
  grace: 1m
tasks:
  - command: echo a
    name: one
  - command: [echo, b]
    name: two
    shell: false
    max_attempts: 1
    priority: 4999
    env: {B: x, C: "{task_id}"}
"""
    tasks = by_id(load(tmp_path, text))
    assert tasks["one"].shell and tasks["one"].command == "echo a"
    assert (tasks["one"].timeout, tasks["one"].max_attempts, tasks["one"].grace) == (3600, 3, 60)
    assert tasks["one"].env == {"A": "1", "B": "2.5"}
    two = tasks["two"]
    assert (two.shell, two.max_attempts, two.priority, two.timeout) == (False, 1, 4999, 3600)
    assert two.env == {"A": "1", "B": "x", "C": "{task_id}"}
    assert render_env(two, {"task_id": "two"})["C"] == "two"


def test_cwd_forms(tmp_path: Path) -> None:
    text = f"""
tasks:
  - {{name: rel, command: a, cwd: sub/dir}}
  - {{name: abs, command: a, cwd: {tmp_path / "x"}}}
  - {{name: tmpl, command: a, cwd: "{{workspace}}/out"}}
  - {{name: none, command: a}}
"""
    loaded = load(tmp_path, text)
    tasks = by_id(loaded)
    assert tasks["rel"].cwd == str(tmp_path.resolve() / "sub" / "dir")
    assert tasks["abs"].cwd == str(tmp_path / "x")
    assert tasks["tmpl"].cwd == "{workspace}/out"
    assert render_cwd(tasks["tmpl"], {"workspace": "/w"}, loaded.base_dir) == Path("/w/out")
    assert render_cwd(tasks["none"], {}, loaded.base_dir) == loaded.base_dir


def test_taskspec_survives_a_json_round_trip() -> None:
    for task in load_config(DATA / "kernels.yaml").tasks:
        assert TaskSpec.model_validate_json(task.model_dump_json()) == task


def test_expand_tasks_is_public(tmp_path: Path) -> None:
    config = RunConfig.model_validate({"tasks": [{"command": "a b", "name": "x"}]})
    [task] = expand_tasks(config, tmp_path, "inline")
    assert task.id == "x" and task.command == ["a", "b"]
    bad = RunConfig.model_validate({"tasks": [{"command": "echo {nope}"}]})
    with pytest.raises(ConfigError, match=r"^inline: tasks\[0\]\.command: unknown placeholder"):
        expand_tasks(bad, tmp_path, "inline")


def test_with_overrides(tmp_path: Path) -> None:
    loaded = load(tmp_path, "tasks: [{command: a}]\n")
    other = loaded.with_overrides(name="other", workspace=Path("elsewhere"))
    assert other.name == "other" and other.workspace == Path.cwd() / "elsewhere"
    assert loaded.with_overrides() == loaded
    with pytest.raises(ConfigError, match=r"--name: 'a b' cannot be a folder name.*'a-b'"):
        loaded.with_overrides(name="a b")
    with pytest.raises(
        ConfigError, match=r"--name: 'n+\.\.\.n+' is 300 characters; a run name is 128"
    ):
        loaded.with_overrides(name="n" * 300)  # was: "cannot be a folder name ... e.g. 'nnn...'"


# -- commands: shlex vs shell ----------------------------------------------------------------------
def test_shlex_split_keeps_quoted_args_and_does_not_run_a_shell(tmp_path: Path) -> None:
    text = """
tasks:
  - {name: q, command: "python x.py --msg 'hello world' | tee ${HOME}/o", shell: false}
  - {name: s, command: "python x.py --msg 'hello world' | tee ${HOME}/o", shell: true}
"""
    tasks = by_id(load(tmp_path, text))
    assert tasks["q"].command == ["python", "x.py", "--msg", "hello world", "|", "tee", "${HOME}/o"]
    assert render_command(tasks["s"], {}) == [
        "/bin/sh",
        "-c",
        "python x.py --msg 'hello world' | tee ${HOME}/o",
    ]


def test_render_command_keeps_values_with_spaces_one_argument(tmp_path: Path) -> None:
    loaded = load(tmp_path, "tasks: [{name: a, command: 'run --out {workspace} {{x}}'}]\n")
    argv = render_command(loaded.tasks[0], {"workspace": "/runs/my run"})
    assert argv == ["run", "--out", "/runs/my run", "{x}"]


def test_launch_values_win_over_vars() -> None:
    task = TaskSpec(id="t", name="t", command=["echo", "{lr}"], vars={"lr": "1"})
    assert render_command(task, {"lr": "2"}) == ["echo", "2"]
    as_string = TaskSpec(id="t", name="t", command="echo '{lr} x'", vars={"lr": "1"})
    assert render_command(as_string, {}) == ["echo", "1 x"]


# -- placeholders ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{a}-{b}", "1-{b}"),
        ("{{a}}", "{a}"),
        ("{{{a}}}", "{1}"),
        ("${HOME}/{a}", "${HOME}/1"),
        ("${a}", "${a}"),
        ("awk '{ print $1 }' {a,b} \\d{2}", "awk '{ print $1 }' {a,b} \\d{2}"),
        ('{"k": {a}}', '{"k": 1}'),
        ("}}{{", "}{"),
    ],
)
def test_render(template: str, expected: str) -> None:
    assert render(template, {"a": "1"}) == expected


def test_find_placeholders_skips_escapes_and_shell_vars() -> None:
    assert find_placeholders("{a} {{b}} ${c} {d} {a} {1x}") == ["a", "d"]


def test_launch_placeholders_are_accepted(tmp_path: Path) -> None:
    names = " ".join("{" + name + "}" for name in PLACEHOLDERS_AT_LAUNCH)
    loaded = load(tmp_path, f"tasks: [{{name: a, command: 'echo {names}'}}]\n")
    values = {name: name.upper() for name in PLACEHOLDERS_AT_LAUNCH}
    assert render_command(loaded.tasks[0], values)[1:] == [
        n.upper() for n in PLACEHOLDERS_AT_LAUNCH
    ]


@given(st.text().filter(lambda t: "{" not in t and "}" not in t))
def test_render_without_braces_is_identity(text: str) -> None:
    assert render(text, {"a": "1", "x": "y"}) == text


@given(st.text().filter(lambda t: "$" not in t))
def test_escaped_text_renders_to_itself(text: str) -> None:
    assert render(escape_braces(text), {"a": "1"}) == text


@given(st.text(max_size=300))
def test_task_ids_are_always_safe(name: str) -> None:
    task_id = task_id_for(name)
    assert check_task_id(task_id) == task_id
    assert "/" not in task_id and task_id not in (".", "..")


# -- matrix and glob -------------------------------------------------------------------------------
def test_matrix_default_names(tmp_path: Path) -> None:
    text = """
tasks:
  - {command: a, name: first}
  - matrix: {lr: [0.1, 0.01], seed: [1, 2], fast: [true]}
    command: python train.py --lr {lr} --seed {seed}
  - matrix: {opt: [adam]}
    name: sweep
    command: python train.py --opt {opt}
"""
    tasks = load(tmp_path, text).tasks
    assert [t.name for t in tasks[1:3]] == [
        "matrix1-lr=0.1-seed=1-fast=true",
        "matrix1-lr=0.1-seed=2-fast=true",
    ]
    assert tasks[1].id == "matrix1-lr-0.1-seed-1-fast-true"
    assert tasks[1].vars == {"lr": "0.1", "seed": "1", "fast": "true"}
    assert (tasks[-1].name, tasks[-1].id) == ("sweep-opt=adam", "sweep-opt-adam")


def test_glob_names_and_vars(kernel_tree: Path) -> None:
    (kernel_tree / "tasks" / "top.yaml").write_text("x: 1\n")
    text = """
tasks:
  - glob: tasks/hip2hip/**/config.yaml
  - glob: tasks/hip2hip/gpumode/*
    name: dir
    command: agent {task_dir}
  - glob: tasks/*.yaml
    name: "t-{task_rel}"
    command: agent {task_file}
"""
    text = text.replace("config.yaml\n", "config.yaml\n    command: agent {task_dir}\n", 1)
    tasks = load(kernel_tree, text).tasks
    assert [t.id for t in tasks] == [  # relative to the config's folder, whatever the glob
        "tasks-hip2hip-gpumode-gemm",
        "tasks-hip2hip-gpumode-softmax",
        "dir-tasks-hip2hip-gpumode-gemm",
        "dir-tasks-hip2hip-gpumode-softmax",
        "t-tasks",  # a matched file stands for its folder
    ]
    folder = kernel_tree.resolve() / "tasks" / "hip2hip" / "gpumode" / "gemm"
    assert tasks[2].vars["task_dir"] == tasks[2].vars["task_file"] == str(folder)
    assert tasks[4].vars["task_file"] == str(kernel_tree.resolve() / "tasks" / "top.yaml")
    assert render_command(tasks[0], {}) == ["agent", str(folder)]


def test_glob_absolute_and_literal_patterns(kernel_tree: Path, tmp_path: Path) -> None:
    root = kernel_tree.resolve() / "tasks" / "hip2hip"
    text = f"""
tasks_root: ../tasks
tasks:
  - {{glob: "{root}/*/softmax/config.yaml", command: a}}
  - {{glob: ../tasks/hip2hip/gpumode/gemm/config.yaml, command: a}}
"""
    other = tmp_path / "elsewhere"
    other.mkdir()
    tasks = load(other, text).tasks
    assert [t.name for t in tasks] == ["hip2hip/gpumode/softmax", "hip2hip/gpumode/gemm"]
    # without tasks_root the matches lie outside the config's folder: refused, with the fix
    message = error(other, text.replace("tasks_root: ../tasks\n", ""))
    assert "is outside" in message and "set tasks_root:" in message, message


# -- fingerprints ----------------------------------------------------------------------------------
def test_fingerprint_is_stable_across_key_order(tmp_path: Path) -> None:
    one = load(tmp_path, "name: x\ngrace: 5\ntasks:\n  - {command: a, env: {A: '1', B: '2'}}\n")
    two = load(tmp_path, "tasks:\n  - {env: {B: '2', A: '1'}, command: a}\ngrace: 5s\nname: x\n")
    assert config_fingerprint(one.config) == config_fingerprint(two.config)
    assert spec_hash(one) == spec_hash(two)
    assert re.fullmatch(r"[0-9a-f]{64}", config_fingerprint(one.config))


def test_fingerprint_changes_with_a_task(tmp_path: Path) -> None:
    one = load(tmp_path, "tasks:\n  - {command: a, name: t}\n")
    two = load(tmp_path, "tasks:\n  - {command: a --x, name: t}\n")
    three = load(tmp_path, "tasks:\n  - {command: a, name: t, timeout: 5}\n")
    prints = {config_fingerprint(c.config) for c in (one, two, three)}
    assert len(prints) == 3
    assert len({spec_hash(c) for c in (one, two, three)}) == 3


def test_spec_hash_ignores_what_a_resume_may_change(tmp_path: Path) -> None:
    one = load(tmp_path, "gpus: 0,1\nname: a\ntasks:\n  - {command: a, name: t}\n")
    two = load(tmp_path, "gpus: sim:2\nname: b\ntasks:\n  - {command: a, name: t}\n")
    assert spec_hash(one) == spec_hash(two)
    assert config_fingerprint(one.config) != config_fingerprint(two.config)


# -- command lists ---------------------------------------------------------------------------------
COMMANDS = (
    "# sweep\n"
    "python train.py --lr 0.1\n"
    "\n"
    "  python train.py --msg 'a b'   \n"  # surrounding blanks are dropped
    "# python skipped.py\n"
    "echo {workspace} | tee log\n"
)


def test_command_list(tmp_path: Path) -> None:
    path = write(tmp_path, COMMANDS, "cmds.txt")
    loaded = load_command_list(path, base_dir=tmp_path)  # each line through /bin/sh -c
    assert [t.id for t in loaded.tasks] == ["cmd-00002", "cmd-00004", "cmd-00006"]
    assert all(t.shell for t in loaded.tasks)
    assert loaded.tasks[2].command == "echo {workspace} | tee log"
    argv = load_command_list(path, shell=False, base_dir=tmp_path).tasks  # --no-shell
    assert not argv[1].shell and argv[1].command == ["python", "train.py", "--msg", "a b"]
    assert argv[2].command == ["echo", "{workspace}", "|", "tee", "log"]
    assert loaded.tasks[1].name == "python train.py --msg 'a b'"
    assert (loaded.name, loaded.path, loaded.base_dir) == ("cmds", path, tmp_path.resolve())
    assert loaded.workspace == tmp_path.resolve() / "runs"
    assert loaded.config.tasks[0].command == "python train.py --lr 0.1"


@pytest.mark.parametrize("shell", [False, True])
def test_command_list_tasks_are_what_one_model_per_line_would_be(
    tmp_path: Path, shell: bool
) -> None:
    """CommandTasks keeps a template and a row per line: its dumps, its models and the run's
    fingerprint are exactly those of one TaskSpec per line (the way lists were loaded before)."""
    import hashlib
    import json

    from gpuswarm.config.commands import task_dumps
    from gpuswarm.config.instances import Instance
    from gpuswarm.config.load import spec_hash
    from gpuswarm.config.models import to_plain
    from gpuswarm.config.tasks import make_spec, split_command
    from gpuswarm.config.yamlload import Locator

    text = COMMANDS + "python a.py --name 'x y'  # tail\n" + "echo \u00e9t\u00e9 {gpu}\n" * 3
    defaults = TaskOptions(timeout=60, env={"A": "b"}, metrics={"loss": r"loss=(\S+)"})
    loaded = load_command_list(None, text, shell=shell, base_dir=tmp_path, defaults=defaults)
    opts = defaults.model_copy(update={"shell": shell})
    numbered = [(n, ln.strip()) for n, ln in enumerate(text.splitlines(), 1)]
    lines = [(n, ln) for n, ln in numbered if ln and not ln.startswith("#")]
    expected = [
        make_spec(
            Instance(ln[:60], {}, f"line {n}"),
            split_command(ln, shell, Locator("<stdin>", {(): n}), (), shell_hint=""),
            opts,
            grace=10.0,
            base_dir=tmp_path.resolve(),
            task_id=f"cmd-{n:05d}",
        )
        for n, ln in lines
    ]
    assert list(task_dumps(loaded.tasks)) == [t.model_dump(mode="json") for t in expected]
    assert list(loaded.tasks) == expected and loaded.tasks[-1] == expected[-1]
    assert loaded.tasks[1:3] == expected[1:3]
    old_blob = json.dumps(
        {
            "tasks": sorted((to_plain(t) for t in expected), key=lambda t: str(t["id"])),
            "gpus_per_task": loaded.config.gpus_per_task,
            "tasks_per_gpu": loaded.config.tasks_per_gpu,
            "home": to_plain(loaded.config.home),
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    assert spec_hash(loaded) == hashlib.sha256(old_blob.encode()).hexdigest()


def test_a_long_command_list_is_summarised_in_the_config(tmp_path: Path) -> None:
    loaded = load_command_list(None, "true\n" * 1001, base_dir=tmp_path)
    assert len(loaded.tasks) == 1001 and loaded.tasks[1000].id == "cmd-01001"
    (entry,) = loaded.config.tasks
    assert entry.name is not None and entry.name.startswith("1001 commands from <stdin>")


def test_command_list_from_stdin_text_with_shell_and_defaults(tmp_path: Path) -> None:
    defaults = TaskOptions(timeout=60, max_attempts=2, env={"A": "b"})
    loaded = load_command_list(
        None, COMMANDS, shell=True, base_dir=tmp_path, name="sweep", defaults=defaults
    )
    task = loaded.tasks[2]
    assert loaded.name == "sweep" and loaded.path is None
    assert task.shell and task.command == "echo {workspace} | tee log"
    assert (task.timeout, task.max_attempts, task.env) == (60.0, 2, {"A": "b"})
    assert render_command(task, {"workspace": "/w"}) == ["/bin/sh", "-c", "echo /w | tee log"]
    assert load_command_list(None, "a\n", base_dir=tmp_path).name == "stdin"


def test_command_list_names_are_cut_and_ids_padded(tmp_path: Path) -> None:
    text = "\n" * 123456 + "echo " + "x" * 100 + "\n"
    [task] = load_command_list(None, text, base_dir=tmp_path).tasks
    assert task.id == "cmd-123457" and len(task.name) == 60


def test_command_list_reads_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("echo hi\n"))
    assert load_command_list(None, base_dir=tmp_path).tasks[0].command == "echo hi"


def test_command_list_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_command_list(None, "echo ok\n\necho 'oops\n", shell=False, base_dir=tmp_path)
    assert str(info.value).startswith("<stdin>:3: cannot split the command")
    assert "drop --no-shell" in str(info.value) and "fix the quoting" in str(info.value)
    with pytest.raises(ConfigError, match=r"^cmds\.txt: no commands .*one command per line"):
        load_command_list(Path("cmds.txt"), "# nothing\n\n", base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"^<stdin>:2: unknown placeholder \{lr\}"):
        load_command_list(None, "a\necho {lr}\n", base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"missing\.txt: no such file"):
        load_command_list(tmp_path / "missing.txt", base_dir=tmp_path)


# -- the YAML loader -------------------------------------------------------------------------------
def test_loader_records_lines() -> None:
    text = "name: x\ntasks:\n  - command: a\n    timeout: 5\n  - [b, c]\nflow: {k: 1}\n"
    data, lines = load_yaml(text, "t.yaml")
    assert data["tasks"][1] == ["b", "c"]
    assert lines[("name",)] == 1 and lines[("tasks",)] == 2
    assert lines[("tasks", 0)] == 3 and lines[("tasks", 0, "timeout")] == 4
    assert lines[("tasks", 1)] == 5 and lines[("tasks", 1, 1)] == 5 and lines[("flow", "k")] == 6


def test_loader_handles_anchors_and_merges_and_refuses_recursion() -> None:
    text = "base: &b {x: 1}\nuse:\n  <<: *b\n  y: 2\n"
    data, lines = load_yaml(text, "t.yaml")
    assert data["use"] == {"x": 1, "y": 2} and lines[("use", "y")] == 4
    with pytest.raises(ConfigError, match=r"^t\.yaml:5: an alias refers to the anchor it is in"):
        load_yaml(text + "loop: &l [*l]\n", "t.yaml")  # a config cannot be infinite


def test_loader_refuses_python_tags() -> None:
    with pytest.raises(ConfigError, match=r"^t\.yaml:1: invalid YAML"):
        load_yaml("a: !!python/object/apply:os.system [echo]\n", "t.yaml")


# -- bad input: every message names file:line, the field, and the fix ------------------------------
def test_malformed_yaml(tmp_path: Path) -> None:
    message = error(tmp_path, "tasks:\n  - command: a\n    name: [x\n  - command: b\n")
    assert re.search(r"kernels\.yaml:\d+: invalid YAML: .*line 3.*check the indentation", message)
    message = error(tmp_path, "name: x\ntasks:\n  - command: echo a: b\n")
    assert message.endswith(
        "kernels.yaml:3: invalid YAML: mapping values are not allowed here (column 20); "
        "quote values that contain ': ' and check the indentation"
    )
    tabs = error(tmp_path, "tasks:\n\t- command: a\n")
    assert re.search(r"kernels\.yaml:2: invalid YAML: .*indent with spaces, not tabs", tabs)


def test_wrong_types(tmp_path: Path) -> None:
    message = error(tmp_path, "gpus_per_task: two\ntasks:\n  - command: a\n    max_attempts: '3'\n")
    assert message.splitlines() == [
        f"{tmp_path / 'kernels.yaml'}:1: gpus_per_task: expected a whole number, got 'two' "
        "(a string)",
        f"{tmp_path / 'kernels.yaml'}:4: tasks[0].max_attempts: expected a whole number, got '3' "
        "(a string); remove the quotes",
    ]


def test_a_task_that_is_a_string(tmp_path: Path) -> None:
    message = error(tmp_path, "tasks:\n  - command: a\n  - python b.py\n")
    assert message.endswith(
        "kernels.yaml:3: tasks[1]: expected a mapping (key: value lines), got 'python b.py' "
        "(a string); write it as - command: python b.py"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "gpu: auto\ntasks: [{command: a}]\n",
            ":1: unknown key 'gpu' in the top level; did you mean 'gpus'?",
        ),
        (
            "tasks:\n  - command: a\n    timout: 5\n",
            ":3: unknown key 'timout' in tasks[0]; did you mean 'timeout'?",
        ),
        (
            "defaults:\n  evn: {}\ntasks: [{command: a}]\n",
            ":2: unknown key 'evn' in defaults; did you mean 'env'?",
        ),
        (
            "home:\n  isolat: true\ntasks: [{command: a}]\n",
            ":2: unknown key 'isolat' in home; did you mean 'isolate'?",
        ),
        (
            "zzz: 1\ntasks: [{command: a}]\n",
            ":1: unknown key 'zzz' in the top level; allowed keys: after_all, backend, budget,"
            " defaults, docker, gpus,",
        ),
    ],
)
def test_unknown_keys(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error(tmp_path, text)


def test_typo_of_a_required_key_is_reported_once(tmp_path: Path) -> None:
    message = error(tmp_path, "tasks:\n  - comand: a\n")
    assert message.endswith(":2: unknown key 'comand' in tasks[0]; did you mean 'command'?")
    assert "missing" not in message


def test_bad_duration(tmp_path: Path) -> None:
    text = "tasks:\n  - command: a\n  - command: b\n  - command: c\n    timeout: 10 minutes\n"
    assert error(tmp_path, text).endswith(
        "kernels.yaml:5: tasks[2].timeout: '10 minutes' is not a duration; write seconds (600) "
        "or 90s, 10m, 2h, 1h30m; or null for no timeout"
    )
    message = error(tmp_path, "grace: 0\ntasks: [{command: a}]\n")
    assert message.endswith(
        ":1: grace: 0 is not a positive duration; write seconds (600) or 90s, 10m, 2h, 1h30m"
    )


def test_duplicate_key(tmp_path: Path) -> None:
    message = error(tmp_path, "tasks:\n  - command: a\n    name: x\n    name: y\n")
    assert message.endswith(
        "kernels.yaml:4: duplicate key 'name' in tasks[0] (first at line 3); YAML would silently "
        "keep only the last one: remove or rename one of them"
    )
    assert ":3: duplicate key 'tasks' in the top level (first at line 1)" in error(
        tmp_path, "tasks: []\nname: a\ntasks: []\n"
    )


def test_duplicate_task_ids(tmp_path: Path) -> None:
    message = error(tmp_path, "tasks:\n  - command: a\n    name: x\n  - command: b\n    name: x\n")
    assert message.endswith(
        "kernels.yaml:4: tasks[1]: task id 'x' (name 'x') of tasks[1] is already used by "
        "tasks[0] at line 2; task ids must be unique: set a different name: on one of them"
    )
    # names that differ only in characters a file name cannot hold give the same id
    text = "tasks:\n  - {command: a, name: x}\n  - {command: b, name: 'x?'}\n"
    assert ":3: tasks[1]: task id 'x' (name 'x?') of tasks[1] is already used" in error(
        tmp_path, text
    )
    text = "tasks:\n  - matrix: {lr: [1, 2], seed: [1, 2]}\n    name: 'lr{lr}'\n    command: a\n"
    message = error(tmp_path, text)
    assert ":2: tasks[0]: task id 'lr1' (name 'lr1') of tasks[0] (lr=1, seed=2)" in message
    assert 'use every matrix key in the name, e.g. name: "lr{lr}-seed{seed}"' in message


def test_duplicate_ids_from_globs(kernel_tree: Path) -> None:
    text = (
        "tasks:\n"
        "  - {glob: 'tasks/**/config.yaml', name: k, command: a}\n"
        "  - {command: a, name: k-tasks/hip2hip/gpumode/gemm}\n"
    )
    message = error(kernel_tree, text)
    assert ":3: tasks[1]: task id 'k-tasks-hip2hip-gpumode-gemm'" in message
    assert "at line 2" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "kernels.yaml: the file is empty; it needs at least a tasks: list"),
        ("# just a comment\n", "kernels.yaml: the file is empty"),
        (
            "- a\n",
            (
                "kernels.yaml:1: the file must be a mapping of settings (name:, tasks:, ...), "
                "not a list"
            ),
        ),
        ("tasks: []\n", "kernels.yaml:1: tasks: the task list is empty; add at least one entry"),
        ("name: x\n", "kernels.yaml:1: missing required key 'tasks'; add a tasks: list"),
        ("tasks:\n  x: 1\n", "kernels.yaml:1: tasks: expected a list, got {'x': 1} (a mapping)"),
    ],
)
def test_empty_or_shapeless_files(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error(tmp_path, text)


def test_missing_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such file; check the path"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a folder; pass the YAML file inside it"):
        load_config(tmp_path)
    (tmp_path / "bin.yaml").write_bytes(b"tasks: \xff\n")
    with pytest.raises(ConfigError, match=r"bin\.yaml: not UTF-8 text \(byte 7\)"):
        load_config(tmp_path / "bin.yaml")


def test_glob_that_matches_nothing(kernel_tree: Path) -> None:
    message = error(
        kernel_tree, "tasks:\n  - command: a\n  - glob: tasks/**/nothing.yaml\n    command: a\n"
    )
    root = kernel_tree.resolve()
    assert (
        f":3: tasks[1].glob: 'tasks/**/nothing.yaml' matches nothing under {root / 'tasks'};"
        in message
    )
    assert f"relative patterns start at the config file's folder {root}" in message
    assert "missing does not exist)" in error(
        kernel_tree, "tasks: [{glob: missing/*.yaml, command: a}]\n"
    )


def test_unreadable_task_folder(kernel_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests may run as root, where chmod 000 does not stop reading: simulate os.access instead.
    real_access = os.access
    denied = str(kernel_tree.resolve() / "tasks" / "hip2hip" / "gpumode" / "softmax")

    def access(path: str | os.PathLike[str], mode: int) -> bool:
        return str(path) != denied and real_access(path, mode)

    monkeypatch.setattr(os, "access", access)
    message = error(kernel_tree, "tasks:\n  - glob: tasks/**/config.yaml\n    command: a\n")
    assert f":2: tasks[0].glob: the matched task {denied}/config.yaml is not readable" in message
    assert "chmod -R u+rX" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads folders whatever their mode is")
def test_unreadable_task_folder_for_real(kernel_tree: Path) -> None:
    folder = kernel_tree / "tasks" / "hip2hip" / "gpumode" / "gemm"
    folder.chmod(0o000)
    try:
        assert "is not readable" in error(
            kernel_tree, "tasks: [{glob: 'tasks/*/*/*', command: a}]\n"
        )
    finally:
        folder.chmod(0o755)


def test_unknown_placeholders(tmp_path: Path) -> None:
    message = error(tmp_path, "tasks:\n  - command: a\n  - command: echo {foo}\n")
    assert message.endswith(
        "kernels.yaml:3: tasks[1].command: unknown placeholder {foo} in the command; known "
        "placeholders: {attempt}, {config_dir}, {gpu}, {gpu_ids}, {name}, {run_dir}, {slot}, "
        "{slot_id}, {task_id}, {workspace}; write {{ and }} for literal braces"
    )
    text = "tasks:\n  - matrix: {lr: [1]}\n    command: [echo, '{lr}', '{seed}']\n"
    assert (
        ":3: tasks[0].command[2]: unknown placeholder {seed} in the command; "
        "known placeholders: {attempt}, {config_dir}, {gpu}, {gpu_ids}, {lr},"
        in error(tmp_path, text)
    )
    text = "defaults:\n  env: {OUT: '{lr}/x'}\ntasks:\n  - command: a\n"
    message = error(tmp_path, text)
    assert (
        ":2: defaults.env.OUT: unknown placeholder {lr} in the value of OUT (as used by tasks[0])"
        in message
    )
    assert error(tmp_path, "tasks: [{command: a, done_when: '{x}.yaml'}]\n").endswith(
        "done_when; known placeholders: {attempt}, {config_dir}, {gpu}, {gpu_ids}, {name}, "
        "{run_dir}, {slot}, "
        "{slot_id}, {task_id}, {workspace}; write {{ and }} for literal braces"
    )
    assert "tasks[0].cwd: unknown placeholder {where} in cwd" in error(
        tmp_path, "tasks: [{command: a, cwd: '{where}'}]\n"
    )


def test_names_use_only_load_time_values(tmp_path: Path) -> None:
    message = error(tmp_path, "tasks:\n  - command: echo\n    name: 'x{gpu}'\n")
    assert message.endswith(
        ":3: tasks[0].name: placeholder {gpu} is known only at launch; a name is fixed when the "
        "config is loaded, so it can use only this entry's values (none); write {{ and }} for "
        "literal braces"
    )
    text = "tasks:\n  - matrix: {lr: [1]}\n    name: '{lr}-{x}'\n    command: a\n"
    assert "{x} is not defined; a name is fixed" in error(tmp_path, text)
    assert "({lr})" in error(tmp_path, text)


def test_gpus_more_than_gpus_per_task(tmp_path: Path) -> None:
    message = error(tmp_path, "tasks:\n  - command: echo\n    gpus: 2\n")
    assert message.endswith(
        ":3: tasks[0].gpus: 2 GPUs per task is more than gpus_per_task (1); set "
        "gpus_per_task: 2 at the top level, or lower gpus"
    )
    assert ":2: defaults.gpus: 4 GPUs" in error(
        tmp_path, "defaults:\n  gpus: 4\ntasks: [{command: a}]\n"
    )
    assert load(tmp_path, "gpus_per_task: 4\ntasks: [{command: a, gpus: 4}]\n").tasks[0].gpus == 4


def test_bad_regex(tmp_path: Path) -> None:
    message = error(tmp_path, "tasks:\n  - command: echo\n    metrics: {loss: 'loss=(\\d+'}\n")
    assert message.endswith(
        ":3: tasks[0].metrics.loss: pattern 'loss=(\\d+' is not a valid regular expression "
        "(missing ), unterminated subpattern at position 5); escape special characters with a "
        "backslash"
    )
    message = error(tmp_path, "tasks:\n  - command: echo\n    metrics: {loss: 'loss=\\d+'}\n")
    assert "pattern 'loss=\\d+' has 0 capture groups; it needs exactly one" in message


def test_env_errors_never_show_values(tmp_path: Path) -> None:
    text = (
        "tasks:\n  - command: a\n    env:\n"
        "      TOKEN: [sk-secret]\n      bad-name: x\n      FLAG: true\n"
    )
    message = error(tmp_path, text)
    assert "sk-secret" not in message
    assert ":4: tasks[0].env.TOKEN: the value must be a string (or a number); quote it" in message
    assert (
        ":5: tasks[0].env.bad-name: 'bad-name' is not a valid environment variable name" in message
    )
    assert ":6: tasks[0].env.FLAG: the value is true, not a string; quote it" in message
    message = error(tmp_path, "tasks: [{command: a, env: {A: {b: sk-secret}}}]\n")
    assert "sk-secret" not in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "tasks:\n  - name: x\n",
            (":2: tasks[0]: missing required key 'command'; add command: <program and arguments>"),
        ),
        (
            "tasks:\n  - {command: a, glob: x, matrix: {a: [1]}}\n",
            (
                ":2: tasks[0]: an entry can have glob: or matrix:, not both; split it into two "
                "entries"
            ),
        ),
        (
            'tasks:\n  - command: "echo \'abc"\n',
            (
                ":2: tasks[0].command: cannot split the command into arguments (No closing "
                "quotation); fix the quoting, or set shell: true"
            ),
        ),
        (
            "tasks:\n  - {command: [a, b], shell: true}\n",
            ":2: tasks[0].command: shell: true needs the command as one string",
        ),
        (
            "tasks:\n  - {command: [a, 1]}\n",
            "tasks[0].command: every element of an argv list must be a string; quote numbers",
        ),
        ("tasks:\n  - {command: '  '}\n", "tasks[0].command: the command is empty"),
        ("tasks:\n  - {command: 5}\n", "tasks[0].command: expected a string"),
        (
            "tasks:\n  - command: a\n    priority: 9000\n",
            ":3: tasks[0].priority: 9000 is out of range; it must be <= 4999",
        ),
        (
            "tasks:\n  - command: a\n    max_attempts: 0\n",
            ":3: tasks[0].max_attempts: 0 is out of range; it must be >= 1",
        ),
        (
            "tasks:\n  - command: a\n    shell: maybe\n",
            ":3: tasks[0].shell: expected true or false, got 'maybe' (a string)",
        ),
        (
            "tasks:\n  - command: a\n    done_when: ../x\n",
            ":3: tasks[0].done_when: '../x' must be a relative path inside the task workspace",
        ),
        (
            "tasks:\n  - command: a\n    done_when: /x\n",
            "it cannot be empty or absolute or use '..'",
        ),
        (
            "name: my run\ntasks: [{command: a}]\n",
            (
                ":1: name: 'my run' cannot be a folder name; use letters, digits, '.', '_' and "
                "'-', e.g. 'my-run'"
            ),
        ),
        (
            "gpus: [a]\ntasks: [{command: a}]\n",
            ":1: gpus: ['a'] is not a GPU selection; write auto, 0,1,2 or sim:N",
        ),
        (
            "gpus_per_task: 2\ntasks_per_gpu: 2\ntasks: [{command: a}]\n",
            ":1: gpus_per_task and tasks_per_gpu are both above 1",
        ),
        (
            "home:\n  provision: [{src: a, dest: b}]\ntasks: [{command: a}]\n",
            (
                ":1: home: provision: copies files into a private per-slot HOME, which needs "
                "isolate: true; set home.isolate: true"
            ),
        ),
        (
            (
                "home:\n  isolate: true\n  provision:\n    - {src: a, dest: ../b}\n"
                "tasks: [{command: "
                "a}]\n"
            ),
            (":4: home.provision[0].dest: '../b' must be a relative path inside the slot's HOME"),
        ),
        (
            (
                "home:\n  isolate: true\n  provision:\n    - {src: nope.json, dest: b}\ntasks: "
                "[{command: a}]\n"
            ),
            ":4: home.provision[0].src: ",
        ),
        (
            "tasks:\n  - matrix: {gpu: [1]}\n    command: a\n",
            (
                ":2: tasks[0].matrix.gpu: matrix key 'gpu' clashes with a placeholder gpuswarm "
                "supplies; rename it"
            ),
        ),
        (
            "tasks:\n  - matrix: {x: []}\n    command: a\n",
            ":2: tasks[0].matrix.x: the list is empty; give at least one value",
        ),
        (
            "tasks:\n  - matrix: {x: 1}\n    command: a\n",
            ":2: tasks[0].matrix.x: expected a list, got 1 (a number)",
        ),
        ("tasks:\n  - matrix: {}\n    command: a\n", ":2: tasks[0]: matrix: is empty"),
        (
            "1: a\ntasks: [{command: a}]\n",
            ":1: key 1 in the top level is not a string; quote it or remove it",
        ),
        (
            "tasks: []\n---\nname: x\n",
            ":2: invalid YAML: expected a single document in the stream at line 1",
        ),
    ],
)
def test_other_bad_input(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error(tmp_path, text)


def test_provision_src_is_checked_against_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "auth.json").write_text("{}")
    text = (
        "home:\n  isolate: true\n  provision: [{src: auth.json, dest: .codex/auth.json}]\n"
        "tasks: [{command: a}]\n"
    )
    loaded = load(tmp_path, text)
    assert (
        loaded.resolve_path(loaded.config.home.provision[0].src) == tmp_path.resolve() / "auth.json"
    )
    message = error(tmp_path, text.replace("auth.json,", "gone.json,"))
    assert (
        f"{tmp_path.resolve() / 'gone.json'} does not exist; fix the path or remove this entry"
        in message
    )


def test_many_errors_are_listed_in_line_order(tmp_path: Path) -> None:
    text = "tasks:\n" + "".join(f"  - {{command: a, max_attempts: x{i}}}\n" for i in range(12))
    lines = error(tmp_path, "gpu: 1\n" + text).splitlines()
    assert lines[0].endswith(":1: unknown key 'gpu' in the top level; did you mean 'gpus'?")
    assert ":3: tasks[0].max_attempts" in lines[1]
    assert lines[-1] == "... and 3 more problems"


def test_task_options_from_cli_flags() -> None:
    options = TaskOptions.from_cli(timeout="10m", max_attempts=None, shell=None)
    assert (options.timeout, options.max_attempts, options.model_fields_set) == (
        600.0,
        1,
        {"timeout"},
    )
    with pytest.raises(ConfigError, match=r"^--timeout: '10 minutes' is not a duration; write"):
        TaskOptions.from_cli(timeout="10 minutes")
    with pytest.raises(ConfigError, match=r"^--max-attempts: 0 is out of range; it must be >= 1"):
        TaskOptions.from_cli(max_attempts=0)
