"""One attempt on a slot actor, as the supervisor's loop sees it (a Handle with no wake-up fd).

The loop hands it to a waiter thread at once; :meth:`RayHandle.wait` starts the attempt on its
actor, then long-polls it: each answer carries the log bytes written since the last one (appended
to ``tasks/<id>/attempt-<n>/output.log`` on the driver, whose cap the keeper holds) and, at the
end, the outcome with the files the attempt wrote when it ran in a stage (written into its task
folder here). The outcome is taken only from a poll with this attempt's token: an actor that
does not know it (restarted) or a node Ray declared dead make the attempt ``lost``.
``cancel`` only sets flags (it may run in a signal handler); the waiter sends the cancel.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Protocol

from gpuswarm.core.models import EndKind
from gpuswarm.exec.base import AttemptEnd, BackendOptions, EndFlags, LaunchSpec
from gpuswarm.exec.local.spawn import PUMPED_LOG_FLAGS, fresh_log_dir
from gpuswarm.exec.ray.cluster import Node
from gpuswarm.exec.ray.settings import RayConfig
from gpuswarm.exec.ray.shapes import PollReply, StartReply
from gpuswarm.exec.ray.wire import TooLarge, wire, write_outputs
from gpuswarm.placement.gpus import Slot

POLL_SECONDS = 0.5  # the actor answers at the end at once, else after this long with new output
TICK = 0.05  # how often the waiter looks at a cancel and at its node while a poll is out
START_TIMEOUT = 120.0
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


class Driver(Protocol):
    """What a handle asks of the driver's side (:class:`.backend.RayBackend`): declared here,
    so that the handle never imports its backend (the backend and the slot pool make handles).
    """

    options: BackendOptions  # run_dir: the run folder a node may see
    cfg: RayConfig
    probe: str  # the run folder's probe (a node that reads it back sees the folder)

    @property
    def ray(self) -> Any: ...

    def retire(self, label: str, why: str) -> None: ...

    def node_dead(self, node_id: str) -> str | None: ...

    def tree_for(self, spec: LaunchSpec) -> tuple[str, Any]: ...

    def home_for(self, home: Path) -> bytes: ...


class OnNode(Protocol):
    """The slot an attempt runs on (:class:`.slots.RaySlot`): its actor on its node."""

    @property
    def slot(self) -> Slot: ...

    @property
    def node(self) -> Node: ...

    @property
    def actor(self) -> Any: ...


class _Gone(Exception):
    """The attempt's node died (or the head is gone) while a call to its actor was out."""


