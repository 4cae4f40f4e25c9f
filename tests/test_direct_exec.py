"""Issue 31: a command-list line that needs no shell runs as its argv, without /bin/sh, and
gives what ``/bin/sh -c LINE`` gives (output, status, environment); every other line keeps sh."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuswarm.config.commands import through_shell
from gpuswarm.config.direct import _PLAIN, SHELL_WORDS, DirectRule, shell_env, shell_pwd
from gpuswarm.config.load import load_command_list
from gpuswarm.config.shellsyntax import shell_syntax, unclosed_quote
from gpuswarm.core.placeholders import shell_split

PATH = os.environ.get("PATH", "/usr/bin:/bin")
RULE = DirectRule(PATH)
PY = Path(sys.executable).resolve()


@pytest.mark.parametrize(
    ("line", "argv"),
    [
        ("ls -l /tmp", ["ls", "-l", "/tmp"]),
        ("python3 train.py --lr 0.1 --out=a,b:c@d%e+f", None),  # None: filled below
        ("ls 'a b' \"c d\"", ["ls", "a b", "c d"]),
        ("ls 'x | y; $HOME `z` * ~ # (a)'", ["ls", "x | y; $HOME `z` * ~ # (a)"]),
        ("true", ["true"]),
        ("false", ["false"]),
    ],
)
def test_plain_lines_go_direct(line: str, argv: list[str] | None) -> None:
    got = RULE.argv(line)
    assert got == (argv or shlex.split(line))


@pytest.mark.parametrize(
    "line",
    [
        # expansions and substitutions
        "ls $HOME",
        "ls ${HOME}",
        'ls "$HOME"',
        "ls $(pwd)",
        "ls `pwd`",
        # globs
        "ls *.py",
        "ls a?",
        "ls [ab]",
        "ls {a,b}",
        # home, comments, escapes
        "ls ~",
        "ls ~/x",
        "ls x #comment",
        r"ls a\ b",
        r'ls "a\"b"',
        # redirections and operators
        "ls > out",
        "ls < in",
        "ls 2>&1",
        "ls | cat",
        "ls; ls",
        "ls && ls",
        "ls || ls",
        "ls &",
        "(ls)",
        "{ ls; }",
        "! ls",
        # an assignment first
        "A=1 ls",
        "LANG=C ls",
        # builtins and keywords
        "cd /tmp",
        "export A=1",
        ". ./env.sh",
        "source env.sh",
        "exec ls",
        "eval ls",
        "echo hi",
        "printf x",
        "test -e x",
        "kill 1",
        "pwd",
        "true --help",  # the program prints help, the builtin does not
        "false x",
        "if",
        "time ls",
        # the program is not found, is relative, or is no binary or script
        "no-such-program-gpuswarm x",
        "./run.sh",
        "bin/tool",
        "/no/such/file",
        "/etc/hostname",  # a file without #! or ELF start: sh would run it as a script
        # not ASCII outside single quotes
        "ls é",
    ],
)
def test_shell_lines_keep_the_shell(line: str) -> None:
    assert RULE.argv(line) is None


_SPECIAL = "'\"$`\\|&;<>()*?#~{}\n!é"
_SEGMENT = st.one_of(
    st.text(alphabet="ab_ 9\t@%+=:,./-", min_size=1, max_size=5),  # plain outside quotes
    st.text(alphabet='a $`|;#~*"\\', max_size=4).map(lambda t: f"'{t}'"),  # all literal
    st.text(alphabet="a_ 9@%+=:,./'-", max_size=4).map(lambda t: f'"{t}"'),
    st.sampled_from(_SPECIAL),  # anything else: the pattern must refuse it
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_SEGMENT, min_size=1, max_size=6).map("".join))
def test_a_plain_line_needs_no_syntax_check(line: str) -> None:
    """DirectRule.argv runs neither shell_syntax nor unclosed_quote on a line its pattern
    matches: such a line has no construct the shell acts on but a first word NAME=value (which
    the rule refuses by its ``=``), closes every quote, and splits as shell_split does."""
    if not _PLAIN.fullmatch(line):
        return
    argv = shell_split(line)
    assert shell_syntax(line) is None or "=" in argv[0]
    assert unclosed_quote(line) is None
    got = RULE.argv(line)
    if got is not None:
        assert got == argv == shlex.split(line)


def test_every_builtin_keeps_the_shell() -> None:
    for word in sorted(SHELL_WORDS - {"true", "false"}):
        assert RULE.argv(f"{word} x") is None, word
        assert RULE.argv(word) is None, word


def test_no_path_keeps_the_shell() -> None:
    assert DirectRule(None).argv("ls") is None  # sh's default PATH is not Python's
    assert DirectRule("relative/bin:bin").argv("ls") is None


def test_an_absolute_program_goes_direct(tmp_path: Path) -> None:
    assert RULE.argv(f"{PY} -c pass") == [str(PY), "-c", "pass"]
    script = tmp_path / "s"
    script.write_text("echo hi\n")  # no #!: /bin/sh runs it itself
    script.chmod(0o755)
    assert RULE.argv(str(script)) is None
    script.write_text("#!/bin/sh\necho hi\n")
    assert RULE.argv(str(script)) is None  # a load decides once per program
    assert DirectRule(PATH).argv(str(script)) == [str(script)]


def test_shell_pwd(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert shell_pwd(str(link), str(tmp_path)) == str(link)  # logical path kept
    assert shell_pwd("/", str(tmp_path)) == str(tmp_path.resolve())
    assert shell_pwd(None, str(link)) == str(tmp_path.resolve())
    assert shell_pwd("rel", str(tmp_path)) == str(tmp_path.resolve())


def test_shell_env_is_what_sh_passes_on(tmp_path: Path) -> None:
    env = {"PATH": PATH, "A-B": "1", "x.y": "2", "OK_1": "3", "PWD": "/"}
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    shell = subprocess.run(
        ["/bin/sh", "-c", f"{PY} -c {shlex.quote(dump)}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        check=True,
    )
    direct = subprocess.run(
        [PY, "-c", dump], cwd=tmp_path, env=shell_env(env, str(tmp_path)), capture_output=True
    )
    assert json.loads(direct.stdout) == json.loads(shell.stdout)
    assert json.loads(direct.stdout)["OK_1"] == "3"


# -- equivalence: what goes direct gives what /bin/sh -c gives -------------------------------------
_WORD_CHARS = "abcxyz019_@%+=:,./-"
_plain = st.text(st.sampled_from(_WORD_CHARS), min_size=1, max_size=6)
_single = st.text(st.sampled_from('ab $`*?~#;|&()<>{}[]\\"!é\t'), max_size=6).map(
    lambda t: f"'{t}'"
)
_double = st.text(st.sampled_from("ab '@%:,.-\t"), max_size=6).map(lambda t: f'"{t}"')
_word = st.lists(st.one_of(_plain, _single, _double), min_size=1, max_size=3).map("".join)
_spaces = st.sampled_from([" ", "  ", "\t", " \t "])
_PROBE = (
    "import json, os, sys; print(json.dumps([sys.argv[1:], os.getcwd(), os.environ.get('PWD')]));"
    " sys.stderr.write('err\\n'); sys.exit(len(sys.argv) % 5)"
)


@st.composite
def _lines(draw: st.DrawFn) -> str:
    words = draw(st.lists(_word, max_size=4))
    gaps = [draw(_spaces) for _ in words]
    tail = "".join(g + w for g, w in zip(gaps, words, strict=True))
    return f"{PY} -c {shlex.quote(_PROBE)}{tail}"


def _run(argv: list[str], cwd: Path) -> tuple[bytes, bytes, int]:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, timeout=30, check=False)
    return proc.stdout, proc.stderr, proc.returncode


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(line=_lines())
def test_direct_gives_what_sh_gives(line: str, tmp_path: Path) -> None:
    argv = RULE.argv(line)
    assert argv is not None, line  # the generator makes only lines the rule lets go direct
    env = shell_env(dict(os.environ), str(tmp_path))
    direct = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=30)
    shell = subprocess.run(["/bin/sh", "-c", line], cwd=tmp_path, capture_output=True, timeout=30)
    assert (direct.stdout, direct.stderr, direct.returncode) == (
        shell.stdout,
        shell.stderr,
        shell.returncode,
    )


@pytest.mark.parametrize("line", ["true", "false", "ls /", "ls /no-such-folder-gpuswarm"])
def test_direct_programs_give_what_sh_gives(line: str, tmp_path: Path) -> None:
    argv = RULE.argv(line)
    assert argv is not None
    assert _run(argv, tmp_path) == _run(["/bin/sh", "-c", line], tmp_path)


# -- loading: the stored command records the choice ------------------------------------------------
def test_load_stores_the_choice(tmp_path: Path) -> None:
    text = "ls /\nls | cat\nno-such-program-gpuswarm\n"
    loaded = load_command_list(None, text, base_dir=tmp_path, direct=True)
    commands = [row[2] for row in loaded.tasks.rows()]  # type: ignore[union-attr]
    assert commands == [["ls", "/"], "ls | cat", "no-such-program-gpuswarm"]
    assert all(t["shell"] for t in loaded.tasks.dumps())  # type: ignore[union-attr]
    shelled = through_shell(loaded.tasks)  # type: ignore[arg-type]
    assert [row[2] for row in shelled.rows()] == ["ls /", "ls | cat", "no-such-program-gpuswarm"]
    plain = load_command_list(None, text.replace("|", ""), base_dir=tmp_path)  # the API's default
    assert all(isinstance(row[2], str) for row in plain.tasks.rows())  # type: ignore[union-attr]
    split = load_command_list(None, "ls /\n", shell=False, base_dir=tmp_path, direct=True)
    assert [t["shell"] for t in split.tasks.dumps()] == [False]  # type: ignore[union-attr]


# -- the CLI: no /bin/sh per plain line, sh for a pipe ---------------------------------------------
_PARENT = (
    "import os; p = open('/proc/self/stat').read().rsplit(')', 1)[1].split()[1];"
    " print(open('/proc/' + p + '/comm').read().strip())"
)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.timeout(120)
def test_cli_runs_plain_lines_without_sh(tmp_path: Path) -> None:
    line = f"{shutil.which('python3') or PY} -c {shlex.quote(_PARENT)}"
    assert RULE.argv(line) is not None
    (tmp_path / "cmds.txt").write_text(f"{line}\n{line} | cat\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    run = [sys.executable, "-m", "gpuswarm", "run", "-q", "--no-report", "--gpus", "sim:2"]
    proc = subprocess.run(
        [*run, "--workspace", str(tmp_path / "ws"), "cmds.txt"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    logs = {
        log.parts[-3]: log.read_text().strip()
        for log in (tmp_path / "ws").rglob("attempt-1/output.log")
    }
    assert logs["cmd-00002"] == "sh"  # the pipe: /bin/sh runs it
    assert logs["cmd-00001"] not in ("sh", "dash", "bash")  # direct: gpuswarm is its parent
    tasks = {
        d["id"]: d["task"]
        for d in (
            json.loads(p.read_text()) for p in (tmp_path / "ws").rglob(".parallel/done/*.json")
        )
    }
    assert tasks["cmd-00001"]["shell"] is True
    assert tasks["cmd-00001"]["command"] == shlex.split(line)  # the queue records the choice
    assert tasks["cmd-00002"]["command"] == f"{line} | cat"
