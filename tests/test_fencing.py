"""Fenced writes under a lease (issue 11 item 4): a lost lease is never re-created."""

from __future__ import annotations

import os
import threading
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
