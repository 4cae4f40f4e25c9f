"""``{name}`` placeholders in commands, names, paths and environment values.

Rules (the same at load time and at launch):

- ``{key}`` (``key`` an identifier, or ``config.<field>`` in a glob task) is replaced by
  ``values[key]``; an unknown key is left as is (configs are checked at load time, so that only
  happens for hand-made templates);
- ``{config.<field>|default}`` is ``default`` (any text without braces) when the matched
  config has no such field (``values`` has no ``config.<field>``);
- ``{{`` and ``}}`` produce literal ``{`` and ``}``;
- ``${...}`` (a shell variable) is left untouched, braces and all;
- any other brace (``{a,b}``, ``{"k": 1}``, ``\\d{2}``) is literal text;
- ``{key!raw}`` is the same value as ``{key}``; it differs only in shell commands.

In a ``shell: true`` command (:func:`render_shell`) every value is quoted for the place it
lands in, so that a matched folder named ``$(rm -rf ~)`` or a matrix value ``a; reboot`` stays
one literal word: outside quotes with :func:`shlex.quote`, inside ``"..."`` by escaping
``\\ " $ ```, inside ``'...'`` by closing and reopening the quotes around ``\\'``. Write
``{key!raw}`` to splice a value into the shell text as it is (then it *is* shell code).

:func:`shell_split` splits a command like :func:`shlex.split` (POSIX rules), in linear time.
"""

from __future__ import annotations

import re
import shlex
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

#: Placeholders the loader fills in: the folder of the file the tasks come from, absolute (a
#: config, a command list; the current folder for a list read from stdin). A task that uses it
#: carries it in its ``vars``, so ``add`` from another config gets that config's folder.
PLACEHOLDERS_AT_LOAD = ("config_dir",)

#: Variables a ``glob:`` entry defines for each matched file.
GLOB_VARS = ("task_file", "task_dir", "task_rel")

#: ``{config.KEY}`` (``{config.a.b}`` for nested keys): a field of a glob task's matched config.
CONFIG_PREFIX = "config."

_CONFIG_KEY = r"config(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)+"
_TOKEN = re.compile(
    r"\$\{[^}]*\}|\{\{|\}\}"
    r"|\{(?P<key>[A-Za-z_][A-Za-z0-9_]*"
    r"|(?P<config>" + _CONFIG_KEY + r")(?:\|(?P<default>[^{}]*?))?)(?P<raw>!raw)?\}"
)
#: ``{config.KEY}``, ``{config.KEY|default}`` (with or without ``!raw``): groups key, default.
CONFIG_REF = re.compile(r"\{(" + _CONFIG_KEY + r")(?:\|([^{}]*?))?(?:!raw)?\}")
_LITERAL = {"{{": "{", "}}": "}"}


def _key(match: re.Match[str]) -> str | None:
    """The values key of a placeholder token (``config.x`` of ``{config.x|1h}``); None for
    ``{{``, ``}}`` and ``${...}``."""
    return match.group("config") or match.group("key")


def _value(match: re.Match[str], values: Mapping[str, str]) -> str | None:
    """The value of a placeholder: ``values[key]``, else its ``|default``; None: neither."""
    key = _key(match)
    if key is None:
        return None
    found = values.get(key)
    return found if found is not None else match.group("default")


def render(template: str, values: Mapping[str, str]) -> str:
    """Replace every known ``{key}`` of ``template``; see the module docstring for the rules."""

    def substitute(match: re.Match[str]) -> str:
        value = _value(match, values)
        if value is not None:
            return value
        token = match.group(0)
        return _LITERAL.get(token, token)

    return _TOKEN.sub(substitute, template)


def render_shell(template: str, values: Mapping[str, str]) -> str:
    """:func:`render` for a ``/bin/sh -c`` command: each value quoted where it lands."""
    out: list[str] = []
    quote = ""  # the quote we are inside: "", "'" or '"'
    pos = 0
    for match in _TOKEN.finditer(template):
        literal = template[pos : match.start()]
        quote = _quote_state(literal, quote)
        out.append(literal)
        token = match.group(0)
        value = _value(match, values)
        if _key(match) is None:
            out.append(_LITERAL.get(token, token))
        elif value is None:
            out.append(token)
        elif match.group("raw"):  # {key!raw}: spliced as shell code
            out.append(value)
        else:
            out.append(_shell_quoted(value, quote))
        pos = match.end()
    out.append(template[pos:])
    return "".join(out)


