"""Ray's own messages to its driver, kept off the terminal: the run's ``ray.log``.

A Ray driver prints what the cluster says about its job on **stdout**, whatever
``log_to_driver`` says: ``(raylet) Raylet is terminated ... Last 20 lines of the Raylet logs``,
``The node ... has been marked dead``, an actor's death. stdout is where ``--json`` goes, and a
node's death is the supervisor's news to tell (one ``slots`` event, one terminal line). So the
driver's error listener (``ray._private.worker.print_to_stdstream``, the one function it calls
for each message) writes here instead: to the run folder's ``ray.log`` (0600, appended, never
followed, redacted, bounded) once the run is known, to stderr before (``gpuswarm check``).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuswarm.core.redact import redact_shapes

MAX_BYTES = 16 << 20  # a cluster that keeps failing cannot fill the run's disk through this
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_lock = threading.Lock()
_target: list[Path | None] = [None]


def send_to(path: Path | None) -> None:
    """Ray's messages from now on go to ``path`` (None: stderr)."""
    with _lock:
        _target[0] = path


def install(ray: Any) -> bool:
    """Route the connected driver's message printer here; False where this Ray has none of that
    name (its messages then go where Ray puts them)."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    if worker is None or not callable(getattr(worker, "print_to_stdstream", None)):
        return False
    worker.print_to_stdstream = write
    return True


def write(data: dict[str, Any], ignore_prefix: bool = False) -> None:
    """One message of Ray's (``{"lines": [...], "pid": "raylet", "is_err": bool}``)."""
    del ignore_prefix
    source = str(data.get("pid") or "ray")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    text = "".join(
        f"{stamp} ({source}) {redact_shapes(_ANSI.sub('', str(line)))}\n"
        for line in data.get("lines") or ()
    )
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
