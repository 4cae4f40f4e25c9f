"""Fast checks of ``logs`` and ``clean``'s pieces (no task processes): TASK arguments resolved
(store/lookup.py), the follower over hand-written attempt logs (outputs/tasklog.py), and the
removal of a run that is never a live one (store/cleanup.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.outputs.clean import find_candidates, finish_half_removed
from gpuswarm.outputs.tasklog import Ended, Hop, follow, task_log
from gpuswarm.store.cleanup import REMOVING, remove_run
from gpuswarm.store.leases import FileLock
from gpuswarm.store.lookup import UnknownTaskError, resolve_tasks, task_ended
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import NewRun, create_run

OWNER = "host:1:1"


def spec(tid: str, name: str) -> dict[str, Any]:
    return TaskSpec(id=tid, name=name, command=["true"]).model_dump(mode="json")


def make_run(tmp_path: Path, tasks: list[tuple[str, str]]) -> RunPaths:
    info = {"name": "t", "slot_count": 1}
    return create_run(NewRun("t", tmp_path, info, [spec(t, n) for t, n in tasks]))


def finish(paths: RunPaths, state: State, logs: list[bytes]) -> str:
    """Claim the next task, give it attempt logs, move it to ``state``; its id."""
    queue = DirQueue(paths)
    claimed = queue.claim(OWNER, 0)
    assert claimed is not None
    tid = claimed.desc.id
    for n, text in enumerate(logs, 1):
        paths.attempt_dir(tid, n).mkdir(parents=True)
        paths.attempt_log(tid, n).write_bytes(text)
    queue.move(claimed, state)
    return tid


def test_a_task_argument_is_an_id_then_an_exact_name_then_a_unique_prefix(
    tmp_path: Path,
) -> None:
    paths = make_run(
        tmp_path,
        [("cmd-1", "one"), ("cmd-10", "ten"), ("lr-a", "train lr=0.1"), ("lr-b", "train lr=0.2")],
    )
    assert resolve_tasks(paths, ["cmd-1"]) == ["cmd-1"]  # exact id, though cmd-10 starts so
    assert resolve_tasks(paths, ["cmd-10", "te", "train lr=0.2"]) == ["cmd-10", "lr-b"]
    assert resolve_tasks(paths, ["lr-a", "train lr=0.1", "lr-a"]) == ["lr-a"]  # each once
    with pytest.raises(UnknownTaskError, match=r"'train lr' is ambiguous.*lr-a \(train lr=0.1\)"):
        resolve_tasks(paths, ["train lr"])
    with pytest.raises(UnknownTaskError) as err:
        resolve_tasks(paths, ["one", "zzz", "cmd-"])
    assert "'zzz'" in str(err.value) and "'cmd-' is ambiguous" in str(err.value)
    assert err.value.exit_code == 2
    with pytest.raises(UnknownTaskError, match="empty"):
        resolve_tasks(paths, [""])
    assert not task_ended(State.PENDING) and not task_ended(State.RUNNING)
    assert not task_ended(State.BLOCKED)  # issue 35: it runs once its prerequisites end
    waiting = (State.PENDING, State.RUNNING, State.BLOCKED)
    assert all(task_ended(s) for s in State if s not in waiting)


def test_a_task_moved_back_to_pending_between_two_listings_is_still_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry moves a task running -> pending; listed pending first and running after the move,
    one pass sees it in neither folder (the cancel-race chaos test found it as 'no task')."""
    paths = make_run(tmp_path, [("a", "alpha")])
    queue = DirQueue(paths)
    claimed = queue.claim(OWNER, 0)
    assert claimed is not None
    real = RunReader.names
    moved: list[bool] = []

    def names(self: RunReader, state: State) -> list[str]:
        out = real(self, state)
        if state is State.PENDING and not moved:  # pending listed: now the retry lands
            queue.move(claimed, State.PENDING)
            moved.append(True)
        return out

    monkeypatch.setattr(RunReader, "names", names)
    assert resolve_tasks(paths, ["a"]) == ["a"]
    assert moved


def test_the_follower_reads_every_attempt_of_an_ended_task_in_order(tmp_path: Path) -> None:
    paths = make_run(tmp_path, [("a", "a")])
    tid = finish(paths, State.DONE, [b"one\n", b"two"])
    target = task_log(paths.root, "a", attempt=1)
    items = list(follow(target, poll=0.01))
    assert items == [
        Hop(1, paths.attempt_log(tid, 1)),
        b"one\n",
        Hop(2, paths.attempt_log(tid, 2)),
        b"two",
        Ended("done"),
    ]
    assert task_log(paths.root, "a").attempt == 2  # the last attempt by default


def test_a_log_replaced_by_a_symlink_is_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("do not show\n")
    paths = make_run(tmp_path, [("a", "a")])
    tid = finish(paths, State.FAILED, [b"kept\n", b""])
    paths.attempt_log(tid, 2).unlink()
    paths.attempt_log(tid, 2).symlink_to(secret)
    items = list(follow(task_log(paths.root, "a", attempt=1), poll=0.01))
    assert b"do not show\n" not in items and items[-1] == Ended("failed")
    assert b"kept\n" in items


def test_a_run_is_not_removed_while_live_and_goes_whole_when_not(tmp_path: Path) -> None:
    paths = make_run(tmp_path, [("a", "a")])
    finish(paths, State.DONE, [b"x\n"])
    hold = FileLock(paths.live_lock)
    assert hold.acquire(exclusive=False)  # a live supervisor's hold
    try:
        assert remove_run(paths) == "it is live"
        assert paths.is_run()
    finally:
        hold.release()
    assert [c.run for c in find_candidates(tmp_path, 1.0, now=paths.events.stat().st_mtime + 5)]
    assert remove_run(paths) is None
    assert not paths.root.exists()
    assert list(paths.root.parent.iterdir()) == []


def test_a_half_removed_run_is_finished_and_never_listed(tmp_path: Path) -> None:
    paths = make_run(tmp_path, [("a", "a")])
    dead = tmp_path / "t" / f".{paths.root.name}{REMOVING}999999999"
    os.rename(paths.root, dead)
    assert find_candidates(tmp_path, 1.0, now=1e12) == []
    assert finish_half_removed(tmp_path) == [dead]
    assert not dead.exists()


def test_following_a_task_cancelled_before_it_started_ends_at_once(tmp_path: Path) -> None:
    paths = make_run(tmp_path, [("a", "a"), ("b", "b")])
    assert DirQueue(paths).cancel_pending("b", "not needed", lambda desc: None) is not None
    target = task_log(paths.root, "b")
    assert (target.state, target.attempt, target.log) == ("cancelled", None, None)
    assert list(follow(target, poll=0.01)) == [Ended("cancelled")]
