"""Units of issue 35's dependencies: the verdict of a blocked task, cycles, the edges file,
the moves out of blocked/ and what a crash leaves of them, the RunView's counts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuswarm.config.deps import find_cycle
from gpuswarm.config.load import load_config
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.runview import RunView
from gpuswarm.store.blocked import SETTLE, BlockedFolder, Edge, EdgeIndex, verdict, write_edges
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.staging import create_layout, write_pending

DONE, FAILED, SKIPPED = State.DONE.value, State.FAILED.value, State.SKIPPED.value


@pytest.mark.parametrize(
    ("edge", "states", "to"),
    [
        (Edge("d", "n", after=("a",)), {}, None),  # waits
        (Edge("d", "n", after=("a",)), {"a": DONE}, State.PENDING),
        (Edge("d", "n", after=("a", "b")), {"a": DONE}, None),
        (Edge("d", "n", after=("a", "b")), {"b": FAILED}, State.DEPENDENCY_FAILED),  # at once
        (Edge("d", "n", after=("a",)), {"a": SKIPPED}, State.DEPENDENCY_FAILED),
        (Edge("d", "n", after_any=("a",)), {"a": FAILED}, State.PENDING),
        (Edge("d", "n", after_failed=("a",)), {"a": FAILED}, State.PENDING),
        (Edge("d", "n", after_failed=("a",)), {"a": DONE}, State.SKIPPED),
        (Edge("d", "n", after_failed=("a", "b")), {"a": DONE}, None),
        (Edge("d", "n", after_failed=("a", "b")), {"a": DONE, "b": FAILED}, State.PENDING),
        (Edge("d", "n", after_failed=("a",)), {"a": "dependency_failed"}, State.PENDING),
    ],
)
def test_verdict(edge: Edge, states: dict[str, str], to: State | None) -> None:
    assert verdict(edge, states.get)[0] is to


def test_cycles_are_found_without_recursion() -> None:
    chain = {f"t{i}": [f"t{i - 1}"] if i else [] for i in range(100_000)}
    assert find_cycle(chain) is None
    chain["t0"] = ["t99999"]
    cycle = find_cycle(chain)
    assert cycle is not None and cycle[0] == cycle[-1] and len(cycle) == 100_001
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["b"]}) == ["b", "c", "b"]


def test_the_index_reads_new_lines_only_and_skips_a_torn_one(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    create_layout(paths)
    index = EdgeIndex(paths)
    write_edges(paths, [Edge("b", "nb", after=("a",))], durable=False)
    assert [e.task for e in index.of("a")] == ["b"]
    with paths.edges.open("ab") as fh:
        fh.write(b'{"task": "c", "name": "nc", "after": ["a"]')  # an add being written
    assert [e.task for e in index.of("a")] == ["b"]
    with paths.edges.open("ab") as fh:
        fh.write(b"}\n")
    assert [e.task for e in index.of("a")] == ["b", "c"]


def _blocked_run(tmp_path: Path) -> tuple[RunPaths, str]:
    paths = RunPaths(tmp_path)
    create_layout(paths)
    a = Descriptor.new({"id": "a", "priority": 0}, 0)
    b = Descriptor.new({"id": "b", "priority": 0, "after": ["a"]}, 1)
    write_pending(paths, [a, b])
    (name,) = os.listdir(paths.state_dir("blocked"))
    return paths, name


def test_a_blocked_task_is_written_blocked_with_its_edge(tmp_path: Path) -> None:
    paths, name = _blocked_run(tmp_path)
    assert [n for n in os.listdir(paths.state_dir("pending"))] == ["5000000000000_a.json"]
    assert json.loads((paths.state_dir("blocked") / name).read_text())["state"] == "blocked"
    assert EdgeIndex(paths).edge("b") == Edge("b", name, after=("a",))


def test_two_settles_of_one_task_one_wins(tmp_path: Path) -> None:
    paths, name = _blocked_run(tmp_path)
    folder = BlockedFolder(paths, durable=False)
    said: list[str] = []
    assert folder.settle(name, State.PENDING, None, lambda d: said.append(d.id)) is not None
    assert folder.settle(name, State.CANCELLED, "x", lambda d: said.append(d.id)) is None
    assert said == ["b"] and os.listdir(paths.state_dir("pending")).count(name) == 1


def test_a_cut_settle_is_finished_or_put_back(tmp_path: Path) -> None:
    paths, name = _blocked_run(tmp_path)
    blocked = paths.state_dir("blocked")
    dead = 2**22 + 12345  # no such pid
    aside = blocked / f"{SETTLE}{dead}-{name}"
    os.rename(blocked / name, aside)  # a release cut after its take: back, settled again
    folder = BlockedFolder(paths, durable=False)
    assert folder.finish_cut(lambda d, to: None) == 0
    assert os.listdir(blocked) == [name]
    data = json.loads((blocked / name).read_text())
    data.update(state="dependency_failed", reason="prerequisite a ended failed")
    aside.write_text(json.dumps(data))  # an end saved, not renamed: finished, journaled
    (blocked / name).unlink()
    said: list[tuple[str, State]] = []
    assert folder.finish_cut(lambda d, to: said.append((d.id, to))) == 1
    assert said == [("b", State.DEPENDENCY_FAILED)]
    assert os.listdir(paths.state_dir("dependency_failed")) == [name]


def test_an_add_batch_puts_a_task_with_prerequisites_in_blocked_cut_short_too(
    tmp_path: Path,
) -> None:
    paths = RunPaths(tmp_path)
    create_layout(paths)
    queue = DirQueue(paths)
    blocked = Descriptor.new({"id": "b", "after": ["a"]}, 1)
    blocked.mark_blocked()  # as AddedDeps.place marks it
    plain = Descriptor.new({"id": "c"}, 2)
    batches: list[str] = []
    queue.add_batch([blocked, plain], batches.append)
    assert queue.names(State.BLOCKED) == ["5000000000001_b.json"]
    assert queue.names(State.PENDING) == ["5000000000002_c.json"]

    class Crash(Exception):
        pass

    def crash(batch: str) -> None:  # killed once the journal said it, before the renames
        batches.append(batch)
        raise Crash

    again = Descriptor.new({"id": "d", "after": ["a"]}, 3)
    again.mark_blocked()
    with pytest.raises(Crash):
        queue.add_batch([again, Descriptor.new({"id": "e"}, 4)], crash)
    assert queue.finish_adds(lambda: set(batches)) == 2
    assert queue.names(State.BLOCKED) == ["5000000000001_b.json", "5000000000003_d.json"]
    assert queue.names(State.PENDING) == ["5000000000002_c.json", "5000000000004_e.json"]
    assert not [n for n in os.listdir(paths.state_dir("pending")) if n.startswith(".")]


def test_the_runview_counts_blocked_tasks() -> None:
    view = RunView({"pending": 1, "blocked": 2})
    view.apply({"ev": "added", "count": 3, "blocked": 2})
    assert view.counts["pending"] == 2 and view.counts["blocked"] == 4
    view.apply({"ev": "requeued", "task": "b", "frm": "blocked", "reason": "released"})
    view.apply({"ev": "dependency", "task": "c", "frm": "blocked", "state": "dependency_failed"})
    assert view.counts == {"pending": 3, "blocked": 2, "dependency_failed": 1}
    view.apply({"ev": "control", "request": "cancel", "task": "d", "state": "cancelled",
                "frm": "blocked"})  # fmt: skip
    assert view.counts["blocked"] == 1 and view.counts["cancelled"] == 1


def test_the_live_table_shows_each_groups_progress(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from gpuswarm.app.output import GroupLines
    from gpuswarm.store.queue import DirQueue
    from gpuswarm.ui.table import LiveView

    paths = RunPaths(tmp_path)
    create_layout(paths)
    tasks = [{"id": f"v{i}", "priority": 0, "group": "validate"} for i in range(3)]
    write_pending(paths, [Descriptor.new(t, i) for i, t in enumerate(tasks)])
    queue = DirQueue(paths, durable=False)
    claimed = queue.claim("o", 0)
    assert claimed is not None
    queue.move(claimed, State.DONE)
    lines = GroupLines(queue, 3)
    view = LiveView(RunView({"pending": 2, "done": 1}), lambda t, n: tmp_path, groups=lines)
    console = Console(record=True, width=140, file=io.StringIO())
    console.print(view.render())
    assert "validate  1/3 (33.3%)  done 1  pending 2" in console.export_text()


def test_after_a_repeated_task_waits_for_each_of_its_repeats(tmp_path: Path) -> None:
    config = tmp_path / "r.yaml"
    config.write_text(
        "name: r\ngpus: sim:1\ntasks:\n"
        "  - {name: foo, command: 'true', repeats: 2}\n"
        "  - {name: bar, command: 'true', after: foo}\n"
    )
    by_id = {t.id: t for t in load_config(config).tasks}
    assert by_id["bar"].after == ["foo-r1", "foo-r2"]
