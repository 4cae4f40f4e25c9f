"""Starting an attempt and naming its end: log folders, pre-checks, classification.

Pure helpers of :class:`gpuswarm.exec.local.process.Attempt`: nothing here waits on a process.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from pathlib import Path

from gpuswarm.core.logs import detect_oom, log_tail
from gpuswarm.core.models import EndKind
from gpuswarm.exec.base import AttemptEnd, LaunchSpec

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
# a log written by the LogPump: created fresh (never an existing file or a planted symlink)
PUMPED_LOG_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _is_shell_c(argv: list[str]) -> bool:
    return len(argv) >= 2 and Path(argv[0]).name in _SHELLS and argv[1].startswith("-")


def _shell_subject(log: Path, needle: str) -> str | None:
    """The name a shell complained about: ``sh: 1: foo: not found`` -> ``foo``."""
    for line in reversed(log_tail(log, max_lines=10).splitlines()):
        parts = [p.strip() for p in line.split(": ")]
        for i, part in enumerate(parts):
            if needle in part.lower():
                if part.lower() == "command not found" and i + 1 < len(parts):
                    return parts[i + 1]
                return parts[i - 1] if i > 0 else None
    return None


def _exit_kind(spec: LaunchSpec, code: int) -> tuple[EndKind, str]:
    if not _is_shell_c(spec.argv) or code not in (126, 127):
        return EndKind.EXITED, f"exit {code}"
    if code == 127:
        name = _shell_subject(spec.log_path, "not found")
        return EndKind.NOT_FOUND, f"command not found: {name}" if name else "command not found"
    name = _shell_subject(spec.log_path, "permission denied")
    what = f"command not executable: {name}" if name else "command not executable"
    return EndKind.NOT_EXECUTABLE, f"{what} (exit 126)"


def spawn_failure(exc: Exception, spec: LaunchSpec) -> tuple[EndKind, str]:
    name = spec.argv[0]
    if isinstance(exc, OSError):
        detail = exc.strerror or str(exc)
        if exc.filename is not None and str(exc.filename) == str(spec.cwd):
            return EndKind.SPAWN_ERROR, f"cannot enter working directory {spec.cwd}: {detail}"
        if isinstance(exc, FileNotFoundError):
            return EndKind.NOT_FOUND, f"command not found: {name}"
        if isinstance(exc, PermissionError) or exc.errno == errno.ENOEXEC:
            return EndKind.NOT_EXECUTABLE, f"command not executable: {name} ({detail.lower()})"
        return EndKind.SPAWN_ERROR, f"cannot start {name}: {detail}"
    return EndKind.SPAWN_ERROR, f"cannot start {name!r}: {exc}"


def make_log_dir(folder: Path) -> None:
    """``<task dir>/attempt-<n>``: one mkdir per level, no lookups first (hot path)."""
    for level in (folder.parent, folder):
        try:
            os.mkdir(level)  # noqa: PTH102
        except FileExistsError:
            pass
        except FileNotFoundError:
            os.makedirs(level, exist_ok=True)  # noqa: PTH103 - a deeper parent is missing


def fresh_log_dir(folder: Path) -> None:
    """``<task dir>/attempt-<n>``, made new: an earlier attempt may have planted it (a folder
    whose ``output.log`` is a symlink to a file outside the run); that is removed first (never
    followed). The task dir must be a real folder, not a symlink. One mkdir per level when
    nothing is in the way (hot path)."""
    try:
        os.mkdir(folder.parent)  # noqa: PTH102
    except FileNotFoundError:
        os.makedirs(folder.parent, exist_ok=True)  # noqa: PTH103 - a deeper parent is missing
    except FileExistsError:
        if folder.parent.is_symlink():
            why = "the task workspace is a symlink"
            raise OSError(errno.ELOOP, why, str(folder.parent)) from None
    try:
        os.mkdir(folder)  # noqa: PTH102
    except FileExistsError:
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)  # symlinks inside are removed, never followed
        else:
            folder.unlink()
        os.mkdir(folder)  # noqa: PTH102


def precheck(spec: LaunchSpec) -> str | None:
    if not spec.argv:
        return "empty command"
    if not spec.cwd.is_dir():
        return f"working directory does not exist: {spec.cwd}"
    return None


def verdict(
    spec: LaunchSpec,
    how: str,
    rc: int,
    *,
    reaped: bool,
    stop: str,
    started: float,
    pid: int | None,
    killed: int,
) -> AttemptEnd:
    """Classify an attempt's end once: ``how`` it ended (exited, timeout, cancelled), its
    status ``rc`` (negative: a signal) and ``stop``, what the stop did (SIGTERM, SIGKILL)."""
    sig = _signame(-rc) if rc < 0 else None
    if how == "timeout":
        kind, reason = EndKind.TIMEOUT, f"timeout after {spec.timeout:g}s ({stop})"
    elif how == "cancelled" and reaped and rc == 0:
        # it exited 0 in the stop's grace period: judged like any end (the supervisor hands
        # it back unless that makes it done; see ``cancelled``)
        kind, reason = EndKind.EXITED, "exit 0 during the stop's grace period"
    elif how == "cancelled":
        kind, reason = EndKind.CANCELLED, f"cancelled ({stop})"
    elif sig is not None:
        kind, reason = EndKind.SIGNALED, f"killed by {sig}"
    else:
        kind, reason = _exit_kind(spec, rc)
    failed = kind in (EndKind.SIGNALED, EndKind.TIMEOUT) or (kind is EndKind.EXITED and rc != 0)
    oom = failed and detect_oom(spec.log_path)  # only a failure can be an OOM
    if oom:
        reason = f"CUDA out of memory ({reason})"
    return AttemptEnd(
        kind=kind,
        returncode=rc if rc >= 0 else None,
        signal=sig,
        reason=reason,
        oom=oom,
        started=started,
        ended=time.time(),
        pid=pid,
        killed=killed,
    )
