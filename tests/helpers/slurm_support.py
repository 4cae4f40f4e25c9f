"""What the Slurm tests share (tests/slurm): the environment of a client of the test cluster,
task files, and reading a run's journal back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurm_cluster import SlurmCluster


def slurm_env(slurm: SlurmCluster, **extra: str) -> dict[str, str]:
    here = Path(__file__).resolve().parents[2]
    env = slurm.client_env({"PYTHONPATH": str(here / "src"), "PYTHONUNBUFFERED": "1"})
    for var in ("GPUSWARM_RUN_DIR", "GPUSWARM_OWNER", "GPUSWARM_ATTEMPT_TOKEN"):
        env.pop(var, None)
    env.update(extra)
    return env


def write_cmds(folder: Path, count: int, seconds: float) -> Path:
    path = folder / "cmds.txt"
    lines = [f"sleep {seconds}; echo task{i} $GPUSWARM_GPU_IDS $(hostname)\n" for i in range(count)]
    path.write_text("".join(lines))
    return path


def write_config(folder: Path, count: int, seconds: float, **extra: Any) -> Path:
    tasks = [{"name": f"t{i:02d}", "command": f"sleep {seconds}", **extra} for i in range(count)]
    cfg = {"name": "slurmrun", "reliability": {"lease_ttl": 3}, "tasks": tasks}
    path = folder / "run.yaml"
    path.write_text(json.dumps(cfg))  # YAML is a superset of JSON
    return path


def only_run(workspace: Path) -> Path:
    found = sorted(workspace.glob("*/run_*"))
    assert len(found) == 1, found
    return found[0]


def events_of(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line]


def hosts_of_done(run: Path) -> dict[str, str]:
    """task -> the host of the slot it finished on (from the journal)."""
    slots = {}
    for ev in events_of(run):
        if ev.get("ev") == "started":
            slots[ev["task"]] = ev.get("slot", "")
    return {t: s.split("-gpu")[0] for t, s in slots.items()}


def is_done(ev: dict[str, Any]) -> bool:
    return ev.get("ev") == "finished" and ev.get("state") == "done"


def cut_short(ev: dict[str, Any]) -> bool:
    return ev.get("ev") == "finished" and ev.get("state") != "done"


def summary_of(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return data


def done_once(run: Path, count: int) -> None:
    """Every task done, each finished exactly once (nothing finished ran again)."""
    done = [ev["task"] for ev in events_of(run) if is_done(ev)]
    assert len(done) == count == len(set(done)), done
    assert summary_of(run)["counts"]["done"] == count