class RayHandle(EndFlags):
    def __init__(
        self,
        backend: Driver,
        rs: OnNode,
        spec: LaunchSpec,
        *,
        adopted: bool = False,
    ) -> None:
        self._backend = backend
        self._rs = rs
        self._spec = spec
        self._adopted = adopted  # started by a driver that died: only polled
        self._end: AttemptEnd | None = None
        self._cancelled = False
        self._hard = False
        self._sent: bool | None = None  # the cancel sent (its hardness)
        self._pid: int | None = None
        self._started = time.time()

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def exit_fd(self) -> int | None:
        return None  # the waiter path: wait() polls the actor

    @property
    def deadline(self) -> float | None:
        return None  # the actor holds the timeout (TERM, grace, KILL on its node)

    @property
    def node(self) -> str:
        return self._rs.node.host

    def end_if_clean(self) -> AttemptEnd | None:
        return self._end

    def pids(self) -> list[int]:
        return []  # its processes are on its node, not on this host (the VRAM sampler's)

    def cancel(self, *, hard: bool = False) -> None:
        if self._end is not None:
            return
        self._cancelled = True
        self._hard = self._hard or hard

    def wait(self) -> AttemptEnd:
        if self._end is None:
            try:
                self._end = self._run()
            except BaseException:
                self._send_cancel(force=True)
                raise
        return self._end

    # -- the waiter's side -----------------------------------------------------------------------
    def _ray(self) -> Any:
        return self._backend.ray

    def _lost(self, why: str, *, retire: bool = True) -> AttemptEnd:
        node = self._rs.node
        if retire:  # its actor is gone: the slot must claim nothing more
            self._backend.retire(self._rs.slot.label, why)
        reason = f"lost: {why} (node {node.host}, {node.node_id[:12]})"
        now = time.time()
        return AttemptEnd(EndKind.LOST, None, None, reason, False, self._started, now, None, 0)

    def _failed(self, why: str) -> AttemptEnd:
        now = time.time()
        return AttemptEnd(EndKind.SPAWN_ERROR, None, None, why, False, self._started, now, None, 0)

    def _send_cancel(self, *, force: bool = False) -> None:
        hard = self._hard or force
        if self._sent is not None and (self._sent or not hard):
            return
        self._sent = hard
        with contextlib.suppress(Exception):
            self._rs.actor.cancel.remote(self._spec.token, hard)

    def _open_log(self) -> int:
        log = self._spec.log_path
        if self._adopted:
            with contextlib.suppress(OSError):
                return os.open(log, APPEND_FLAGS)
        fresh_log_dir(log.parent)
        return os.open(log, PUMPED_LOG_FLAGS, 0o600)

    def _start(self) -> AttemptEnd | None:
        """Start it on the actor; its cwd is packed and shipped only when the node asks for it
        (it does not see the run folder)."""
        from ray.exceptions import RayTaskError

        backend = self._backend
        root, probe, ship = backend.options.run_dir, backend.probe, backend.cfg.ship
        data = self._with_shared(wire(self._spec, root=root, probe=probe, ship=ship))
        actor = self._rs.actor
        try:
            res = self._get(actor.start.remote(data), START_TIMEOUT)
            if res.get("need_tree") or res.get("need_home"):
                blob = home = None
                if res.get("need_tree"):
                    key, blob = backend.tree_for(self._spec)
                    tree = (key, str(self._spec.cwd))
                    data = wire(self._spec, root=root, probe=probe, ship=ship, tree=tree)
                    data = self._with_shared(data)
                if res.get("need_home"):
                    home = backend.home_for(Path(str(data["home"])))
                res = self._get(actor.start.remote(data, blob, home), START_TIMEOUT)
        except RayTaskError as exc:  # the node could not stage it (a full disk, a bad tree)
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            return self._failed(f"its node could not start it: {str(cause).splitlines()[-1]}")
        self._pid = res.get("pid")
        return None

    def _get(self, ref: Any, timeout: float) -> StartReply:
        """``ray.get`` of an actor call, given up early when its node dies meanwhile."""
        from ray.exceptions import GetTimeoutError

        ray = self._ray()
        deadline = time.monotonic() + timeout
        while not ray.wait([ref], timeout=TICK * 4)[0]:
            if why := self._backend.node_dead(self._rs.node.node_id):
                raise _Gone(why)
            if time.monotonic() > deadline:
                raise GetTimeoutError(f"no answer within {timeout:.0f} s")
        got: StartReply = ray.get(ref)
        return got

    def _with_shared(self, data: dict[str, Any]) -> dict[str, Any]:
        """``ray.shared_path`` as ``$GPUSWARM_SHARED_PATH`` (large artifacts go there)."""
        shared = self._backend.cfg.shared_path
        if shared:
            data["env"]["GPUSWARM_SHARED_PATH"] = shared
        return data

    def _run(self) -> AttemptEnd:
        try:
            fd = self._open_log()
        except OSError as exc:
            return self._failed(f"cannot open log {self._spec.log_path}: {exc}")
        try:
            offset = -1 if self._adopted else 0  # adopted: from what the dead driver had
            if not self._adopted:
                failed = self._begin()
                if failed is not None:
                    return failed
            while True:
                res = self._poll(offset)
                if isinstance(res, AttemptEnd):
                    return res
                data = res.get("data") or b""
                if data:
                    _write_all(fd, data)
                offset = int(res["offset"])
                if "end" in res:
                    return self._finish(res, fd)
        finally:
            os.close(fd)

    def _begin(self) -> AttemptEnd | None:
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return self._start()
        except _Gone as gone:
            return self._gone(str(gone))
        except TooLarge as exc:
            return self._failed(str(exc))
        except RayActorError:
            return self._lost("its slot actor died before the attempt started")
        except GetTimeoutError:
            return self._lost("its slot actor did not answer the start")

    def _poll(self, offset: int) -> PollReply | AttemptEnd:
        """One long poll: its answer, or the end of an attempt whose node or actor is gone.
        While it is out, a cancel is sent and the node's death noticed every TICK."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        ray = self._ray()
        node = self._rs.node.node_id
        dead = self._backend.node_dead
        while True:
            if why := dead(node):
                return self._gone(why)
            if self._cancelled:
                self._send_cancel()
            ref = self._rs.actor.poll.remote(self._spec.token, offset, POLL_SECONDS)
            while not ray.wait([ref], timeout=TICK)[0]:
                if self._cancelled:
                    self._send_cancel()
                if why := dead(node):
                    return self._gone(why)
            try:
                res: PollReply = ray.get(ref)
            except ActorUnavailableError:  # for a moment (a network blip), or for good
                if why := dead(node):
                    return self._gone(why)
                time.sleep(0.2)
                continue
            except RayActorError:
                return self._lost("its node left the cluster or its slot actor died")
            if not res.get("known"):
                return self._lost("its slot actor does not know the attempt", retire=False)
            return res

    def _gone(self, why: str) -> AttemptEnd:
        """Its node is dead, or the head is gone while the node may still run it: ended on
        the node now where it still answers (else its guard ends it with the actor)."""
        self._send_cancel(force=True)
        return self._lost(why)

    def _finish(self, res: PollReply, fd: int) -> AttemptEnd:
        e = res["end"]
        end = AttemptEnd(
            EndKind(e["kind"]),
            e["returncode"],
            e["signal"],
            str(e["reason"]),
            bool(e["oom"]),
            float(e["started"]),
            float(e["ended"]),
            e["pid"],
            int(e["killed"]),
        )
        error = res.get("error")
        files = res.get("files") or []
        if files and error is None:
            task_dir = Path(self._spec.env.get("GPUSWARM_TASK_WORKSPACE", ""))
            try:
                write_outputs(task_dir, files)
            except OSError as exc:
                error = f"its outputs could not be written into {task_dir}: {exc}"
        if error is not None:
            _write_all(fd, f"\ngpuswarm: {error}\n".encode())
            end = AttemptEnd(
                EndKind.EXITED, None, None, error, end.oom, end.started, end.ended, end.pid, 0
            )
        with contextlib.suppress(Exception):
            self._rs.actor.forget.remote(self._spec.token)
        return end


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
