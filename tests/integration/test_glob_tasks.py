"""Glob tasks on a task tree like AgentKernelArena's (issue 11 items 6 and 10), through the CLI.

Item 6: overlapping globs ran one folder twice (`tasks/**` plus one folder's config.yaml gave 427
tasks from 426 folders) and ids changed with the glob root. Now: one task per selected folder,
ids relative to one root (the config's folder or `tasks_root:`), and exit 2 when two distinct
folders would get one id.

Item 10: a glob task reads fields of its matched config.yaml: `{config.<field>}` in the command
(and name, env, cwd, done_when) and `timeout: "{config.<field>}"`; exit 2 naming the file when a
field is missing or not a duration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliResult, find_runs, run_cli
from integration_support import queue_files

pytestmark = pytest.mark.slow  # CLI processes: part of CI, not of the fast suite

KERNELS: dict[str, dict[str, Any]] = {
    "hip2hip/gpumode/GELU": {"performance_timeout": 1, "kernel": "gelu"},
    "hip2hip/gpumode/softmax": {"performance_timeout": "90s", "kernel": "softmax"},
    "hip2hip/ops/add": {"performance_timeout": "2m", "kernel": "add"},
    "triton2triton/vllm/x": {"performance_timeout": 600, "kernel": "x"},
}


def _tree(tmp_path: Path) -> Path:
    for rel, fields in KERNELS.items():
        folder = tmp_path / "tasks" / rel
        folder.mkdir(parents=True)
        lines = [f"{k}: {json.dumps(v)}" for k, v in fields.items()]
        (folder / "config.yaml").write_text("task_type: hip2hip\n" + "\n".join(lines) + "\n")
    return tmp_path


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "aka.yaml"
    path.write_text("name: aka\nworkspace: ws\ngpus: sim:2\n" + body)
    return path


def _run(tmp_path: Path, body: str, *args: str) -> CliResult:
    return run_cli("run", "-q", "--no-report", *args, _config(tmp_path, body), cwd=tmp_path)


def _tasks(tmp_path: Path) -> dict[str, dict[str, Any]]:
    (run_dir,) = find_runs(tmp_path / "ws")
    out = {}
    for task_id, places in queue_files(run_dir).items():
        ((_, path),) = places
        out[task_id] = json.loads(path.read_text())
    return out


def test_overlapping_globs_give_one_task_per_folder_with_stable_ids(tmp_path: Path) -> None:
    _tree(tmp_path)
    body = (
        "tasks_root: tasks\n"
        "tasks:\n"
        "  - {glob: 'tasks/**/config.yaml', command: 'true'}\n"
        "  - {glob: tasks/hip2hip/gpumode/GELU/config.yaml, command: 'true'}\n"  # overlaps
        "  - {glob: 'tasks/hip2hip/**/config.yaml', command: 'true'}\n"  # another root
        "  - {glob: 'tasks/hip2hip/gpumode/*', command: 'true'}\n"  # folders, not files
    )
    res = _run(tmp_path, body)
    assert res.returncode == 0, res
    tasks = _tasks(tmp_path)
    # was: 4 + 1 + 3 + 2 = 10 tasks from 4 folders, with ids such as GELU and gpumode-GELU
    assert sorted(tasks) == [
        "hip2hip-gpumode-GELU",
        "hip2hip-gpumode-softmax",
        "hip2hip-ops-add",
        "triton2triton-vllm-x",
    ]
    assert all(len(d["attempts"]) == 1 for d in tasks.values())  # each ran once


def test_ids_are_relative_to_the_config_folder_by_default(tmp_path: Path) -> None:
    _tree(tmp_path)
    one = "tasks:\n  - {glob: 'tasks/triton2triton/**/config.yaml', command: 'true'}\n"
    assert _run(tmp_path, one).returncode == 0
    two = "tasks:\n  - {glob: 'tasks/**/config.yaml', command: 'true'}\n"
    assert _run(tmp_path, two, "--suffix", "b").returncode == 0
    ids = [sorted(queue_files(r)) for r in find_runs(tmp_path / "ws")]
    assert "tasks-triton2triton-vllm-x" in ids[0] and "tasks-triton2triton-vllm-x" in ids[1]


def test_two_folders_with_one_id_are_refused_naming_both(tmp_path: Path) -> None:
    for rel in ("a b", "a-b"):  # both slugify to a-b
        (tmp_path / "tasks" / rel).mkdir(parents=True)
        (tmp_path / "tasks" / rel / "config.yaml").write_text("k: 1\n")
    res = _run(
        tmp_path, "tasks_root: tasks\ntasks:\n  - {glob: 'tasks/*/config.yaml', command: x}\n"
    )
    assert res.returncode == 2, res
    assert "task id 'a-b'" in res.stderr, res.stderr
    assert "tasks/a b/config.yaml" in res.stderr and "tasks/a-b/config.yaml" in res.stderr
    assert not (tmp_path / "ws").exists() or not find_runs(tmp_path / "ws")  # nothing written


def test_fields_of_the_matched_config_in_placeholders_and_timeout(tmp_path: Path) -> None:
    _tree(tmp_path)
    body = (
        "tasks_root: tasks\n"
        "tasks:\n"
        "  - glob: 'tasks/hip2hip/**/config.yaml'\n"
        "    name: '{config.kernel}'\n"
        "    shell: true\n"
        "    timeout: '{config.performance_timeout}'\n"
        "    env: {KERNEL: '{config.kernel}'}\n"
        "    command: 'echo {config.kernel} $KERNEL > {workspace}/out; "
        "[ {config.kernel} != gelu ] || sleep 30'\n"
    )
    res = _run(tmp_path, body)
    assert res.returncode == 1, res  # GELU's performance_timeout is 1 s: it times out
    tasks = _tasks(tmp_path)
    assert {k: d["task"]["timeout"] for k, d in tasks.items()} == {
        "gelu": 1.0,
        "softmax": 90.0,
        "add": 120.0,
    }
    assert tasks["gelu"]["attempts"][0]["kind"] == "timeout", tasks["gelu"]["attempts"]
    (run_dir,) = find_runs(tmp_path / "ws")
    assert (run_dir / "tasks" / "add" / "out").read_text() == "add add\n"


def test_a_missing_or_bad_config_field_is_exit_2_naming_the_file(tmp_path: Path) -> None:
    _tree(tmp_path)
    gelu = tmp_path / "tasks" / "hip2hip" / "gpumode" / "GELU" / "config.yaml"
    missing = (
        "tasks:\n  - {glob: 'tasks/**/config.yaml', command: 'run {config.compile_timeout}'}\n"
    )
    res = _run(tmp_path, missing)
    assert res.returncode == 2, res
    assert "compile_timeout" in res.stderr and "config.yaml: has no field" in res.stderr
    gelu.write_text("performance_timeout: soon\n")
    bad = (
        "tasks:\n  - {glob: 'tasks/**/config.yaml', command: 'true', "
        "timeout: '{config.performance_timeout}'}\n"
    )
    res = _run(tmp_path, bad)
    assert res.returncode == 2, res
    assert f"{gelu}: field 'performance_timeout'" in res.stderr, res.stderr
    assert "'soon' is not a duration" in res.stderr, res.stderr
    explicit = "tasks:\n  - {command: 'true', timeout: '{config.performance_timeout}'}\n"
    res = _run(tmp_path, explicit)
    assert res.returncode == 2 and "only glob tasks" in res.stderr, res
    assert not find_runs(tmp_path / "ws")
