"""Scenario 5: corrupt state on disk, and completion files written half-way.

Descriptors truncated mid-JSON, overwritten with garbage, valid JSON that is no descriptor, a
descriptor whose task no longer validates: each is moved to ``corrupt/`` with a reason in its
name, and the run goes on with the others. A completion file (``done_when``) that is truncated,
empty, or still being written when the task's main process exits never makes a task done.
"""

from __future__ import annotations

import json
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, count_events, read_events, wait_for, wait_for_run
from harness import HERE, PY, q, summary, write_config
from invariants import check_run, task_id_of

pytestmark = pytest.mark.slow

FAULTY = str(HERE / "faulty.py")


def descriptor_path(run_dir: Path, state: str, tid: str) -> Path:
    (path,) = [p for p in (run_dir / ".parallel" / state).iterdir() if task_id_of(p.name) == tid]
    return path


def corrupt_one(path: Path, how: str) -> None:
    raw = path.read_bytes()
    if how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "garbage":
        path.write_bytes(b"\x00\xff\xfe garbage {{{ \x00" * 7)
    elif how == "not-a-descriptor":
        path.write_text("[1, 2, 3]\n")
    elif how == "invalid-task":
        data = json.loads(raw)
        data["task"]["timeout"] = "soon"
        path.write_text(json.dumps(data))
    else:
        raise ValueError(how)


CORRUPTIONS = {"t2": "truncated", "t3": "garbage", "t4": "not-a-descriptor", "t5": "invalid-task"}


def _stopped_run(
    tmp_path: Path, shared: Path, cli_popen: Callable[..., CliProcess], sig: int
) -> tuple[Path, list[str], Path]:
    """A run of 8 tasks on one slot, stopped by ``sig`` while t0 blocks on a release file."""
    release = tmp_path / "release"
    effect = f"echo $GPUSWARM_ATTEMPT >> {q(shared)}/$GPUSWARM_TASK_ID"
    tasks: list[dict[str, Any]] = [
        {"name": "t0", "command": f"while [ ! -e {q(release)} ]; do sleep 0.05; done; {effect}"}
    ]
    tasks += [{"name": f"t{i}", "command": effect} for i in range(1, 8)]
    for t in tasks:
        t["shell"] = True
    top = {"name": "corrupt", "workspace": "ws", "gpus": "sim:1", "grace": "1s"}
    config = write_config(tmp_path, top, tasks)
    proc = cli_popen("run", "-q", config)
    run_dir = wait_for_run(tmp_path / "ws")
    wait_for(lambda: count_events(run_dir, "started", task="t0"), 20, what="t0 to start")
    proc.send(sig)
    proc.wait(30)
    return run_dir, [str(t["name"]) for t in tasks], release


@pytest.mark.trials(1)
def test_corrupt_pending_descriptors_are_moved_aside_and_the_run_continues(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    figures: Callable[..., None],
    seed: int,
) -> None:
    run_dir, ids, release = _stopped_run(tmp_path, shared, cli_popen, signal.SIGTERM)
    assert {p.name.split("_", 1)[1] for p in (run_dir / ".parallel/pending").iterdir()} == {
        f"{t}.json" for t in ids
    }
    victims = random.Random(seed).sample(ids[1:], len(CORRUPTIONS))
    corruptions = dict(zip(victims, CORRUPTIONS.values(), strict=True))
    print(f"seed={seed}: {corruptions}")
    for tid, how in corruptions.items():
        corrupt_one(descriptor_path(run_dir, "pending", tid), how)
    release.touch()

    res = cli("resume", "-q", run_dir)
    rep = check_run(run_dir, ids, shared=shared, corrupted=corruptions)
    assert set(rep.corrupt) == set(corruptions), rep.corrupt
    for tid, name in rep.corrupt.items():  # <descriptor name>[@lease].<reason>
        want = ".invalid-task" if corruptions[tid] == "invalid-task" else ".unreadable"
        assert want in name, name
    done = {t for t, s in rep.states.items() if s == "done"}
    assert done == set(ids) - set(corruptions), rep.states
    # the invariants also checked that each one is journaled ('corrupt' is its last event) and
    # counted in summary.json; a run that lost tasks to corrupt/ is not complete (regressions:
    # claim-time quarantines journaled nothing, and corrupt tasks vanished from the summary
    # and results.tsv while the run exited 0; found by this suite, fixed in 32bebe8)
    assert res.returncode == 1, str(res)
    assert summary(run_dir)["complete"] is False
    rows = (run_dir / "results.tsv").read_text().splitlines()[1:]
    assert len(rows) == len(ids), rows
    figures(
        "5 corrupt descriptors",
        tasks=len(ids),
        faults=len(CORRUPTIONS),
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
    )


