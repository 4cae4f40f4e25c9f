"""The end-of-run outputs of a run this process created read only what changed since
(store/created.py, outputs/createdrows.py, issue 31): the rows are the ones read off disk,
whoever changed a descriptor meanwhile, and an untouched descriptor is not read."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from gpuswarm.app.planning import plan
from gpuswarm.app.setup import new_run
from gpuswarm.config.load import load_command_list
from gpuswarm.core.fsutil import atomic_write_bytes, dumps_compact
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.outputs.results import collect, to_tsv
from gpuswarm.store.created import Created
from gpuswarm.store.folders import QueueFolders
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import create_run
from gpuswarm.store.spool import CHUNK, stream

pytestmark = pytest.mark.timeout(60)


def _run(tmp_path: Path, n: int, stream_after: int | None) -> tuple[RunPaths, Created]:
    cmds = tmp_path / "cmds.txt"
    cmds.write_text("".join(f"echo task {i}\n" for i in range(n)))
    loaded = load_command_list(cmds, base_dir=tmp_path, direct=True)
    gpus, slots = plan(loaded, "sim:2")
    loaded = dataclasses.replace(loaded, workspace=tmp_path / "ws")
    created = Created()
    new = new_run(loaded, gpus, slots, stream=True, created=created)
    new = dataclasses.replace(new, stream_after=stream_after)
    return create_run(new), created


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    read: list[str] = []
    real = QueueFolders.read_desc

    def counted(self: QueueFolders, state: State, name: str) -> Descriptor | None:
        read.append(name)
        return real(self, state, name)

    monkeypatch.setattr(QueueFolders, "read_desc", counted)
    return read


def _tsv(paths: RunPaths, created: Created | None) -> str:
    return to_tsv(collect(DirQueue(paths, created=created)))


def _rewrite(paths: RunPaths, file: str, **changes: object) -> None:
    """Another writer's change: temp + rename, as every writer makes one (a new file)."""
    path = paths.state_dir("pending") / file
    desc = Descriptor.loads(path.read_bytes())
    atomic_write_bytes(path, dumps_compact({**desc.raw, **changes}))


def test_untouched_rows_are_not_read_and_equal_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, created = _run(tmp_path, 40, None)
    slow = _tsv(paths, None)
    read = _reads(monkeypatch)
    assert _tsv(paths, created) == slow
    assert read == []  # every row from memory
    assert len(created) == 40


def test_a_changed_descriptor_is_read_whoever_changed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, created = _run(tmp_path, 30, None)
    names = sorted(os.listdir(paths.state_dir("pending")))
    _rewrite(paths, names[3], reason="renamed by another host")  # another supervisor's write
    queue = DirQueue(paths)
    claimed = queue.claim("other-host:1:1", 0)  # claimed elsewhere: moved, then rewritten
    assert claimed is not None
    read = _reads(monkeypatch)
    fast = _tsv(paths, created)
    monkeypatch.undo()
    assert fast == _tsv(paths, None)
    assert "renamed by another host" in fast
    assert names[3] in read
    assert len(read) == 2  # the rewritten one and the claimed one; none of the 28 others


def test_the_spool_and_the_streamed_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 8 + 3 * CHUNK
    paths, created = _run(tmp_path, n, 8)
    assert paths.enqueue_spool.exists()
    assert _tsv(paths, created) == _tsv(paths, None)  # 8 files, the rest only in the spool
    read = _reads(monkeypatch)
    _tsv(paths, created)
    assert read == []
    monkeypatch.undo()
    ledger = Ledger(paths.events)
    try:
        assert stream(paths, lambda name: None, ledger, created=created) == n - 8
    finally:
        ledger.close()
    assert not paths.enqueue_spool.exists()
    moved = sorted(os.listdir(paths.state_dir("pending")))[-1]
    _rewrite(paths, moved, reason="changed after the move")
    read = _reads(monkeypatch)
    fast = _tsv(paths, created)
    monkeypatch.undo()
    assert fast == _tsv(paths, None)
    assert read == [moved]  # the streamed files are remembered as written


def test_a_run_this_process_did_not_create_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, _ = _run(tmp_path, 5, None)
    read = _reads(monkeypatch)
    _tsv(paths, Created())  # an empty record: nothing known, everything read
    assert len(read) == 5


def test_descriptors_a_group_commit_wrote_into_kept_inodes_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committer's group commit writes a saved descriptor into an inode a move before it
    swapped out (fsutil.Spares): a created task's file may then be another task's old inode,
    or its own, rewritten. Every such file is read, and the rows are the long way's."""
    paths, created = _run(tmp_path, 16, None)
    queue = DirQueue(paths, durable=True)
    # back to pending, then done (the same tasks: claimed first), one task a group and then
    # four: the first task's done file is its own first inode, written again
    for round_, size in enumerate((1, 1, 4, 4)):
        claims = [c for i in range(size) if (c := queue.claim("host:1:2", i)) is not None]
        state = State.PENDING if round_ % 2 == 0 else State.DONE
        with queue.grouped_commit():
            for c in claims:
                queue.move(c, state, None, after=lambda: None, lost=lambda: None)
    queue.drop_spares()
    assert len(queue.names(State.DONE)) == 5
    read = _reads(monkeypatch)
    fast = _tsv(paths, created)
    monkeypatch.undo()
    assert fast == _tsv(paths, None)
    assert sorted(read) == sorted(queue.names(State.DONE))  # none of the 11 never claimed
