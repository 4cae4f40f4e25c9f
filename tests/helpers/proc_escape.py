"""Test helper for test_process: leave a descendant behind that escaped the process group.

usage: proc_escape.py PIDFILE MODE MAIN

MODE  setsid  double fork; the grandchild calls setsid() and sleeps, its parent exits
      keep    the grandchild calls setsid() and sleeps; its parent (still in the group) sleeps too
      daemon  classic daemon: fork, setsid, fork, stdio to /dev/null; the intermediate exits
      noenv   like daemon, but the daemon is `sleep` started with an empty environment
MAIN  exit    the main process exits 0 once PIDFILE exists
      hang    the main process ignores SIGTERM and sleeps
The escaped grandchild writes its pid to PIDFILE (atomically) and sleeps 300 s.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def write_pid(path: str) -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    Path(path + ".tmp").replace(path)


def grandchild(path: str, mode: str) -> None:
    if mode in ("daemon", "noenv"):
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.chdir("/")
    if mode == "noenv":
        script = f"echo $$ > '{path}.tmp' && mv '{path}.tmp' '{path}' && exec sleep 300"
        os.execve("/bin/sh", ["/bin/sh", "-c", script], {})
    write_pid(path)
    time.sleep(300)


def child(path: str, mode: str) -> None:
    if mode in ("daemon", "noenv"):
        os.setsid()
    if os.fork() == 0:
        if mode in ("setsid", "keep"):
            os.setsid()
        grandchild(path, mode)
        os._exit(0)
    if mode == "keep":
        time.sleep(300)
    os._exit(0)


def main() -> None:
    path, mode, main_mode = sys.argv[1:4]
    if main_mode == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        child(path, mode)
    if mode != "keep":
        os.waitpid(pid, 0)
    deadline = time.monotonic() + 30
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    print("escaped", flush=True)
    if main_mode == "hang":
        time.sleep(300)
    sys.exit(0)


if __name__ == "__main__":
    main()