@pytest.mark.trials(1)
def test_unreadable_running_descriptor_after_a_crash(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    figures: Callable[..., None],
    seed: int,
) -> None:
    """SIGKILL, then the crashed supervisor's running descriptor is torn: resume sets it aside."""
    run_dir, ids, release = _stopped_run(tmp_path, shared, cli_popen, signal.SIGKILL)
    how = random.Random(seed).choice(["truncated", "garbage", "not-a-descriptor"])
    print(f"seed={seed}: running descriptor {how}")
    corrupt_one(descriptor_path(run_dir, "running", "t0"), how)
    release.touch()
    res = cli("resume", "-q", run_dir)
    assert res.returncode in (0, 1), str(res)
    rep = check_run(run_dir, ids, shared=shared, corrupted={"t0"})
    assert set(rep.corrupt) == {"t0"}
    assert {s for t, s in rep.states.items() if t != "t0"} == {"done"}
    events = [e for e in read_events(run_dir) if e["ev"] == "corrupt"]
    assert [task_id_of(e["file"]) for e in events] == ["t0"], events
    figures(
        "5 corrupt descriptors",
        tasks=len(ids),
        faults=1,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
    )


COMPLETION_CASES = {
    # name: (faulty.py args, timeout)
    "json-truncated": (["write", "result.json", '{"score": 0.9, "ok"'], None),
    "yaml-truncated": (["write", "result.yaml", "score: [0.9, 0.8\nok: tr"], None),
    "empty": (["write", "result.json", ""], None),
    "writer-still-writing": (["write-bg", "result.json", '{"score": 0.9,', ' "ok": true}'], None),
    "killed-mid-write": (["write-hang", "result.json", '{"score": 0.9, "ok": tr'], "1s"),
    "complete": (["write", "result.json", '{"score": 0.9, "ok": true}'], None),
}


@pytest.mark.trials(1)
def test_half_written_completion_file_never_counts_as_done(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    figures: Callable[..., None],
    seed: int,
) -> None:
    tasks = []
    order = list(COMPLETION_CASES)
    random.Random(seed).shuffle(order)
    for name in order:
        args, timeout = COMPLETION_CASES[name]
        t: dict[str, Any] = {"name": name, "command": [PY, FAULTY, *args], "done_when": args[1]}
        if timeout:
            t["timeout"] = timeout
        tasks.append(t)
    top = {
        "name": "completion",
        "workspace": "ws",
        "gpus": "sim:3",
        "grace": "0.5s",
        "defaults": {"env": {"CHAOS_SHARED": str(shared)}},
    }
    config = write_config(tmp_path, top, tasks)
    res = cli("run", "-q", config)
    assert res.returncode == 1, str(res)
    run_dir = wait_for_run(tmp_path / "ws")
    ids = list(COMPLETION_CASES)
    rep = check_run(run_dir, ids)  # side effects: written before the file check, not counted
    assert rep.states == {n: "done" if n == "complete" else "failed" for n in ids}, rep.states
    for name in ids:
        reason = rep.descriptors[name]["reason"] or ""
        if name == "complete":
            assert rep.descriptors[name]["result"] == {"score": 0.9, "ok": True}
        elif name == "killed-mid-write":
            assert reason.startswith("timeout"), reason
        else:
            assert "completion file" in reason, (name, reason)
    rows = (run_dir / "results.tsv").read_text()
    assert summary(run_dir)["counts"]["done"] == 1, rows
    figures(
        "5b half-written completion files",
        tasks=len(ids),
        faults=len(ids) - 1,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
    )
