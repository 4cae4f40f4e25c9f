"""What a run's attempts spent, as its journal's ``finished`` lines say (issue 34): read by
``status``, a watch or dashboard that starts on a live run, and a budget at a resume."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

from gpuswarm.core.events import kind_of
from gpuswarm.core.records import parse_event


class Spent(TypedDict):
    """What a run's attempts spent (status's ``cost``)."""

    attempts: int  # those that reported usage
    tokens: int
    cost_usd: float  # the known costs' sum
    cost_unknown_attempts: int
    usd_per_done_task: float | None


def journal_spend(events: Path, done: int, upto: int | None = None) -> Spent | None:
    """What the journal's ``finished`` lines say the run's attempts spent (a live run's too):
    ``tokens``, known ``cost_usd``, ``cost_unknown_attempts``, ``usd_per_done_task``; None when
    no attempt reported usage. Only lines that carry ``"tokens"`` are parsed."""
    attempts = tokens = unknown = 0
    usd = 0.0
    for raw in _lines_with(events, b'"tokens"', upto):
        e = parse_event(raw)
        if e is None or kind_of(e) != "finished":
            continue
        n, cost = e.get("tokens"), e.get("cost_usd")
        if not isinstance(n, int) or isinstance(n, bool):
            continue
        attempts += 1
        tokens += n
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            usd += float(cost)
        else:
            unknown += 1
    if not attempts:
        return None
    return {
        "attempts": attempts,
        "tokens": tokens,
        "cost_usd": round(usd, 6),
        "cost_unknown_attempts": unknown,
        "usd_per_done_task": round(usd / done, 6) if done else None,
    }


def _lines_with(path: Path, needle: bytes, upto: int | None) -> Iterator[bytes]:
    """The whole lines of the journal (up to byte ``upto``) that hold ``needle``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    seen = 0
    with os.fdopen(fd, "rb") as f:
        for line in f:
            seen += len(line)
            if upto is not None and seen > upto:
                return
            if needle in line and line.endswith(b"\n"):
                yield line
