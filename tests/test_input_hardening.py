"""Bad input and hostile values (issue 12, items 10-15), below the CLI: the loader's limits and
messages, shell quoting of placeholders, redaction by value shape, inert terminal text.

The bad-input cases also run through the real CLI: exit 2, the file and field named, no
traceback, nothing written.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuswarm.config.load import load_command_list, load_config
from gpuswarm.config.models import TaskSpec
from gpuswarm.config.render import render_command
from gpuswarm.config.yamlload import MAX_DEPTH, load_yaml
from gpuswarm.core.errors import ConfigError
from gpuswarm.core.placeholders import render_shell, shell_split
from gpuswarm.core.redact import inert, redact_argv, redact_env, redact_shapes, redact_text


def _config(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(_config(tmp_path, text))
    return str(info.value)


def _bomb(levels: int) -> str:
    """A "billion laughs": each anchor is a list of nine aliases of the one before."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for n in range(1, levels + 1):
        lines.append(f"l{n}: &l{n} [" + ",".join([f"*l{n - 1}"] * 9) + "]")
    return "x-bombs:\n" + "\n".join("  " + line for line in lines) + "\n"


# -- 13: YAML bombs and what a message quotes ---------------------------------------------------
@pytest.mark.parametrize(
    "use",
    [
        "name: *l9\ntasks: [{command: 'true'}]",
        "tasks: *l9",
        "tasks: [{command: 'true', env: *l9}]",
        "tasks: [{command: 'true', matrix: {x: *l9}}]",
        "tasks: [{command: *l9}]",
    ],
)
def test_billion_laughs_is_refused_before_it_expands(tmp_path: Path, use: str) -> None:
    message = _error(tmp_path, _bomb(9).replace("x-bombs:", "x:") + use + "\n")
    assert "c.yaml:" in message and "aliases expand this value to over 1,000,000 values" in message
    assert len(message) < 500


@pytest.mark.parametrize(
    "use",
    [
        "name: *l4\ntasks: [{command: 'true'}]",
        "tasks: [{command: 'true', matrix: {x: *l4}}]",
        "tasks: [{command: *l4}]",
        "tasks: [{command: 'true', timeout: *l4}]",
        "gpus: *l4\ntasks: [{command: 'true'}]",
    ],
)
def test_a_message_quotes_a_huge_value_in_lines(tmp_path: Path, use: str) -> None:
    # 9**4 = 6,561 strings: under the alias bound, so validation sees the whole value
    message = _error(tmp_path, _bomb(4).replace("x-bombs:", "x:") + use + "\n")
    assert "c.yaml:" in message and "unknown key 'x'" in message
    lines = message.splitlines()
    assert len(lines) <= 11 and max(map(len, lines)) < 400, message[:400]


def test_a_huge_string_is_quoted_short(tmp_path: Path) -> None:
    message = _error(tmp_path, f"tasks: [{{command: 'true', timeout: '{'9' * 100_000}x'}}]\n")
    assert "tasks[0].timeout: '9999" in message and "is not a duration" in message
    assert len(message) < 400


def test_recursive_and_deeply_aliased_values_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"t\.yaml:1: an alias refers to the anchor it is"):
        load_yaml("tasks: &a [*a]\n", "t.yaml")
    chain = "".join(f"a{n}: &a{n} [*a{n - 1}]\n" for n in range(1, MAX_DEPTH + 5))
    with pytest.raises(ConfigError, match=r"aliases nest this value more than 64 levels"):
        load_yaml("a0: &a0 [x]\n" + chain, "t.yaml")


