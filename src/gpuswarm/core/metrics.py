"""Reading what a task produced: metric lines in its log and its completion (result) file."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuswarm.core.taskfiles import inside, read_limited, read_tail

LOG_SCAN_BYTES = 1 << 20
RESULT_MAX_BYTES = 4 << 20  # a completion file larger than this is a failed attempt
RESULT_MAX_DEPTH = 100  # nesting deeper than this is a failed attempt (never a RecursionError)
RESULT_MAX_VALUES = 100_000


class ResultFileError(Exception):
    """The completion file is missing or does not parse (not a GpuswarmError: a task outcome)."""


def _log_text(path: Path, max_bytes: int = LOG_SCAN_BYTES) -> str:
    data = read_tail(path, max_bytes)[0]  # never blocks on a FIFO, never follows a symlink
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def to_number(text: str) -> float | int | str:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_metrics(log: Path, patterns: Mapping[str, str]) -> dict[str, float | int | str]:
    """Apply each ``name -> regex`` to the log (multiline); the last match wins.

    The value is the first capture group (or the whole match), converted to a number when it is
    one. Progress lines ending in ``\\r`` count as separate lines.
    """
    if not patterns:
        return {}
    text = _log_text(log)
    out: dict[str, float | int | str] = {}
    for name, pattern in patterns.items():
        last = None
        for last in re.finditer(pattern, text, re.MULTILINE):  # noqa: B007 - keep the last one
            pass
        if last is not None:
            value = last.group(1) if last.groups() else last.group(0)
            out[name] = to_number(value.strip())
    return out


def load_result_file(path: Path) -> Any:
    """Parse a completion file (JSON or YAML); raise ResultFileError with the reason.

    The file is the task's: it may be a FIFO, a symlink, huge, deeply nested or recursive
    (a YAML anchor that contains itself). Each of these is a ResultFileError, never a hang or
    an exception of another kind."""
    try:
        raw = read_limited(path, RESULT_MAX_BYTES)
    except FileNotFoundError:
        raise ResultFileError(f"completion file {path.name} was not written") from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ResultFileError(f"completion file {path.name} is unreadable: {why}") from None
    try:
        text = raw.decode("utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        _check_shape(data)
    except ResultFileError as exc:
        raise ResultFileError(f"completion file {path.name} is unusable: {exc}") from None
    except RecursionError:
        raise ResultFileError(f"completion file {path.name} is nested too deeply") from None
    except (ValueError, yaml.YAMLError, MemoryError, TypeError, OverflowError) as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ResultFileError(f"completion file {path.name} does not parse: {first}") from None
    if data is None:
        raise ResultFileError(f"completion file {path.name} is empty")
    return data


def read_completion(workspace: Path, rel: str) -> Any:
    """The parsed completion file ``rel`` of a task workspace (placeholders already filled in).

    It must stay inside the workspace once symlinks are resolved (a task or a placeholder
    value must not make gpuswarm copy ``/etc/passwd`` or a secret into results.tsv)."""
    try:
        target = inside(workspace, rel)
    except OSError as exc:
        raise ResultFileError(f"completion file {exc.filename}: {exc.strerror}") from None
    return load_result_file(target)


def _check_shape(data: Any) -> None:
    """Refuse structures nested deeper than RESULT_MAX_DEPTH (a structure that contains
    itself, a recursive YAML alias, is infinitely deep) or with too many values (aliases
    shared many times over: a "billion laughs")."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        if not isinstance(value, Mapping | list):
            continue
        if depth >= RESULT_MAX_DEPTH:
            raise ResultFileError(
                f"nested more than {RESULT_MAX_DEPTH} levels deep, or it contains itself "
                "(a recursive YAML alias)"
            )
        seen += 1
        if seen > RESULT_MAX_VALUES:
            raise ResultFileError(f"more than {RESULT_MAX_VALUES} nested lists and mappings")
        children = value.values() if isinstance(value, Mapping) else value
        stack.extend((child, depth + 1) for child in children)


def flatten(data: Any, prefix: str = "", max_items: int = 200) -> dict[str, object]:
    """Flatten nested mappings into ``a.b.c`` keys; lists of scalars become one joined value.
    The values are the task's own (a result file's scalars: any JSON or YAML leaf)."""
    out: dict[str, object] = {}

    def walk(value: Any, key: str) -> None:
        if len(out) >= max_items:
            return
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list):
            if all(not isinstance(v, (Mapping, list)) for v in value):
                out[key or "value"] = ",".join(str(v) for v in value)
            else:
                for i, v in enumerate(value):
                    walk(v, f"{key}.{i}" if key else str(i))
        else:
            out[key or "value"] = value

    walk(data, prefix)
    return out
