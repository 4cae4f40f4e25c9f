"""Command-list lines run directly (issue 31): a line that ``/bin/sh -c`` would run as one plain
program with its words, no shell feature used, is stored as that argv and exec'd without the
shell process, with the same program, arguments, environment (as the shell passes it on:
:func:`shell_env`), working folder, exit status and signals. The task keeps ``shell: true``;
its command, a list, records the choice (the queue keeps it, so a resume runs it the same way).

A line goes direct only when every character outside single quotes is plain (ASCII letters,
digits, white space, double quotes and ``_ @ % + = : , . / -``: no ``$``, backtick, backslash,
wildcard, ``~``, ``#``, redirection, operator, brace or bracket; inside ``'...'`` all is literal),
:func:`~gpuswarm.config.shellsyntax.shell_syntax` finds nothing,
the first word is no shell builtin or keyword (``true`` and ``false`` alone excepted: the
programs do what the builtins do), holds no ``=`` (an assignment), and names an executable file
with a ``#!`` or ELF start (the shell runs other files as scripts itself): an absolute path, or
a bare name found on ``PATH`` in an absolute folder. Anything else keeps ``/bin/sh``, so its
messages (``not found``, exit 127) stay the shell's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

from gpuswarm.core.placeholders import shell_split

# POSIX special and regular builtins, dash's and bash's common ones, and the reserved words
SHELL_WORDS = frozenset(
    {
        "!",
        ".",
        ":",
        "[",
        "[[",
        "]]",
        "{",
        "}",
        "alias",
        "bg",
        "break",
        "builtin",
        "case",
        "cd",
        "chdir",
        "command",
        "continue",
        "declare",
        "do",
        "done",
        "echo",
        "elif",
        "else",
        "enable",
        "esac",
        "eval",
        "exec",
        "exit",
        "export",
        "false",
        "fc",
        "fg",
        "fi",
        "for",
        "function",
        "getopts",
        "hash",
        "history",
        "if",
        "in",
        "jobs",
        "kill",
        "let",
        "local",
        "logout",
        "printf",
        "pwd",
        "read",
        "readonly",
        "return",
        "select",
        "set",
        "shift",
        "source",
        "suspend",
        "test",
        "then",
        "time",
        "times",
        "trap",
        "true",
        "type",
        "typeset",
        "ulimit",
        "umask",
        "unalias",
        "unset",
        "until",
        "wait",
        "while",
    }
)
_NO_ARGS_OK = frozenset({"true", "false"})  # alone, /usr/bin/true is the builtin's twin
_PLAIN = re.compile(r"""(?:[\w \t@%+=:,./-]|'[^']*'|"[\w \t@%+=:,./'-]*")+""", re.ASCII)
_MAGIC = (b"#!", b"\x7fELF")


class DirectRule:
    """Decides, line by line, whether a shell line can run as its argv; it caches each
    program's lookup (a 100,000-line list names a few programs)."""

    def __init__(self, path: str | None) -> None:
        self._path = path  # the PATH the tasks get (None: unset, the shell's default differs)
        self._found: dict[str, bool] = {}

    def argv(self, line: str) -> list[str] | None:
        """The argv ``/bin/sh -c line`` would exec, or None when the line keeps the shell.

        A line :data:`_PLAIN` matches closes every quote and holds nothing
        :func:`~gpuswarm.config.shellsyntax.shell_syntax` acts on but a first word
        ``NAME=value``, which the ``=`` check refuses (tests/test_direct_exec.py checks this over
        generated lines), so neither is run per line; one without quotes splits at its blanks
        (only spaces and tabs can be in it), as :func:`shell_split` would."""
        if self._path is None or not _PLAIN.fullmatch(line):
            return None
        try:
            argv = shell_split(line) if "'" in line or '"' in line else line.split()
        except ValueError:
            return None
        if not argv or "=" in argv[0]:
            return None
        if argv[0] in SHELL_WORDS and not (argv[0] in _NO_ARGS_OK and len(argv) == 1):
            return None
        return argv if self._runnable(argv[0]) else None

    def _runnable(self, program: str) -> bool:
        known = self._found.get(program)
        if known is None:
            known = self._found[program] = _executable(_resolve(program, self._path or ""))
        return known


def _resolve(program: str, path: str) -> Path | None:
    if "/" in program:  # relative: the task's cwd would decide
        return Path(program) if Path(program).is_absolute() else None
    found = shutil.which(program, path=path)
    return Path(found) if found is not None and Path(found).is_absolute() else None


def _executable(path: Path | None) -> bool:
    try:
        if path is None or not path.is_file() or not os.access(path, os.X_OK):
            return False
        with path.open("rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(_MAGIC)


def shell_env(env: dict[str, str], cwd: str) -> dict[str, str]:
    """The environment ``/bin/sh`` passes on to what it runs in ``cwd``: without variables
    whose names are no shell names (dash drops ``A-B=1``), ``PWD`` as it sets it."""
    out = {k: v for k, v in env.items() if k.isascii() and k.isidentifier()}  # [A-Za-z_]\w*
    out["PWD"] = shell_pwd(env.get("PWD"), cwd)
    return out


def shell_pwd(inherited: str | None, cwd: str) -> str:
    """The ``PWD`` ``/bin/sh`` exports to what it runs in ``cwd``: the inherited value when it
    names that folder (a logical path kept), else the physical path. Per task: plain os calls."""
    if inherited and inherited.startswith("/"):
        with contextlib.suppress(OSError):
            if os.path.samefile(inherited, cwd):  # noqa: PTH121 - two stats, no Path objects
                return inherited
    return os.path.realpath(cwd)
