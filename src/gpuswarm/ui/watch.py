"""``gpuswarm watch RUN_DIR``: follow a run another process supervises.

One look at the folders when it starts (``RunReader.view``: counts, what runs where), then only
the new lines of events.jsonl, folded by the one reducer: no folder scans while it follows. It
ends when no supervisor holds the run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TextIO

from gpuswarm.core.events import Event
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.runview import RunView
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.outputs.spend import seed_view
from gpuswarm.store.ledger import EventTail
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import open_run
from gpuswarm.ui.terminal import PlainReporter, is_terminal, paused_now

POLL_SECONDS = 0.25
LIVE_CHECK_SECONDS = 1.0


class Follower:
    """A :class:`RunView` of a run another process supervises, kept up to date: one look at the
    folders (``RunReader.view``), then only the journal's new lines (``watch``, ``research
    loop``'s live table)."""

    def __init__(self, paths: RunPaths) -> None:
        self.reader = RunReader(paths)
        self.view: RunView = self.reader.view()
        self._tail = EventTail(paths.events, from_end=True)
        seed_view(self.view, paths.events, self._tail.position)  # what was spent so far (34)

    @property
    def position(self) -> int:
        """The journal offset the view has folded up to (after its last complete line)."""
        return self._tail.position

    def grew(self) -> bool:
        """Whether the journal has lines not folded yet (one stat)."""
        return self._tail.grew()

    def poll(self) -> list[Event | dict[str, object]]:
        """Fold the lines appended since the last call; each one's typed event, or the raw
        line (any JSON object) when it is of the wrong shape (skipped)."""
        out: list[Event | dict[str, object]] = []
        for raw in self._tail.poll():
            event = self.view.apply(raw)
            out.append(raw if event is None else event)
        return out


def watch(run_dir: Path, *, stream: TextIO, plain: bool = False, once: bool = False) -> int:
    """Follow the run until no supervisor is live; exit code 0 when every task is done."""
    from gpuswarm.ui.table import LiveView, shown  # rich: here (the notifier's Follower is not)

    paths, info = open_run(run_dir)
    follower = Follower(paths)
    reader, state = follower.reader, follower.view
    listener = (
        LiveView(
            state,
            paths.attempt_log,
            title=paths.root.name,
            paused=paused_now(paths),
            redactor=run_redactor(info),
        )
        if is_terminal(stream) and not plain
        else None
    )
    reporter = PlainReporter(view=state, stream=stream)

    def follow() -> None:
        next_check = time.monotonic() + (0 if once else LIVE_CHECK_SECONDS)
        while True:
            for event in follower.poll():
                if isinstance(event, dict):  # a line no gpuswarm wrote: go on
                    stream.write(
                        f"gpuswarm: skipped a malformed journal line: {str(event)[:200]}\n"
                    )
                elif listener is None:
                    reporter.show(event)
            if time.monotonic() >= next_check:
                if once or not reader.live():
                    return
                next_check = time.monotonic() + LIVE_CHECK_SECONDS
            time.sleep(POLL_SECONDS)

    if listener is not None:
        with shown(listener):
            follow()
    else:
        follow()
    with state.lock:
        left = state.counts.get("pending", 0) + state.counts.get("running", 0)
        failed = state.counts.get("failed", 0)
        done = state.counts.get("done", 0)
    live = reader.live()
    stream.write(
        f"{paths.root.name}: done {done}  failed {failed}  "
        f"unfinished {left}  ({'live' if live else 'no supervisor running'})\n"
    )
    stream.flush()
    return 0 if left == 0 and failed == 0 else 1
