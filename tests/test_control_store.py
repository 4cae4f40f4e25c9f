"""Issue 17's store layer: a pending task cancelled at once, a priority changed, a cancelled
task retried, holds a crash cut short finished, control requests and pause flags."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store import control
from gpuswarm.store.holds import HELD, parse_hold
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.staging import create_layout, write_pending


def queue_of(root: Path, ids: list[str]) -> DirQueue:
    paths = RunPaths(root)
    create_layout(paths)
    write_pending(paths, [Descriptor.new({"id": t, "priority": 0}, i) for i, t in enumerate(ids)])
    return DirQueue(paths, durable=False)


def test_a_pending_task_is_cancelled_at_once_and_journaled_first(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a", "b"])
    seen: list[str] = []

    def announce(desc: Descriptor) -> None:  # journaled before it shows up in cancelled/
        seen.append(str(desc.state))
        assert not q.names(State.CANCELLED)

    desc = q.cancel_pending("a", "cancelled by me", announce)
    assert desc is not None and seen == ["cancelled"]
    (name,) = q.names(State.CANCELLED)
    got = q.read_desc(State.CANCELLED, name)
    assert got is not None and got.id == "a" and got.reason == "cancelled by me"
    assert [n for n in os.listdir(q.paths.state_dir("pending"))] == [q.names(State.PENDING)[0]]
    assert q.cancel_pending("a", "again", announce) is None  # not pending any more
    claimed = q.claim("o", 0)
    assert claimed is not None and claimed.task_id == "b"
    assert q.cancel_pending("b", "too late", announce) is None  # claimed: the supervisor's


def test_a_cancelled_task_is_retried_with_a_fresh_budget(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a"])
    q.cancel_pending("a", "x", lambda d: None)
    (name,) = q.names(State.CANCELLED)
    froms: list[str] = []
    with q.control_lock():
        desc = q.retry(State.CANCELLED, name, lambda d: froms.append(str(d.state)))
    assert desc is not None and froms == ["pending"]
    assert q.names(State.CANCELLED) == [] and q.names(State.PENDING) == [name]
    claimed = q.claim("o", 0)
    assert claimed is not None and claimed.desc.reason is None


def test_priority_renames_the_task_to_its_new_rank(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a", "b", "c"])
    new = q.reprioritize("c", 10, lambda d: None)
    assert new is not None and new.startswith("4990")
    claimed = q.claim("o", 0)  # the heap was refilled from the folder: c goes first
    assert claimed is not None and claimed.task_id == "c" and claimed.desc.task["priority"] == 10
    assert q.reprioritize("c", 0, lambda d: None) is None  # running: not pending


def test_holds_a_crash_cut_short_are_finished(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a", "b"])
    pending = q.paths.state_dir("pending")
    name_a, name_b = sorted(q.names(State.PENDING))
    dead = 2**22 + 12345  # no such pid
    os.rename(pending / name_a, pending / f"{HELD}cancel-{dead}-{name_a}")
    os.rename(pending / name_b, pending / f"{HELD}prio-{dead}-{name_b}")
    assert parse_hold(f"{HELD}cancel-{dead}-{name_a}") == ("cancel", dead, name_a)
    journaled: list[str] = []
    assert q.finish_holds(lambda d: journaled.append(d.id)) == 2
    assert journaled == ["a"]
    assert q.names(State.CANCELLED) == [name_a]  # the cancel is finished
    assert q.names(State.PENDING) == [name_b]  # the priority change undone: pending as it was
    assert not [n for n in os.listdir(pending) if n.startswith(HELD)]


def test_control_requests_are_durable_bounded_and_removed_once(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    create_layout(paths)
    req = control.put(paths, "cancel", "t1", reason="burns a GPU")
    (paths.control / "00000000000000000000-cancel-junk.json").write_text("{not json")
    (paths.control / "00000000000000000001-cancel-big.json").write_bytes(b" " * (70 << 10))
    got = control.requests(paths)
    assert [(r.kind, r.task, r.reason) for r in got] == [("cancel", "t1", "burns a GPU")]
    assert (
        got[0].by == req.by and json.loads((paths.control / req.name).read_text())["task"] == "t1"
    )
    assert control.drop(paths, got[0]) and not control.drop(paths, got[0])
    assert control.requests(paths) == []


def test_pause_flags(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    create_layout(paths)
    assert control.paused(paths) == control.Paused(False, frozenset())
    assert control.pause(paths) and not control.pause(paths)
    assert control.pause(paths, "h-gpu1")
    now = control.paused(paths)
    assert now.run and now.slots == {"h-gpu1"} and now.holds("h-gpu0")
    assert control.unpause(paths) and not control.unpause(paths)
    now = control.paused(paths)
    assert not now.holds("h-gpu0") and now.holds("h-gpu1")


def test_a_cache_reads_each_request_file_once(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    create_layout(paths)
    first = control.put(paths, "cancel", "t1")
    cache: dict[str, control.Request | None] = {}
    assert [r.task for r in control.requests(paths, cache)] == ["t1"]
    (paths.control / first.name).write_text("{not json")  # never rewritten in practice
    assert [r.task for r in control.requests(paths, cache)] == ["t1"]  # not read again
    control.put(paths, "cancel", "t2")
    assert [r.task for r in control.requests(paths, cache)] == ["t1", "t2"]
    (paths.control / first.name).unlink()
    assert [r.task for r in control.requests(paths, cache)] == ["t2"]
    assert set(cache) == {n for n in os.listdir(paths.control) if n.endswith(".json")}
