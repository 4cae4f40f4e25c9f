"""Named fault points: places in the code where a test can make the process fail on purpose.

The chaos tests SIGKILL a supervisor at the worst moments (a descriptor saved but not renamed, an
event about to be written, ...). They used to patch private attributes by name, which after a
refactor still "succeeds" and never fires. Instead the code calls :func:`point` with a declared
name at each such moment, and a test arms a name; arming a name not in :data:`POINTS` fails
loudly, and so does a code path that reaches an undeclared name.

Cost when nothing is armed: one call and one truthiness test of a module-level dict.

Arming: ``GPUSWARM_FAULTS`` (read once, at import) or :func:`arm`, both taking specs separated
by ``;``, each ``NAME[?KEY=VALUE[&KEY=VALUE...]]:ACTION[#N]``:

- ``KEY=VALUE`` matches only calls whose context field ``KEY`` (``str()``) equals ``VALUE``;
- ``ACTION`` is ``kill`` (SIGKILL this process: nothing after the point runs, like ``kill -9``)
  or ``raise`` (raise :class:`FaultInjected`);
- ``#N`` fires at the Nth matching call (default 1), once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuswarm.core.errors import GpuswarmError

ENV = "GPUSWARM_FAULTS"

#: every fault point the code declares, with the moment it marks
POINTS: dict[str, str] = {
    "ledger.emit.before": "an event (ctx: ev, its fields) is about to be appended to the journal",
    "ledger.emit.after": "an event (ctx: ev, its fields) was appended to the journal",
    "queue.claimed": "a claim's rename into running/ happened; nothing was launched yet",
    "queue.move.saved": "a move's descriptor (ctx: state) was saved in running/, not yet renamed",
    "queue.group.synced": "a group commit's saved descriptors (ctx: count) are durable; none "
    "is in place, journaled or renamed yet",
    "fsutil.temp_written": "an atomic write's temp file (ctx: path, data) is written, not renamed",
    "committer.cancel.ended": "a cancelled attempt (ctx: task) ended, its commit not yet begun",
    "spool.chunk": "a streamed enqueue wrote a chunk (ctx: done, tasks in pending/ so far)",
    # issue 35: releasing the dependents of an ended task
    "release.marked": "a prerequisite's end mark (ctx: task) written, its dependents not settled",
    "blocked.settle.saved": "a blocked task's new state (ctx: state) saved aside, not journaled",
    "blocked.settle.journaled": "a blocked task's move (ctx: state) journaled, not renamed",
    "cancel.blocked.seen": "a cancel saw a task (ctx: task) in blocked/, not yet taken it",
}

Predicate = Callable[[dict[str, Any]], bool]
Action = Callable[[str], None]


class FaultInjected(GpuswarmError):
    """Raised by a fault point armed with the ``raise`` action."""


class UnknownFaultPoint(GpuswarmError):
    """A fault point name that is not declared in :data:`POINTS` (a typo or a removed point)."""


@dataclass
class _Armed:
    spec: str
    action: Action
    nth: int = 1
    match: dict[str, str] = field(default_factory=dict)
    when: Predicate | None = None
    count: int = 0

    def matches(self, ctx: dict[str, Any]) -> bool:
        if any(str(ctx.get(k)) != v for k, v in self.match.items()):
            return False
        return self.when is None or self.when(ctx)


_armed: dict[str, list[_Armed]] = {}
_lock = threading.Lock()


def armed() -> bool:
    """Whether any fault is armed: a hot path's point whose context costs a dict per call
    (``point(name, **record)``) is skipped without building it when none is."""
    return bool(_armed)


def point(name: str, /, **ctx: Any) -> None:
    """Mark the fault point ``name`` (declared in POINTS); fires an armed fault that matches."""
    if _armed:
        _reach(name, ctx)


def _reach(name: str, ctx: dict[str, Any]) -> None:
    if name not in POINTS:
        raise UnknownFaultPoint(f"fault point {name!r} is not declared in gpuswarm.core.faults")
    fire: _Armed | None = None
    with _lock:
        for armed in _armed.get(name, ()):
            if armed.count < armed.nth and armed.matches(ctx):
                armed.count += 1
                if armed.count == armed.nth:
                    fire = armed
                    break
    if fire is not None:
        fire.action(fire.spec)


def kill(spec: str) -> None:
    """SIGKILL this process (what ``kill -9`` does at exactly this point)."""
    sys.stderr.write(f"faults: SIGKILL at {spec}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _raise(spec: str) -> None:
    raise FaultInjected(f"fault injected at {spec}")


ACTIONS: dict[str, Action] = {"kill": kill, "raise": _raise}


def arm(specs: str, *, when: Predicate | None = None, action: Action | None = None) -> None:
    """Arm each ``;``-separated spec (grammar in the module docstring). ``when`` adds a
    predicate on the context and ``action`` replaces the spec's action (callers in tests)."""
    for spec in filter(None, (s.strip() for s in specs.split(";"))):
        armed = _parse(spec, when, action)
        with _lock:
            _armed.setdefault(spec.partition("?")[0].partition(":")[0], []).append(armed)


def _parse(spec: str, when: Predicate | None, action: Action | None) -> _Armed:
    head, _, nth = spec.partition("#")
    target, sep, verb = head.rpartition(":")
    if not sep:
        raise UnknownFaultPoint(f"fault spec {spec!r}: expected NAME[?K=V]:ACTION[#N]")
    name, _, query = target.partition("?")
    if name not in POINTS:
        known = ", ".join(sorted(POINTS))
        raise UnknownFaultPoint(f"fault spec {spec!r}: unknown point {name!r} (known: {known})")
    if action is None and verb not in ACTIONS:
        raise UnknownFaultPoint(f"fault spec {spec!r}: unknown action {verb!r}")
    match = dict(kv.partition("=")[::2] for kv in query.split("&") if kv)
    chosen = action if action is not None else ACTIONS[verb]
    return _Armed(spec=spec, action=chosen, nth=int(nth or 1), match=match, when=when)


def disarm() -> None:
    """Forget every armed fault (tests that arm in-process)."""
    with _lock:
        _armed.clear()


arm(os.environ.get(ENV, ""))