# -- 14: bounded fields, linear loading ---------------------------------------------------------
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("tasks_per_gpu: 100000000", "tasks_per_gpu: 100000000 is out of range; it must be <= 256"),
        (
            "gpus_per_task: 100000000",
            "gpus_per_task: 100000000 is out of range; it must be <= 1024",
        ),
        ("defaults: {max_attempts: 1000000000}", "max_attempts: 1000000000 is out of range"),
        ("reliability: {max_log_mb: 1.0e+300}", "max_log_mb: 1e+300 is out of range"),
        ("reliability: {max_log_mb: .inf}", "max_log_mb: inf is not a finite number"),
        ("reliability: {max_log_mb: .nan}", "max_log_mb: nan is not a finite number"),
        ("reliability: {breaker: {failures: 99999999}}", "failures: 99999999 is out of range"),
    ],
)
def test_bounded_fields(tmp_path: Path, setting: str, message: str) -> None:
    text = f"{setting}\ntasks: [{{command: 'true'}}]\n"
    assert message in _error(tmp_path, text)


@pytest.mark.timeout(30)  # shlex.split needs minutes for this (quadratic); now about a second
def test_a_2mb_command_splits_and_is_refused_by_size(tmp_path: Path) -> None:
    words = "a b " * 100_000
    arg = "x" * 1_600_000
    assert shell_split(f'echo {arg} "{words}"') == ["echo", arg, words]
    path = _config(tmp_path, f"tasks:\n  - command: 'echo {arg} \"{words}\"'\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:2: tasks\[0\]\.command: the command is "):
        load_config(path)  # issue 30: no exec could take it (MAX_ARG_STRLEN)
    with pytest.raises(ConfigError, match=r"^<stdin>:1: the command is 1,600,005 bytes long"):
        load_command_list(None, f"echo {arg}\n", shell=False, base_dir=tmp_path)


_SHELLY = st.text(alphabet=" \t\n\r\x0b'\"\\ab$;`{}", max_size=16)


@settings(max_examples=400, deadline=None)
@given(_SHELLY)
def test_shell_split_is_shlex_split(text: str) -> None:
    try:
        expected: list[str] | str = shlex.split(text)
    except ValueError:
        expected = "error"
    try:
        got: list[str] | str = shell_split(text)
    except ValueError:
        got = "error"
    assert got == expected


# -- 15: messages, not tracebacks ---------------------------------------------------------------
def test_nesting_1000_levels_is_a_message(tmp_path: Path) -> None:
    message = _error(tmp_path, "tasks:\n  - " + "[" * 1000 + "]" * 1000 + "\n")
    assert message.startswith(str(tmp_path / "c.yaml") + ":2: the YAML is nested more than 64")
    assert "flatten it" in message


def test_lone_surrogate_is_a_message(tmp_path: Path) -> None:
    message = _error(tmp_path, 'tasks: [{command: "echo \\ud800"}]\n')
    assert message.endswith(
        "c.yaml:1: tasks[0].command: the value holds \\ud800, a lone UTF-16 surrogate, which is "
        "not text; remove that escape or write the character itself"
    )


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ('{command: "echo a\\0b"}', "tasks[0].command"),
        ('{command: [echo, "a\\0b"]}', "tasks[0].command[1]"),
        ('{command: "echo {x}", matrix: {x: [ok, "a\\0b"]}}', "tasks[0].matrix.x[1]"),
        ('{command: "true", cwd: "sub\\0dir"}', "tasks[0].cwd"),
        ('{command: "true", done_when: "r\\0.json"}', "tasks[0].done_when"),
    ],
)
def test_nul_bytes_are_refused_at_load_time(tmp_path: Path, entry: str, field: str) -> None:
    message = _error(tmp_path, f"tasks:\n  - {entry}\n")
    assert f"c.yaml:2: {field}: the value holds a NUL byte" in message


