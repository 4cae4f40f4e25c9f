"""A task that misbehaves on purpose: the faults of the chaos scenarios, one per MODE.

usage: python faulty.py MODE [ARGS...]

  ok                       succeed
  exit CODE                exit with CODE
  signal NAME              kill itself with signal NAME (SEGV, KILL, ABRT, ...)
  hang                     ignore SIGTERM and sleep (a timeout must SIGKILL it)
  escape PIDFILE exit|hang leave a grandchild that escaped with a double fork and setsid(),
                           ignores SIGTERM and sleeps; then exit 0, or hang ignoring SIGTERM
  flood MB                 write MB mebibytes to stdout as fast as it can (the largest size its
                           log reached goes to flood.peak in its workspace), then succeed
  flaky                    fail (exit 1) on attempt 1, succeed on later attempts
  write PATH TEXT          write TEXT to PATH (relative to the task workspace) and exit 0
  write-bg PATH HEAD TAIL  a background process writes HEAD, sleeps 30 s, then TAIL; exit 0 at once
  write-hang PATH TEXT     write TEXT, then hang ignoring SIGTERM (a timeout kills it mid-file)

"Succeed" = append this attempt's number to $CHAOS_SHARED/<task id> (the side effect the
invariants count), then exit 0. Failing modes never write the side effect.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path


def succeed() -> None:
    shared = os.environ.get("CHAOS_SHARED")
    if shared:
        with open(Path(shared) / os.environ["GPUSWARM_TASK_ID"], "a") as fh:
            fh.write(os.environ["GPUSWARM_ATTEMPT"] + "\n")
    sys.exit(0)


def ignore_term() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def escape(pidfile: str, main: str) -> None:
    if main == "hang":
        ignore_term()
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            ignore_term()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            Path(pidfile + ".tmp").write_text(str(os.getpid()))
            os.replace(pidfile + ".tmp", pidfile)
            time.sleep(300)
        os._exit(0)
    os.waitpid(child, 0)
    while not Path(pidfile).exists():
        time.sleep(0.01)
    print("escaped", flush=True)
    if main == "hang":
        time.sleep(300)
    succeed()


def _log_size() -> int:
    """The size of this attempt's output.log (our stdout may be a pipe to it, or the file)."""
    env = os.environ
    log = Path(env["GPUSWARM_RUN_DIR"], "tasks", env["GPUSWARM_TASK_ID"])
    try:
        return (log / f"attempt-{env['GPUSWARM_ATTEMPT']}" / "output.log").stat().st_size
    except OSError:
        return 0


def flood(mib: int) -> None:
    """Write ``mib`` MiB in 64 KiB writes; note the largest size the log reached (a stat of
    this attempt's output.log after each MiB) in ``flood.peak`` of the task workspace."""
    chunk = (b"flood " * 10923)[: (1 << 16) - 1] + b"\n"
    peak = 0
    for i in range(mib * 16):
        os.write(1, chunk)
        if i % 16 == 15:
            peak = max(peak, _log_size())
    workspace_path("flood.peak").write_text(str(peak))
    succeed()


def workspace_path(rel: str) -> Path:
    return Path(os.environ["GPUSWARM_TASK_WORKSPACE"]) / rel


def kill_self(name: str) -> None:
    sig = getattr(signal, "SIG" + name)
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(5)


def hang() -> None:
    ignore_term()
    print("hanging", flush=True)
    time.sleep(300)


def flaky() -> None:
    if os.environ["GPUSWARM_ATTEMPT"] == "1":
        sys.exit(1)
    succeed()


def write(rel: str, text: str) -> None:
    workspace_path(rel).write_text(text)
    succeed()


def write_bg(rel: str, head: str, tail: str) -> None:
    if os.fork() == 0:
        with workspace_path(rel).open("w") as fh:
            fh.write(head)
            fh.flush()
            time.sleep(30)
            fh.write(tail)
        os._exit(0)
    time.sleep(0.2)  # the head is on disk
    succeed()


def write_hang(rel: str, text: str) -> None:
    ignore_term()
    with workspace_path(rel).open("w") as fh:
        fh.write(text)
        fh.flush()
        time.sleep(300)


MODES: dict[str, Callable[..., None]] = {
    "ok": succeed,
    "exit": lambda code: sys.exit(int(code)),
    "signal": kill_self,
    "hang": hang,
    "escape": escape,
    "flood": lambda mib: flood(int(mib)),
    "flaky": flaky,
    "write": write,
    "write-bg": write_bg,
    "write-hang": write_hang,
}


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode not in MODES:
        raise SystemExit(f"faulty.py: unknown mode {mode}")
    MODES[mode](*args)


if __name__ == "__main__":
    main()
