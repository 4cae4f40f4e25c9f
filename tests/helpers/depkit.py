"""What the dependency tests through the real CLI share (issue 35): a config file, the run
folder, and where each task is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_driver import find_runs

from gpuswarm.core.paths import STATES


def deps_yaml(path: Path, tasks: list[dict[str, Any]], **top: Any) -> Path:
    """A config (JSON is YAML) of ``tasks`` on sim:2 with its runs under ``ws``."""
    path.write_text(json.dumps({"name": "deps", "workspace": "ws", "gpus": "sim:2", **top,
                                "tasks": tasks}))  # fmt: skip
    return path


def run_dir(tmp_path: Path) -> Path:
    """The one run under ``tmp_path/ws``."""
    (run,) = find_runs(tmp_path / "ws")
    return run


def task_states(run: Path) -> dict[str, str]:
    """task id -> its one state folder (every state: blocked and dependency_failed too; a task
    in two is a failure)."""
    out: dict[str, str] = {}
    for state in STATES:
        for path in (run / ".parallel" / state).iterdir():
            if not path.name.startswith("."):
                task = json.loads(path.read_text())["id"]
                assert task not in out, f"{task} in {out[task]} and {state}"
                out[task] = state
    return out
