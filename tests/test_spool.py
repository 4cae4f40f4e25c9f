"""A streamed enqueue (store/spool.py, issue 31) at the store's level: what a crash half-way
leaves is counted, and the next stream writes each missing task once, never one that moved on."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.app.setup import queued
from gpuswarm.config.commands import CommandTasks
from gpuswarm.config.load import load_command_list
from gpuswarm.core import faults
from gpuswarm.core.errors import QueueError
from gpuswarm.core.models import State
from gpuswarm.core.paths import STATES, RunPaths
from gpuswarm.outputs.results import collect
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.names import task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.store.spool import CHUNK, HEADER, HEADER_ROWS, spooled_ids, stream
from gpuswarm.store.staging import Templated

FIRST = 10
N = FIRST + 3 * CHUNK + 7


def _task(i: int) -> dict[str, Any]:
    return {"id": f"t{i:05d}", "name": f"t{i}", "command": "true", "shell": True, "env": {}}


def _templated(tmp_path: Path, n: int) -> Templated:
    """A command list's tasks with ids t00000.. (one template and its rows, as gpuswarm run
    makes them: the spool's second layout)."""
    loaded = load_command_list(None, "true\n", base_dir=tmp_path)
    assert isinstance(loaded.tasks, CommandTasks)
    rows: list[tuple[str, str, str | list[str]]] = [
        (f"t{i:05d}", f"t{i}", "true") for i in range(n)
    ]
    tasks = CommandTasks(loaded.tasks.dump(0), rows)
    templated = queued(replace(loaded, tasks=tasks))
    assert isinstance(templated, Templated)
    return templated


@pytest.fixture(params=["dumps", "rows"])
def run(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RunPaths]:
    """A streamed run in each spool layout: a descriptor per line, or a template and rows."""
    tasks: Iterable[Any] = (
        map(_task, range(N)) if request.param == "dumps" else _templated(tmp_path, N)
    )
    new = NewRun("s", tmp_path / "ws", {"name": "s"}, tasks, stream_after=FIRST)
    paths = create_run(new)
    header = HEADER if request.param == "dumps" else HEADER_ROWS
    assert paths.enqueue_spool.read_bytes().startswith(header)
    yield paths
    faults.disarm()


def test_the_rows_layout_streams_the_long_ways_bytes(tmp_path: Path) -> None:
    """Each descriptor streamed from the second layout is the bytes the first would hold,
    and the spool is a small part of the first's size."""
    templated = _templated(tmp_path, N)
    made = {}
    layouts: list[tuple[str, Iterable[Any]]] = [("rows", templated), ("dumps", list(templated))]
    for layout, items in layouts:
        new = NewRun("s", tmp_path / layout, {"name": "s"}, items, stream_after=FIRST)
        paths = create_run(new)
        size = paths.enqueue_spool.stat().st_size
        ledger = Ledger(paths.events)
        assert stream(paths, lambda _: None, ledger) == N - FIRST
        ledger.close()
        pending = paths.state_dir("pending")
        made[layout] = (size, {n: (pending / n).read_bytes() for n in os.listdir(pending)})
    assert made["rows"][1] == made["dumps"][1]
    assert len(made["rows"][1]) == N
    assert made["rows"][0] * 4 < made["dumps"][0]


