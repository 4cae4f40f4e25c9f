"""Scenario 1d: ``gpuswarm cancel`` racing the end of the attempt it was made for (issue 28).

A live supervisor (in process, two sim slots, real processes) runs tasks whose first attempt
fails after a random short while and whose second succeeds; a canceller of its own process
(canceller.py: ``control_ops.cancel_tasks``, what ``gpuswarm cancel`` calls) cancels each task
at a random moment around its first attempt's end, so many requests land as the attempt ends,
before the supervisor's keeper applies them. Half the races run with retries straight back to
pending/, half with retries waiting out a backoff in running/. Then, as a person would,
``gpuswarm retry --failed --cancelled`` and a resume (recover + a new supervisor).

Invariants: a cancel is applied only to the attempt it was made for (the request's attempt, or
the retry that waited, never one that follows an outcome that counts), so no retry is lost:
every task whose cancel call ended before its first attempt's failure was journaled starts a
second attempt; every task ends done or cancelled; after the retry and resume every task is
done, no request is left, and ``gpuswarm check`` finds the run consistent.
``GPUSWARM_CHAOS_CANCEL_RACES`` sets the number of races (default 200).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import HERE, PY, scale
from invariants import cli_check

import gpuswarm
from gpuswarm.app.control import retry_tasks
from gpuswarm.config.models import TaskSpec
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.store import control
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.supervise.recovery import recover
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig

pytestmark = pytest.mark.slow

RACES = scale(200, "GPUSWARM_CHAOS_CANCEL_RACES")
SRC = str(Path(gpuswarm.__file__).resolve().parents[1])


def _tasks(
    rng: random.Random, prefix: str, count: int
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Tasks whose attempt 1 fails after 60-200 ms (attempt 2 exits 0 at once), and when to
    cancel each: from 100 ms before that end to 30 ms after it, counted from when it is first
    seen running (a person's cancel fsyncs its request: the canceller does ~25 a second, so
    two slots, not more, feed it)."""
    tasks, plan = [], {}
    for i in range(count):
        tid = f"{prefix}{i:03d}"
        run_for = round(rng.uniform(0.06, 0.2), 3)
        script = f'[ "$GPUSWARM_ATTEMPT" -gt 1 ] || {{ sleep {run_for}; exit 1; }}'
        spec = TaskSpec(id=tid, name=tid, command=["/bin/sh", "-c", script], max_attempts=2)
        tasks.append(spec.model_dump(mode="json"))
        plan[tid] = max(0.0, round(run_for + rng.uniform(-0.1, 0.03), 3))
    return tasks, plan


def _supervise(tmp_path: Path, paths: RunPaths, owner: str, backoff: float) -> None:
    slots = plan_slots(parse_gpu_spec("sim:2"))
    cfg = SupervisorConfig(
        slots, tmp_path, owner=owner, heartbeat=0.5, retry_backoff=backoff, breaker_failures=0
    )
    Supervisor(paths, DirQueue(paths, durable=False), Ledger(paths.events), cfg).run()


