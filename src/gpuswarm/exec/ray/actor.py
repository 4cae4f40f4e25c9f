"""The slot actor: one long-lived Ray actor per GPU slot, pinned to its node.

It never touches CUDA: each attempt is a subprocess under the local backend's process control
(:class:`gpuswarm.exec.local.process.Attempt`: its own session, timeout TERM -> grace -> KILL of
the tree, leftovers killed, the actor a child subreaper), its output in a node-local file the
driver pulls in chunks (:meth:`SlotActor.poll`). Attempts are kept by their token, so a driver
that died and came back (``gpuswarm resume``) finds a running attempt and waits for it, or
collects the outcome of one that ended meanwhile; an outcome is handed over only to a poll with
the attempt's own token. The actor is threaded (``max_concurrency``): ``start`` returns at once,
``poll`` long-polls while a thread per attempt waits for its end.

Imported on the node by Ray (``gpuswarm`` must be installed there); ``ray`` itself only inside
methods, so the class is importable without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuswarm.exec.base import AttemptEnd, LaunchSpec
from gpuswarm.exec.local.process import Attempt
from gpuswarm.exec.local.tree import become_subreaper
from gpuswarm.exec.ray.guard import Guard
from gpuswarm.exec.ray.shapes import (
    ActorInfo,
    EndWire,
    HeldAttempt,
    PollReply,
    SetupReply,
    StartReply,
)
from gpuswarm.exec.ray.wire import (
    Staged,
    TooLarge,
    collect_outputs,
    home_dir,
    needs_tree,
    node_spec,
    sees_run_folder,
    unpack_tree,
)

CHUNK = 4 << 20  # log bytes per poll at most
PUNCH_EVERY = 64 << 20  # the node's copy of a log keeps at most about this much on its disk
_FALLOC_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


def punch_hole(fd: int, upto: int) -> int:
    """Free the log's first ``upto`` bytes on disk (the driver has them; the file keeps its
    size and offsets): a task that prints 100 GB fills no node's disk. Returns what is freed
    (0 where the filesystem cannot punch holes: the copy then stays whole)."""
    upto -= upto % 4096
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
        if fallocate(fd, _FALLOC_PUNCH, 0, upto) != 0:
            return 0
    except (OSError, AttributeError):
        return 0
    return upto


SETUP_TAIL = 4096


def end_dict(end: AttemptEnd) -> EndWire:
    return {
        "kind": end.kind.value,
        "returncode": end.returncode,
        "signal": end.signal,
        "reason": end.reason,
        "oom": end.oom,
        "started": end.started,
        "ended": end.ended,
        "pid": end.pid,
        "killed": end.killed,
    }


@dataclass
class _Run:
    token: str
    staged: Staged
    attempt: Attempt
    identity: dict[str, str]
    log: str  # the driver's log path (for a reattach)
    workspace: str  # the driver's task folder (its outputs go there)
    end: AttemptEnd | None = None
    files: list[tuple[str, bytes]] = field(default_factory=list)
    error: str | None = None  # outputs over the limit: the attempt fails with this
    delivered: int = 0  # log bytes a driver acknowledged (a reattaching one goes on from here)
    punched: int = 0  # log bytes before this were freed on the node's disk


class SlotActor:
    """One slot of one node. Methods are called by the driver through Ray."""

    def __init__(self, run: str, max_result: int, scratch: str | None = None) -> None:
        base = Path(scratch or os.environ.get("GPUSWARM_RAY_SCRATCH") or tempfile.gettempdir())
        self._scratch = base / "gpuswarm-ray" / run
        self._scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._max_result = max_result
        self._runs: dict[str, _Run] = {}
        self._cond = threading.Condition()
        self._node_env = dict(os.environ)
        self._guard = Guard()  # before the subreaper: the guard must not be in our tree
        become_subreaper()

    # -- who and where ---------------------------------------------------------------------------
    def info(self) -> ActorInfo:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "host": socket.gethostname(),
            "node": ctx.get_node_id(),
            "gpus": [int(g) for g in ray.get_gpu_ids()],
            "pid": os.getpid(),
        }

    # -- per-node setup --------------------------------------------------------------------------
    def setup(self, command: str, key: str, timeout: float) -> SetupReply:
        """Run ``command`` once per node (``key``: the node): the first slot runs it under a
        lock, the others wait and read its result."""
        done = self._scratch / f"setup-{key}.done"
        with open(self._scratch / f"setup-{key}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if done.is_file():
                return {"rc": int(done.read_text() or 0), "tail": "", "ran": False}
            log = self._scratch / f"setup-{key}.log"
            spec = LaunchSpec(
                argv=["/bin/sh", "-c", command],
                env=self._node_env,
                cwd=Path.home() if Path.home().is_dir() else Path("/"),
                log_path=log,
                timeout=timeout,
                grace=10.0,
            )
            attempt = Attempt.launch(spec)
            self._guard.watch(attempt.token, attempt.pid, spec.grace)
            end = attempt.wait()
            self._guard.unwatch(attempt.token)
            rc = end.returncode if end.ok or end.returncode is not None else -1
            with contextlib.suppress(OSError):
                tail = log.read_bytes()[-SETUP_TAIL:].decode(errors="replace")
            if end.ok:
                done.write_text("0")
            return {"rc": rc, "tail": tail, "ran": True, "reason": end.reason}

    # -- attempts --------------------------------------------------------------------------------
    def has_tree(self, key: str) -> bool:
        return (self._scratch / "trees" / key).is_dir()

    def start(
        self, data: dict[str, Any], tree: bytes | None = None, home: bytes | None = None
    ) -> StartReply:
        """Launch the attempt (idempotent by token). ``need_tree`` / ``need_home``: send the
        shipped folder / the slot's HOME (a node without the run folder, once each)."""
        token = str(data["token"])
        with self._cond:
            if token in self._runs:
                return {"pid": self._runs[token].attempt.pid, "started": True}
        shared = data["ship"] != "always" and sees_run_folder(str(data["root"]), str(data["probe"]))
        tree_dir: Path | None = None
        need_tree = not shared and needs_tree(data) and not data.get("tree")
        if not shared and data.get("tree"):
            tree_dir = self._scratch / "trees" / str(data["tree"][0])
            if not tree_dir.is_dir():
                if tree is None:
                    need_tree = True
                else:
                    tree_dir.parent.mkdir(parents=True, exist_ok=True)
                    unpack_tree(tree, tree_dir)
        slot_home = None if shared else home_dir(data, self._scratch)
        need_home = False
        if slot_home is not None and not slot_home.is_dir():
            if home is None:
                need_home = True
            else:
                slot_home.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                unpack_tree(home, slot_home)
                slot_home.chmod(0o700)
        if need_tree or need_home:
            return {"need_tree": need_tree, "need_home": need_home}
        staged = node_spec(data, self._node_env, self._scratch, tree_dir, slot_home)
        staged.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            staged.spec.log_path.unlink()
        attempt = Attempt.launch(staged.spec)
        self._guard.watch(attempt.token, attempt.pid, staged.spec.grace)
        workspace = str(data["env"].get("GPUSWARM_TASK_WORKSPACE", ""))
        identity = dict(data.get("identity") or {})
        run = _Run(token, staged, attempt, identity, str(data["log"]), workspace)
        with self._cond:
            self._runs[token] = run
        threading.Thread(target=self._wait, args=(run,), daemon=True).start()
        return {"pid": attempt.pid, "started": True}

    def _wait(self, run: _Run) -> None:
        end = run.attempt.wait()
        self._guard.unwatch(run.attempt.token)
        if run.staged.task_dir is not None:
            try:
                run.files = collect_outputs(run.staged.task_dir, self._max_result)
            except TooLarge as exc:
                run.error = str(exc)
            except OSError as exc:
                run.error = f"the attempt's outputs could not be read on its node: {exc}"
        with self._cond:
            run.end = end
            self._cond.notify_all()

    def poll(self, token: str, offset: int, wait: float) -> PollReply:
        """New log bytes from ``offset`` (negative: from what was last handed over, for a
        driver that reattaches), and the outcome once the attempt ended and every byte of its
        log was handed over. ``known`` False: this actor has no such attempt."""
        deadline = time.monotonic() + wait
        with self._cond:
            run = self._runs.get(token)
            if run is None:
                return {"known": False}
            if offset < 0:
                offset = run.delivered
            while run.end is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            ended = run.end is not None
        data = b""
        size = 0
        with contextlib.suppress(OSError), open(run.staged.spec.log_path, "r+b") as log:
            size = os.fstat(log.fileno()).st_size
            if size > offset:
                log.seek(offset)
                data = log.read(CHUNK)
            run.delivered = max(run.delivered, offset)  # what the driver asks from, it has
            if offset - run.punched >= PUNCH_EVERY:  # the driver has everything before offset
                run.punched = max(run.punched, punch_hole(log.fileno(), offset))
        out: PollReply = {"known": True, "data": data, "offset": offset + len(data)}
        if ended and offset + len(data) >= size:
            assert run.end is not None
            out["end"] = end_dict(run.end)
            out["files"] = run.files
            out["error"] = run.error
        return out

    def cancel(self, token: str, hard: bool) -> bool:
        with self._cond:
            run = self._runs.get(token)
        if run is None or run.end is not None:
            return False
        run.attempt.cancel(hard=hard)
        return True

    def forget(self, token: str) -> None:
        """The driver has the outcome: drop the attempt, its log and its stage."""
        with self._cond:
            run = self._runs.pop(token, None)
        if run is None:
            return
        with contextlib.suppress(OSError):
            run.staged.spec.log_path.unlink()
        if run.staged.stage is not None:
            shutil.rmtree(run.staged.stage.parent, ignore_errors=True)

    def attempts(self) -> list[HeldAttempt]:
        """What this actor holds (a reattaching driver): token, identity, ended or not."""
        with self._cond:
            return [
                {
                    "token": r.token,
                    "identity": r.identity,
                    "ended": r.end is not None,
                    "log": r.log,
                    "workspace": r.workspace,
                }
                for r in self._runs.values()
            ]

    def cleanup(self) -> None:
        """The driver is done for now: shipped trees, slot HOMEs, stages and logs go (the
        per-node setup's mark stays: a resumed run does not set the node up again)."""
        for name in ("trees", "homes", "stage", "logs"):
            shutil.rmtree(self._scratch / name, ignore_errors=True)

    def stop_all(self, grace: float) -> int:
        """End every attempt it runs (TERM, grace, KILL); how many were running."""
        with self._cond:
            running = [r for r in self._runs.values() if r.end is None]
        for run in running:
            run.attempt.cancel(hard=grace <= 0)
        deadline = time.monotonic() + grace + 15
        with self._cond:
            while any(r.end is None for r in running) and time.monotonic() < deadline:
                self._cond.wait(0.2)
        return len(running)
