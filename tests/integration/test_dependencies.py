"""Task dependencies through the real CLI (issue 35): ``after:``, ``after_any:``,
``after_failed:``, the ``dependency_failed`` end state, per-instance references of glob entries,
refusals at load and at ``add`` (exit 2 naming the cycle or the reference), a cancel of a
blocked task and a retry that brings dependency_failed dependents back.

Order is proven by effects, not by timing: a dependent's command fails unless the file its
prerequisite writes is there, so a dependent started early ends failed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliResult, find_runs, read_events
from depkit import deps_yaml as _yaml
from depkit import run_dir as _run_dir
from depkit import task_states

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]


def _needs(marker: str) -> str:
    """A command that fails unless ``marker`` exists (its prerequisite's effect)."""
    return f"test -e {marker}"


TASKS: list[dict[str, Any]] = [
    {"name": "build", "command": "sleep 0.3; touch built", "shell": True},
    {"name": "bad", "command": "exit 3", "shell": True},
    {"name": "evaluate", "command": _needs("built"), "shell": True, "after": "build"},
    {"name": "ev2", "command": "true", "after": ["bad"]},
    {"name": "ev3", "command": "true", "after": ["ev2"]},
    {"name": "cleanup", "command": "true", "after_failed": ["bad"]},
    {"name": "notneeded", "command": "true", "after_failed": ["build"]},
    {"name": "anyway", "command": _needs("built"), "shell": True, "after_any": ["bad", "build"]},
]


def test_after_rules_and_dependency_failed_at_once(tmp_path: Path, gpuswarm: Cli) -> None:
    res = gpuswarm("run", "-q", _yaml(tmp_path / "d.yaml", TASKS))
    assert res.returncode == 1, res  # bad failed
    run = _run_dir(tmp_path)
    assert task_states(run) == {
        "build": "done",
        "bad": "failed",
        "evaluate": "done",  # after build: it saw build's file
        "ev2": "dependency_failed",  # after bad, which failed: ended at once, never ran
        "ev3": "dependency_failed",  # after ev2: the chain follows
        "cleanup": "done",  # after_failed bad: ran because bad failed
        "notneeded": "skipped",  # after_failed build: build succeeded
        "anyway": "done",  # after_any: once both ended
    }
    events = read_events(run)
    started = [e["task"] for e in events if e.get("ev") == "started"]
    assert "ev2" not in started and "ev3" not in started and "notneeded" not in started
    summary = json.loads((run / "summary.json").read_text())
    assert summary["counts"]["dependency_failed"] == 2
    assert {f["task"] for f in summary["failures"]} == {"bad"}  # shown apart, not failures
    reasons = {e["task"]: e.get("reason") for e in events if e.get("ev") == "dependency"}
    assert reasons["ev2"] == "prerequisite bad ended failed"
    status = gpuswarm("status", run)
    assert "dependency_failed 2" in status.stdout, status
    assert "consistent" in gpuswarm("check", run).stdout
    report = (run / "report.html").read_text()
    assert "dependency_failed" in report


def test_cycles_unknown_ids_and_self_references_are_exit_2(tmp_path: Path, gpuswarm: Cli) -> None:
    cycle = [
        {"name": "a", "command": "true", "after": "c"},
        {"name": "b", "command": "true", "after": "a"},
        {"name": "c", "command": "true", "after_any": "b"},
    ]
    res = gpuswarm("run", "-q", _yaml(tmp_path / "cycle.yaml", cycle))
    assert res.returncode == 2, res
    assert "cycle: a -> c -> b -> a" in res.stderr, res
    unknown = [{"name": "a", "command": "true"}, {"name": "b", "command": "true", "after": "nope"}]
    res = gpuswarm("run", "-q", _yaml(tmp_path / "unknown.yaml", unknown))
    assert res.returncode == 2, res
    assert "tasks[1].after" in res.stderr and "'nope'" in res.stderr, res
    me = [{"name": "a", "command": "true", "after_failed": ["a"]}]
    res = gpuswarm("run", "-q", _yaml(tmp_path / "self.yaml", me))
    assert res.returncode == 2 and "after_failed itself" in res.stderr, res
    assert not (tmp_path / "ws").exists() or not find_runs(tmp_path / "ws")  # nothing written


def _tree(root: Path, folders: list[str]) -> None:
    for rel in folders:
        (root / "tasks" / rel).mkdir(parents=True)
        (root / "tasks" / rel / "config.yaml").write_text("kernel: x\n")


def test_glob_entries_depend_per_instance(tmp_path: Path, gpuswarm: Cli) -> None:
    """The validator of a folder runs after the agent of the same folder: one line each."""
    _tree(tmp_path, ["hip/gelu", "hip/softmax", "triton/add"])
    tasks = [
        {  # the agent pass: softmax's agent fails
            "name": "agent/{task_rel}",
            "glob": "tasks/*/*",
            "command": "case {task_dir} in *softmax) exit 1;; esac; echo ok > {task_dir}/solution",
            "shell": True,
        },
        {  # the validator pass: needs its own folder's solution
            "name": "validate/{task_rel}",
            "glob": "tasks/*/*",
            "command": "test -e {task_dir}/solution",
            "shell": True,
            "after": "agent/{task_rel}",
        },
    ]
    res = gpuswarm("run", "-q", _yaml(tmp_path / "aka.yaml", tasks))
    assert res.returncode == 1, res
    states = task_states(_run_dir(tmp_path))
    assert states["validate-tasks-hip-gelu"] == "done"
    assert states["validate-tasks-triton-add"] == "done"
    assert states["agent-tasks-hip-softmax"] == "failed"
    assert states["validate-tasks-hip-softmax"] == "dependency_failed"
    status = gpuswarm("status", "--json", _run_dir(tmp_path))
    assert status.returncode == 0, status


def test_add_after_flags_refusals_and_prerequisites_ended_already(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    base = [{"name": "build", "command": "touch built", "shell": True}]
    assert gpuswarm("run", "-q", _yaml(tmp_path / "b.yaml", base)).returncode == 0
    run = _run_dir(tmp_path)
    (tmp_path / "more.txt").write_text(f"{_needs('built')}\n")
    res = gpuswarm("add", run, "more.txt", "--after", "nope")
    assert res.returncode == 2 and "nope" in res.stderr, res
    cyc = _yaml(tmp_path / "c.yaml", [{"name": "x", "command": "true", "after": "y"},
                                      {"name": "y", "command": "true", "after": "x"}])  # fmt: skip
    res = gpuswarm("add", run, cyc)
    assert res.returncode == 2 and "cycle: x -> y -> x" in res.stderr, res
    assert set(task_states(run)) == {"build"}  # nothing half-added
    # build is done already: the added task is released at once, not blocked for ever
    res = gpuswarm("add", run, "more.txt", "--after", "build", "--json")
    assert res.returncode == 0, res
    (added,) = json.loads(res.stdout)["ids"]
    assert task_states(run)[added] == "pending"
    # a YAML naming the run's task and its own
    later = _yaml(tmp_path / "l.yaml", [
        {"name": "one", "command": "true", "after": "build"},
        {"name": "two", "command": "true", "after": ["one", added]},
    ])  # fmt: skip
    assert gpuswarm("add", run, later).returncode == 0
    states = task_states(run)
    assert states["one"] == "pending" and states["two"] == "blocked"
    assert gpuswarm("resume", "-q", run).returncode == 0
    assert set(task_states(run).values()) == {"done"}
    assert "consistent" in gpuswarm("check", run).stdout


def test_cancel_a_blocked_task_and_retry_brings_dependents_back(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    flag = tmp_path / "fixed"
    tasks: list[dict[str, Any]] = [
        {"name": "flaky", "command": f"test -e {flag}", "shell": True},
        {"name": "next", "command": "true", "after": "flaky"},
        {"name": "last", "command": "true", "after": "next"},
        {"name": "spare", "command": "true", "after_any": "last"},
    ]
    _yaml(tmp_path / "f.yaml", tasks)
    res = gpuswarm("run", "-q", "f.yaml")
    assert res.returncode == 1, res
    run = _run_dir(tmp_path)
    states = task_states(run)
    assert states["next"] == states["last"] == "dependency_failed" and states["spare"] == "done"
    res = gpuswarm("retry", run, "next")
    assert res.returncode == 2 and "retry the prerequisite" in res.stderr, res
    assert gpuswarm("retry", run, "flaky").returncode == 0
    states = task_states(run)
    assert states["flaky"] == "pending" and states["next"] == states["last"] == "blocked"
    res = gpuswarm("cancel", run, "last")
    assert res.returncode == 0 and "blocked -> cancelled" in res.stdout, res
    flag.touch()
    assert gpuswarm("resume", "-q", "--no-retry-failed", run).returncode == 0
    states = task_states(run)
    assert states == {"flaky": "done", "next": "done", "last": "cancelled", "spare": "done"}
    assert "consistent" in gpuswarm("check", run).stdout


def test_requeue_of_a_prerequisite_and_cancel_of_a_pending_one_move_its_dependents(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    """requeue follows retry's rules: a dependency_failed task is refused, a requeued
    prerequisite brings its dependency_failed dependents back to blocked; a pending
    prerequisite cancelled by hand ends its ``after:`` dependents at once."""
    flag = tmp_path / "fixed"
    tasks: list[dict[str, Any]] = [
        {"name": "flaky", "command": f"test -e {flag}", "shell": True},
        {"name": "next", "command": "true", "after": "flaky"},
        {"name": "last", "command": "true", "after": "next"},
    ]
    _yaml(tmp_path / "f.yaml", tasks)
    assert gpuswarm("run", "-q", "f.yaml").returncode == 1
    run = _run_dir(tmp_path)
    res = gpuswarm("requeue", run, "next")
    assert res.returncode == 2 and "requeue the prerequisite" in res.stderr, res
    assert gpuswarm("requeue", run, "flaky").returncode == 0
    assert task_states(run) == {"flaky": "pending", "next": "blocked", "last": "blocked"}
    back = [e for e in read_events(run) if e.get("ev") == "dependency"]
    assert {(e["task"], e["frm"], e["state"]) for e in back} >= {
        ("next", "dependency_failed", "blocked"),
        ("last", "dependency_failed", "blocked"),
    }
    res = gpuswarm("cancel", run, "flaky")  # pending: cancelled now, its dependents follow
    assert res.returncode == 0 and "pending -> cancelled" in res.stdout, res
    states = task_states(run)
    assert states == {
        "flaky": "cancelled",
        "next": "dependency_failed",
        "last": "dependency_failed",
    }
    assert gpuswarm("requeue", run, "flaky").returncode == 0
    flag.touch()
    assert gpuswarm("resume", "-q", run).returncode == 0
    assert task_states(run) == {"flaky": "done", "next": "done", "last": "done"}
    assert "consistent" in gpuswarm("check", run).stdout


def test_two_pass_aka_layout_of_426_folders(tmp_path: Path, gpuswarm: Cli) -> None:
    """The README's two-pass config on AKA's 426 task folders: every folder's validator runs
    after that folder's agent (it checks the agent's output), a summary after every one."""
    suites = {"hip2hip/gpumode": 160, "hip2hip/ops": 106, "triton2triton/vllm": 160}
    for suite, n in suites.items():
        for k in range(n):
            folder = tmp_path / "tasks" / suite / f"k{k:03d}"
            folder.mkdir(parents=True)
            (folder / "config.yaml").write_text(f"kernel: k{k}\n")
    assert sum(suites.values()) == 426
    tasks = [
        {
            "name": "agent/{task_rel}",
            "glob": "tasks/*/*/*/config.yaml",
            "command": "echo ok > {task_dir}/solution",
            "shell": True,
        },
        {
            "name": "validate/{task_rel}",
            "glob": "tasks/*/*/*/config.yaml",
            "after": "agent/{task_rel}",
            "command": "test -s {task_dir}/solution && touch {task_dir}/valid",
            "shell": True,
        },
        {
            "name": "summary",
            "command": "test $(ls tasks/*/*/*/valid | wc -l) -eq 426",
            "shell": True,
            "after_any": "group:validate",
        },
    ]
    groups = {"agent": {"max_parallel": 6}, "validate": {"priority": 10}}  # as the README
    config = _yaml(tmp_path / "aka.yaml", tasks, gpus="sim:8", groups=groups)
    res = gpuswarm("run", "-q", "--no-report", config, timeout=240)
    assert res.returncode == 0, res
    states = task_states(_run_dir(tmp_path))
    assert len(states) == 853 and set(states.values()) == {"done"}
    events = read_events(_run_dir(tmp_path))
    started = [e["task"] for e in events if e.get("ev") == "started"]
    first_validator = next(i for i, t in enumerate(started) if t.startswith("validate-"))
    assert first_validator < 50, first_validator  # validators run while agents still wait
    res = gpuswarm("status", _run_dir(tmp_path), "--group", "validate", "--json")
    data = json.loads(res.stdout)
    assert data["counts"] == {"done": 426} and data["percent"] == 100.0
