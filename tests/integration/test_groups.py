"""Groups through the real CLI (issue 35): ``group:`` and a matrix entry's default group,
``groups: {NAME: {max_parallel, priority}}``, ``status --group NAME --json`` (counts, percent,
ETA), report.html's Groups section, ``cancel --group``, ``retry --group --failed``,
``pause --group`` / ``unpause --group``.

``max_parallel: 1`` is proven by effect: each task of the group takes a lock folder with
``mkdir`` and fails when another one holds it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliResult, find_runs, read_events

from gpuswarm.core.paths import STATES

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]


def _yaml(path: Path, tasks: list[dict[str, Any]], **top: Any) -> Path:
    body = {"name": "groups", "workspace": "ws", "gpus": "sim:3", **top, "tasks": tasks}
    path.write_text(json.dumps(body))
    return path


def _states(run: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for state in STATES:
        for path in (run / ".parallel" / state).iterdir():
            if not path.name.startswith("."):
                out[json.loads(path.read_text())["id"]] = state
    return out


def test_max_parallel_priority_status_and_report(tmp_path: Path, gpuswarm: Cli) -> None:
    exclusive = "mkdir held || exit 9; sleep 0.15; rmdir held"
    tasks: list[dict[str, Any]] = [
        {"name": "other", "command": "sleep 0.05"},
        {"name": "train-{lr}", "matrix": {"lr": [1, 2, 3]}, "command": exclusive, "shell": True},
        {"name": "ev", "command": "true", "group": "eval"},
    ]
    groups = {"train": {"max_parallel": 1, "priority": 10}}
    res = gpuswarm("run", "-q", _yaml(tmp_path / "g.yaml", tasks, groups=groups))
    assert res.returncode == 0, res  # no train task found the lock held: one at a time
    (run,) = find_runs(tmp_path / "ws")
    first = next(e["task"] for e in read_events(run) if e.get("ev") == "started")
    assert first.startswith("train-"), first  # the group's priority: before `other`
    res = gpuswarm("status", run, "--group", "train", "--json")
    assert res.returncode == 0, res
    data = json.loads(res.stdout)
    assert data["counts"] == {"done": 3} and data["total"] == 3
    assert data["percent"] == 100.0 and data["eta_seconds"] == 0.0
    res = gpuswarm("status", run, "--group", "nope")
    assert res.returncode == 2 and "train" in res.stderr, res
    assert gpuswarm("status", run, "--group", "eval").stdout.startswith("eval  1/1 (100.0%)")
    html = (run / "report.html").read_text()
    assert "<h2>Groups</h2>" in html and "train" in html


def test_cancel_retry_and_pause_a_group(tmp_path: Path, gpuswarm: Cli) -> None:
    fixed = tmp_path / "fixed"
    tasks: list[dict[str, Any]] = [
        {"name": "a-{n}", "matrix": {"n": [1, 2]}, "command": f"test -e {fixed}", "shell": True},
        {"name": "b-{n}", "matrix": {"n": [1, 2]}, "command": "true"},
        {"name": "c-{n}", "matrix": {"n": [1, 2]}, "command": "true"},
    ]
    config = _yaml(tmp_path / "g.yaml", tasks, gpus="sim:1", grace="0.5s")
    # a stopped run (a-1 failed first: halt now), b and c not started: pause b, cancel c
    res = gpuswarm("run", "-q", "--no-report", "--halt", "now,fail=1", config)
    (run,) = find_runs(tmp_path / "ws")
    assert res.returncode != 0, res
    assert gpuswarm("pause", run, "--group", "b").returncode == 0
    res = gpuswarm("cancel", run, "--group", "c", "--json")
    assert res.returncode == 0, res
    assert gpuswarm("pause", run, "--group", "zzz").returncode == 2
    res = gpuswarm("resume", "-q", "--no-report", "--halt", "never", "--no-retry-failed", run)
    states = _states(run)
    assert states["b-1"] == states["b-2"] == "pending", states  # paused: never started
    assert states["c-1"] == states["c-2"] == "cancelled"
    assert "a-1" in states and states["a-1"] == "failed"
    fixed.touch()
    res = gpuswarm("retry", run, "--group", "a", "--failed", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["retried"] == 2, res
    assert gpuswarm("unpause", run, "--group", "b").returncode == 0
    res = gpuswarm("resume", "-q", "--no-report", run)
    states = _states(run)
    assert all(states[t] == "done" for t in ("a-1", "a-2", "b-1", "b-2")), states
