"""Fenced writes under a lease (issue 11 item 4): a lost lease is never re-created."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuswarm.core import fsutil
from gpuswarm.core.errors import LeaseLostError
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.queue import Claimed, DirQueue
from gpuswarm.store.staging import create_layout, write_pending


@pytest.fixture(params=["exchange", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":  # a filesystem that refuses RENAME_EXCHANGE
        monkeypatch.setattr(fsutil, "_exchange_supported", [False])
    return str(request.param)


def test_a_fenced_write_replaces_an_existing_file_and_leaves_no_temp(
    tmp_path: Path, mode: str
) -> None:
    path = tmp_path / "x.json@owner@0.1"
    path.write_text("old")
    fsutil.atomic_write_bytes(path, b"new", fenced=True)
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == [path.name]


def test_a_fenced_write_never_recreates_a_file_renamed_away(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "x.json@owner@0.1"
    path.write_text("old")
    path.rename(tmp_path / "x.json@reclaimer@-1.abc")
    with pytest.raises(FileNotFoundError):
        fsutil.atomic_write_bytes(path, b"new", fenced=True)
    assert os.listdir(tmp_path) == ["x.json@reclaimer@-1.abc"]  # not re-created, no temp
    assert (tmp_path / "x.json@reclaimer@-1.abc").read_text() == "old"


def test_a_stale_temp_of_this_thread_does_not_block_a_fenced_write(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text("old")
    stale = tmp_path / f".tmp-{path.name}.{os.getpid()}.{threading.get_ident()}"
    stale.write_text("half")
    fsutil.atomic_write_bytes(path, b"new", fenced=True)
    assert path.read_text() == "new" and not stale.exists()


def _claimed(tmp_path: Path) -> tuple[DirQueue, Claimed]:
    paths = RunPaths(tmp_path)
    create_layout(paths)
    write_pending(paths, [Descriptor.new({"id": "t", "priority": 0}, 0)])
    queue = DirQueue(paths, durable=False)
    claimed = queue.claim("host:1:2", 0)
    assert claimed is not None
    return queue, claimed


def test_save_and_move_of_a_reclaimed_task_raise_and_write_nothing(tmp_path: Path) -> None:
    queue, claimed = _claimed(tmp_path)
    running = queue.paths.state_dir("running")
    taken = running / (claimed.name + "@other:3:4@-1.0")
    claimed.path.rename(taken)  # what a reclaimer does
    announced: list[str] = []
    with pytest.raises(LeaseLostError):
        queue.save(claimed)
    with pytest.raises(LeaseLostError):
        queue.move(claimed, State.DONE, lambda: announced.append("finished"))
    assert announced == []  # nothing journaled
    assert sorted(os.listdir(running)) == [taken.name]  # the lease was not re-created
    assert queue.names(State.DONE) == []
    assert "moved_from" not in (queue.read(State.RUNNING, taken.name) or {})


def test_a_group_commit_fences_each_move_and_journals_only_what_it_put_in_place(
    tmp_path: Path, mode: str
) -> None:
    """Three outcomes committed as one group; a reclaimer takes the second's lease before the
    group's flush: that one is reported lost (nothing of it written, journaled or re-created,
    its ``after`` never runs), the others are made in order, each saved, announced, renamed."""
    paths = RunPaths(tmp_path)
    create_layout(paths)
    write_pending(paths, [Descriptor.new({"id": f"t{i}", "priority": 0}, i) for i in range(3)])
    queue = DirQueue(paths, durable=True)  # a group commit is what makes moves durable
    claims = [c for i in range(3) if (c := queue.claim("host:1:2", i)) is not None]
    assert len(claims) == 3
    running = queue.paths.state_dir("running")
    log: list[str] = []
    with queue.grouped_commit():
        for c in claims:
            tid = c.task_id

            def announce(tid: str = tid, c: Claimed = c) -> None:
                log.append(f"announce {tid} {c.path.parent.name}")  # still under its lease
                saved = Descriptor.loads(c.path.read_bytes())
                assert saved.state == State.DONE.value  # journaled only once saved

            def noted(what: str, tid: str = tid) -> Callable[[], None]:
                return lambda: log.append(f"{what} {tid}")

            queue.move(c, State.DONE, announce, after=noted("after"), lost=noted("lost"))
        assert log == [] and queue.names(State.DONE) == []  # nothing before the flush
        second = claims[1]
        taken = running / (second.name + "@other:3:4@-1.0")
        second.path.rename(taken)  # a reclaimer, while the group waits for its flush
    assert log == [
        "announce t0 running",
        "after t0",
        "lost t1",
        "announce t2 running",
        "after t2",
    ]
    assert sorted(queue.names(State.DONE)) == sorted([claims[0].name, claims[2].name])
    kept = [n for n in os.listdir(running) if n != taken.name]  # not re-created
    assert all(n.startswith(".tmp-") for n in kept)  # swapped-out files kept to be written again
    assert len(kept) == (2 if mode == "exchange" else 0)
    queue.drop_spares()
    assert os.listdir(running) == [taken.name]  # no temp file left
    assert "moved_from" not in (queue.read(State.RUNNING, taken.name) or {})