def _race(
    tmp_path: Path, name: str, rng: random.Random, count: int, backoff: float
) -> dict[str, Any]:
    """One run of ``count`` races; returns its figures (asserting the invariants)."""
    tasks, plan = _tasks(rng, f"{name}-", count)
    paths = create_run(NewRun(name, tmp_path / "ws", {"name": name}, tasks))
    plan_file, out, stop = (
        tmp_path / f"{name}.plan",
        tmp_path / f"{name}.out",
        tmp_path / f"{name}.stop",
    )
    plan_file.write_text(json.dumps(plan))
    out.touch()
    canceller = subprocess.Popen(
        [PY, str(HERE / "canceller.py"), str(paths.root), str(plan_file), str(out), str(stop)],
        env={**os.environ, "PYTHONPATH": SRC},
    )
    try:
        deadline = time.monotonic() + 60
        while not stop.exists():  # it is ready (imported, listing): the run may start
            assert canceller.poll() is None and time.monotonic() < deadline, "no canceller"
            time.sleep(0.01)
        stop.unlink()
        runner = threading.Thread(target=_supervise, args=(tmp_path, paths, f"{name}:1:1", backoff))
        runner.start()
        runner.join(240)
        assert not runner.is_alive(), "the supervisor did not end"
    finally:
        stop.touch()
        assert canceller.wait(60) == 0
    calls = {c["task"]: c for c in map(json.loads, out.read_text().splitlines())}
    events = list(read_events(paths.events))
    figures = _check_race(paths, calls, events)

    # what a person does next: retry what did not end done, then resume
    retried = retry_tasks(paths.root, [], failed=True, cancelled=True)["retried"]
    assert recover(DirQueue(paths), Ledger(paths.events), retry_failed=False)["cancelled"] == 0
    _supervise(tmp_path, paths, f"{name}:2:2", backoff)
    final = _states(paths)
    assert set(final.values()) == {"done"}, Counter(final.values())
    assert control.requests(paths) == []
    starts = Counter(
        e["task"] for e in list(read_events(paths.events))[len(events) :] if e["ev"] == "started"
    )
    assert sum(starts.values()) == retried and all(n == 1 for n in starts.values()), starts
    report = cli_check(paths.root)
    assert report is None or report["exit_code"] == 0, report
    return {**figures, "retried": retried}


def _states(paths: RunPaths) -> dict[str, str]:
    q = DirQueue(paths)
    return {data["id"]: s.value for s in State for _, data in q.iter_state(s)}


def _check_race(
    paths: RunPaths, calls: dict[str, dict[str, Any]], events: list[dict[str, Any]]
) -> dict[str, Any]:
    q = DirQueue(paths)
    descs = {d.id: d for s in State for _, d in q.iter_descs(s)}
    states = {tid: str(d.state) for tid, d in descs.items()}
    assert set(states.values()) <= {"done", "cancelled"}, Counter(states.values())
    first_end = {
        e["task"]: float(e["ts"]) for e in events if e["ev"] == "finished" and e.get("attempt") == 1
    }
    second = {e["task"] for e in events if e["ev"] == "started" and e.get("attempt") == 2}
    lost, wrong = [], []
    for tid, call in calls.items():
        # a cancel that was asked (and returned) before attempt 1's failure was journaled is
        # for attempt 1: it either stopped attempt 1, or came too late and the retry ran
        attempts = descs[tid].attempts
        stopped_first = bool(attempts) and attempts[0].kind == "cancelled"
        if call["t1"] < first_end.get(tid, 0.0) and not stopped_first and tid not in second:
            lost.append(tid)
        bound = call["row"].get("attempt")
        if states[tid] == "cancelled" and bound is not None:
            after = [a for a in descs[tid].attempts if a.n >= bound]
            if any(a.counted and a.kind != "cancelled" for a in after):
                wrong.append((tid, bound, [a.kind for a in descs[tid].attempts]))
    assert not lost, (
        f"{len(lost)} retries lost (cancelled for an attempt that had failed): {lost[:10]}"
    )
    assert not wrong, f"cancels applied past their attempt: {wrong[:10]}"
    controls = [e for e in events if e["ev"] == "control" and e.get("request") == "cancel"]
    applied = sum(1 for e in controls if e.get("state") == "cancelled")
    late = sum(1 for e in controls if str(e.get("dropped", "")).startswith("too late"))
    return {"races": len(calls), "applied": applied, "too_late": late, "lost": len(lost)}


@pytest.mark.trials(1)
@pytest.mark.timeout(600)
def test_a_cancel_racing_its_attempts_end_never_loses_the_retry(
    tmp_path: Path, figures: Callable[..., None], seed: int
) -> None:
    rng = random.Random(seed)
    half = max(1, RACES // 2)
    straight = _race(tmp_path, "straight", rng, half, backoff=0)
    waiting = _race(tmp_path, "waiting", rng, max(1, RACES - half), backoff=0.3)
    total = {k: straight[k] + waiting[k] for k in straight}
    print(f"seed={seed}: {total}")
    assert total["races"] >= RACES * 0.9, total  # the canceller saw (nearly) every task run
    assert total["applied"] > 0 and total["too_late"] > 0, f"no race happened: {total}"
    figures("1d cancel racing the attempt's end", faults=0, **total)
