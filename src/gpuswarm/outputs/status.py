"""Read-only views of runs: ``gpuswarm status`` and ``gpuswarm ls``.

Status never scans more than it must: counts come from folder listings, the ETA from the tail
of events.jsonl, and only running and (the latest) failed descriptors are read.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from gpuswarm.core.fsutil import read_json
from gpuswarm.core.logs import log_tail
from gpuswarm.core.paths import RunPaths, find_runs
from gpuswarm.exec.sandbox import redact_text
from gpuswarm.outputs.results import STOPPED, UNFINISHED, WITH_FAILURES, end_state, shown_counts
from gpuswarm.store.leases import is_live, slot_label
from gpuswarm.store.ledger import tail_events
from gpuswarm.store.queue import DirQueue, State, base_name, lease_of, task_id_of
from gpuswarm.store.runs import open_run
from gpuswarm.supervise.breaker import lift_by_hand, read_quarantines
from gpuswarm.ui.live import attempt_number

MAX_FAILURES = 20


def _running(queue: DirQueue, now: float) -> list[dict[str, Any]]:
    out = []
    for name in queue.names(State.RUNNING):
        path = queue.paths.state_dir("running") / name
        data = queue.read(State.RUNNING, name) or {}
        lease = lease_of(name)
        try:
            since = path.stat().st_mtime
        except FileNotFoundError:
            continue
        attempt = attempt_number(data)
        out.append(
            {
                "task": data.get("id", task_id_of(name)),
                "name": data.get("task", {}).get("name", ""),
                "owner": lease[0] if lease else None,
                "host": lease[0].split(":", 1)[0] if lease else None,
                "slot": slot_label(queue.paths, *lease) if lease else None,  # unique in the run
                "attempt": attempt,
                "elapsed": round(now - since, 1),
                "timeout": data.get("task", {}).get("timeout"),
                "log": str(queue.paths.attempt_log(data["id"], attempt)) if "id" in data else None,
            }
        )
    return sorted(out, key=lambda r: (r["slot"] is None, r["slot"] or ""))


def _failures(queue: DirQueue, limit: int = MAX_FAILURES) -> list[dict[str, Any]]:
    failed_dir = queue.paths.state_dir("failed")
    entries = sorted(
        (e for e in os.scandir(failed_dir) if not e.name.startswith(".")),
        key=lambda e: e.stat().st_mtime,
        reverse=True,
    )[:limit]
    out = []
    for entry in entries:
        data = queue.read(State.FAILED, entry.name) or {}
        attempts = data.get("attempts", [])
        task_id = data.get("id", task_id_of(base_name(entry.name)))
        log = queue.paths.attempt_log(task_id, attempts[-1]["n"]) if attempts else None
        out.append(
            {
                "task": task_id,
                "name": data.get("task", {}).get("name", ""),
                "attempts": len(attempts),
                "reason": data.get("reason") or "",
                "log": str(log) if log else None,
                "log_tail": _redacted_tail(log, data),
            }
        )
    return out


def _redacted_tail(log: Path | None, data: dict[str, Any]) -> str:
    """A log tail with the values of secret-looking variables (task's and ours) blanked."""
    if log is None or not log.exists():
        return ""
    env = {**os.environ, **data.get("task", {}).get("env", {})}
    return redact_text(log_tail(log, max_lines=8), env)


def _eta(paths: RunPaths, pending: int, running: int, slots: int) -> dict[str, Any]:
    durations = [
        float(e["seconds"])
        for e in tail_events(paths.events)
        if e.get("ev") == "finished" and e.get("state") == "done" and "seconds" in e
    ]
    if not durations or slots <= 0:
        return {"mean_seconds": None, "eta_seconds": None}
    mean = statistics.fmean(durations)
    remaining = pending + running / 2
    return {"mean_seconds": round(mean, 3), "eta_seconds": round(remaining * mean / slots, 1)}


def run_status(run_dir: Path) -> dict[str, Any]:
    paths, info = open_run(run_dir)
    queue = DirQueue(paths)
    now = time.time()
    counts = shown_counts({s.value: n for s, n in queue.counts().items()})
    slots = int(info.get("slot_count") or 1)
    live = is_live(paths)
    return {
        "run": str(paths.root),
        "name": info.get("name", ""),
        "created": info.get("created"),
        "live": live,
        "state": (state := run_state(paths, counts, live)),
        "hint": _hint(paths, state),
        "gpus": info.get("gpus"),
        "counts": counts,
        "total": sum(counts.values()),
        "running": _running(queue, now),
        "failures": _failures(queue),
        "eta": _eta(paths, counts["pending"], counts["running"], slots) if live else None,
        "corrupt": sorted(p.name for p in paths.corrupt.iterdir())
        if paths.corrupt.is_dir()
        else [],
        "quarantined": _quarantined(paths, live),
    }


def _hint(paths: RunPaths, state: str) -> str:
    """What to do about a run in ``state`` (empty when nothing is needed)."""
    if state == CRASHED:
        return (
            "its supervisor is gone (killed or crashed): the running rows are stale leases; "
            f"finish it with: gpuswarm resume {paths.root}"
        )
    if state in (STOPPED, UNFINISHED, WITH_FAILURES):
        return f"finish it with: gpuswarm resume {paths.root}"
    return ""


def _quarantined(paths: RunPaths, live: bool) -> list[dict[str, Any]]:
    """Slots out of rotation: a live run's quarantine files, else what its summary recorded."""
    if live:
        return [{k: v for k, v in q.items() if k != "file"} for q in read_quarantines(paths)]
    try:
        summary = read_json(paths.summary_json)
    except (OSError, ValueError):
        return []
    found = summary.get("quarantined") if isinstance(summary, dict) else None
    return [q for q in found or [] if isinstance(q, dict) and not q.get("lifted")]


def lift_quarantine(run_dir: Path, slot: str | None) -> list[dict[str, Any]]:
    """``gpuswarm unquarantine``: remove the quarantine files of a live run's slot(s)."""
    paths, _ = open_run(run_dir)
    return lift_by_hand(paths, slot)


LIVE, CRASHED = "live", "crashed"


def run_state(paths: RunPaths, counts: dict[str, int], live: bool) -> str:
    """live, crashed (no supervisor, yet tasks in running/: its owner died), or how the last
    supervisor ended (summary.json: complete, finished with failures, stopped, unfinished)."""
    if live:
        return LIVE
    if counts.get("running", 0) > 0:
        return CRASHED
    try:
        summary = read_json(paths.summary_json)
    except (OSError, ValueError):
        summary = None
    stopped = isinstance(summary, dict) and bool(summary.get("stopped"))
    left = counts.get("pending", 0) > 0
    if left and not isinstance(summary, dict):
        return CRASHED if _ever_started(paths) else UNFINISHED
    return end_state(counts, stopped and left)


def _ever_started(paths: RunPaths) -> bool:
    return any(e.get("ev") == "supervisor_started" for e in tail_events(paths.events))


def list_runs(workspace: Path) -> list[dict[str, Any]]:
    out = []
    for run in find_runs(workspace):
        paths = RunPaths(run)
        try:
            counts = shown_counts({s.value: n for s, n in DirQueue(paths).counts().items()})
            unusable = _empty_descriptors(paths)
        except OSError:
            continue
        for state, n in unusable.items():  # a descriptor truncated to 0 bytes is no task done
            counts[state] -= n
        counts["corrupt"] = sum(unusable.values()) + _corrupt_count(paths)
        out.append(
            {
                "run": str(run),
                "name": run.parent.name,
                "live": (live := is_live(paths)),
                "state": run_state(paths, counts, live),
                "counts": counts,
                "total": sum(counts.values()),
            }
        )
    return out


def _empty_descriptors(paths: RunPaths) -> dict[str, int]:
    """Descriptors truncated to 0 bytes, per state folder (one stat each: cheap for ``ls``;
    other damage is found by ``check``, ``report`` and the end-of-run summary)."""
    out: dict[str, int] = {}
    for state in (State.DONE, State.FAILED):
        with os.scandir(paths.state_dir(state.value)) as it:
            n = sum(1 for e in it if not e.name.startswith(".") and e.stat().st_size == 0)
        if n:
            out[state.value] = n
    return out


def _corrupt_count(paths: RunPaths) -> int:
    try:
        return sum(1 for name in os.listdir(paths.corrupt) if not name.startswith("."))
    except OSError:
        return 0
