"""Where a command's program is: the PATH search of ``execvp``, done once a second, not per task.

``subprocess.Popen`` given a bare name (``true``, ``python``) joins it to every PATH entry in
Python and the child tries each with ``execve`` until one runs: per task, a list built in the
parent and a failed ``execve`` per earlier entry in the child, while the parent waits (vfork).
:func:`program_path` names the file that search would run, from a cache that forgets within
:data:`TTL` seconds (a program installed or removed meanwhile is seen as ``execvp`` sees it
after at most that long). The caller hands it to Popen as ``executable`` (the child's argv[0]
stays the bare name) and, when that start fails for any reason, starts it again the long way,
so every failure (not found, not executable, a bad format where a later entry would run) is the
one the plain search gives.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

TTL = 1.0  # seconds a found program is trusted without looking again
_MAX = 256  # distinct (program, PATH) pairs kept

_lock = threading.Lock()
_found: dict[tuple[str, str], tuple[float, str]] = {}


def program_path(name: str, env: dict[str, str]) -> str | None:
    """The absolute file ``execvp(name)`` would run under ``env``'s PATH, or None: a name with
    a slash (no search), a PATH with a relative entry (it depends on the attempt's folder), or
    nothing found (the long way reports it)."""
    if not name or "/" in name:
        return None
    path = env.get("PATH", os.defpath)
    key = (name, path)
    now = time.monotonic()
    with _lock:
        hit = _found.get(key)
    if hit is not None and now - hit[0] < TTL:
        return hit[1]
    if not all(entry.startswith("/") for entry in path.split(os.pathsep)):
        return None  # "" or "." mean the child's own folder
    found = shutil.which(name, path=path)
    if found is None:
        return None
    with _lock:
        if len(_found) >= _MAX:
            _found.clear()
        _found[key] = (now, found)
    return found


def forget() -> None:
    """Drop every remembered program (a start that failed with one of them)."""
    with _lock:
        _found.clear()


def popen(
    argv: list[str], env: dict[str, str], cwd: Path, log: int, keep: tuple[int, ...]
) -> subprocess.Popen[bytes]:
    """An attempt's process: in its own session, ``log`` its stdout and stderr, no fd of ours
    but ``keep``; its program from the cache, and a start with it that fails made again the
    long way, whose error is the one raised."""
    exe = program_path(argv[0], env) if argv else None
    while True:
        try:
            return subprocess.Popen(
                argv,
                executable=exe,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                pass_fds=keep,
            )
        except OSError:
            if exe is None:
                raise
            forget()
            exe = None