def test_a_damaged_rows_spool_is_named_not_skipped(tmp_path: Path) -> None:
    new = NewRun("s", tmp_path / "ws", {"name": "s"}, _templated(tmp_path, N), stream_after=FIRST)
    paths = create_run(new)
    lines = paths.enqueue_spool.read_bytes().split(b"\n")
    lines[2] = lines[2][: len(lines[2]) // 2]  # a row line cut in the middle, its end kept
    paths.enqueue_spool.write_bytes(b"\n".join(lines))
    with pytest.raises(
        QueueError, match=re.escape("enqueue.spool: a streamed enqueue's spool is damaged")
    ):
        spooled_ids(paths)
    ledger = Ledger(paths.events)
    with pytest.raises(QueueError):
        stream(paths, lambda _: None, ledger)
    ledger.close()
    assert paths.enqueue_spool.is_file()  # kept: nothing is dropped


def _ids(paths: RunPaths) -> Counter[str]:
    found: Counter[str] = Counter()
    for state in STATES:
        folder = paths.state_dir(state)
        if folder.is_dir():
            found.update(task_id_of(n) for n in os.listdir(folder) if not n.startswith("."))
    return found


def test_a_streamed_run_counts_every_task_from_its_creation(run: RunPaths) -> None:
    assert len(os.listdir(run.state_dir("pending"))) == FIRST
    assert len(spooled_ids(run)) == N - FIRST
    assert RunReader(run).counts()["pending"] == N
    rows = collect(DirQueue(run))
    assert sorted(str(r.values["task"]) for r in rows) == [f"t{i:05d}" for i in range(N)]
    assert {r.values["state"] for r in rows} == {"pending"}


def test_a_stream_cut_short_is_finished_once_each(run: RunPaths) -> None:
    ledger = Ledger(run.events)
    pushed: list[str] = []
    faults.arm("spool.chunk:raise#2")  # a crash after the second chunk
    with pytest.raises(faults.FaultInjected):
        stream(run, pushed.append, ledger)
    faults.disarm()
    assert run.enqueue_spool.is_file()
    assert len(pushed) == 2 * CHUNK
    assert RunReader(run).counts()["pending"] == N  # none counted twice, none missing
    # meanwhile streamed tasks ran: one is done, one was claimed, one got a new priority name
    pending = run.state_dir("pending")
    os.rename(pending / pushed[0], run.state_dir("done") / pushed[0])
    claimed = DirQueue(run).claim("me:1:1", 0)
    assert claimed is not None
    renamed = pushed[5].replace(pushed[5][:4], "4990", 1)
    os.rename(pending / pushed[5], pending / renamed)

    again: list[str] = []
    written = stream(run, again.append, ledger)
    ledger.close()
    assert written == N - FIRST - 2 * CHUNK
    assert not run.enqueue_spool.exists()
    found = _ids(run)
    assert set(found) == {f"t{i:05d}" for i in range(N)}
    assert max(found.values()) == 1, [t for t, n in found.items() if n > 1]
    assert RunReader(run).counts()[State.PENDING.value] == N - 2
    assert "enqueued" in run.events.read_text()


def test_the_live_output_counts_the_spooled_tasks(run: RunPaths) -> None:
    from gpuswarm.app.output import counted

    counts = counted(DirQueue(run))
    assert counts[State.PENDING] == N
    assert sum(counts.values()) == N


def test_a_task_with_prerequisites_waits_in_blocked_not_in_the_spool(tmp_path: Path) -> None:
    """A streamed run's tail is moved into pending/ by the supervisor: a task after another
    (issue 35) must never ride in it, or it would be claimable before its prerequisite ended."""

    def task(i: int) -> dict[str, Any]:
        t = _task(i)
        return {**t, "after": [f"t{i - 1:05d}"]} if i % 50 == 49 else t

    new = NewRun("s", tmp_path / "ws", {"name": "s"}, map(task, range(N)), stream_after=FIRST)
    run = create_run(new)
    later = {f"t{i:05d}" for i in range(N) if i % 50 == 49}
    assert later and not later & set(spooled_ids(run))
    assert {task_id_of(n) for n in os.listdir(run.state_dir(State.BLOCKED.value))} == later
    assert len(spooled_ids(run)) == N - FIRST - len(later)
    assert sum(_ids(run).values()) == N - len(spooled_ids(run))
    assert run.edges.read_bytes().count(b"\n") == len(later)  # each edge known before it is seen


@pytest.mark.parametrize("stream_after", [FIRST, None])
def test_a_written_command_list_is_not_kept(tmp_path: Path, stream_after: int | None) -> None:
    """create_run reads a command list's rows once: whoever still holds its Templated while the
    run goes on (the engine does) holds no row (the scale bench's peak RSS: 127 vs 152 MB)."""
    templated = _templated(tmp_path, N)
    create_run(NewRun("s", tmp_path / "ws", {"name": "s"}, templated, stream_after=stream_after))
    assert len(templated) == 0
