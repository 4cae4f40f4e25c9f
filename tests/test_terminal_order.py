"""The plain reporter's lines per slot (issue 33): a slot's next ``start`` is journaled by the
loop before a committer thread journals the last task's end; the terminal prints it after."""

from __future__ import annotations

import io

import pytest

from gpuswarm.core.events import Event, Finished, Requeued, Slots, Started
from gpuswarm.ui import terminal
from gpuswarm.ui.terminal import PlainReporter, slots_line


def _words(events: list[Event]) -> list[str]:
    out = io.StringIO()
    rep = PlainReporter(stream=out)
    for e in events:
        rep.show(e)
    return [" ".join(line.split()[1:3]) for line in out.getvalue().splitlines()]


def _start(task: str, slot: str = "gpu0") -> Started:
    return Started(task=task, attempt=1, slot=slot, ts=0.0)


def _done(task: str, slot: str = "gpu0") -> Finished:
    return Finished(task=task, slot=slot, state="done", seconds=0.1, ts=0.0)


def test_a_start_journaled_before_the_last_end_is_printed_after_it() -> None:
    events: list[Event] = [
        _start("a"), _start("b"), _start("c"), _start("x", "gpu1"), _done("a"), _done("b"),
        _done("x", "gpu1"), _done("c"),
    ]  # fmt: skip
    assert _words(events) == [
        "gpu0 start", "gpu1 start", "gpu0 done", "gpu0 start", "gpu0 done", "gpu0 start",
        "gpu1 done", "gpu0 done",
    ]  # fmt: skip


def test_a_requeued_end_releases_the_next_start_and_a_held_one_waits_at_most_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lost = Requeued(task="a", frm="running", reason="lost", ts=0.0)
    assert _words([_start("a"), _start("b"), lost]) == ["gpu0 start", "requeued a", "gpu0 start"]
    clock = [100.0]
    monkeypatch.setattr("gpuswarm.ui.terminal.time.monotonic", lambda: clock[0])
    out = io.StringIO()
    rep = PlainReporter(stream=out)
    rep.show(_start("a"))
    rep.show(_start("b"))  # a's end never comes (a reader that joined late)
    assert out.getvalue().count(" start ") == 1
    clock[0] += terminal.HELD_SECONDS + 0.1
    rep.show(_start("y", "gpu1"))
    assert out.getvalue().count(" start ") == 3


def test_a_node_joining_and_leaving_is_one_line_each() -> None:
    joined = Slots(change="joined", node="2ad7a3bf", host="h1", slots=["a", "b"])
    left = Slots(change="left", node="2ad7a3bf", host="h1", slots=["a"])
    assert slots_line(joined) == "node 2ad7a3 (h1) joined: 2 slots"
    assert (line := slots_line(left)) is not None and line.startswith(
        "node 2ad7a3 (h1) left the cluster: 1 slot retired"
    )
    assert slots_line(Slots(change="adopted", slots=["a"])) is None
