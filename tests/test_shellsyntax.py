"""Issue 28: which command strings need a shell, and ``{config.<field>|default}`` fallbacks."""

from __future__ import annotations

import pytest

from gpuswarm.config.shellsyntax import shell_syntax, unclosed_quote
from gpuswarm.core.placeholders import (
    blank_placeholders,
    find_placeholders,
    render,
    render_shell,
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
