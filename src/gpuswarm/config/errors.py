"""Turn a pydantic ``ValidationError`` into one :class:`ConfigError` a person can act on.

Each pydantic error becomes ``file:line: field.path: what is wrong; how to fix it``. The line
comes from the YAML node marks (:class:`~gpuswarm.config.yamlload.Locator`); pydantic's ``loc``
is cut
back to the part that exists in the data (union member names and ``[key]`` markers are dropped).
Values under ``env`` are never shown: they may be secrets.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuswarm.config.yamlload import Locator, PathKey, format_path, quote
from gpuswarm.core.errors import ConfigError

MAX_REPORTED = 10

_EXPECTED = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping (key: value lines)",
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
}
_MISSING_HINT = {
    "tasks": "add a tasks: list with one entry per job",
    "command": "add command: <program and arguments>",
}
_RANGE = {
    "greater_than_equal": ("ge", ">="),
    "greater_than": ("gt", ">"),
    "less_than_equal": ("le", "<="),
    "less_than": ("lt", "<"),
}


def _kind(value: object) -> str:
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _shown(value: object, path: PathKey) -> str:
    if "env" in path:
        return "<hidden>"
    return quote(value)  # bounded: a value may be a 2 MB string or a huge list


def data_path(data: Any, loc: tuple[int | str, ...]) -> PathKey:
    """The longest prefix of ``loc`` that names something in ``data`` (plus a missing key)."""
    out: list[str | int] = []
    current = data
    for part in loc:
        in_dict = isinstance(current, dict) and part in current
        in_list = isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current)
        if in_dict or in_list:
            out.append(part)
            current = current[part]
        else:
            if isinstance(current, dict) and isinstance(part, str) and part != "[key]":
                out.append(part)
            break
    return tuple(out)


def _unwrap(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _unwrap(members[0]) if len(members) == 1 else annotation
    return annotation


def model_at(root: type[BaseModel], path: PathKey) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``path`` (None if it is not a model)."""
    current: Any = root
    for part in path:
        if isinstance(current, type) and issubclass(current, BaseModel) and isinstance(part, str):
            field = current.model_fields.get(part)
            if field is None:
                return None
            current = _unwrap(field.annotation)
        elif typing.get_origin(current) is list and isinstance(part, int):
            current = _unwrap(typing.get_args(current)[0])
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unknown_key(path: PathKey, root: type[BaseModel]) -> str:
    key, parent = path[-1], path[:-1]
    where = format_path(parent) or "the top level"
    model = model_at(root, parent)
    allowed = sorted(model.model_fields) if model else []
    close = difflib.get_close_matches(str(key), allowed, n=1) if len(str(key)) < 100 else []
    if close:
        return f"unknown key {quote(key)} in {where}; did you mean {close[0]!r}?"
    return f"unknown key {quote(key)} in {where}; allowed keys: {', '.join(allowed)}"


def _looks_typed(text: str) -> bool:
    if text.strip().lower() in ("true", "false", "yes", "no"):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def _hint(kind: str, value: object, path: PathKey) -> str:
    if isinstance(value, str) and kind.startswith(("int", "float", "bool")) and _looks_typed(value):
        return "; remove the quotes"
    if kind == "model_type" and isinstance(value, str) and len(path) == 2 and path[0] == "tasks":
        return f"; write it as - command: {value}"
    return ""


def _describe(err: Mapping[str, Any], path: PathKey) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind in ("value_error", "assertion_error"):
        return str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind == "missing":
        key = str(path[-1]) if path else "?"
        return f"missing required key {key!r}; {_MISSING_HINT.get(key, f'add {key}: ...')}"
    if kind in _EXPECTED:
        hint = _hint(kind, value, path)
        return f"expected {_EXPECTED[kind]}, got {_shown(value, path)} ({_kind(value)}){hint}"
    if kind in _RANGE:
        name, op = _RANGE[kind]
        return f"{_shown(value, path)} is out of range; it must be {op} {ctx.get(name)}"
    if kind == "finite_number":
        return f"{_shown(value, path)} is not a finite number; write a number, e.g. 256"
    if kind == "too_short":
        return "the list is empty; give at least one value"
    return f"{err['msg']} (got {_shown(value, path)})"


