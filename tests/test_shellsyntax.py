"""Issue 28: which command strings need a shell, and ``{config.<field>|default}`` fallbacks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuswarm.config.shellsyntax import shell_syntax, unclosed_quote
from gpuswarm.core.placeholders import (
    blank_placeholders,
    find_placeholders,
    render,
    render_shell,
    shell_split,
)


@pytest.mark.parametrize(
    ("command", "found"),
    [
        ("echo hello | tr a-z A-Z > out.txt", "a pipe |"),
        ("a || b", "the operator ||"),
        ("make && ./run", "the operator &&"),
        ("sleep 9 &", "& (run in the background)"),
        ("cd x; make", "the command separator ;"),
        ("sort < in.txt", "a redirection <"),
        ("echo hi >> log", "a redirection >"),
        ("(cd x && make)", "a subshell ("),
        ("echo `date`", "a command substitution `...`"),
        ('echo "`date`"', "a command substitution `...`"),
        ("echo $(date)", "the expansion $(...)"),
        ("echo ${HOME}", "the expansion ${...}"),
        ('echo "$HOME/x"', "the expansion $HOME"),
        ("echo $1", "the expansion $1"),
        ("sleep 2 #1", "a comment #"),
        ("python run.py --out ~/results", "~ (the home folder)"),
        ("ls data/*.json", "the wildcard *"),
        (
            "CUDA_VISIBLE_DEVICES=1 python x.py",
            "a variable assignment (NAME=value) before the program",
        ),
    ],
)
def test_shell_syntax_is_found(command: str, found: str) -> None:
    assert shell_syntax(command) == found


@pytest.mark.parametrize(
    "command",
    [
        "python train.py --lr 0.1 --seed 2",
        'python -c "a|b; c > d && e"',  # quoted: one argument
        "python -c 'import os; print(os.environ[\"HOME\"])'",
        "awk '{print $1}' data.txt",  # $ inside '...' is no expansion
        r"echo a\|b \; \$HOME \#x",  # escaped
        "python x.py issue#28 --key=value",  # '#' inside a word, '=' after the program
        "python x.py --out {workspace}/r --lr {lr} --t {config.timeout|1h}",
        "echo {{literal}} 50$ cost",  # '$' alone is no expansion
        "pip install .[dev]",
    ],
)
def test_argv_commands_need_no_shell(command: str) -> None:
    assert shell_syntax(command) is None


def test_unclosed_quotes() -> None:
    assert unclosed_quote("echo 'never closed") == "'"
    assert unclosed_quote('echo "a \\" b') == '"'
    assert unclosed_quote("echo hi # don't") is None  # a comment
    assert unclosed_quote("echo it\\'s; echo 'a'\"b\"") is None
    assert unclosed_quote("a#'b") == "'"  # '#' inside a word is no comment


def test_config_fallbacks_render_when_the_field_is_missing() -> None:
    template = "run {config.a|x y} {config.b.c|} {config.a} {lr|1}"
    assert find_placeholders(template) == ["config.a", "config.b.c"]  # {lr|1}: text
    assert render(template, {"lr": "3"}) == "run x y  {config.a} {lr|1}"
    assert render(template, {"config.a": "A", "lr": "3"}) == "run A  A {lr|1}"
    shell = "echo {config.a|x; y} '{config.a|$(z)}' {config.a|d!raw}"
    assert render_shell(shell, {}) == "echo 'x; y' '$(z)' d"  # fallbacks are values: quoted
    assert blank_placeholders("a {config.a|b|c} {{ ${X} {lr!raw}") == "a _ _ ${X} _"


# every character /bin/sh treats specially on one line, and some it does not ('\n' and '\r'
# are left out: a YAML string may break an argv over lines, which shell_split reads as blanks)
_SHELLISH = st.text(alphabet=" \t'\"\\ab=$;`{}|&<>()*?#~-.,:!%@[]^", max_size=12)


@pytest.fixture(scope="module")
def empty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with no file for a glob such as ``[ab]`` to match."""
    return tmp_path_factory.mktemp("empty")


@settings(max_examples=300, deadline=None)
@given(text=_SHELLISH)
def test_what_needs_no_shell_splits_as_sh_would(empty: Path, text: str) -> None:
    """Where shell_syntax finds nothing, /bin/sh gives the program exactly the words of the
    argv split: refusing the rest is what keeps a YAML string from a silent argv run."""
    if shell_syntax(text) is not None or unclosed_quote(text) is not None:
        return
    try:
        words = shell_split(text)
    except ValueError:  # a trailing backslash: refused at load with the quoting message
        return
    script = f'set -- {text}\nfor a in "$@"; do printf \'%s\\0\' "$a"; done'
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(empty)}
    out = subprocess.run(
        ["/bin/sh", "-c", script], cwd=empty, env=env, capture_output=True, check=True
    )
    assert out.stdout.decode().split("\0")[:-1] == words, text