def test_nul_byte_in_a_command_list(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^<stdin>:2: the command holds a NUL byte"):
        load_command_list(None, "echo ok\necho a\0b\n", base_dir=tmp_path)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("workspace: ~nosuchuser/runs\ntasks: [{command: 'true'}]", "workspace"),
        ("tasks: [{command: 'true', cwd: ~nosuchuser/x}]", "tasks[0].cwd"),
        ("defaults: {cwd: ~nosuchuser/x}\ntasks: [{command: 'true'}]", "defaults.cwd"),
        ("tasks: [{command: 'true', glob: '~nosuchuser/*/config.yaml'}]", "tasks[0].glob"),
        (
            "home: {isolate: true, provision: [{src: ~nosuchuser/a, dest: a}]}\n"
            "tasks: [{command: 'true'}]",
            "home.provision[0].src",
        ),
    ],
)
def test_unknown_user_in_a_path_is_a_message(tmp_path: Path, text: str, field: str) -> None:
    message = _error(tmp_path, text + "\n")
    assert f": {field}: '~nosuchuser': no such user on this machine" in message
    assert "write the full path, or ~/ for your own home" in message


# -- the same through the CLI: exit 2, named, no traceback, nothing written ---------------------
BAD_CONFIGS = {
    "bomb": _bomb(9).replace("x-bombs:", "x:") + "name: *l9\ntasks: [{command: 'true'}]\n",
    "deep": "tasks: " + "[" * 1000 + "]" * 1000 + "\n",
    "inf": "reliability: {max_log_mb: .inf}\ntasks: [{command: 'true'}]\n",
    "surrogate": 'tasks: [{command: "echo \\ud800"}]\n',
    "tasks_per_gpu": "tasks_per_gpu: 100000000\ntasks: [{command: 'true'}]\n",
    "nul": 'tasks: [{command: "echo a\\0b"}]\n',
    "user": "workspace: ~nosuchuser/w\ntasks: [{command: 'true'}]\n",
}


def _cli(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "gpuswarm", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=60,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


@pytest.mark.slow  # runs the CLI
@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_through_the_cli(tmp_path: Path, case: str) -> None:
    path = _config(tmp_path, BAD_CONFIGS[case], f"{case}.yaml")
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = _cli("run", str(path), "--gpus", "sim:1", "-q", cwd=tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "Traceback" not in err and f"{case}.yaml" in err and len(err) < 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_non_utf8_command_list_on_stdin(tmp_path: Path) -> None:
    proc = _cli(
        "run", "-", "--gpus", "sim:1", "-q", cwd=tmp_path, stdin=b"echo ok\necho \xff\xfe\n"
    )
    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        "gpuswarm: error: <stdin>: not UTF-8 text (byte 13); convert it, e.g. with iconv -t UTF-8\n"
    )
    assert list(tmp_path.iterdir()) == []


# -- 10: placeholders in shell commands ---------------------------------------------------------
def _shell(template: str, **values: str) -> str:
    spec = TaskSpec(id="t", name="t", command=template, shell=True)
    argv = render_command(spec, values)
    assert argv[:2] == ["/bin/sh", "-c"]
    return argv[2]


@pytest.mark.parametrize(
    "value", ["$(touch X)", "a; touch X", "it's", 'say "hi" `x` $HOME \\', "", "  spaced  "]
)
@pytest.mark.parametrize(
    ("template", "wrap"),
    [
        ("printf '%s' {v}", "{}"),
        ("printf '%s' \"{v}\"", "{}"),
        ("printf '%s' 'pre-{v}-post'", "pre-{}-post"),
        ("printf '%s' \"a'{v}'b\"", "a'{}'b"),
        ("printf '%s' x{v}y", "x{}y"),
    ],
)
def test_every_value_is_one_literal_word(
    tmp_path: Path, template: str, wrap: str, value: str
) -> None:
    out = subprocess.run(
        ["/bin/sh", "-c", _shell(template, v=value)], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout == wrap.replace("{}", value)
    assert not (tmp_path / "X").exists()


def test_raw_and_escapes_in_shell_templates() -> None:
    assert _shell("{cmd!raw} && echo {{x}} ${HOME}", cmd="ls | wc") == "ls | wc && echo {x} ${HOME}"
    assert _shell("echo {v}", v="a b") == "echo 'a b'"
    assert render_shell("echo {unknown}", {}) == "echo {unknown}"
    argv = render_command(TaskSpec(id="t", name="t", command=["echo", "{v!raw}"]), {"v": "a b"})
    assert argv == ["echo", "a b"]  # without a shell, a value is one argument anyway


# -- 11: redaction by shape ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("psql postgres://admin:hunter22@db/x", "psql postgres://admin:***@db/x"),
        ("https://user:p%40ss@proxy:3128", "https://user:***@proxy:3128"),
        ("--api-key sk-abcdefghijklmnopqrstuvwx1234", "--api-key ***"),
        ("--token=abc123 --password 'two words'", "--token=*** --password '***'"),
        ("-H 'Authorization: Bearer abc.def'", "-H 'Authorization: Bearer ***'"),
        ("X-Api-Key: 12345", "X-Api-Key: ***"),
        ("HF_TOKEN=hf_x python a.py", "HF_TOKEN=*** python a.py"),
        ("curl -u alice:wonderland https://x", "curl -u alice:*** https://x"),
        ("key sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ_09", "key ***"),
        ("ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", "***"),
        ("github_pat_11ABCDEFG0123456789_abcdefghijk", "***"),
        ("xoxb-1234567890-abcdefghij", "***"),
        ("AKIAIOSFODNN7EXAMPLE", "***"),
        ("hf_abcdefghijklmnopqrstuvwxyz", "***"),
        ("glpat-abcdefghijklmnopqrst", "***"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "***"),
    ],
)
def test_secret_shapes(text: str, shown: str) -> None:
    assert redact_shapes(text) == shown


