"""Checks before any task is claimed: the ``preflight:`` commands of each slot, and whether the
programs the tasks run can be found at all.

``preflight:`` commands run once per slot (with that slot's environment, HOME and GPUs, in the
run's base folder, through ``/bin/sh -c``), slots in parallel, before the slot claims anything,
through the run's backend: in the slot's container for docker, under the local backend's
process control (its own session, the tree killed on timeout) here. The
first failure stops the run before any task is touched: :class:`PreflightError` (exit 2), two
lines: the check's own message (the last line its command printed) and the log's path; every
task stays pending. Each slot's commands and their output are kept in
``<run>/preflight/<slot>.log`` (private), each command's in ``<slot>/cmd-<i>/output.log``, both
under ``reliability.max_log_mb`` like a task's log (head, a marker, the latest output): the
backend's log pump holds a command's log while it writes, or, for a backend that has none
(``caps_logs`` false), a capper here every half second.

:func:`missing_programs` resolves the program of every task (the first word of its command; for
a shell command the first word of its first simple command) on the task's PATH, so a run whose
every task runs a program that is not installed ends at once with one line naming it, instead of
failing every task (and blaming the GPUs).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.config.commands import CommandTasks, task_dumps
from gpuswarm.config.models import TaskSpec
from gpuswarm.core.errors import PreflightError
from gpuswarm.core.logs import cap_log, log_tail
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import inert, redact_text
from gpuswarm.core.taskdump import TaskDump
from gpuswarm.core.taskfiles import read_tail
from gpuswarm.core.words import counted
from gpuswarm.exec.base import AttemptEnd, Backend, LaunchSpec
from gpuswarm.exec.sandbox import Provision
from gpuswarm.placement.gpus import Slot, isolation_env

PREFLIGHT_TIMEOUT = 600.0  # seconds each preflight command may take
COPIED_TAIL = 1 << 20  # what of a command's output the slot's log gets at most
CAP_EVERY = 0.5  # seconds between caps of a command's log a backend does not cap itself
COMMAND_SHOWN = 60  # characters of a failed one-line command the error repeats
MESSAGE_SHOWN = 300  # and of the last line it printed
SHELL = "/bin/sh"
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./+")
# ASCII text shlex splits at blanks as str.split does: no quote, escape or comment, and no blank
# str.split knows that shlex does not (\v \f \x1c-\x1f)
_SHLEX_PLAIN = re.compile(r"[^'\"\\#\x0b\x0c\x1c-\x1f]*")


@dataclass(frozen=True)
class Failure:
    slot: str
    command: str
    how: str  # the attempt's end: "exit 1", "timeout after 600s (...)", "command not found: x"
    output: str  # the last line the command printed (its message), "" for none
    log: Path


def slot_env(
    paths: RunPaths, slot: Slot, home_env: dict[str, str], base_env: Mapping[str, str]
) -> dict[str, str]:
    """What a preflight command of ``slot`` sees: the slot's HOME and GPUs over the base
    environment (passed in), like its tasks."""
    env = {**base_env, **home_env, **isolation_env(slot)}
    env["GPUSWARM_RUN_DIR"] = str(paths.root)
    env["GPUSWARM_PREFLIGHT"] = "1"
    return env


def run_preflight(
    paths: RunPaths,
    slots: Sequence[Slot],
    commands: Sequence[str],
    *,
    cwd: Path,
    isolate: bool,
    provisions: Sequence[Provision],
    base_env: Mapping[str, str],
    backend: Backend,
    timeout: float = PREFLIGHT_TIMEOUT,
    max_log_bytes: int = 256 << 20,
) -> list[str]:
    """Run ``commands`` once per slot (slots in parallel) through the run's ``backend`` (in
    the slot's container, for docker); raise PreflightError on the first failure (naming the
    slot, the command and its output). Returns the slot labels checked."""
    if not commands:
        return []
    folder = paths.preflight
    folder.mkdir(exist_ok=True)
    failures: list[Failure] = []
    lock = threading.Lock()

    def one(slot: Slot) -> None:
        home = paths.slot_home(slot.label) if isolate else None
        env = slot_env(paths, slot, backend.prepare_slot(home, provisions), base_env)
        check = _SlotCheck(paths, slot, env, cwd, home, base_env, timeout, max_log_bytes)
        failure = check.run(backend, commands, folder)
        if failure is not None:
            with lock:
                failures.append(failure)

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in slots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise PreflightError(failure_message(paths, failures))
    return [s.label for s in slots]


def failure_message(paths: RunPaths, failures: Sequence[Failure]) -> str:
    """Two lines: what the check said (the last line its command printed; a one-line command
    and how it ended before it) and where its whole output is. The command itself, a script
    of twenty lines for an agent's check, is only in the log."""
    f = min(failures, key=lambda x: x.slot)
    others = len(failures) - 1
    more = f" (and on {counted(others, 'other slot')})" if others else ""
    command = f.command.strip()
    if "\n" in command and f.output:  # a script: its own message says what it checked
        plain = f.how.startswith(("exit ", "command not found"))  # its exit code: the message's
        said = f.output if plain else f"{f.output} ({f.how})"  # a timeout, a signal: said too
    else:
        cmd = command.splitlines()[0] if command else f.command
        cmd = (
            cmd
            if len(cmd) <= COMMAND_SHOWN and "\n" not in command
            else cmd[:COMMAND_SHOWN] + " ..."
        )
        said = f"`{cmd}` {f.how}" + (f": {f.output}" if f.output else " (no output)")
    return (
        f"preflight failed on {f.slot}{more}: {said}\n"
        f"log: {f.log} (no task was started; fix it, then: gpuswarm resume {paths.root})"
    )


