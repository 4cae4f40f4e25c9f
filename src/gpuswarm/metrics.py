"""Reading what a task produced: metric lines in its log and its completion (result) file."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

LOG_SCAN_BYTES = 1 << 20


class ResultFileError(Exception):
    """The completion file is missing or does not parse (not a GpuswarmError: a task outcome)."""


def _log_text(path: Path, max_bytes: int = LOG_SCAN_BYTES) -> str:
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return ""
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


def parse_metrics(log: Path, patterns: Mapping[str, str]) -> dict[str, Any]:
    """Apply each ``name -> regex`` to the log (multiline); the last match wins.

    The value is the first capture group (or the whole match), converted to a number when it is
    one. Progress lines ending in ``\\r`` count as separate lines.
    """
    if not patterns:
        return {}
    text = _log_text(log)
    out: dict[str, Any] = {}
    for name, pattern in patterns.items():
        last = None
        for last in re.finditer(pattern, text, re.MULTILINE):  # noqa: B007 - keep the last one
            pass
        if last is not None:
            value = last.group(1) if last.groups() else last.group(0)
            out[name] = to_number(value.strip())
    return out


def load_result_file(path: Path) -> Any:
    """Parse a completion file (JSON or YAML); raise ResultFileError with the reason."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultFileError(f"completion file {path.name} was not written") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultFileError(f"completion file {path.name} is unreadable: {exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ResultFileError(f"completion file {path.name} does not parse: {first}") from None
    if data is None:
        raise ResultFileError(f"completion file {path.name} is empty")
    return data


def flatten(data: Any, prefix: str = "", max_items: int = 200) -> dict[str, Any]:
    """Flatten nested mappings into ``a.b.c`` keys; lists of scalars become one joined value."""
    out: dict[str, Any] = {}

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
