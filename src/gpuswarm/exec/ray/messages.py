"""Ray's own messages to its driver, kept off the terminal: the run's ``ray.log``.

A Ray driver prints what the cluster says about its job on **stdout**, whatever
``log_to_driver`` says: ``(raylet) Raylet is terminated ... Last 20 lines of the Raylet logs``,
``The node ... has been marked dead``, an actor's death; with ``log_to_driver`` its workers'
(the slot actors') output too. stdout is where ``--json`` goes, and a node's death is the
supervisor's news to tell (one ``slots`` event, one terminal line). Ray's driver calls one
function for each of these, ``ray._private.worker.print_to_stdstream`` (its error listener by
name, its log handler through a partial made at ``ray.init``): :func:`install`, before
``ray.init``, puts :func:`write` in its place, which appends to the run folder's ``ray.log``
(0600, never followed, redacted, bounded) once the run is known, to stderr before (``gpuswarm
check``).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpuswarm.core.redact import redact_shapes

MAX_BYTES = 16 << 20  # a cluster that keeps failing cannot fill the run's disk through this
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_lock = threading.Lock()
_target: list[Path | None] = [None]
_events_of: list[Callable[[list[str]], Iterable[str]] | None] = [None]  # Ray's own filter


def send_to(path: Path | None) -> None:
    """Ray's messages from now on go to ``path`` (None: stderr)."""
    with _lock:
        _target[0] = path


def install(ray: Any) -> bool:
    """Route the driver's message printer here (before ``ray.init``: its log handler binds the
    function then); False where this Ray has none of that name (then forward no worker logs)."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    if worker is None or not callable(getattr(worker, "print_to_stdstream", None)):
        return False
    worker.print_to_stdstream = write
    found = getattr(worker, "filter_autoscaler_events", None)
    _events_of[0] = found if callable(found) else None
    return True


def write(data: dict[str, Any], ignore_prefix: bool = False) -> None:
    """One message of Ray's (``{"lines": [...], "pid": "raylet", "is_err": bool}``)."""
    del ignore_prefix
    source = str(data.get("actor_name") or data.get("task_name") or data.get("pid") or "ray")
    lines = [str(line) for line in data.get("lines") or ()]
    if source == "autoscaler":  # its status every few seconds: only its events, as Ray does
        lines = _autoscaler_events(lines)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    text = "".join(f"{stamp} ({source}) {redact_shapes(_ANSI.sub('', line))}\n" for line in lines)
    if not text:
        return
    with _lock:
        path = _target[0]
        if path is None:
            sys.stderr.write(text)
            sys.stderr.flush()
            return
        # the run folder's disk is full or gone: Ray's chatter is what gives way
        with contextlib.suppress(OSError):
            _append(path, text.encode("utf-8", "replace"))


def _autoscaler_events(lines: list[str]) -> list[str]:
    events = _events_of[0]
    if events is None:
        return [line for line in lines if ":event_summary:" in line]
    try:
        return [str(line) for line in events(lines)]
    except Exception:  # Ray's filter asks the cluster: a head gone for a moment drops them
        return []


def _append(path: Path, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size >= MAX_BYTES:
            return
        os.write(fd, data[: MAX_BYTES - size])
    finally:
        os.close(fd)
