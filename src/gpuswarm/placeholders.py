"""``{name}`` placeholders in commands, names, paths and environment values.

Rules (the same at load time and at launch):

- ``{key}`` (``key`` an identifier, or ``config.<field>`` in a glob task) is replaced by
  ``values[key]``; an unknown key is left as is (configs are checked at load time, so that only
  happens for hand-made templates);
- ``{{`` and ``}}`` produce literal ``{`` and ``}``;
- ``${...}`` (a shell variable) is left untouched, braces and all;
- any other brace (``{a,b}``, ``{"k": 1}``, ``\\d{2}``) is literal text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

#: Placeholders the supervisor supplies when it launches an attempt.
PLACEHOLDERS_AT_LAUNCH = (
    "workspace",  # the task's workspace folder: <run_dir>/tasks/<task_id>
    "run_dir",  # the run folder
    "task_id",
    "name",  # the task's human name
    "attempt",  # 1, 2, ...
    "gpu_ids",  # host GPU ids of the slot, comma separated: "0,1"
    "gpu",  # the first of them
    "slot",  # the worker slot number (0..n-1 of its supervisor)
    "slot_id",  # the slot's id, unique in the run: <host>-gpu3, <host>-gpu3.1
)

#: Variables a ``glob:`` entry defines for each matched file.
GLOB_VARS = ("task_file", "task_dir", "task_rel")

#: ``{config.KEY}`` (``{config.a.b}`` for nested keys): a field of a glob task's matched config.
CONFIG_PREFIX = "config."

_TOKEN = re.compile(
    r"\$\{[^}]*\}|\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*|config(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)+)\}"
)
CONFIG_REF = re.compile(r"\{(config(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)+)\}")
_LITERAL = {"{{": "{", "}}": "}"}


def render(template: str, values: Mapping[str, str]) -> str:
    """Replace every known ``{key}`` of ``template``; see the module docstring for the rules."""

    def substitute(match: re.Match[str]) -> str:
        key = match.group(1)
        if key is not None:
            return values.get(key, match.group(0))
        token = match.group(0)
        return _LITERAL.get(token, token)

    return _TOKEN.sub(substitute, template)


def find_placeholders(template: str) -> list[str]:
    """The ``{key}`` names used in ``template``, in order of first use, without escapes."""
    found: list[str] = []
    for match in _TOKEN.finditer(template):
        key = match.group(1)
        if key is not None and key not in found:
            found.append(key)
    return found


def unknown_placeholders(template: str, known: Iterable[str]) -> list[str]:
    """The placeholders of ``template`` that are not in ``known``."""
    allowed = set(known)
    return [key for key in find_placeholders(template) if key not in allowed]


def escape_braces(text: str) -> str:
    """Make ``text`` render to itself (for text without ``${``): double every brace."""
    return text.replace("{", "{{").replace("}", "}}")
