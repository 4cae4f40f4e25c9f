"""The one exception hierarchy.

Every error a user can cause derives from :class:`GpuswarmError` and carries the exit code the CLI
returns for it. Bad input (exit code 2) names the file, line or field at fault and the fix.
Control-flow signals (an interrupt) live outside this hierarchy.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_UNFINISHED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class GpuswarmError(Exception):
    """Root of every error gpuswarm raises on purpose."""

    exit_code: int = EXIT_UNFINISHED


class BadInputError(GpuswarmError):
    """The user's input is wrong: the message says where and how to fix it. Nothing was written."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(BadInputError):
    """A config file or command list is malformed, mistyped or selects nothing."""


class GpuSpecError(BadInputError):
    """A ``--gpus`` value is malformed, duplicated or names GPUs this machine does not have."""


class RunDirError(BadInputError):
    """A run directory does not exist, is not a gpuswarm run, or its snapshot is unreadable."""


class RunLockedError(GpuswarmError):
    """Another live supervisor holds the run's lock."""

    exit_code = EXIT_BAD_INPUT


class PreflightError(BadInputError):
    """A preflight command failed, or no task's program can be found: nothing was started."""


class BackendError(BadInputError):
    """What runs the attempts cannot run any (docker: no daemon, no image, no GPU device):
    found before anything is claimed; the message says how to fix it."""


class GpuBusyError(BadInputError):
    """The GPUs asked for are held by another live run of this host (see ``--share-gpus``)."""


class QueueError(GpuswarmError):
    """The on-disk queue is in a state gpuswarm cannot repair by itself."""


class LeaseLostError(QueueError):
    """A claimed descriptor's lease file was renamed away (another supervisor reclaimed it):
    the write that found it gone wrote nothing, and the task is no longer this process's."""


class DiskFullError(GpuswarmError):
    """The disk (or a quota) is full: the queue is intact, a resume after freeing space goes on."""


DISK_FULL_ERRNOS = (28, 122)  # ENOSPC, EDQUOT


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


class ResearchError(BadInputError):
    """A research command cannot do what was asked (no experiment, bad variant id, dirty edit)."""


class BudgetSpentError(GpuswarmError):
    """What the agents may spend is spent (issue 34: ``--budget-usd``): exit 1, raise it to go
    on."""


class GitError(GpuswarmError):
    """A git command failed in a way the user must look at (the message has git's own words)."""


class Interrupted(BaseException):
    """Raised to unwind on the first Ctrl-C / SIGTERM after a warm shutdown."""
