"""``/metrics`` has each group's tasks per state (issue 35): ``gpuswarm_group_tasks{run, group,
state}``, counted as ``gpuswarm status --group --json`` counts them, parsed back with
prometheus_client's own parser."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuswarm.app import api
from gpuswarm.app.control import add_tasks, cancel_tasks
from gpuswarm.config.load import load_config
from gpuswarm.metrics.collector import SwarmCollector
from gpuswarm.metrics.sources import Sources
from gpuswarm.outputs.groups import group_status


def test_group_series_count_each_groups_tasks_per_state(tmp_path: Path) -> None:
    spec = api.NewRunSpec(workspace=tmp_path, folder="g", name="g", base_dir=tmp_path,
                          gpus=api.plan_gpus("sim:1"), source="test")  # fmt: skip
    run = api.create_run(spec)
    tasks = [
        {"name": "s1", "command": "true", "group": "sweep"},
        {"name": "s2", "command": "true", "group": "sweep"},
        {"name": "e1", "command": "true", "group": "eval"},
        {"name": "free", "command": "true"},
    ]
    config = tmp_path / "more.yaml"
    config.write_text(json.dumps({"name": "g", "tasks": tasks}))
    add_tasks(run.root, load_config(config))
    cancel_tasks(run.root, ["s1"], reason="test", wait=None)
    registry = CollectorRegistry()
    registry.register(SwarmCollector(Sources([tmp_path])))
    text = generate_latest(registry).decode()
    found = {
        (s.labels["group"], s.labels["state"]): s.value
        for f in text_string_to_metric_families(text)
        if f.name == "gpuswarm_group_tasks"
        for s in f.samples
    }
    assert found == {("sweep", "cancelled"): 1, ("sweep", "pending"): 1, ("eval", "pending"): 1}
    table = group_status(run.root)["groups"]
    assert {(g, st): n for g, t in table.items() for st, n in t["counts"].items()} == found
