"""Pure logic: metrics parsing, result files, aggregation, the event journal, run creation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuswarm.core.events import Ev
from gpuswarm.core.metrics import ResultFileError, flatten, load_result_file, parse_metrics
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths, check_task_id, slugify
from gpuswarm.outputs.fieldstats import field_stats
from gpuswarm.outputs.results import collect, to_tsv
from gpuswarm.store.ledger import Ledger, read_events, tail_events
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run, latest_run


def test_metrics_last_match_wins_and_carriage_returns(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_bytes(
        b"step 1\rval_bpb: 1.50\rval_bpb: 1.25\n---\nval_bpb:   0.997900\npeak_vram_mb: 45060.2\n"
    )
    got = parse_metrics(
        log, {"val_bpb": r"^val_bpb:\s*([0-9.]+)", "mem": r"^peak_vram_mb:\s*(\S+)"}
    )
    assert got == {"val_bpb": 0.9979, "mem": 45060.2}
    assert parse_metrics(log, {"missing": r"^nope: (\d+)"}) == {}
    assert parse_metrics(tmp_path / "absent.log", {"x": "(1)"}) == {}


def test_result_files(tmp_path: Path) -> None:
    good = tmp_path / "task_result.yaml"
    good.write_text("pass_correctness: false\nperf: {speedup: 1.5, ms: [1, 2]}\n")
    assert flatten(load_result_file(good)) == {
        "pass_correctness": False,
        "perf.speedup": 1.5,
        "perf.ms": "1,2",
    }
    with pytest.raises(ResultFileError, match="was not written"):
        load_result_file(tmp_path / "nope.yaml")
    half = tmp_path / "half.json"
    half.write_text('{"pass": tr')
    with pytest.raises(ResultFileError, match="does not parse"):
        load_result_file(half)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ResultFileError, match="empty"):
        load_result_file(empty)


def test_ledger_appends_and_tolerates_torn_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    ledger = Ledger(path)
    seen: list[dict[str, object]] = []
    ledger.subscribe(seen.append)
    for i in range(5):
        ledger.emit(Ev.STARTED, task=f"t{i}")
    ledger.close()
    with path.open("ab") as fh:
        fh.write(b'{"ts": 1, "ev": "fini')  # a torn last line
    events = list(read_events(path))
    assert [e["task"] for e in events] == [f"t{i}" for i in range(5)]
    assert len(seen) == 5
    tail = [e["task"] for e in tail_events(path, max_bytes=120)]
    assert tail and tail == [e["task"] for e in events][-len(tail) :] and len(tail) < 5


def _run(tmp_path: Path, tasks: list[dict[str, object]]) -> RunPaths:
    new = NewRun(name="unit", workspace=tmp_path, info={"name": "unit"}, tasks=tasks)
    return create_run(new, suffix="x")


def test_create_run_is_complete_and_named(tmp_path: Path) -> None:
    paths = _run(tmp_path, [{"id": f"t{i}", "priority": 0} for i in range(3)])
    assert paths.root.name.startswith("run_") and paths.root.name.endswith("_x")
    assert DirQueue(paths).counts()[State.PENDING] == 3
    assert json.loads(paths.run_json.read_text())["run_dir"] == paths.root.name
    assert [e["ev"] for e in read_events(paths.events)] == ["run_created"]
    assert not [p for p in (tmp_path / "unit").iterdir() if p.name.startswith(".staging")]
    assert oct(paths.parallel.stat().st_mode & 0o777) == "0o700"
    second = _run(tmp_path, [{"id": "a", "priority": 0}])
    assert second.root != paths.root  # same second: a distinct folder
    assert latest_run(tmp_path, "unit") in (paths.root, second.root)


def test_failed_creation_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="priority"):
        _run(tmp_path, [{"id": "a", "priority": 0}, {"id": "b", "priority": 99999}])
    assert [p.name for p in (tmp_path / "unit").iterdir()] == []


def test_results_rows_and_honest_rates(tmp_path: Path) -> None:
    paths = _run(tmp_path, [{"id": f"t{i}", "priority": 0, "name": f"n\t{i}"} for i in range(4)])
    q = DirQueue(paths, durable=False)
    outcomes = [(State.DONE, True), (State.DONE, False), (State.FAILED, None)]
    for state, passed in outcomes:
        c = q.claim("o", 0)
        assert c is not None
        c.data["attempts"].append(
            {
                "n": 1,
                "gpus": [0],
                "duration": 1.5,
                "returncode": 0,
                "reason": "exit 0",
                "metrics": {"score": 2.0},
            }
        )
        if passed is not None:
            c.data["result"] = {"pass": passed}
        q.move(c, state)
    rows = collect(q)
    tsv = to_tsv(rows).splitlines()
    assert tsv[0].split("\t")[:8] == [
        "task",
        "name",
        "state",
        "attempts",
        "gpus",
        "seconds",
        "exit",
        "reason",
    ]
    assert len(tsv) == 5 and all(len(r.split("\t")) == len(tsv[0].split("\t")) for r in tsv)
    assert [r.split("\t")[2] for r in tsv[1:]] == ["done", "done", "failed", "pending"]
    stats = field_stats(rows)
    assert stats["result.pass"] == {
        "kind": "bool",
        "true": 1,
        "of_done": 2,
        "of_total": 4,
        "rate_done": 0.5,
        "rate_total": 0.25,
    }
    assert stats["score"]["mean"] == 2.0


def test_task_ids_cannot_escape() -> None:
    for evil in ["../../etc/passwd", "a/b", "..", ".hidden", "x\ny", ""]:
        slug = slugify(evil)
        assert check_task_id(slug) == slug
        assert "/" not in slug and not slug.startswith(".")
    with pytest.raises(Exception, match="not allowed"):
        check_task_id("../x")


def test_recover_finishes_a_move_cut_short_and_numbers_lost_attempts(tmp_path: Path) -> None:
    from gpuswarm.supervise.recovery import recover

    paths = _run(tmp_path, [{"id": f"t{i}", "priority": 0} for i in range(2)])
    q = DirQueue(paths, durable=False)
    finishing, lost = q.claim("host:1:2", 0), q.claim("host:1:2", 1)
    assert finishing is not None and lost is not None
    # The supervisor wrote the successful attempt, then died before the rename to done/.
    finishing.data["attempts"].append({"n": 1, "reason": "exit 0"})
    finishing.data["state"] = "done"
    finishing.data["moved_from"] = finishing.path.name
    q.save(finishing)
    ledger = Ledger(paths.events)
    moved = recover(q, ledger, retry_failed=True, grace=0.1)
    ledger.close()
    assert (moved["recovered"], moved["interrupted"]) == (1, 1)
    assert q.read(State.DONE, finishing.name) is not None
    requeued = q.read(State.PENDING, lost.name)
    assert requeued is not None
    assert requeued["attempts"] == [
        {
            "n": 1,
            "slot": "slot 1",
            "interrupted": True,
            "kind": "lost",
            "reason": "its supervisor died (host:1:2)",
        }
    ]


def test_recover_keeps_a_temp_file_whose_writer_is_alive(tmp_path: Path) -> None:
    """A process adding tasks to a run it does not lock (``research try`` beside its runner)
    may be between its write and its rename while a runner starts and recovers the run: its
    temp file is a write in progress and must survive; a dead writer's file is removed."""
    import subprocess
    import sys

    from gpuswarm.store.runs import temp_files
    from gpuswarm.supervise.recovery import recover

    paths = _run(tmp_path, [{"id": "t0", "priority": 0}])
    pending = paths.state_dir("pending")
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        live = pending / f".tmp-0000_t9.json.{writer.pid}.140001"
        cut = pending / f".tmp-0000_t8.json.{dead.pid}.140002"
        odd = pending / ".tmp-unnamed"
        for path in (live, cut, odd):
            path.write_bytes(b"{")
        assert sorted(p.name for p in temp_files(paths)) == sorted([cut.name, odd.name])
        ledger = Ledger(paths.events)
        moved = recover(DirQueue(paths, durable=False), ledger, retry_failed=True, grace=0.1)
        ledger.close()
        assert moved["temp_files"] == 2
        assert live.exists() and not cut.exists() and not odd.exists()
    finally:
        writer.kill()
        writer.wait()


def test_a_closed_terminal_stops_like_sigterm_unless_nohup_ignored_it() -> None:
    import signal as sig

    from gpuswarm.core.signals import on_stop_signals, signal_text

    assert signal_text(sig.SIGHUP) == "SIGHUP (the terminal closed)"
    before = sig.getsignal(sig.SIGHUP)
    try:
        sig.signal(sig.SIGHUP, sig.SIG_DFL)
        with on_stop_signals(lambda: None):
            assert callable(sig.getsignal(sig.SIGHUP))  # ours: a warm stop
        assert sig.getsignal(sig.SIGHUP) is sig.SIG_DFL  # given back
        sig.signal(sig.SIGHUP, sig.SIG_IGN)  # started under nohup
        with on_stop_signals(lambda: None):
            assert sig.getsignal(sig.SIGHUP) is sig.SIG_IGN  # its wish stands
    finally:
        sig.signal(sig.SIGHUP, before)
