"""The queue transitions that engine, research and recovery once wrote by hand: submit,
update_pending, withdraw, retry_failed, finish_begun_retry, take_lease. Each saves, then lets
the caller journal (``announce``), then renames."""

from __future__ import annotations

import json
from pathlib import Path

from gpuswarm.core.models import AttemptRecord, Descriptor, Lease, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.names import reclaim_name
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.staging import create_layout, write_pending


def queue_of(root: Path, ids: list[str]) -> DirQueue:
    paths = RunPaths(root)
    create_layout(paths)
    write_pending(paths, [Descriptor.new({"id": t, "priority": 0}, i) for i, t in enumerate(ids)])
    return DirQueue(paths, durable=False)


def test_submit_is_claimable_at_once_and_indexed(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a"])
    assert q.claim("o", 0) is not None
    name = q.submit({"id": "b", "priority": 0, "name": "bee"}, 5)
    got = q.claim("o", 0)
    assert got is not None and got.name == name and got.desc.name == "bee"
    known, max_seq = q.index()
    assert max_seq == 5 and set(known) == {"a", "b"} and known["b"][0] is State.RUNNING


def test_update_pending_replaces_the_spec_only(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a"])
    (name,) = q.names(State.PENDING)
    q.update_pending(name, {"id": "a", "priority": 0, "timeout": 9})
    desc = q.read_desc(State.PENDING, name)
    assert desc is not None and desc.task["timeout"] == 9 and desc.seq == 0


def test_withdraw_wins_or_loses_against_a_claim(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a", "b"])
    assert q.withdraw("b") and len(q.names(State.PENDING)) == 1
    assert not q.withdraw("b")  # gone
    claimed = q.claim("o", 0)
    assert claimed is not None and claimed.task_id == "a"
    assert not q.withdraw("a")  # claimed first
    assert sorted(p.name for p in q.paths.state_dir("pending").iterdir()) == []


def _failed(q: DirQueue) -> str:
    claimed = q.claim("o", 0)
    assert claimed is not None
    claimed.desc.add_attempt(AttemptRecord.lost(n=1, reason="x"))
    claimed.desc.reason = "exit 1"
    q.move(claimed, State.FAILED)
    return claimed.name


def test_retry_failed_saves_then_announces_then_renames(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a"])
    name = _failed(q)
    seen: list[str | None] = []

    def announce(desc: Descriptor) -> None:  # between the save and the rename
        on_disk = q.read_desc(State.FAILED, name)
        assert on_disk is not None
        seen.append(on_disk.state)

    desc = q.retry_failed(name, announce)
    assert desc is not None and seen == [State.PENDING.value]
    assert q.names(State.FAILED) == [] and q.names(State.PENDING) == [name]
    again = q.read_desc(State.PENDING, name)
    assert again is not None and again.budget_from == 1 and again.reason is None
    assert again.attempts_used == 0 and q.claim("o", 0) is not None


def test_finish_begun_retry_only_for_a_saved_retry(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a"])
    name = _failed(q)
    calls: list[str] = []
    assert not q.finish_begun_retry(name, lambda d: calls.append(d.id))  # a plain failure
    desc = q.read_desc(State.FAILED, name)
    assert desc is not None
    desc.fresh_budget()  # what a crash after retry_failed's save leaves
    (q.paths.state_dir("failed") / name).write_text(json.dumps(desc.raw))
    assert q.finish_begun_retry(name, lambda d: calls.append(d.id))
    assert calls == ["a"] and q.names(State.PENDING) == [name]


def test_take_lease_arbitrates_between_reclaimers(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a"])
    claimed = q.claim("dead:1:2", 0)
    assert claimed is not None
    leased = claimed.path.name
    mine = q.take_lease(leased, "me:3:4")
    assert mine == reclaim_name(leased, "me:3:4")
    assert Lease.parse(mine) == Lease("me:3:4", -1, mine.rsplit(".", 1)[1])
    assert q.take_lease(leased, "other:5:6") is None  # the first rename won
    assert [(n, lease.owner, lease.slot) for n, lease in q.leases()] == [(mine, "me:3:4", -1)]
    assert q.adopt_running(mine).task_id == "a"