def _entry(err: Mapping[str, Any], data: Any, where: Locator, root: type[BaseModel]) -> str:
    path = data_path(data, tuple(err["loc"]))
    if err["type"] == "extra_forbidden" and path:
        return where.message(path, _unknown_key(path, root), show_path=False)
    if err["type"] == "invalid_key" and path:
        inside = format_path(path[:-1]) or "the top level"
        text = f"key {quote(path[-1])} in {inside} is not a string; quote it or remove it"
        return where.message(path, text, show_path=False)
    parent = path[:-1] if err["type"] == "missing" else path
    return where.message(parent, _describe(err, path))


_TYPO_CANDIDATES = 64  # unknown keys of one mapping looked at for a missing key's typo


class _Typos:
    """Whether a missing key is a typo of an unknown key beside it (``comand`` for
    ``command``): then "unknown key 'comand'; did you mean 'command'?" says it already.

    The unknown keys are grouped by mapping once (no difflib); difflib runs only for the
    missing keys that are reported, over at most :data:`_TYPO_CANDIDATES` keys each."""

    def __init__(self, located: list[tuple[int, int, PathKey, Mapping[str, Any]]]) -> None:
        self.unknown: dict[PathKey, list[str]] = {}
        for _, _, path, err in located:
            if err["type"] == "extra_forbidden" and path:
                self.unknown.setdefault(path[:-1], []).append(str(path[-1]))

    def has_unknown(self, path: PathKey) -> bool:
        return bool(path) and path[:-1] in self.unknown

    def covers(self, path: PathKey, root: type[BaseModel]) -> bool:
        if not self.has_unknown(path):
            return False
        model = model_at(root, path[:-1])
        allowed = list(model.model_fields) if model else []
        keys = self.unknown[path[:-1]][:_TYPO_CANDIDATES]
        return any(
            path[-1] in difflib.get_close_matches(key, allowed, n=1)
            for key in keys
            if len(key) < 100
        )


def _cheap_key(err: Mapping[str, Any], path: PathKey) -> tuple[Any, ...]:
    return (path, err["type"], err["msg"])


def config_error(
    exc: ValidationError, data: Any, where: Locator, root: type[BaseModel]
) -> ConfigError:
    """One :class:`ConfigError` listing the first problems of ``exc`` by line (at most
    :data:`MAX_REPORTED`) and how many more there are.

    Linear in the problems: each is located once (no message, no difflib); messages are made
    in line order until ``MAX_REPORTED + 1`` distinct ones are found; the rest are counted
    by a cheap key (field, kind, pydantic's message)."""
    errors: list[Mapping[str, Any]] = list(exc.errors(include_url=False))
    located = []
    for n, err in enumerate(errors):
        path = data_path(data, tuple(err["loc"]))
        located.append((where.line(path) or 0, n, path, err))
    located.sort(key=lambda item: (item[0], item[1]))
    typos = _Typos(located)
    shown: list[str] = []
    seen: set[str] = set()
    shown_keys: set[tuple[Any, ...]] = set()
    rest: set[tuple[Any, ...]] = set()
    for _, _, path, err in located:
        missing = err["type"] == "missing"
        if len(shown) > MAX_REPORTED:
            if not (missing and typos.has_unknown(path)):
                rest.add(_cheap_key(err, path))
            continue
        if missing and typos.covers(path, root):
            continue
        text = _entry(err, data, where, root)
        if text not in seen:
            seen.add(text)
            shown.append(text)
            shown_keys.add(_cheap_key(err, path))
    more = len(shown) - MAX_REPORTED + len(rest - shown_keys)
    lines = shown[:MAX_REPORTED]
    if more > 0:
        lines.append(f"... and {more} more problems")
    return ConfigError("\n".join(lines))


def flag_error(exc: ValidationError) -> ConfigError:
    """A ConfigError for options given as command-line flags: ``--max-attempts: ...``."""
    messages = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        flag = "--" + str(loc[0]).replace("_", "-") if loc else "option"
        messages.append(f"{flag}: {_describe(err, loc)}")
    return ConfigError("\n".join(messages))
