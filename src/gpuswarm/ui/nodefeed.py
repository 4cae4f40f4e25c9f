"""The other nodes' slots in a Slurm head's terminal output (issue 36: the head "shows each
node's slots").

Inside a multi-node allocation each other node's ``gpuswarm work`` journals its own slots in
the shared run folder's events.jsonl; the head's reporter (a live table or lines) hears only
its own process's records. :class:`NodeFeed` follows the journal as ``gpuswarm watch`` does
(store.ledger.EventTail: only what was appended, from the end) and hands the reporter the
other supervisors' slot records: a ``supervisor_started`` naming none of the head's slots, and
every event of a slot that is not the head's (its starts, ends, requeues). Lines of the wrong
shape are skipped (every reader's rule); the head's own records already reached it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from gpuswarm.core.events import SupervisorStarted, decode
from gpuswarm.store.ledger import EventTail

POLL_SECONDS = 0.25


class NodeFeed:
    def __init__(
        self, events: Path, listener: Callable[[dict[str, Any]], None], own: Iterable[str]
    ) -> None:
        self.listener = listener
        self.own = frozenset(own)
        self._tail = EventTail(events, from_end=True)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="node-feed", daemon=True)

    def foreign(self, raw: Mapping[str, object]) -> bool:
        """Whether a journal line is another node's slot record (checked field by field)."""
        event = decode(raw)
        if event is None:
            return False
        if isinstance(event, SupervisorStarted):
            return bool(event.slots) and not self.own.intersection(event.slots)
        slot = getattr(event, "slot", None)
        return isinstance(slot, str) and bool(slot) and slot not in self.own

    def poll(self) -> None:
        for raw in self._tail.poll():
            if self.foreign(raw):
                self.listener(raw)

    def _follow(self) -> None:
        while not self._done.wait(POLL_SECONDS):
            self.poll()

    def __enter__(self) -> NodeFeed:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.poll()  # what the others journaled last
