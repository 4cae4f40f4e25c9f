"""Swapped-out files written again (core/fsutil.Spares): a group commit frees no inode per
move, and a file planted at a kept name is never written through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_driver import run_cli

from gpuswarm.core import fsutil
from gpuswarm.core.fsutil import Spares, replace_existing
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.staging import create_layout, write_pending


def _lease(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_a_save_writes_into_the_inode_the_last_one_swapped_out(tmp_path: Path) -> None:
    spares = Spares()
    first = _lease(tmp_path, "a.json@o", "old a, a long descriptor")
    old_inode = first.stat().st_ino
    replace_existing(spares.write(first, b"new a"), first, spares)
    assert first.read_text() == "new a" and len(spares) == 1
    second = _lease(tmp_path, "b.json@o", "old b")
    tmp = spares.write(second, b"new b")  # the kept inode, renamed to b's temp name
    assert tmp == fsutil.temp_path(second) and tmp.stat().st_ino == old_inode
    assert tmp.read_text() == "new b"  # cut to its length: nothing of the longer old one
    replace_existing(tmp, second, spares)
    assert second.read_text() == "new b"
    spares.drop()
    assert sorted(os.listdir(tmp_path)) == ["a.json@o", "b.json@o"]


@pytest.mark.parametrize("planted", ["symlink", "hardlink", "gone"])
def test_a_file_planted_at_a_kept_name_is_never_written_through(
    tmp_path: Path, planted: str
) -> None:
    spares = Spares()
    lease = _lease(tmp_path, "a.json@o", "old")
    tmp = spares.write(lease, b"new")
    replace_existing(tmp, lease, spares)  # tmp now holds the old inode, kept
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    tmp.unlink()
    if planted == "symlink":
        tmp.symlink_to(outside)
    elif planted == "hardlink":
        os.link(outside, tmp)
    second = _lease(tmp_path, "b.json@o", "old b")
    made = spares.write(second, b"new b")
    assert outside.read_text() == "precious"  # not followed, not written through
    assert made.read_text() == "new b" and made.stat().st_nlink == 1
    assert not os.path.lexists(tmp)  # the planted name is removed, never followed
    replace_existing(made, second, spares)
    spares.drop()
    assert sorted(os.listdir(tmp_path)) == ["a.json@o", "b.json@o", "outside.txt"]


def test_at_most_limit_files_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Spares, "LIMIT", 2)
    spares = Spares()
    leases = [_lease(tmp_path, f"{i}.json@o", "old") for i in range(4)]
    tmps = [fsutil.write_temp(p, b"new", durable=False, exclusive=True) for p in leases]
    for tmp, lease in zip(tmps, leases, strict=True):
        replace_existing(tmp, lease, spares)
    assert len(spares) == 2
    assert len([n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]) == 2
    spares.drop()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]


def test_a_committers_group_commits_free_no_inode_per_move(tmp_path: Path) -> None:
    """Group after group, the committer writes each saved descriptor into an inode a move
    before it swapped out (a claimed descriptor's old one): after the first group, no move
    makes or frees an inode (the queue's files are the same inodes throughout), every outcome
    is in place, and dropping the kept ones leaves no temp file."""
    paths = RunPaths(tmp_path)
    create_layout(paths)
    n = 12
    write_pending(paths, [Descriptor.new({"id": f"t{i}", "priority": 0}, i) for i in range(n)])
    queue = DirQueue(paths, durable=True)
    running = paths.state_dir("running")

    def inodes() -> set[int]:
        folders = [paths.state_dir(s) for s in ("pending", "running", "done")]
        return {(f / m).stat().st_ino for f in folders for m in os.listdir(f)}

    seen: list[set[int]] = []
    for group in range(n // 3):
        claims = [c for i in range(3) if (c := queue.claim("host:1:2", group * 3 + i))]
        with queue.grouped_commit():
            for c in claims:
                queue.move(c, State.DONE, None, after=lambda: None, lost=lambda: None)
        seen.append(inodes())
    assert seen[0] == seen[1] == seen[2] == seen[3]  # none made, none freed
    assert len(queue.names(State.DONE)) == n
    for name in queue.names(State.DONE):
        assert Descriptor.loads((paths.state_dir("done") / name).read_bytes()).state == "done"
    queue.drop_spares()
    assert os.listdir(running) == []


def test_a_finished_run_through_the_cli_leaves_no_kept_file(tmp_path: Path) -> None:
    """The committer drops what it kept when its last batch is made: a finished run's
    running/ is empty, dot files included (the real CLI, 40 tasks over 4 slots)."""
    (tmp_path / "cmds.txt").write_text("true\n" * 40)
    res = run_cli("run", "cmds.txt", "--gpus", "sim:4", "-q", "--no-report", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run,) = [p.parent.parent for p in tmp_path.glob("**/.parallel/done")]
    assert os.listdir(run / ".parallel" / "running") == []
    assert len(os.listdir(run / ".parallel" / "done")) == 40
