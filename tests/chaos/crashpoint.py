"""Run the gpuswarm CLI with a SIGKILL planted at one precise point of its code.

usage: python crashpoint.py POINT -- CLI-ARGS...

The process SIGKILLs itself (nothing after that point runs, exactly like ``kill -9``) the Nth
time it reaches POINT:

- ``emit:EV[:KEY=VALUE][#N]``: just before writing the Nth event EV whose field KEY is VALUE;
  every transition renames first and journals second, so this is "the rename happened, its
  event was never written";
- ``emitted:EV[:KEY=VALUE][#N]``: just after writing that event (a transition fully done);
- ``claimed[#N]``: just after the Nth claim's rename into running/, before anything is launched;
- ``state-written:STATE[#N]``: inside ``DirQueue.move``, after the descriptor with its new
  ``state`` was written in running/, before the rename that moves it there;
- ``temp-left:STATE[#N]``: inside that write, with its temp file written and not yet renamed
  over the descriptor (``fsutil.atomic_write_bytes`` killed before its ``os.replace``).

Used by test_crash_points.py to hit, every time, the windows that random kills hit rarely.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

POINT = ""


def _die() -> None:
    sys.stderr.write(f"crashpoint: SIGKILL at {POINT}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class Trigger:
    def __init__(self, nth: int) -> None:
        self.nth = nth
        self.count = 0
        self.lock = threading.Lock()

    def hit(self) -> None:
        with self.lock:
            self.count += 1
            if self.count == self.nth:
                _die()


def _at_emit(kind: str, rest: str, trigger: Trigger) -> None:
    from gpuswarm.store import ledger

    ev, _, match = rest.partition(":")
    key, _, value = match.partition("=")
    emit = ledger.Ledger.emit

    def patched_emit(self: ledger.Ledger, e: ledger.Ev, **fields: Any) -> dict[str, Any]:
        hit = e.value == ev and (not key or str(fields.get(key)) == value)
        if hit and kind == "emit":
            trigger.hit()
        record = emit(self, e, **fields)
        if hit and kind == "emitted":
            trigger.hit()
        return record

    ledger.Ledger.emit = patched_emit  # type: ignore[method-assign,assignment]


def _at_claim(kind: str, rest: str, trigger: Trigger) -> None:
    from gpuswarm.store import queue

    try_claim = queue.DirQueue._try_claim

    def patched_claim(self: queue.DirQueue, name: str, owner: str, slot: int) -> Any:
        got = try_claim(self, name, owner, slot)
        if got is not None:
            trigger.hit()
        return got

    queue.DirQueue._try_claim = patched_claim  # type: ignore[method-assign]


def _at_write(kind: str, rest: str, trigger: Trigger) -> None:
    from gpuswarm.store import queue

    write = queue.atomic_write_bytes  # type: ignore[attr-defined]  # queue's own import

    def patched_write(path: Path, data: bytes, **kw: Any) -> None:
        hit = path.parent.name == "running" and json.loads(data).get("state") == rest
        if hit and kind == "temp-left":
            # what fsutil.atomic_write_bytes has done when it is killed before its os.replace
            tmp = path.parent / f".tmp-{path.name}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_bytes(data)
            trigger.hit()
        write(path, data, **kw)
        if hit and kind == "state-written":
            trigger.hit()

    queue.atomic_write_bytes = patched_write  # type: ignore[attr-defined]


INSTALLERS = {
    "emit": _at_emit,
    "emitted": _at_emit,
    "claimed": _at_claim,
    "temp-left": _at_write,
    "state-written": _at_write,
}


def install(point: str) -> None:
    point, _, nth = point.partition("#")
    kind, _, rest = point.partition(":")
    if kind not in INSTALLERS:
        raise SystemExit(f"crashpoint: unknown point {point!r}")
    INSTALLERS[kind](kind, rest, Trigger(int(nth or 1)))


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        raise SystemExit(__doc__)
    global POINT
    POINT = sys.argv[1]
    install(POINT)
    from gpuswarm.cli import main as cli_main

    sys.argv = ["gpuswarm", *sys.argv[3:]]
    cli_main()


if __name__ == "__main__":
    main()