def last_said(path: Path, env: Mapping[str, str]) -> str:
    """The last line with something on it a command printed (redacted, no control characters,
    at most MESSAGE_SHOWN characters): a check's own message is its last word."""
    lines = [line.strip() for line in log_tail(path, max_lines=50).splitlines()]
    line = next((x for x in reversed(lines) if x), "")
    line = inert(redact_text(line, env))
    return line if len(line) <= MESSAGE_SHOWN else line[: MESSAGE_SHOWN - 3] + "..."


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in label) or "slot"


@dataclass(frozen=True)
class _SlotCheck:
    """The preflight commands of one slot, each an attempt of the run's backend."""

    paths: RunPaths
    slot: Slot
    env: dict[str, str]
    cwd: Path
    home: Path | None
    inherited: Mapping[str, str]
    timeout: float
    max_log_bytes: int

    def run(self, backend: Backend, commands: Sequence[str], folder: Path) -> Failure | None:
        """Each command in turn; its output lands in ``preflight/<slot>.log`` (all of them)."""
        name = _safe(self.slot.label)
        log = folder / f"{name}.log"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(log, flags, 0o600)  # appends: a cap's truncation leaves no hole
        except OSError as exc:  # a link planted there, a full disk: no check can be recorded
            why = f"could not start: cannot write {log}: {exc.strerror}"
            return Failure(self.slot.label, commands[0], why, "", log)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(fd, 0o600)  # private, like every log (an earlier start's may be 0644)
            for i, command in enumerate(commands):
                out.write(f"$ {command}\n".encode())
                own = self.paths.preflight_output(name, i)  # the launch makes its folder
                with contextlib.suppress(FileNotFoundError):
                    own.unlink()  # an earlier start's output is not this one's
                end = self._wait(backend, self._spec(command, own, i), own)
                cap_log(own, self.max_log_bytes)
                out.write(read_tail(own, min(COPIED_TAIL, self.max_log_bytes))[0])
                out.flush()
                cap_log(log, self.max_log_bytes)
                if not end.ok:
                    said = last_said(own, self.env)
                    return Failure(self.slot.label, command, end.reason, said, log)
        return None

    def _wait(self, backend: Backend, spec: LaunchSpec, own: Path) -> AttemptEnd:
        """Launch and wait; a backend without a log pump gets its log capped meanwhile."""
        handle = backend.launch(spec)
        if backend.caps_logs:
            return handle.wait()
        done = threading.Event()

        def capper() -> None:
            while not done.wait(CAP_EVERY):
                cap_log(own, self.max_log_bytes)

        thread = threading.Thread(target=capper, name="preflight-log-cap", daemon=True)
        thread.start()
        try:
            return handle.wait()
        finally:
            done.set()
            thread.join()

    def _spec(self, command: str, log: Path, i: int) -> LaunchSpec:
        env = self.env
        return LaunchSpec(
            argv=[SHELL, "-c", command],
            env=env,
            cwd=self.cwd,
            log_path=log,
            timeout=self.timeout,
            grace=5.0,
            token=f"{self.paths.root.name}/preflight-{self.slot.label}/{i}",
            devices=self.slot.devices_of(self.slot.gpu_ids),
            vendor=self.slot.vendor,
            binds=() if self.home is None else (self.home,),
            own_env=frozenset(k for k, v in env.items() if self.inherited.get(k) != v),
            identity={"kind": "preflight", "slot": self.slot.label},
        )


