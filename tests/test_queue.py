"""The directory queue: ordering, claims exactly once under competing processes, transitions."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuswarm.core.models import Descriptor, State, base_name
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.names import descriptor_name, lease_of, task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.staging import create_layout, write_pending


def make_queue(root: Path, n: int, priorities: list[int] | None = None) -> DirQueue:
    paths = RunPaths(root)
    create_layout(paths)
    tasks = [{"id": f"t{i:05d}", "priority": priorities[i] if priorities else 0} for i in range(n)]
    write_pending(paths, (Descriptor.new(t, i) for i, t in enumerate(tasks)))
    return DirQueue(paths, durable=False)


def test_names_sort_by_priority_then_submission() -> None:
    names = [descriptor_name(p, s, f"t{s}") for s, p in [(0, 0), (1, 5), (2, -3), (3, 5)]]
    assert [task_id_of(n) for n in sorted(names)] == ["t1", "t3", "t0", "t2"]
    with pytest.raises(ValueError):
        descriptor_name(5000, 0, "x")


def test_claim_order_and_lease_in_name(tmp_path: Path) -> None:
    q = make_queue(tmp_path, 4, priorities=[0, 0, 9, 0])
    first = q.claim("host:1:2", 3)
    assert first is not None and first.task_id == "t00002"
    assert lease_of(first.path.name) == ("host:1:2", 3)
    assert base_name(first.path.name) == first.name
    order = [first.task_id]
    while (c := q.claim("host:1:2", 0)) is not None:
        order.append(c.task_id)
    assert order == ["t00002", "t00000", "t00001", "t00003"]
    assert q.counts()[State.RUNNING] == 4
    assert q.counts()[State.PENDING] == 0


def test_move_keeps_data_and_requeue_is_claimable(tmp_path: Path) -> None:
    q = make_queue(tmp_path, 1)
    c = q.claim("o", 0)
    assert c is not None
    c.data["attempts"].append({"n": 1, "reason": "exit 1"})
    q.move(c, State.PENDING)
    again = q.claim("o", 1)
    assert again is not None and again.data["attempts"] == [{"n": 1, "reason": "exit 1"}]
    q.move(again, State.DONE)
    counts = {s: 0 for s in State} | {State.DONE: 1}
    assert q.counts() == counts
    assert q.claim("o", 0) is None


def test_corrupt_descriptor_is_moved_aside(tmp_path: Path) -> None:
    q = make_queue(tmp_path, 2)
    victim = sorted(q.paths.state_dir("pending").iterdir())[0]
    victim.write_bytes(b'{"id": "t000')  # truncated mid-write
    claimed = []
    while (c := q.claim("o", 0)) is not None:
        claimed.append(c.task_id)
    assert claimed == ["t00001"]
    assert len(list(q.paths.corrupt.iterdir())) == 1


@pytest.mark.timeout(20)
def test_a_planted_fifo_symlink_or_deep_nest_is_set_aside_never_blocked_on(
    tmp_path: Path,
) -> None:
    """What someone put in pending/ under descriptor names (a FIFO with no writer, a symlink to
    a real descriptor elsewhere, JSON nested past the parser's depth) is set aside as
    unreadable at its claim: the claim never blocks, never follows the link, never crashes;
    the real task after them is claimed and its mtime says when."""
    q = make_queue(tmp_path, 1)
    pending = q.paths.state_dir("pending")
    (real,) = pending.iterdir()
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes(real.read_bytes().replace(b"t00000", b"t99999"))
    os.mkfifo(pending / descriptor_name(5, 0, "fifo"))
    (pending / descriptor_name(5, 1, "link")).symlink_to(outside)
    (pending / descriptor_name(5, 2, "deep")).write_text("[" * 100_000)
    os.utime(real, (0, 0))
    q = DirQueue(q.paths, durable=False)  # a fresh scan sees them
    claimed = q.claim("o", 0)
    assert claimed is not None and claimed.task_id == "t00000"
    assert claimed.path.stat().st_mtime > time.time() - 60  # the claim's time, not 1970's
    assert q.claim("o", 0) is None
    corrupt = sorted(n.split(".json", 1)[0].split("_", 1)[1] for n in os.listdir(q.paths.corrupt))
    assert corrupt == ["deep", "fifo", "link"]
    assert outside.exists()  # the link was moved aside, what it pointed to left alone


def test_attempts_used_ignores_interrupted_and_old_budgets() -> None:
    d = Descriptor.new({"id": "x"}, 0).raw
    d["attempts"] = [{"n": 1}, {"n": 2, "interrupted": True}, {"n": 3}]
    assert Descriptor(d).attempts_used == 2
    d["budget_from"] = 2
    assert Descriptor(d).attempts_used == 1


def _claimer(root: str, worker: int, out: str) -> None:
    q = DirQueue(RunPaths(Path(root)), durable=False)
    got = []
    while (c := q.claim(f"w{worker}", worker)) is not None:
        got.append(c.task_id)
        q.move(c, State.DONE)
    Path(out).write_text(json.dumps(got))


@pytest.mark.slow
def test_competing_processes_claim_each_task_exactly_once(tmp_path: Path) -> None:
    n_tasks, n_procs = 1500, 6
    make_queue(tmp_path / "run", n_tasks)
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"out{i}.json" for i in range(n_procs)]
    procs = [
        ctx.Process(target=_claimer, args=(str(tmp_path / "run"), i, str(outs[i])))
        for i in range(n_procs)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    claims = [t for o in outs for t in json.loads(o.read_text())]
    assert len(claims) == n_tasks
    assert sorted(claims) == [f"t{i:05d}" for i in range(n_tasks)]
    assert sum(1 for o in outs if json.loads(o.read_text())) >= 2  # they really competed
    q = DirQueue(RunPaths(tmp_path / "run"))
    assert q.counts()[State.DONE] == n_tasks


ops = st.lists(st.sampled_from(["claim", "done", "fail", "requeue"]), max_size=60)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=0, max_value=8), script=ops)
def test_every_task_is_in_exactly_one_state(
    tmp_path_factory: pytest.TempPathFactory, n: int, script: list[str]
) -> None:
    root = tmp_path_factory.mktemp("q")
    q = make_queue(root, n)
    held = []
    for op in script:
        if op == "claim":
            c = q.claim("o", 0)
            if c is not None:
                held.append(c)
        elif held:
            c = held.pop(0)
            q.move(c, {"done": State.DONE, "fail": State.FAILED, "requeue": State.PENDING}[op])
    seen: dict[str, str] = {}
    for state in State:
        for name in os.listdir(q.paths.state_dir(state.value)):
            tid = task_id_of(name)
            assert tid not in seen, f"{tid} in {seen.get(tid)} and {state}"
            seen[tid] = state.value
    assert sorted(seen) == [f"t{i:05d}" for i in range(n)]
    assert q.counts()[State.RUNNING] == len(held)


def test_a_task_added_later_with_a_higher_priority_is_claimed_next(tmp_path: Path) -> None:
    """The heap is loaded by the first claim; a task added afterwards (add_pending touches the
    ``added`` marker) goes before the tasks already in it, without a scan per claim."""
    q = make_queue(tmp_path, 5)
    first = q.claim("o", 0)
    assert first is not None and first.task_id == "t00000"
    other = DirQueue(q.paths, durable=False)  # a second supervisor with its own heap
    assert (c := other.claim("o2", 0)) is not None and c.task_id == "t00001"
    DirQueue.add_pending(q.paths, {"id": "urgent", "priority": 7}, 100, durable=False)
    got = [c.task_id for c in iter(lambda: q.claim("o", 0), None)]
    assert got == ["urgent", "t00002", "t00003", "t00004"]
    assert other.claim("o2", 0) is None  # nothing claimed twice


def test_claims_do_not_rescan_pending_without_new_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_queue(tmp_path, 50)
    scans = 0
    refill = DirQueue._refill

    def counting(self: DirQueue) -> None:
        nonlocal scans
        scans += 1
        refill(self)

    monkeypatch.setattr(DirQueue, "_refill", counting)
    while q.claim("o", 0) is not None:
        pass
    assert scans == 2  # the first claim and the one that found pending/ empty
