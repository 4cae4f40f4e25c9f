"""``api.slot_count``: as planned, or for a cluster's run the slots its supervisor has now
(research sizes its rounds by it: nodes join and leave)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuswarm.app import api
from gpuswarm.store.runs import NewRun, create_run


def _run(tmp_path: Path, backend: str, events: list[dict[str, Any]]) -> api.RunPaths:
    info = {"name": "c", "slot_count": 4, "config": {"backend": backend}}
    paths = create_run(NewRun("c", tmp_path, info, []))
    with paths.events.open("a") as fh:
        for e in events:
            fh.write(json.dumps({"ts": 1.0, **e}) + "\n")
    return paths


def test_a_cluster_run_counts_the_slots_its_supervisor_has_now(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = [
        {"ev": "supervisor_started", "slots": ["a-gpu0", "a-gpu1"]},
        {"ev": "slots", "change": "joined", "slots": ["b-gpu0", "b-gpu1", "b-gpu2"]},
        {"ev": "slots", "change": "left", "slots": ["a-gpu0", "a-gpu1"]},
        {"ev": "slots", "change": "preflight_failed", "slots": ["b-gpu2"]},
    ]
    assert api.slot_count(_run(tmp_path / "1", "ray", events)) == 2
    stopped: list[dict[str, Any]] = [*events, {"ev": "supervisor_stopped"}]  # none live: planned
    assert api.slot_count(_run(tmp_path / "2", "ray", stopped)) == 4
    assert api.slot_count(_run(tmp_path / "3", "ray", [])) == 4  # none started yet


def test_a_local_run_counts_what_it_was_planned_with(tmp_path: Path) -> None:
    events = [{"ev": "supervisor_started", "slots": ["gpu0"]}]
    assert api.slot_count(_run(tmp_path, "local", events)) == 4