# -- programs that cannot be found -----------------------------------------------------------------
def program_of(task: TaskDump) -> str | None:
    """The program a task dump runs, when it can be told without running anything: the first
    word of its command (of its first simple command, for a shell command); None when it
    depends on a placeholder, a variable or shell syntax."""
    return program_of_command(task.get("command"), bool(task.get("shell")))


def program_of_command(command: object, shell: bool) -> str | None:
    """:func:`program_of` of a task with this ``command`` and ``shell``."""
    word: str | None
    if isinstance(command, list):
        word = str(command[0]) if command else None
    elif isinstance(command, str):
        words = _first_words(command)
        if words is None:
            return None
        word = words[0] if words else None
        if shell and word is not None and "=" in word:
            return None  # an assignment first: VAR=x prog ...
    else:
        return None
    if not word or not set(word) <= _PLAIN:
        return None  # a placeholder, a variable, a glob, quoting: only a launch can tell
    return word


def _first_words(command: str) -> list[str] | None:
    """``shlex.split(command, comments=True)``'s first word (a list of at most one), or None
    when it cannot split; a command without quotes, escapes, comments or exotic blanks is split
    at its blanks (the same words, without shlex's per-character loop: 100k tasks are checked)."""
    if command.isascii() and _SHLEX_PLAIN.fullmatch(command):
        return command.split(None, 1)[:1]
    try:
        return shlex.split(command, comments=True)[:1]
    except ValueError:
        return None


def _found(word: str, cwd: Path, path_var: str | None, shell: bool) -> bool:
    if shell:  # the shell itself says: its builtins and keywords count, as PATH and ./x do
        env = dict(os.environ)
        if path_var is not None:
            env["PATH"] = path_var
        try:
            probe = subprocess.run(
                [SHELL, "-c", 'command -v -- "$1" >/dev/null 2>&1', "sh", word],
                env=env,
                cwd=cwd if cwd.is_dir() else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return True  # cannot tell: let the launch say
        return probe.returncode == 0
    if "/" in word:
        target = Path(word) if word.startswith("/") else cwd / word
        return os.access(target, os.X_OK) and target.is_file()
    return shutil.which(word, path=path_var) is not None


def missing_programs(tasks: Sequence[TaskSpec], base_dir: Path) -> tuple[dict[str, int], int]:
    """``({program: tasks that run it}, tasks checked)`` for programs not found on PATH (or, for
    a path, not an executable file relative to the task's folder). A command list's tasks share
    every field but their command: each program is counted, then looked at once."""
    groups: Iterable[tuple[TaskDump, str | None, int]]
    # a plain command list only: a subclass adds fields per dump (--repeats)
    if type(tasks) is CommandTasks:
        shared = tasks.with_holes()
        shell = bool(shared.get("shell"))
        words = Counter(program_of_command(c, shell) for _, _, c in tasks.rows())
        groups = ((shared, word, n) for word, n in words.items())
    else:
        groups = ((task, program_of(task), 1) for task in task_dumps(tasks))
    cache: dict[tuple[str, str, str | None, bool], bool] = {}  # by the task's own cwd text
    missing: dict[str, int] = {}
    checked = 0
    default_path = os.environ.get("PATH")
    for task, word, n in groups:
        cwd_text = task.get("cwd")
        if word is None or (isinstance(cwd_text, str) and "{" in cwd_text):
            continue
        path_var = (task.get("env") or {}).get("PATH", default_path)
        if path_var is not None and "$" in path_var:
            continue
        shell = bool(task.get("shell"))
        key = (word, cwd_text if isinstance(cwd_text, str) else "", path_var, shell)
        found = cache.get(key)
        if found is None:  # the folder is built once per distinct key: 100k tasks share a few
            cwd = Path(cwd_text) if isinstance(cwd_text, str) else base_dir
            found = cache[key] = _found(
                word, cwd if cwd.is_absolute() else base_dir / cwd, path_var, shell
            )
        checked += n
        if not found:
            missing[word] = missing.get(word, 0) + n
    return missing, checked
