"""Secrets, injection and bad input, through the real CLI (issue 12, items 10-15).

- shell: true quotes every placeholder value (a folder named ``$(touch X)`` or a matrix value
  ``a; touch X`` stays a word); ``{key!raw}`` splices on purpose;
- a planted secret (URL credentials under ordinary names, ``--api-key sk-...``, ``--token X``,
  ``Authorization: Bearer ...``, token shapes) reaches none of the files gpuswarm writes (the
  queue ``.parallel/`` keeps the real command, it must run it; the task's own workspace and log
  are the task's) nor ``status``, ``status --json``, the plain lines or the live view;
- run folders, logs and homes are private: another user cannot read a log;
- escape sequences from a task reach no terminal (``status``, plain lines, the live view);
- bad input: exit 2, the file/field named, no traceback, nothing written.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_driver import CliResult, find_runs, read_events
from rich.console import Console

from gpuswarm.core.runview import RunView as ViewState
from gpuswarm.core.runview import SlotRow
from gpuswarm.ui.table import LiveView

pytestmark = pytest.mark.slow  # CLI processes: part of CI, not of the fast suite

Cli = Callable[..., CliResult]
MARK = "S3cret"  # every planted secret contains it


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _only_run(workspace: Path) -> Path:
    runs = find_runs(workspace)
    assert len(runs) == 1, runs
    return runs[0]


# -- 10: shell quoting --------------------------------------------------------------------------
HOSTILE_NAMES = [
    "$(touch PWNED_glob)",
    "a;touch PWNED_semi",
    "q'`touch PWNED_tick`'\"$(touch PWNED_dq)\"",
]
HOSTILE_VALUES = [
    "a; touch PWNED_m1",
    "$(touch PWNED_m2)",
    "b' ; touch PWNED_m3 ; '",
    '"; touch PWNED_m4; "',
]


def test_shell_placeholders_are_quoted(tmp_path: Path, gpuswarm: Cli) -> None:
    for name in HOSTILE_NAMES:
        _write(tmp_path / "tasks" / name / "config.yaml", "x: 1\n")
    values = json.dumps(HOSTILE_VALUES)
    three_ways = (
        "printf '%s\\n' {v} > {workspace}/bare; printf '%s\\n' \"{v}\" > {workspace}/dq; "
        "printf '%s\\n' 'x{v}' > {workspace}/sq"
    )
    cfg = _write(
        tmp_path / "q.yaml",
        f"""\
        tasks_root: tasks
        tasks:
          - glob: "tasks/*/config.yaml"
            shell: true
            command: {json.dumps(three_ways.replace("{v}", "{task_rel}"))}
          - matrix: {{v: {values}}}
            shell: true
            command: {json.dumps(three_ways)}
        """,
    )
    result = gpuswarm("run", cfg, "--gpus", "sim:2", "-q", "--no-report")
    assert sorted(p.name for p in tmp_path.rglob("PWNED*")) == []  # no value ran as code
    assert result.returncode == 0, result
    run = _only_run(tmp_path / "runs")
    seen = set()
    for task in (run / "tasks").iterdir():
        bare = (task / "bare").read_text().rstrip("\n")
        assert (task / "dq").read_text().rstrip("\n") == bare
        assert (task / "sq").read_text().rstrip("\n") == "x" + bare
        seen.add(bare)
    assert seen == set(HOSTILE_NAMES) | set(HOSTILE_VALUES)  # each value arrived verbatim


def test_raw_placeholder_splices_shell_code(tmp_path: Path, gpuswarm: Cli) -> None:
    cfg = _write(
        tmp_path / "r.yaml",
        """\
        tasks:
          - matrix: {cmd: ["touch RAW_SPLICED", "echo 'two words' > quoted.txt"]}
            shell: true
            command: "{cmd!raw}; echo {cmd} > {workspace}/as_word.txt"
        """,
    )
    result = gpuswarm("run", cfg, "--gpus", "sim:1", "-q", "--no-report")
    assert result.returncode == 0, result
    assert (tmp_path / "RAW_SPLICED").exists()  # {key!raw} is shell code, on purpose
    assert (tmp_path / "quoted.txt").read_text() == "two words\n"
    words = sorted(p.read_text() for p in tmp_path.rglob("as_word.txt"))
    assert words == ["echo 'two words' > quoted.txt\n", "touch RAW_SPLICED\n"]  # {key}: a word


# -- 11: secrets --------------------------------------------------------------------------------
SECRET_CONFIG = f"""\
defaults:
  env:
    DATABASE_URL: "postgres://admin:{MARK}DbPass@db.example.com:5432/x"
    HTTPS_PROXY: "http://proxyuser:{MARK}ProxyPass@proxy.example.com:3128"
