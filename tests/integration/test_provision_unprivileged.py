"""Provisioned credentials are private, writable copies: checked as an unprivileged user.

Agents (Claude Code, Cursor, Codex) refresh tokens and keep state in ``~/.claude.json`` and
``~/.claude/``; the copies were 0400 files in 0500 folders, so as a normal user every such write
failed (root ignores file modes, so a run as root proves nothing). The whole ``gpuswarm run``
here runs as uid 65534 (``setpriv``, keeping only the read/search bypass so that it can reach the
interpreter: writes obey the modes as for any user), with a HOME that user owns. Its task appends
to ``~/.claude.json`` and writes into ``~/.claude/``; the source files must be unchanged.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_driver import cli_argv, cli_env, find_runs

NOBODY = 65534
SETPRIV = [
    "setpriv",
    f"--reuid={NOBODY}",
    f"--regid={NOBODY}",
    "--clear-groups",
    "--inh-caps=+dac_read_search",
    "--ambient-caps=+dac_read_search",
    "--",
]

TASK = r"""
set -e
printf '%s' '-refreshed' >> "$HOME/.claude.json"
echo '{"t": 2}' > "$HOME/.claude/.credentials.json"
mkdir -p "$HOME/.claude/projects/p"
echo state > "$HOME/.claude/projects/p/session.jsonl"
stat -c '%a %n' "$HOME/.claude.json" "$HOME/.claude" "$HOME/.claude/.credentials.json" \
  > {workspace}/modes.txt
"""


def _digest(root: Path) -> dict[str, tuple[str, int, float]]:
    """path -> (sha256, mode, mtime) of every file and folder under ``root`` (and root)."""
    out = {}
    for path in [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]:
        st = path.lstat()
        body = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path)] = (body, stat.S_IMODE(st.st_mode), st.st_mtime)
    return out


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A folder owned by uid 65534 (pytest's tmp_path lives under a 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="gpuswarm-nobody-"))
    os.chown(path, NOBODY, NOBODY)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _as_nobody(*paths: Path) -> None:
    for path in paths:
        os.chown(path, NOBODY, NOBODY)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run gpuswarm as another user",
)
def test_an_unprivileged_task_can_refresh_its_provisioned_credentials(nobody_dir: Path) -> None:
    user_home = nobody_dir / "home"
    claude = user_home / ".claude"
    claude.mkdir(parents=True)
    (user_home / ".claude.json").write_text('{"oauthAccount": "me"}')
    (claude / ".credentials.json").write_text('{"t": 1}')
    (claude / "settings.json").write_text("{}")
    for path in (user_home, claude):
        path.chmod(0o700)
    for path in (
        user_home / ".claude.json",
        claude / ".credentials.json",
        claude / "settings.json",
    ):
        path.chmod(0o600)
    _as_nobody(user_home, claude, *claude.iterdir(), user_home / ".claude.json")
    before = _digest(user_home)

    config = nobody_dir / "agent.yaml"
    command = TASK.replace("\n", "\n      ")
    config.write_text(
        "name: agents\nworkspace: ws\ngpus: sim:1\n"
        "home:\n  isolate: true\n  provision:\n"
        f"    - {{src: {user_home / '.claude.json'}, dest: .claude.json}}\n"
        f"    - {{src: {claude}, dest: .claude}}\n"
        "tasks:\n  - name: agent\n    shell: true\n    command: |\n      " + command + "\n"
    )
    _as_nobody(config)
    proc = subprocess.run(
        cli_argv(
            "run", "-q", "--no-report", config, prefix=[*SETPRIV, sys.executable, "-m", "gpuswarm"]
        ),
        cwd=nobody_dir,
        env=cli_env({"HOME": str(user_home)}),
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        check=False,
    )
    (run_dir,) = find_runs(nobody_dir / "ws")
    log = (run_dir / "tasks" / "agent" / "attempt-1" / "output.log").read_text()
    # before: ".claude.json: Permission denied" (0400 copy) and the task failed
    assert proc.returncode == 0, (proc.stdout, proc.stderr, log)
    assert run_dir.stat().st_uid == NOBODY  # it really ran as the unprivileged user
    modes: dict[str, str] = {}
    for line in (run_dir / "tasks" / "agent" / "modes.txt").read_text().splitlines():
        bits, name = line.split(" ", 1)
        modes[name] = bits
    (slot_home,) = (run_dir / "homes").iterdir()
    assert modes == {
        f"{slot_home}/.claude.json": "600",
        f"{slot_home}/.claude": "700",
        f"{slot_home}/.claude/.credentials.json": "600",
    }, modes
    assert (slot_home / ".claude" / "projects" / "p" / "session.jsonl").read_text() == "state\n"
    assert (slot_home / ".claude.json").read_text() == '{"oauthAccount": "me"}-refreshed'
    assert (slot_home / ".claude" / ".credentials.json").read_text() == '{"t": 2}\n'
    assert stat.S_IMODE(slot_home.stat().st_mode) == 0o700
    # the source: not a byte, mode or mtime changed, nothing added
    assert _digest(user_home) == before


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run gpuswarm as another user",
)
@pytest.mark.parametrize("planted", ["link_out", "not_mine"])
def test_a_link_out_of_claude_or_a_file_of_another_user_is_refused(
    nobody_dir: Path, planted: str
) -> None:
    """Issue 30: ``~/.claude/x -> <another user's id_rsa>`` was copied into every slot HOME (the
    user here can read it: setpriv keeps the read bypass, as root's own runs have). Now the run
    is exit 2 before anything is claimed, naming the file; no slot HOME holds the key."""
    user_home = nobody_dir / "home"
    claude = user_home / ".claude"
    claude.mkdir(parents=True)
    (claude / "settings.json").write_text("{}")
    other = nobody_dir / "other-user"
    other.mkdir()
    (other / "id_rsa").write_text("OTHER USER'S PRIVATE KEY")
    (other / "id_rsa").chmod(0o600)  # root's: another user's file
    _as_nobody(user_home, claude, claude / "settings.json")
    if planted == "link_out":
        (claude / "key").symlink_to(other / "id_rsa")
        os.lchown(claude / "key", NOBODY, NOBODY)
    else:
        (claude / "key").write_text("OTHER USER'S PRIVATE KEY")  # root's file in the user's tree
    config = nobody_dir / "agent.yaml"
    config.write_text(
        "name: agents\nworkspace: ws\ngpus: sim:1\n"
        f"home:\n  isolate: true\n  provision:\n    - {{src: {claude}, dest: .claude}}\n"
        "tasks:\n  - {name: agent, command: 'true'}\n"
    )
    _as_nobody(config)
    proc = subprocess.run(
        cli_argv(
            "run", "-q", "--no-report", config, prefix=[*SETPRIV, sys.executable, "-m", "gpuswarm"]
        ),
        cwd=nobody_dir,
        env=cli_env({"HOME": str(user_home)}),
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        check=False,
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert str(claude / "key") in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    holders = {p for p in nobody_dir.rglob("*") if p.is_file() and b"PRIVATE KEY" in p.read_bytes()}
    assert holders <= {other / "id_rsa", claude / "key"}, holders  # no copy anywhere
