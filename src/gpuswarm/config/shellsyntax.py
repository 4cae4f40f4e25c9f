"""Does a command string need a shell? :func:`shell_syntax` finds the first construct that
``/bin/sh -c`` would act on but an argv split (:func:`gpuswarm.core.placeholders.shell_split`)
passes to the program as plain characters: a YAML ``command:`` string that holds one without
``shell:`` is refused (it would run, but not as written).

Quoting is followed as the shell does: inside ``'...'`` nothing is syntax; inside ``"..."`` only
``$`` expansions and backticks are; a backslash escapes the next character. Outside quotes:
``|`` ``&`` ``;`` ``<`` ``>`` ``(`` ``)``, backticks, ``$NAME`` ``${...}`` ``$(...)`` ``$1``,
the wildcards ``*`` and ``?``, ``#`` (a comment) and ``~`` (the home folder) at the start of a
word, and a first word ``NAME=value`` (a variable assignment). ``{placeholders}`` are not
looked at (``{config.x|1h}`` holds no pipe): their values are substituted after the split.
"""

from __future__ import annotations

import re

from gpuswarm.core.placeholders import blank_placeholders

_OPERATORS = {
    "||": "the operator ||",
    "&&": "the operator &&",
    "|": "a pipe |",
    "&": "& (run in the background)",
    ";": "the command separator ;",
    "<": "a redirection <",
    ">": "a redirection >",
    "(": "a subshell (",
    ")": "a subshell )",
    "`": "a command substitution `...`",
    "*": "the wildcard *",
    "?": "the wildcard ?",
}
_AT_WORD_START = {"#": "a comment #", "~": "~ (the home folder)"}
_EXPANSION = re.compile(r"\$(?:\(|\{|[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?!$-])")
_ASSIGNMENT = re.compile(r"[ \t\r\n]*[A-Za-z_][A-Za-z0-9_]*=")
_SPACE = frozenset(" \t\r\n")
_BREAKS = frozenset(" \t\r\n;|&()<>")  # after one of these (unquoted) a word starts


def shell_syntax(command: str) -> str | None:
    """The first shell construct of ``command`` (``"a pipe |"``), or None when an argv split
    means what a shell would run."""
    text = blank_placeholders(command)
    if _ASSIGNMENT.match(text):
        return "a variable assignment (NAME=value) before the program"
    scan = _Scan(text)
    while scan.pos < len(text):
        found = scan.step()
        if found is not None:
            return found
    return None


def unclosed_quote(command: str) -> str | None:
    """The quote (``'`` or ``"``) that ``command`` leaves open, which ``/bin/sh`` refuses; None
    when every quote closes. A ``#`` starting a word outside quotes is a comment: the rest of
    the line is not looked at (``echo hi # don't`` is fine)."""
    quote = ""
    word_start = True
    i = 0
    while i < len(command):
        char = command[i]
        if quote:
            if char == quote:
                quote = ""
            elif char == "\\" and quote == '"':
                i += 1
        elif char == "#" and word_start:
            break
        elif char == "\\":
            i += 1
        elif char in "'\"":
            quote = char
        word_start = not quote and char in _BREAKS
        i += 1
    return quote or None


class _Scan:
    """One pass over the text: the quote in force and whether a word starts here."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.quote = ""  # "", "'" or '"'
        self.word_start = True

    def step(self) -> str | None:
        char = self.text[self.pos]
        if self.quote == "'":
            self.quote = "" if char == "'" else "'"
            self.pos += 1
            return None
        if char == "\\":
            self.pos += 2
            self.word_start = False
            return None
        if char in "$`":
            return self._expansion(char)
        if self.quote == '"':
            self.quote = "" if char == '"' else '"'
            self.pos += 1
            return None
        return self._unquoted(char)

    def _expansion(self, char: str) -> str | None:
        if char == "`":
            return _OPERATORS["`"]
        match = _EXPANSION.match(self.text, self.pos)
        if match is not None:
            kind = {"(": "$(...)", "{": "${...}"}.get(match.group()[-1], match.group())
            return f"the expansion {kind}"
        self.pos += 1
        self.word_start = False
        return None

    def _unquoted(self, char: str) -> str | None:
        if char in _SPACE:
            self.word_start = True
        elif self.word_start and char in _AT_WORD_START:
            return _AT_WORD_START[char]
        elif char in _OPERATORS:
            pair = self.text[self.pos : self.pos + 2]
            return _OPERATORS.get(pair, _OPERATORS[char])
        else:
            if char in "'\"":
                self.quote = char
            self.word_start = False
        self.pos += 1
        return None