def _quote_state(text: str, quote: str) -> str:
    """The quoting in force after ``text`` when it starts inside ``quote``."""
    i = 0
    while i < len(text):
        char = text[i]
        if quote == "'":
            if char == "'":
                quote = ""
        elif char == "\\":
            i += 1  # the next character is escaped (outside quotes and inside "...")
        elif quote == '"':
            if char == '"':
                quote = ""
        elif char in "'\"":
            quote = char
        i += 1
    return quote


def _shell_quoted(value: str, quote: str) -> str:
    if quote == "'":
        return value.replace("'", "'\\''")
    if quote == '"':
        return re.sub(r'(["\\$`])', r"\\\1", value)
    return shlex.quote(value)


_SHELL_WORD = re.compile(r"""(?:[^ \t\r\n'"\\]+|'[^']*'|"(?:[^"\\]|\\.)*"|\\.)+""", re.DOTALL)
_WORD_PART = re.compile(r"""([^'"\\]+)|'([^']*)'|"((?:[^"\\]|\\.)*)"|\\(.)""", re.DOTALL)
_IN_DOUBLE = re.compile(r'\\(["\\])')
_SHELL_SPACE = frozenset(" \t\r\n")


def shell_split(text: str) -> list[str]:
    """``shlex.split(text)`` (POSIX, no comments) in linear time; ValueError on a bad quote.

    ``shlex`` builds each word one character at a time (quadratic for a 2 MB argument).
    """
    words: list[str] = []
    pos = 0
    for match in _SHELL_WORD.finditer(text):
        _check_gap(text, pos, match.start())
        word = match.group()
        if "'" in word or '"' in word or "\\" in word:
            word = "".join(_unquoted(part) for part in _WORD_PART.finditer(word))
        words.append(word)
        pos = match.end()
    _check_gap(text, pos, len(text))
    return words


def _check_gap(text: str, start: int, end: int) -> None:
    """Between two words only shell white space; anything else is an open quote."""
    for char in text[start:end]:
        if char not in _SHELL_SPACE:
            if char == "\\":
                raise ValueError("No escaped character")
            raise ValueError("No closing quotation")


def _unquoted(part: re.Match[str]) -> str:
    bare, single, double, escaped = part.groups()
    if bare is not None:
        return str(bare)
    if single is not None:
        return str(single)
    if double is not None:
        return _IN_DOUBLE.sub(r"\1", double)
    return str(escaped)


def find_placeholders(template: str) -> list[str]:
    """The ``{key}`` names used in ``template``, in order of first use, without escapes."""
    found: list[str] = []
    for match in _TOKEN.finditer(template):
        key = _key(match)
        if key is not None and key not in found:
            found.append(key)
    return found


def uses_placeholder(templates: Iterable[str], key: str) -> bool:
    """Whether any of ``templates`` uses ``{key}`` (``{key!raw}`` too)."""
    return any("{" in t and key in find_placeholders(t) for t in templates)


def unknown_placeholders(template: str, known: Iterable[str]) -> list[str]:
    """The placeholders of ``template`` that are not in ``known``."""
    allowed = set(known)
    return [key for key in find_placeholders(template) if key not in allowed]


def escape_braces(text: str) -> str:
    """Make ``text`` render to itself (for text without ``${``): double every brace."""
    return text.replace("{", "{{").replace("}", "}}")


def blank_placeholders(template: str) -> str:
    """``template`` with each ``{key}``, ``{{`` and ``}}`` replaced by ``_`` (``${...}`` kept):
    what a scan for shell syntax must look at (``{config.x|1h}`` holds no pipe)."""

    def blank(match: re.Match[str]) -> str:
        token = match.group(0)
        return token if token.startswith("$") else "_"

    return _TOKEN.sub(blank, template)
