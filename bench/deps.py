"""Dependencies at scale (issue 35): releasing dependents is no scan.

(a) in-process, the store's own path: 100,000 tasks as 1,000 chains of 100 (each task ``after:``
    the one before it in its chain) against a flat queue of 100,000 independent tasks. One
    loop claims (``DirQueue.claim``), commits (``DirQueue.move`` to done, journaled) and, for the
    chains, releases (``store.release.released``: the committer's one call). Reported: the mean
    claim cost of each queue and their ratio (the target: within 1.5x of flat), the release's
    cost per ended task, and the gap from a prerequisite's commit to its dependent being
    claimable (pushed in pending/): p50, p99, max (the target: under 5 ms).
(b) end to end, the real CLI: ``gpuswarm run -q --no-report --gpus sim:C`` over C chains of L
    tasks ``true`` (one slot per chain: a dependent always finds an idle slot), the idle gap from
    each prerequisite's ``finished`` event to its dependent's ``started`` event (p50, p99, max),
    and the run's rate against a flat run of as many tasks; beside them each run's slot
    turnaround (a slot's ``finished`` to its next ``started``: the launch every task costs,
    dependency or not).

usage: python bench/deps.py [--tasks 100000] [--chain 100] [--e2e-chains 4] [--e2e-length 100]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuswarm.core.events import Ev  # noqa: E402
from gpuswarm.core.models import Descriptor, State  # noqa: E402
from gpuswarm.core.paths import RunPaths  # noqa: E402
from gpuswarm.store.ledger import Ledger  # noqa: E402
from gpuswarm.store.queue import DirQueue  # noqa: E402
from gpuswarm.store.release import released  # noqa: E402
from gpuswarm.store.staging import create_layout, write_pending  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _queue(root: Path, tasks: int, chain: int, deps: bool) -> tuple[DirQueue, Ledger]:
    paths = RunPaths(root)
    create_layout(paths)
    chains = tasks // chain
    descs: list[Descriptor] = []
    for i in range(chain):  # the heads first: seq order is claim order
        for c in range(chains):
            after = [f"c{c}-{i - 1}"] if deps and i else []
            task = {"id": f"c{c}-{i}", "priority": 0, "after": after}
            descs.append(Descriptor.new(task, len(descs)))
    write_pending(paths, descs)
    paths.events.touch()
    return DirQueue(paths, durable=False), Ledger(paths.events, durable=False)


def _finished(ledger: Ledger, task: str) -> None:
    ledger.emit(Ev.FINISHED, task=task)


def store_bench(tasks: int, chain: int, deps: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-deps-") as tmp:
        queue, ledger = _queue(Path(tmp), tasks, chain, deps)
        claims: list[float] = []
        releases: list[float] = []
        gaps: list[float] = []
        done = 0
        t_start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            claimed = queue.claim("bench", 0)
            claims.append(time.perf_counter() - t0)
            if claimed is None:
                break
            tid = claimed.task_id
            queue.move(claimed, State.DONE, functools.partial(_finished, ledger, tid))
            t_end = time.perf_counter()
            if deps:
                released(queue, ledger, tid, State.DONE)
                t_rel = time.perf_counter()
                releases.append(t_rel - t_end)
                if not tid.endswith(f"-{chain - 1}"):
                    gaps.append(t_rel - t_end)  # its dependent is claimable from here
            done += 1
        wall = time.perf_counter() - t_start
        ledger.close()
    assert done == tasks, f"{done} of {tasks} tasks ran"
    out: dict[str, Any] = {
        "tasks": tasks,
        "claim_mean_us": round(1e6 * statistics.fmean(claims), 2),
        "claim_p99_us": round(1e6 * _pct(claims, 0.99), 2),
        "wall_s": round(wall, 2),
    }
    if deps:
        out["release_mean_us"] = round(1e6 * statistics.fmean(releases), 2)
        out["gap_p50_ms"] = round(1e3 * _pct(gaps, 0.5), 3)
        out["gap_p99_ms"] = round(1e3 * _pct(gaps, 0.99), 3)
        out["gap_max_ms"] = round(1e3 * max(gaps), 3)
    return out


def _config(path: Path, chains: int, length: int, deps: bool) -> Path:
    tasks = []
    for c in range(chains):
        for i in range(length):
            task: dict[str, Any] = {"name": f"c{c}-{i}", "command": "true"}
            if deps and i:
                task["after"] = f"c{c}-{i - 1}"
            tasks.append(task)
    body = {"name": "deps", "workspace": str(path.parent / "ws"), "tasks": tasks}
    path.write_text(json.dumps(body))
    return path


def e2e_bench(chains: int, length: int, deps: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-deps-e2e-") as tmp:
        config = _config(Path(tmp) / "c.yaml", chains, length, deps)
        cmd = [sys.executable, "-m", "gpuswarm", "run", "-q", "--no-report"]
        cmd += ["--gpus", f"sim:{chains}", str(config)]
        env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
        subprocess.run(cmd, check=True, cwd=tmp, env=env, capture_output=True)
        (events,) = Path(tmp, "ws").glob("deps/*/events.jsonl")
        lines = [json.loads(x) for x in events.read_text().splitlines() if x.strip()]
    ended = {e["task"]: e["ts"] for e in lines if e.get("ev") == "finished"}
    started = {e["task"]: e["ts"] for e in lines if e.get("ev") == "started"}
    span = max(ended.values()) - min(started.values())
    out: dict[str, Any] = {"tasks": chains * length, "rate_per_s": round(len(ended) / span, 1)}
    turns = _turnarounds(lines)  # a slot's end to its next start: what any task costs
    out["turnaround_p50_ms"] = round(1e3 * _pct(turns, 0.5), 2)
    out["turnaround_p99_ms"] = round(1e3 * _pct(turns, 0.99), 2)
    if deps:
        gaps = [
            started[f"c{c}-{i}"] - ended[f"c{c}-{i - 1}"]
            for c in range(chains)
            for i in range(1, length)
        ]
        out["gap_p50_ms"] = round(1e3 * _pct(gaps, 0.5), 2)
        out["gap_p99_ms"] = round(1e3 * _pct(gaps, 0.99), 2)
        out["gap_max_ms"] = round(1e3 * max(gaps), 2)
    return out


def _turnarounds(lines: list[dict[str, Any]]) -> list[float]:
    last_end: dict[str, float] = {}
    out: list[float] = []
    for e in lines:
        if e.get("ev") == "finished":
            last_end[e["slot"]] = e["ts"]
        elif e.get("ev") == "started" and e["slot"] in last_end:
            out.append(e["ts"] - last_end.pop(e["slot"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--chain", type=int, default=100)
    ap.add_argument("--e2e-chains", type=int, default=4)
    ap.add_argument("--e2e-length", type=int, default=100)
    args = ap.parse_args()
    flat = store_bench(args.tasks, args.chain, deps=False)
    chains = store_bench(args.tasks, args.chain, deps=True)
    ratio = chains["claim_mean_us"] / flat["claim_mean_us"]
    result = {
        "store": {"flat": flat, "chains": chains, "claim_ratio": round(ratio, 2)},
        "e2e": {
            "flat": e2e_bench(args.e2e_chains, args.e2e_length, deps=False),
            "chains": e2e_bench(args.e2e_chains, args.e2e_length, deps=True),
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
