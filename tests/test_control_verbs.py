"""The queue verbs as typed requests (issue 32, step 4): one handler per kind, the CLI lists a
command per kind; requeue (an ended task back to pending as a fresh attempt series) and the
add batch in the queue module, each save -> journal -> rename, with their crash windows
finished by the next command or resume."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from gpuswarm.app import control as control_ops
from gpuswarm.cli import _Commands
from gpuswarm.cli import control as cli_control
from gpuswarm.core import verbs
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.batches import ADDING, REQUEUING
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.staging import create_layout, write_pending


def queue_of(root: Path, ids: list[str]) -> DirQueue:
    paths = RunPaths(root)
    create_layout(paths)
    write_pending(paths, [Descriptor.new({"id": t, "priority": 0}, i) for i, t in enumerate(ids)])
    return DirQueue(paths, durable=False)


def dead_pid() -> int:
    child = subprocess.Popen(["true"])  # a pid that has ended (its writer died)
    child.wait()
    return child.pid


def test_every_kind_has_one_handler_one_request_and_one_command() -> None:
    assert set(control_ops.HANDLERS) == set(verbs.Kind)
    requests = [verbs.Add, verbs.Cancel, verbs.Retry, verbs.Requeue]
    requests += [verbs.Pause, verbs.Unpause, verbs.Priority]
    kinds = {next(f.default for f in dataclasses.fields(r) if f.name == "kind") for r in requests}
    assert kinds == set(verbs.Kind)
    names = {command.name for command in cli_control.COMMANDS}
    assert names == {kind.value for kind in verbs.Kind}
    assert {kind.value for kind in verbs.Kind} <= set(_Commands.table())


def test_requeue_of_a_done_task_is_journaled_before_it_is_pending(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a"])
    claimed = q.claim("o", 0)
    assert claimed is not None
    claimed.desc.result = {"loss": 1.0}
    q.move(claimed, State.DONE, lambda: None)
    (name,) = q.names(State.DONE)
    seen: list[tuple[str | None, list[str]]] = []

    def announce(desc: Descriptor) -> None:  # journaled while it is in no visible folder
        seen.append((desc.state, q.names(State.PENDING) + q.names(State.DONE)))

    with q.control_lock():
        desc = q.requeue(State.DONE, name, announce)
    assert desc is not None and seen == [("pending", [])]
    assert q.names(State.DONE) == [] and q.names(State.PENDING) == [name]
    got = q.read_desc(State.PENDING, name)
    assert got is not None and got.result is None and got.raw["budget_from"] == 0
    assert q.requeue(State.DONE, name, announce) is None  # gone: nothing done
    with pytest.raises(ValueError):
        q.requeue(State.PENDING, name, announce)


def test_a_requeue_cut_short_is_finished_or_undone(tmp_path: Path) -> None:
    q = queue_of(tmp_path, ["a", "b"])
    for _ in range(2):
        claimed = q.claim("o", 0)
        assert claimed is not None
        q.move(claimed, State.FAILED, lambda: None)
    a, b = q.names(State.FAILED)
    folder = q.paths.state_dir("failed")
    pid = dead_pid()
    saved = q.read_desc(State.FAILED, a)
    assert saved is not None
    saved.fresh_budget()  # saved, maybe journaled: the requeue is finished
    (folder / f"{REQUEUING}{pid}-{a}").write_text(json.dumps(saved.raw))
    (folder / a).unlink()
    (folder / b).rename(folder / f"{REQUEUING}{pid}-{b}")  # held, not saved: undone
    announced: list[tuple[str, State]] = []
    assert q.finish_requeues(lambda d, frm: announced.append((d.id, frm))) == 1
    assert announced == [("a", State.FAILED)]
    assert q.names(State.PENDING) == [a] and q.names(State.FAILED) == [b]
    assert sorted(p.name for p in folder.iterdir()) == [b]


def test_an_add_batch_cut_short_is_finished_when_journaled_else_removed(tmp_path: Path) -> None:
    q = queue_of(tmp_path, [])
    batches: list[str] = []

    class Crash(Exception):
        pass

    def crash(batch: str) -> None:  # killed between the sync and the journal's line
        batches.append(batch)
        raise Crash

    for tid in ("x", "y"):
        with pytest.raises(Crash):
            q.add_batch([Descriptor.new({"id": tid}, 0 if tid == "x" else 1)], crash)
    pending = q.paths.state_dir("pending")
    assert q.names(State.PENDING) == [] and len(list(pending.glob(f"{ADDING}*"))) == 2
    assert q.finish_adds(lambda: {batches[0]}) == 1  # x's batch was journaled, y's not
    (name,) = q.names(State.PENDING)
    assert name.endswith("_x.json") and not list(pending.glob(f"{ADDING}*"))