@pytest.mark.parametrize(
    "text",
    [
        "python train.py --lr 0.1 --max-tokens 100 --tokenizer gpt2 --author me",
        "sk-learn-benchmark-2024 use_auth=true --use-auth true",
        "http://host:8080/path@x ssh git@github.com:org/repo.git user@example.com",
        "gpumode/softmax lr=0.1 seed=2 cmd-00001",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_shapes(text) == text


def test_redact_argv_env_and_text() -> None:
    argv = ["curl", "-H", "Authorization", "Bearer x", "--api-key", "k1", "-u", "bob:pw", "--v"]
    shown = ["curl", "-H", "Authorization", "***", "--api-key", "***", "-u", "bob:***", "--v"]
    assert redact_argv(argv) == shown
    env = {"DATABASE_URL": "mysql://u:pw12@h/db", "HF_TOKEN": "x", "PATH": "/bin"}
    assert redact_env(env) == {
        "DATABASE_URL": "mysql://u:***@h/db",
        "HF_TOKEN": "***",
        "PATH": "/bin",
    }
    assert redact_text("got Bearer? Authorization: Bearer zzz", {}) == (
        "got Bearer? Authorization: Bearer ***"
    )


def test_command_names_carry_no_token(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        """\
        tasks:
          - command: python3 -c pass --api-key sk-abcdefghijklmnopqrstuvwxyz0123456789ABCD
          - command: [git, clone, "https://bob:pw1234@example.com/r.git"]
        """,
    )
    names = [t.name for t in load_config(path).tasks]
    assert names == ["python3 -c pass --api-key ***", "git clone https://bob:***@example.com/r.git"]
    lines = load_command_list(None, "echo --token abcdefgh\n", base_dir=tmp_path).tasks
    assert lines[0].name == "echo --token ***" and lines[0].command == "echo --token abcdefgh"


# -- 12: inert terminal text --------------------------------------------------------------------
def test_inert() -> None:
    assert inert("\x1b[2J\x1b]0;t\x07ok\tend\r") == "\\x1b[2J\\x1b]0;t\\x07ok\tend\\x0d"
    assert inert("a\nb\x9b1m\u202egnp") == "a\\x0ab\\x9b1m\\u202egnp"
    assert inert("a\nb\x1b", keep_newlines=True) == "a\nb\\x1b"
    assert inert("plain text, ünïcode ✓") == "plain text, ünïcode ✓"
