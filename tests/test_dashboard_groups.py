"""The dashboard shows groups with their progress (issue 35): the run's JSON carries the table
``gpuswarm status --group --json`` computes (counts per state, percent, ETA), served by the real
server; taken in a thread of its own, at most every few seconds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from dashkit import Served, serve_here

from gpuswarm.app import api
from gpuswarm.app.control import add_tasks, cancel_tasks
from gpuswarm.config.load import load_config
from gpuswarm.outputs.groups import group_status

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def _grouped_run(workspace: Path) -> api.RunPaths:
    spec = api.NewRunSpec(
        workspace=workspace,
        folder="g",
        name="g",
        base_dir=workspace,
        gpus=api.plan_gpus("sim:2"),
        source="test",
    )
    run = api.create_run(spec)
    tasks = [
        {"name": "t1", "command": "true", "group": "sweep"},
        {"name": "t2", "command": "true", "group": "sweep"},
        {"name": "t3", "command": "true", "group": "eval"},
        {"name": "t4", "command": "true"},
    ]
    config = workspace / "more.yaml"
    config.write_text(json.dumps({"name": "g", "tasks": tasks}))
    add_tasks(run.root, load_config(config))
    cancel_tasks(run.root, ["t1"], reason="test", wait=None)
    return run


def _groups(served: Served, rid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        groups: dict[str, Any] = served.get(f"/api/runs/{rid}")["view"]["groups"]
        if groups or time.monotonic() > deadline:
            return groups
        time.sleep(0.1)  # the first table is being taken


def test_the_run_json_shows_each_groups_progress(tmp_path: Path) -> None:
    workspace = tmp_path / "runs"
    workspace.mkdir()
    run = _grouped_run(workspace)
    with serve_here([workspace]) as served:
        (listed,) = served.get("/api/runs")["runs"]
        groups = _groups(served, listed["id"])
    assert groups == group_status(run.root)["groups"]  # what status --group --json says
    assert groups["sweep"]["counts"] == {"cancelled": 1, "pending": 1}
    assert (groups["sweep"]["total"], groups["sweep"]["percent"]) == (2, 50.0)
    assert groups["eval"]["percent"] == 0.0 and groups["eval"]["eta_seconds"] is None