tasks:
  - command: python3 -c "pass" --api-key sk-{MARK}OpenAiKey0123456789abcdef
  - command: [python3, -c, "import sys; sys.exit(3)", --token, "{MARK}ArgvToken",
              "--password={MARK}PasswordEq"]
  - shell: true
    command: >-
      echo "calling with Authorization: Bearer {MARK}BearerTok";
      echo "clone https://bob:{MARK}UrlPass@example.com/repo.git"; exit 4
  - command: >-
      python3 -c "pass" ghp_{MARK}GithubTok0123456789abcdefABCD
      hf_{MARK}HuggingFaceTok01234567
  - command: 'curl -H "Authorization: Bearer {MARK}CurlBearer" -u alice:{MARK}CurlPass https://x'
    done_when: never.json
"""
SECRET_LINES = f"""\
psql postgres://carol:{MARK}ListPass@db.example.com/x -c 'select 1'
python3 -c "import sys; sys.exit(1)" --api-key=sk-{MARK}ListKey0123456789abcdefgh
sh -c 'echo "Authorization: Bearer {MARK}ListBearer"; exit 2'
python3 -c "pass" --password {MARK}ListPassword xoxb-{MARK}-slack-token-0123
"""


def _written_files(run: Path) -> Iterator[Path]:
    """Every file gpuswarm wrote for people: all but the queue and the tasks' own workspaces."""
    for path in run.rglob("*"):
        rel = path.relative_to(run).parts
        if path.is_file() and rel[0] not in (".parallel", "tasks"):
            yield path


def _assert_no_secret(where: str, text: str) -> None:
    assert MARK not in text, (
        f"a planted secret reached {where}: ...{text[text.find(MARK) - 80 :][:200]}"
    )


def _frame_of(run: Path) -> str:
    """The live view of the run (fed by its journal, as `gpuswarm watch` is), as text."""
    state = ViewState({"pending": 0, "running": 0, "done": 0, "failed": 0})
    view = LiveView(state, lambda task, n: run / "tasks" / task / f"attempt-{n}" / "output.log")
    for event in read_events(run):
        if event.get("ev") == "started":
            state.slots.setdefault(str(event["slot"]), SlotRow())
            view({**event, "ev": "started"})  # every task as if running now: names and tails
    console = Console(record=True, width=300, file=io.StringIO(), color_system=None)
    console.print(view.render())
    text = console.export_text()
    for event in read_events(run):
        view(event)
    console.print(view.render())
    return text + console.export_text()


@pytest.mark.parametrize("source", ["config", "command-list"])
def test_planted_secrets_reach_no_output(tmp_path: Path, gpuswarm: Cli, source: str) -> None:
    args: list[str | Path]
    stdin: str | None = None
    if source == "config":
        args = [_write(tmp_path / "s.yaml", SECRET_CONFIG)]
    else:
        args, stdin = ["-", "--name", "lines"], SECRET_LINES
    env = {"HTTPS_PROXY": f"http://u:{MARK}EnvProxy@proxy:8080"}  # the supervisor's own env
    result = gpuswarm("run", *args, "--gpus", "sim:2", "--plain", input=stdin, env=env)
    assert result.returncode == 1, result  # some tasks fail on purpose (their tails are shown)
    _assert_no_secret("the run's output (plain lines, summary)", result.output)
    run = _only_run(tmp_path / "runs")
    written = sorted(_written_files(run))
    names = {p.name for p in written}
    assert {"run.json", "events.jsonl", "results.tsv", "summary.json", "report.html"} <= names
    for path in written:
        _assert_no_secret(str(path.relative_to(run)), path.read_text(errors="replace"))
    for args2 in (["status", run], ["status", run, "--json"], ["watch", run, "--plain"]):
        shown = gpuswarm(*args2, env=env)
        assert shown.returncode in (0, 1), shown
        _assert_no_secret(" ".join(map(str, args2[:1] + args2[2:])), shown.output)
    _assert_no_secret("the live view", _frame_of(run))
    # the redaction kept what is not secret, and the queue still holds the real commands
    info = json.loads((run / "run.json").read_text())
    assert "***" in json.dumps(info["config"])
    queue = "".join(p.read_text() for p in (run / ".parallel").rglob("*.json*") if p.is_file())
    assert MARK in queue


