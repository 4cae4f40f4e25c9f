"""The last JSON object in a CLI's output: where its usage record and its answer are.

A CLI that prints JSON ends with the object that matters (Claude Code's ``result``, Gemini
CLI's document), on a line of its own; only the last :data:`MAX_CANDIDATES` lines that open an
object are tried. A record that is there but does not parse is :class:`Garbled`, which its
readers report (a usage ``problem``) or skip (an answer), never a traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping

MAX_CANDIDATES = 64  # JSON objects tried per log, from its end


class Garbled(Exception):
    """A record found but unreadable (its message says which field)."""


def _json_candidates(text: str) -> list[int]:
    """Starts of the last :data:`MAX_CANDIDATES` lines that open a JSON object, last first."""
    starts = [m.start() for m in re.finditer(r"(?m)^\{", text)]
    return starts[: -MAX_CANDIDATES - 1 : -1]


def last_object(
    text: str, marker: str, want: Callable[[Mapping[str, object]], bool]
) -> dict[str, object] | None:
    """The last JSON object in ``text`` that opens a line and passes ``want``; Garbled when the
    last line that looks like one (it holds ``marker``) does not parse; None when none. Its
    values are the CLI's JSON, unchecked: each reader narrows what it reads."""
    decoder = json.JSONDecoder()
    broken: str | None = None
    for start in _json_candidates(text):
        try:
            obj, _end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            line = text[start : start + 4096].split("\n", 1)[0]
            if broken is None and marker in line:
                broken = line[:60]
            continue
        if isinstance(obj, dict) and want(obj):
            return obj
    if broken is not None:
        raise Garbled(f"{broken!r}... is not JSON")
    return None
