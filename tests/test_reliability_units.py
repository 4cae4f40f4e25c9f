"""Leases, reclaim, check/repair, log bounds and the slot breaker, in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.app.inspection import check_run_dir as check_run
from gpuswarm.config.models import TaskSpec
from gpuswarm.core.events import Ev
from gpuswarm.core.logs import cap_log
from gpuswarm.core.models import State
from gpuswarm.core.models.budget import MAX_LOST
from gpuswarm.core.paths import RunPaths
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.store.leases import attach, is_live, owner_alive, owner_id, write_owner_file
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.supervise.recovery import reclaim_dead
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig

DEAD = "nohost-that-exists:999999:1"


def spec(tid: str, code: str = "pass", **kw: Any) -> dict[str, Any]:
    return TaskSpec(id=tid, name=tid, command=[sys.executable, "-c", code], **kw).model_dump(
        mode="json"
    )


def new_run(tmp_path: Path, tasks: list[dict[str, Any]]) -> RunPaths:
    info = {"name": "rel", "task_count": len(tasks)}
    return create_run(NewRun("rel", tmp_path, info, tasks))


def started(paths: RunPaths, q: DirQueue, owner: str, n: int) -> list[str]:
    """Claim n tasks as ``owner`` and journal their start, as a supervisor would."""
    names = []
    ledger = Ledger(paths.events)
    for _ in range(n):
        c = q.claim(owner, 0)
        assert c is not None
        ledger.emit(Ev.STARTED, task=c.task_id, attempt=1, slot="gpu0")
        names.append(c.name)
    ledger.close()
    return names


def test_owner_liveness(tmp_path: Path) -> None:
    paths = new_run(tmp_path, [spec("a")])
    me = owner_id()
    assert owner_alive(paths, me, lease_ttl=1)
    dead_here = me.rsplit(":", 2)[0] + ":999999:1"
    assert not owner_alive(paths, dead_here, lease_ttl=1000)
    write_owner_file(paths, DEAD, {})
    assert owner_alive(paths, DEAD, lease_ttl=1000)  # other host: fresh heartbeat
    assert not owner_alive(paths, DEAD, lease_ttl=0.0)  # heartbeat too old


def test_reclaim_never_charges_a_supervisors_death(tmp_path: Path) -> None:
    """Issue 28.5: a reclaimed task's lost attempt is free, as on resume (max_attempts 1 and a
    dead owner: back to pending/, interrupted), by the one rule ``Descriptor.lost_is_free``."""
    paths = new_run(tmp_path, [spec("once"), spec("twice", max_attempts=2)])
    q = DirQueue(paths, durable=False)
    started(paths, q, DEAD, 2)
    ledger = Ledger(paths.events)
    assert reclaim_dead(q, ledger, owner_id(), lease_ttl=1.0) == 2
    assert reclaim_dead(q, ledger, owner_id(), lease_ttl=1.0) == 0
    ledger.close()
    assert not dict(q.iter_state(State.FAILED))
    pending = {d["id"]: d for _, d in q.iter_state(State.PENDING)}
    assert sorted(pending) == ["once", "twice"]
    for desc in pending.values():
        (lost,) = desc["attempts"]
        assert lost["kind"] == "lost" and lost["interrupted"] and DEAD in lost["reason"], lost
        assert desc["interruptions"] == 1
    assert check_run(paths.root)["consistent"]


def test_the_third_lost_attempt_in_a_row_counts(tmp_path: Path) -> None:
    """A task lost with its supervisor MAX_LOST times in a row (it may be what kills it) has
    that attempt counted: with max_attempts 1 it ends failed ``abandoned``, saying why."""
    paths = new_run(tmp_path, [spec("killer")])
    q = DirQueue(paths, durable=False)
    for round_ in range(MAX_LOST):
        if round_:
            assert len(dict(q.iter_state(State.PENDING))) == 1, round_
        started(paths, q, DEAD, 1)
        ledger = Ledger(paths.events)
        assert reclaim_dead(q, ledger, owner_id(), lease_ttl=1.0) == 1
        ledger.close()
    (failed,) = dict(q.iter_state(State.FAILED)).values()
    kinds = [(a["kind"], bool(a.get("interrupted"))) for a in failed["attempts"]]
    assert kinds == [("lost", True)] * (MAX_LOST - 1) + [("lost", False)], kinds
    assert failed["reason"].startswith("abandoned: lost with its supervisor 3 times in a row")
    assert check_run(paths.root)["consistent"]


def test_a_second_resume_is_refused_while_a_supervisor_is_live(tmp_path: Path) -> None:
    paths = new_run(tmp_path, [spec("a")])
    assert not is_live(paths)
    with attach(paths, exclusive_start=False) as hold:
        hold.end_init()
        assert is_live(paths)
        with attach(paths, exclusive_start=False) as other:  # `work` may join
            other.end_init()
        try:
            with attach(paths, exclusive_start=True):
                raise AssertionError("resume must be refused")
        except Exception as exc:
            assert "is live" in str(exc)
    assert not is_live(paths)


def test_check_finds_and_repairs(tmp_path: Path) -> None:
    paths = new_run(tmp_path, [spec(f"t{i}") for i in range(4)])
    q = DirQueue(paths, durable=False)
    dead_here = owner_id().rsplit(":", 2)[0] + ":999999:1"
    names = started(paths, q, dead_here, 2)
    # a stale temp file, and a duplicate of t1 left in pending/
    (paths.state_dir("pending") / ".tmp-x.json.999999999.2").write_text("{")  # dead writer
    (paths.state_dir("pending") / names[1]).write_text(
        (next(paths.state_dir("running").glob(names[1] + "@*"))).read_text()
    )
    report = check_run(paths.root)
    kinds = sorted({f["kind"] for f in report["findings"]})
    assert not report["consistent"]
    assert kinds == ["duplicate", "stale-lease", "temp-file"]
    fixed = check_run(paths.root, repair=True)
    assert fixed["consistent"], fixed["findings"]
    assert fixed["counts"] == {"pending": 4, "running": 0, "done": 0, "failed": 0}
    # losing a descriptor is reported
    next(paths.state_dir("pending").iterdir()).unlink()
    lost = check_run(paths.root)
    assert not lost["consistent"]
    assert "lost" in {f["kind"] for f in lost["findings"]}


@pytest.mark.slow  # runs the CLI
def test_check_cli_exit_codes(tmp_path: Path) -> None:
    paths = new_run(tmp_path, [spec("a")])
    ok = subprocess.run(
        [sys.executable, "-m", "gpuswarm", "check", "--json", str(paths.root)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["consistent"]
    next(paths.state_dir("pending").iterdir()).unlink()
    bad = subprocess.run(
        [sys.executable, "-m", "gpuswarm", "check", str(paths.root)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1 and "INCONSISTENT" in bad.stdout


def test_cap_log_keeps_head_marker_and_latest_output(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_bytes(b"HEAD" + b"x" * 5000 + b"LATEST")
    assert cap_log(log, 100_000) == 0
    dropped = cap_log(log, 400)
    data = log.read_bytes()
    assert dropped > 4000 and data.startswith(b"HEAD") and data.endswith(b"LATEST")
    assert b"bytes of output dropped" in data and len(data) < 400
    with log.open("ab") as fh:  # the task keeps appending after the cut
        fh.write(b"MORE")
    assert log.read_bytes().endswith(b"LATESTMORE")


def test_breaker_quarantines_a_slot_whose_attempts_keep_failing(tmp_path: Path) -> None:
    """Only the slot whose attempts fail while the same tasks succeed elsewhere (issue 11)."""
    code = (
        "import os, sys, time; time.sleep(0.05); "
        "sys.exit(3 if os.environ['GPUSWARM_HOST_GPU_ID'] == '1' else 0)"
    )
    paths = new_run(tmp_path, [spec(f"f{i}", code, max_attempts=6) for i in range(16)])
    slots = plan_slots(parse_gpu_spec("sim:2"))
    cfg = SupervisorConfig(
        slots, tmp_path, owner_id(), heartbeat=0.2, breaker_failures=3, retry_backoff=0
    )
    sup = Supervisor(paths, DirQueue(paths, durable=False), Ledger(paths.events), cfg)
    sup.run()
    assert [q["slot"] for q in sup.quarantined] == ["gpu1"]
    counts = DirQueue(paths).counts()
    assert counts[State.DONE] == 16
    assert any(e["ev"] == "quarantined" for e in read_events(paths.events))


def test_breaker_blames_no_slot_for_failures_every_slot_sees(tmp_path: Path) -> None:
    paths = new_run(tmp_path, [spec(f"f{i}", "import sys; sys.exit(3)") for i in range(12)])
    slots = plan_slots(parse_gpu_spec("sim:2"))
    cfg = SupervisorConfig(slots, tmp_path, owner_id(), heartbeat=0.2, breaker_failures=3)
    sup = Supervisor(paths, DirQueue(paths, durable=False), Ledger(paths.events), cfg)
    sup.run()
    assert sup.quarantined == []
    assert DirQueue(paths).counts()[State.FAILED] == 12


def test_retry_backoff_doubles(tmp_path: Path) -> None:
    paths = new_run(tmp_path, [spec("a")])
    slots = plan_slots(parse_gpu_spec("sim:1"))
    cfg = SupervisorConfig(slots, tmp_path, owner_id(), retry_backoff=2.0)
    sup = Supervisor(paths, DirQueue(paths), Ledger(paths.events), cfg)
    assert [sup.committer.backoff(n) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]
    assert sup.committer.backoff(30) == 600.0
