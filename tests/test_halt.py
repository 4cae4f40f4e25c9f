"""The halt (issue 28): GNU parallel's --halt specs parsed, the count that meets them, and the
supervisor that stops claiming (soon) or stops what runs (now). In process, real subprocesses."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.app.control import add_tasks, retry_tasks
from gpuswarm.config.halt import HaltRule, canonical_halt, parse_halt
from gpuswarm.config.load import load_command_list
from gpuswarm.config.models import TaskSpec
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.supervise.halt import Halt
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig

PY = sys.executable


@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        ("now,fail=1", HaltRule("now", "fail", 1)),
        ("soon,fail=3", HaltRule("soon", "fail", 3)),
        (" Soon, fail=10% ", HaltRule("soon", "fail", 10, percent=True)),
        ("now,success=1", HaltRule("now", "success", 1)),
        ("soon,done=50%", HaltRule("soon", "done", 50, percent=True)),
        ("2", HaltRule("now", "fail", 1)),  # GNU parallel's old numeric forms
        ("1", HaltRule("soon", "fail", 1)),
        ("-2", HaltRule("now", "success", 1)),
        ("20%", HaltRule("soon", "fail", 20, percent=True)),
    ],
)
def test_gnu_parallel_specs_parse_to_their_rule(spec: str, rule: HaltRule) -> None:
    assert parse_halt(spec) == rule
    assert parse_halt(rule.text) == rule  # the canonical text reads back the same


@pytest.mark.parametrize(
    "spec", ["soon", "later,fail=1", "now,fail=0", "now,fail=1.5", "now,fail=0%", "now,oops=2"]
)
def test_a_bad_spec_says_what_is_accepted(spec: str) -> None:
    with pytest.raises(ValueError, match=r"now,fail=1"):
        parse_halt(spec)


def test_never_and_zero_turn_it_off() -> None:
    assert parse_halt("never") is None and parse_halt("0") is None
    assert canonical_halt("never") is None and canonical_halt(2) == "now,fail=1"
    with pytest.raises(ValueError):
        canonical_halt(True)


def test_a_percentage_is_of_the_tasks_rounded_up_and_at_least_one() -> None:
    rule = HaltRule("soon", "fail", 10, percent=True)
    assert [rule.threshold(n) for n in (0, 5, 10, 11, 400)] == [1, 1, 1, 2, 40]


def _queue(tmp_path: Path, n: int) -> tuple[DirQueue, Ledger]:
    tasks = [
        TaskSpec(id=f"t{i}", name=f"t{i}", command=["true"]).model_dump(mode="json")
        for i in range(n)
    ]
    paths = create_run(NewRun("h", tmp_path, {"name": "h"}, tasks))
    return DirQueue(paths, durable=False), Ledger(paths.events)


def test_skipped_and_cancelled_tasks_never_count(tmp_path: Path) -> None:
    queue, ledger = _queue(tmp_path, 4)
    soon: list[bool] = []
    halt = Halt("soon,done=2", queue, ledger, on_soon=lambda: soon.append(True), on_now=print)
    for state in (State.SKIPPED, State.CANCELLED, State.SKIPPED, State.DONE):
        halt.ended(state)
    assert not halt.draining and not soon and halt.may_claim(0)
    halt.ended(State.FAILED)
    assert halt.draining and soon == [True] and not halt.may_claim(0)
    assert halt.reason == "halt: 2 tasks ended (halt soon,done=2)"
    (event,) = [e for e in read_events(queue.paths.events) if e["ev"] == "halted"]
    assert event["spec"] == "soon,done=2" and event["count"] == 2


def test_a_task_retried_by_hand_that_fails_again_is_one_failed_task(tmp_path: Path) -> None:
    """halt x retry: ``gpuswarm retry`` of a failed task on a live run starts a fresh series;
    its second failure is the same task ("halt: 2 tasks failed" after one task failed twice
    was wrong). A resume counts anew (another Halt)."""
    queue, ledger = _queue(tmp_path, 4)
    halt = Halt("soon,fail=2", queue, ledger, on_soon=print, on_now=print)
    halt.ended(State.FAILED, "t0")
    halt.ended(State.FAILED, "t0")  # retried by hand, failed again
    assert not halt.draining and halt.may_claim(0)
    halt.ended(State.FAILED, "t1")
    assert halt.reason == "halt: 2 tasks failed (halt soon,fail=2)"


def test_outcomes_not_committed_yet_hold_a_claim_back_near_the_threshold(tmp_path: Path) -> None:
    queue, ledger = _queue(tmp_path, 10)
    halt = Halt("now,fail=2", queue, ledger, on_soon=print, on_now=print)
    assert halt.may_claim(1)
    assert not halt.may_claim(2)  # two uncommitted outcomes could both be failures
    halt.ended(State.FAILED)
    assert halt.may_claim(0) and not halt.may_claim(1)


def _supervisor(
    tmp_path: Path, tasks: list[dict[str, Any]], halt: str, gpus: int = 2
) -> tuple[Supervisor, RunPaths]:
    paths = create_run(NewRun("halt", tmp_path, {"name": "halt"}, tasks))
    slots = plan_slots(parse_gpu_spec(f"sim:{gpus}"))
    cfg = SupervisorConfig(
        slots, tmp_path, owner="test:1:1", heartbeat=0.2, retry_backoff=0.05, halt=halt
    )
    return Supervisor(paths, DirQueue(paths, durable=False), Ledger(paths.events), cfg), paths


def _task(tid: str, code: str, **kw: Any) -> dict[str, Any]:
    return TaskSpec(id=tid, name=tid, command=[PY, "-c", code], **kw).model_dump(mode="json")


def _counts(paths: RunPaths) -> dict[str, int]:
    return {s.value: n for s, n in DirQueue(paths).counts().items() if n}


def test_soon_fail_n_starts_at_most_n_plus_slots_attempts(tmp_path: Path) -> None:
    tasks = [_task(f"f{i:02d}", "raise SystemExit(1)") for i in range(30)]
    sup, paths = _supervisor(tmp_path, tasks, "soon,fail=3", gpus=3)
    sup.run()
    started = [e for e in read_events(paths.events) if e["ev"] == "started"]
    assert 3 <= len(started) <= 3 + 3 - 1, len(started)
    counts = _counts(paths)
    assert counts["failed"] == len(started) and counts["pending"] == 30 - len(started)
    assert sup.halt.reason == "halt: 3 tasks failed (halt soon,fail=3)"
    assert not sup.stopping.is_set()  # soon: what ran ended as itself, nothing was stopped


def test_a_task_with_attempts_left_is_no_failed_task_yet(tmp_path: Path) -> None:
    tasks = [_task("flaky", "raise SystemExit(1)", max_attempts=3)]
    tasks += [_task(f"ok{i}", "pass") for i in range(3)]
    sup, paths = _supervisor(tmp_path, tasks, "now,fail=1", gpus=1)
    sup.run()
    finished = [e for e in read_events(paths.events) if e["ev"] == "finished"]
    assert [e["task"] for e in finished if e["task"] == "flaky"] == ["flaky"] * 3
    assert sup.halt.reason == "halt: 1 task failed (halt now,fail=1)"


def test_now_stops_the_running_attempts_and_puts_them_back_uncounted(tmp_path: Path) -> None:
    tasks = [_task("bad", "import time; time.sleep(0.3); raise SystemExit(1)")]
    tasks += [_task(f"slow{i}", "import time; time.sleep(60)") for i in range(4)]
    sup, paths = _supervisor(tmp_path, tasks, "now,fail=1", gpus=3)
    sup.run()
    assert _counts(paths) == {"failed": 1, "pending": 4}
    for _, desc in DirQueue(paths).iter_state(State.PENDING):
        assert all(a.get("interrupted") for a in desc["attempts"])  # no attempt counted
        if desc["attempts"]:
            reason = desc["attempts"][-1]["reason"]
            assert reason.startswith("interrupted by halt: 1 task failed"), reason
            assert "cancelled" not in reason
    assert sup.shared.requeued == 2


def test_work_added_or_retried_after_a_soon_halt_waits_for_a_resume(tmp_path: Path) -> None:
    """halt x the live wake (issue 28 items 4 and 7): ``add`` and ``retry`` touch the added
    marker, which wakes the loop at once; a loop that has met its halt claims nothing more, so
    the new work stays pending while the long task finishes."""
    gate = tmp_path / "gate"
    long = f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    tasks = [_task("long", long), _task("bad", "raise SystemExit(1)")]
    sup, paths = _supervisor(tmp_path, tasks, "soon,fail=1")
    runner = threading.Thread(target=sup.run)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while sup.halt.reason is None or not _counts(paths).get("failed"):
            assert time.monotonic() < deadline, "the failing task never met the halt"
            time.sleep(0.02)
        loaded = load_command_list(None, "true\n", shell=True, base_dir=tmp_path)
        assert add_tasks(paths.root, loaded)["added"] == 1
        assert retry_tasks(paths.root, ["bad"], failed=False, cancelled=False)["retried"] == 1
        time.sleep(1.0)  # four of the keeper's looks at the marker: a woken loop would claim
        assert runner.is_alive() and not gate.exists()
    finally:
        gate.touch()
        runner.join(60)
    assert not runner.is_alive()
    started = sorted(e["task"] for e in read_events(paths.events) if e["ev"] == "started")
    assert started == ["bad", "long"], started
    assert _counts(paths) == {"done": 1, "pending": 2}