# -- 11: private folders, logs and homes --------------------------------------------------------
@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder every user can traverse (tmp_path is root's own): modes decide alone."""
    base = Path(tempfile.mkdtemp(prefix="gpuswarm-modes-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` as user 65534 without any capability: the file modes alone decide."""
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    return subprocess.run([*nobody, *argv], capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root")
def test_run_folders_logs_and_homes_are_private(shared_tmp: Path, gpuswarm: Cli) -> None:
    cfg = _write(
        shared_tmp / "p.yaml",
        """\
        home: {isolate: true}
        tasks:
          - name: talk
            command: python3 -c "print('private words')"
        """,
    )
    (shared_tmp / "public.txt").write_text("anyone\n")
    assert _as_nobody("cat", str(shared_tmp / "public.txt")).stdout == "anyone\n"  # it can read
    result = gpuswarm("run", cfg, "--gpus", "sim:1", "-q", cwd=shared_tmp)
    assert result.returncode == 0, result
    run = _only_run(shared_tmp / "runs")
    log = run / "tasks" / "talk" / "attempt-1" / "output.log"
    assert log.read_text() == "private words\n"
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    (home,) = (run / "homes").iterdir()  # one slot: <host>-gpu0
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    denied = _as_nobody("cat", str(log))
    assert denied.returncode != 0 and "private words" not in denied.stdout
    assert "Permission denied" in denied.stderr
    assert _as_nobody("ls", str(run)).returncode != 0


# -- 12: terminal escapes -----------------------------------------------------------------------
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"


def test_task_escape_sequences_reach_no_terminal(tmp_path: Path, gpuswarm: Cli) -> None:
    # the task prints escape sequences, then runs a command named with one: sh says
    # "sh: 1: <ESC>[31mevil: not found", which becomes the attempt's reason
    cfg = _write(
        tmp_path / "e.yaml",
        """\
        tasks:
          - name: loud
            shell: true
            command: >-
              printf '\\033]0;pwned\\007\\033[2J\\033[31mred text\\n';
              "$(printf '\\033[31mevil')"
        """,
    )
    result = gpuswarm("run", cfg, "--gpus", "sim:1", "--plain", "--no-report")
    assert result.returncode == 1, result
    assert "\x1b" not in result.stderr and "\\x1b[31mevil" in result.stderr  # the plain lines
    run = _only_run(tmp_path / "runs")
    log = (run / "tasks" / "loud" / "attempt-1" / "output.log").read_text()
    assert ESCAPES in log  # the log itself is the task's, unchanged
    status = gpuswarm("status", run)
    assert status.returncode == 0, status
    assert "\x1b" not in status.output and "\x07" not in status.output
    assert "\\x1b[31mred text" in status.output  # shown, inert
    frame = _frame_of(run)
    assert "\x1b" not in frame and "\\x1b" in frame


# -- 15: workspaces that cannot hold a run ------------------------------------------------------
def test_workspace_that_is_a_file(tmp_path: Path, gpuswarm: Cli) -> None:
    (tmp_path / "taken").write_text("a file\n")
    cfg = _write(tmp_path / "w.yaml", "workspace: taken\ntasks: [{command: 'true'}]\n")
    result = gpuswarm("run", cfg, "--gpus", "sim:1", "-q")
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert f"workspace {tmp_path / 'taken'}: cannot create the run folder there" in result.stderr
    assert (tmp_path / "taken").read_text() == "a file\n"


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "ro"
    target.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)])
    if os.geteuid() != 0 or mounted.returncode != 0:
        pytest.skip("mounting a tmpfs is refused here")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(target)], check=True)
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_workspace_on_a_read_only_filesystem(
    tmp_path: Path, gpuswarm: Cli, read_only_dir: Path
) -> None:
    cfg = _write(tmp_path / "w.yaml", "workspace: ro/runs\ntasks: [{command: 'true'}]\n")
    result = gpuswarm("run", cfg, "--gpus", "sim:1", "-q")
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert "cannot create the run folder there (Read-only file system" in result.stderr
    assert list(read_only_dir.iterdir()) == []
