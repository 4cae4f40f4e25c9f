"""The live table at 80x24 and 120x40, as a terminal shows it: the real CLI inside a detached
tmux pane of that size, read back with ``tmux capture-pane`` (issue 33).

Every slot row must show the full slot id, the attempt and ``elapsed/timeout``; the task and
the last-output columns are the ones that shrink (ending in an ellipsis), and a row never wraps
onto a second line. Each test uses its own tmux server (``-L``), killed at teardown.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_driver import CliProcess, CliResult, cli_env, read_events, wait_for, wait_for_run
from integration_support import edit_constant, git

# on CI (CI=true) a missing tmux fails the tests instead (.ci/run installs it)
NO_TMUX = shutil.which("tmux") is None and os.environ.get("CI") != "true"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(NO_TMUX, reason="needs tmux")]

SIZES = [(80, 24), (120, 40)]
LONG_OUTPUT = "epoch 3/100 step 1200/50000 loss 0.4512 lr 0.000300 grad-norm 1.25 tokens/s 81234"
# a slot row: the full slot id, the task id, attempt 1, elapsed/timeout (clock(): 3s/1h00m)
ROW = re.compile(r"^(vm-gpu[01])\s+cmd-0000[12]\b.*?\s1\s+(\d+s|\d+m\d\ds)/1h00m\s+\S")
# a research run's slot row: the slot id, a variant's task, attempt 1, elapsed/timeout
RESEARCH_ROW = re.compile(r"^(vm-gpu[01])\s+\S+.*?\s1\s+\d+s/1h00m(\s|$)")
HEADER = re.compile(r"^slot\s+task\s+try\s+elapsed")


class Pane:
    """One detached tmux session of a fixed size on a private server."""

    def __init__(self, tmp: Path, width: int, height: int) -> None:
        self.socket = f"gs-test-{os.getpid()}-{width}-{tmp.name}"[:90]
        self.width, self.height = width, height

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = ["tmux", "-L", self.socket, "-f", os.devnull, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)

    def start(self, script: Path) -> None:
        size = ["-x", str(self.width), "-y", str(self.height)]
        done = self.tmux("new-session", "-d", "-s", "t", *size, f"sh {shlex.quote(str(script))}")
        assert done.returncode == 0, done.stderr

    def resize(self, width: int, height: int) -> None:
        done = self.tmux("resize-window", "-t", "t", "-x", str(width), "-y", str(height))
        assert done.returncode == 0, done.stderr
        self.width, self.height = width, height

    def capture(self) -> list[str]:
        return self.tmux("capture-pane", "-p", "-t", "t").stdout.splitlines()

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def pane_of(tmp_path: Path, run_reaper: None) -> Iterator[Callable[[int, int], Pane]]:
    panes: list[Pane] = []

    def make(width: int, height: int) -> Pane:
        pane = Pane(tmp_path, width, height)
        panes.append(pane)
        return pane

    yield make
    for pane in panes:
        pane.close()


def cli_script(tmp_path: Path, *args: str) -> Path:
    """A shell script that runs the CLI with the tests' environment (minus the fixed width the
    other tests set: the pane's size is the point here) and then waits to be read."""
    env = cli_env()
    for var in ("COLUMNS", "LINES"):
        env.pop(var, None)
    exports = "".join(
        f"export {k}={shlex.quote(v)}\n" for k, v in env.items() if re.fullmatch(r"\w+", k)
    )
    argv = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "gpuswarm", *args])
    script = tmp_path / "pane.sh"
    script.write_text(
        f"{exports}cd {shlex.quote(str(tmp_path))}\n{argv}\necho PANE-EXITED\nsleep 60\n"
    )
    return script


def two_tasks(tmp_path: Path) -> tuple[Path, Path]:
    """A command list of two tasks with long commands that print a long line, then wait for
    ``stop`` (so the test reads the table while both run, and ends them at once)."""
    stop = tmp_path / "stop"
    wait = f"while [ ! -e {shlex.quote(str(stop))} ]; do sleep 0.1; done"
    lines = [
        f"echo {shlex.quote(LONG_OUTPUT)}; {wait}  # train a rather long-named model variant",
        f"echo {shlex.quote('eval ' + LONG_OUTPUT)}; {wait}  # evaluate every checkpoint there is",
    ]
    commands = tmp_path / "cmds.txt"
    commands.write_text("\n".join(lines) + "\n")
    return commands, stop


