"""Records read back from disk are checked before they are used: descriptors and journal lines.

A descriptor in ``done/`` may have been truncated to 0 bytes, or edited so that a value has the
wrong type (``"attempts": "x"``); a journal line may be valid JSON that is no object (``[1]``).
Readers turn such a record into a finding (a corrupt row, a ``check`` finding), never into a
traceback: :func:`descriptor_problem` says what is wrong with a descriptor, :func:`parse_event`
returns an event line's object or None.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_NUMBER = (int, float)
#: the attempt field of its measured peak GPU memory (issue 19): what /metrics' VRAM histogram
#: folds (metrics/runstats.py), named here once beside its type
PEAK_VRAM_FIELD = "peak_vram_mb"
_ATTEMPT_TYPES: dict[str, tuple[type, ...]] = {
    "n": (int,),
    "slot": (str,),
    "gpus": (list,),
    "started": _NUMBER,
    "ended": _NUMBER,
    "duration": _NUMBER,
    "kind": (str,),
    "returncode": (int, type(None)),
    "signal": (str, type(None)),
    "reason": (str, type(None)),
    "metrics": (dict, type(None)),
    "interrupted": (bool,),
    "host": (str,),
    "accelerator": (str,),
    # GPU use (issue 19): the VRAM sampler's measurements
    PEAK_VRAM_FIELD: (int,),
    "mean_vram_mb": (int,),
    "peak_gpu_util": (int,),
    "mean_gpu_util": (int,),
    "energy_j": _NUMBER,  # issue 37
    "energy_mode": (str,),
    # what an agent spent (issue 34): null = not reported / cost unknown
    "tokens_in": (int, type(None)),
    "tokens_cached": (int, type(None)),
    "tokens_out": (int, type(None)),
    "cost_usd": (*_NUMBER, type(None)),
    "model": (str, type(None)),
    "usage_problem": (str, type(None)),
}
_TASK_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "name": (str,),
    "env": (dict,),
    "max_attempts": (int,),
    "timeout": (*_NUMBER, type(None)),
    "priority": (int,),
}
_TOP_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "task": (dict,),
    "attempts": (list,),
    "budget_from": (int,),
    "interruptions": (int,),
    "reason": (str, type(None)),
    "result": (dict, type(None)),
    "state": (str,),
    "retry_at": (*_NUMBER, type(None)),
}


def _wrong(where: str, value: Any, types: tuple[type, ...]) -> str:
    want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
    return f"{where} is {type(value).__name__}, not {want}"


def _check(
    obj: Mapping[str, object], types: dict[str, tuple[type, ...]], prefix: str
) -> str | None:
    for key, allowed in types.items():
        if key in obj:
            value = obj[key]
            if type(value) in allowed:  # parsed JSON: the exact type decides (the hot path)
                continue
            if isinstance(value, bool) and bool not in allowed:  # bool is an int in Python
                return _wrong(f"{prefix}{key}", value, allowed)
            if not isinstance(value, allowed):
                return _wrong(f"{prefix}{key}", value, allowed)
    return None


def descriptor_problem(data: Any, *, task_fields: bool = True) -> str | None:
    """What makes ``data`` (a parsed descriptor) unusable, or None when it is a descriptor.

    ``task_fields=False`` leaves the task's own fields to the caller (a claim validates the
    whole task and sets an invalid one aside as ``invalid-task``)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not a descriptor object"
    if "task" not in data:
        return "no 'task' field"
    problem = _check(data, _TOP_TYPES, "")
    if problem is not None:
        return problem
    problem = _check(data["task"], _TASK_TYPES, "task.") if task_fields else None
    if problem is not None:
        return problem
    for i, attempt in enumerate(data.get("attempts", [])):
        if not isinstance(attempt, dict):
            return _wrong(f"attempts[{i}]", attempt, (dict,))
        problem = _check(attempt, _ATTEMPT_TYPES, f"attempts[{i}].")
        if problem is not None:
            return problem
    return None


def parse_descriptor(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """``(descriptor, None)``, or ``(None, why it is unusable)`` (empty, not JSON, mistyped)."""
    if not raw.strip():
        return None, "empty file" if not raw else "blank file"
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return None, f"not JSON ({str(exc)[:120]})"
    problem = descriptor_problem(data)
    return (None, problem) if problem is not None else (data, None)


_EVENT_TYPES: dict[str, tuple[type, ...]] = {
    "ts": _NUMBER,
    "ev": (str,),
    "task": (str, type(None)),
    "slot": (str,),
    "attempt": (int,),
    "seconds": _NUMBER,
    "state": (str,),
    "reason": (str, type(None)),
    "frm": (str,),
    "added": (int,),
}


def event_problem(event: Any) -> str | None:
    """What makes a parsed journal line unusable as an event, or None."""
    if not isinstance(event, dict):
        kind = "null" if event is None else type(event).__name__
        return f"a JSON {kind}, not an event object"
    return _check(event, _EVENT_TYPES, "")


def parse_event(raw: bytes | str) -> dict[str, Any] | None:
    """A journal line's event object; None for a line that is not JSON, not an object, or an
    event whose fields have the wrong types (readers skip it; ``check`` reports it)."""
    try:
        event = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return event if event_problem(event) is None else None


def why_unreadable(path: Path) -> str | None:
    """Why the descriptor at ``path`` cannot be used; None when it can, or when it is gone
    (moved on by a live supervisor: not a problem of the file)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return parse_descriptor(raw)[1]
