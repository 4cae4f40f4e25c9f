"""The ``wrapped`` backend: the local backend's attempts behind handles with no wake-up fd.

It exists to keep the seam honest: the supervisor must run an attempt whose backend offers no
pidfd through the same loop (each attempt's blocking ``wait`` in a waiter thread), which is the
path a container or a remote actor takes. Selected with ``backend: wrapped``; used by tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuswarm.exec.base import AttemptEnd, BackendOptions, Handle, LaunchSpec, Leftovers
from gpuswarm.exec.local.backend import LocalBackend
from gpuswarm.exec.sandbox import Provision


class NoWakeHandle:
    """A handle that hides its attempt's wake-up fd (everything else is the attempt's own)."""

    def __init__(self, inner: Handle) -> None:
        self._inner = inner

    @property
    def pid(self) -> int | None:
        return self._inner.pid

    @property
    def done(self) -> bool:
        return self._inner.done

    @property
    def cancelled(self) -> bool:
        return self._inner.cancelled

    @property
    def exit_fd(self) -> int | None:
        return None  # nothing to poll: the supervisor must wait in a thread

    @property
    def deadline(self) -> float | None:
        return self._inner.deadline

    def end_if_clean(self) -> AttemptEnd | None:
        return self._inner.end_if_clean()

    def wait(self) -> AttemptEnd:
        return self._inner.wait()

    def pids(self) -> list[int]:
        return self._inner.pids()

    def cancel(self, *, hard: bool = False) -> None:
        self._inner.cancel(hard=hard)


class WrappedBackend:
    """Delegates to :class:`LocalBackend`; every handle it returns is a :class:`NoWakeHandle`."""

    name = "wrapped"
    caps_logs = True

    def __init__(self, options: BackendOptions) -> None:
        self._local = LocalBackend(options)

    def check(self) -> None:
        self._local.check()

    def open(self) -> None:
        self._local.open()

    def prepare_slot(self, home: Path | None, provisions: Sequence[Provision]) -> dict[str, str]:
        return self._local.prepare_slot(home, provisions)

    def launch(self, spec: LaunchSpec) -> NoWakeHandle:
        return NoWakeHandle(self._local.launch(spec))

    def end_leftovers(
        self, *, run_dir: str | None = None, owner: str | None = None, grace: float = 10.0
    ) -> Leftovers:
        return self._local.end_leftovers(run_dir=run_dir, owner=owner, grace=grace)

    def leftovers(self, run_dir: str) -> list[int | str]:
        return self._local.leftovers(run_dir)

    def close(self) -> None:
        self._local.close()