def rows_shown(pane: Pane, row: re.Pattern[str] = ROW) -> list[str]:
    """The pane's lines once both slot rows show (each a full slot id and elapsed/timeout);
    AssertionError with the last capture when they never do."""
    seen: list[list[str]] = [[]]

    def both() -> list[str] | None:
        seen[0] = pane.capture()
        heads = [i for i, line in enumerate(seen[0]) if HEADER.match(line)]
        frame = seen[0][heads[-1] :] if heads else seen[0]  # a resize leaves older frames above
        return seen[0] if sum(bool(row.match(line)) for line in frame) == 2 else None

    try:
        return wait_for(both, timeout=30, interval=0.2, what="two slot rows")  # type: ignore[no-any-return]
    except AssertionError as e:
        raise AssertionError(f"{e}; the pane shows:\n" + "\n".join(seen[0])) from None


def check_table(lines: list[str], width: int) -> None:
    text = "\n".join(lines)
    assert all(len(line) <= width for line in lines), text
    headers = [i for i, line in enumerate(lines) if HEADER.match(line)]
    assert len(headers) == 1, text
    rows = lines[headers[0] + 1 : headers[0] + 3]
    assert sorted(ROW.match(r)[1] for r in rows if ROW.match(r)) == ["vm-gpu0", "vm-gpu1"], text  # type: ignore[index]
    for row in rows:  # the long output is cut, not wrapped: it ends the row in an ellipsis
        assert row.rstrip().endswith("…"), text
        assert "epoch 3/100" in row, text


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_run_live_table_keeps_slot_and_elapsed(
    tmp_path: Path, pane_of: Callable[[int, int], Pane], width: int, height: int
) -> None:
    commands, stop = two_tasks(tmp_path)
    pane = pane_of(width, height)
    pane.start(cli_script(tmp_path, "run", "--gpus", "sim:2", "--timeout", "1h", str(commands)))
    lines = rows_shown(pane)
    stop.touch()
    check_table(lines, width)
    wait_for(lambda: any("PANE-EXITED" in x for x in pane.capture()), timeout=30, interval=0.2)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_watch_live_table_keeps_slot_and_elapsed(
    tmp_path: Path,
    pane_of: Callable[[int, int], Pane],
    gpuswarm_popen: Callable[..., CliProcess],
    width: int,
    height: int,
) -> None:
    commands, stop = two_tasks(tmp_path)
    gpuswarm_popen("run", "--plain", "--gpus", "sim:2", "--timeout", "1h", str(commands))
    run_dir = wait_for_run(tmp_path / "runs")
    wait_for(
        lambda: sum(e.get("ev") == "started" for e in read_events(run_dir)) == 2,
        timeout=30,
        what="both tasks started",
    )
    pane = pane_of(width, height)
    pane.start(cli_script(tmp_path, "watch", str(run_dir)))
    lines = rows_shown(pane)
    stop.touch()
    check_table(lines, width)


def test_research_live_view_keeps_slot_and_elapsed(
    tmp_path: Path,
    pane_of: Callable[[int, int], Pane],
    gpuswarm: Callable[..., CliResult],
    research_repo: Path,
) -> None:
    """``research loop`` on a terminal: its header is long, its slot rows still show the full
    slot id and elapsed/timeout at 120x40 (the slot was ``vm-g…``) and, the same loop's pane
    resized, at 80x24."""
    repo = research_repo
    edit_constant(repo, "SLEEP", "4")  # each training run lasts long enough to be read
    train = repo / "train.py"  # its summary, then a long line it shows while it waits
    text = train.read_text().replace("time.sleep(SLEEP)\n", "") + (
        f"print({LONG_OUTPUT * 2!r}, flush=True)\ntime.sleep(SLEEP)\n"
    )
    train.write_text(text)
    git(repo, "commit", "-q", "-am", "slower")
    init = [
        *("research", "init", "-C", str(repo), "--tag", "t", "--edit", "train.py"),
        *("--command", f"{shlex.quote(sys.executable)} train.py", "--gpus", "sim:2"),
        *("--timeout", "1h", "--baseline-repeats", "2", "--mode", "rounds"),
    ]
    res = gpuswarm(*init)
    assert res.returncode == 0, res
    pane = pane_of(120, 40)
    loop = ("research", "loop", "-C", str(repo), "--mode", "rounds", "--max-experiments", "2")
    pane.start(cli_script(tmp_path, *loop))
    try:
        lines = rows_shown(pane, RESEARCH_ROW)
        text = "\n".join(lines)
        assert any(line.startswith("research t") for line in lines), text
        assert all(len(line) <= 120 for line in lines), text
        pane.resize(80, 24)  # the loop's next frames are drawn at 80 columns
        lines = rows_shown(pane, RESEARCH_ROW)
        text = "\n".join(lines)
        assert any(line.startswith("research t") for line in lines), text
        heads = [i for i, line in enumerate(lines) if HEADER.match(line)]
        assert len(lines[heads[-1]]) <= 80 and re.search(r"last output$", lines[heads[-1]]), text
    finally:
        gpuswarm("research", "stop", "-C", str(repo))
