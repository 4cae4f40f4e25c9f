"""Terminal output of a running supervisor: one log line per transition.

The reporter listens to ledger events (no folder scans) and keeps running counts, so each line
also says where the run stands. (A rich live table for terminals builds on the same events.)
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

from gpuswarm.core.redact import inert
from gpuswarm.store.queue import State


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal that can show the live view."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


WARM_STOP = "stopping: no new tasks, handing running ones back (Ctrl-C again: kill at once)"


class PlainReporter:
    """Prints ``HH:MM:SS slot event task detail [done/total]`` lines."""

    def __init__(self, counts: dict[State, int], stream: TextIO | None = None) -> None:
        self.counts = {s.value: counts.get(s, 0) for s in State}
        self.total = sum(self.counts.values())
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        line = self._line(event)
        if line is None:
            return
        line = inert(line)  # reasons quote task output: no escape sequence reaches the terminal
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def _move(self, frm: str, to: str) -> None:
        self.counts[frm] = max(0, self.counts[frm] - 1)
        self.counts[to] += 1

    def _progress(self) -> str:
        c = self.counts
        extra = f", {c['failed']} failed" if c["failed"] else ""
        return f"[{c['done']}/{self.total} done{extra}]"

    def _line(self, e: dict[str, Any]) -> str | None:
        stamp = time.strftime("%H:%M:%S", time.localtime(e.get("ts", time.time())))
        ev = e.get("ev")
        if ev == "started":
            self._move("pending", "running")
            detail = f"attempt {e['attempt']}" if e.get("attempt", 1) > 1 else ""
            return f"{stamp} {e['slot']:<8} start  {e['task']} {detail}".rstrip()
        if ev == "finished":
            return self._finished(stamp, e)
        if ev == "quarantined":
            return f"{stamp} {e['slot']:<8} QUARANTINED: {e.get('reason', '')}"
        if ev == "unquarantined":
            what = "probe: claims one task" if e.get("probe") else f"back: {e.get('reason', '')}"
            return f"{stamp} {e['slot']:<8} quarantine {what}"
        if ev == "requeued" and e.get("frm") == "running":
            self._move("running", "pending")
            return f"{stamp} {'':<8} requeued {e['task']} ({e.get('reason', '')})"
        if ev == "shutdown":
            what = "killing everything now" if e.get("mode") == "cold" else WARM_STOP
            return f"{stamp} {'':<8} {what}"
        if ev == "corrupt":
            return f"{stamp} {'':<8} corrupt descriptor moved aside: {e.get('file')}"
        return None

    def _finished(self, stamp: str, e: dict[str, Any]) -> str:
        state = "pending" if e.get("state") == "waiting" else e.get("state", "")
        self._move("running", state if state in self.counts else "failed")
        secs = f"{float(e.get('seconds', 0)):.1f}s"
        if state == "done":
            return f"{stamp} {e['slot']:<8} done   {e['task']} {secs} {self._progress()}"
        if state == "skipped":
            why = e.get("reason", "")
            return f"{stamp} {e['slot']:<8} skip   {e['task']} {why} {self._progress()}"
        why = e.get("reason", "")
        if e.get("retry"):
            wait = f", again in {e['retry_in']:g}s" if e.get("retry_in") else ""
            used = e.get("used", e["attempt"])  # within the budget (a resume grants a fresh one)
            return (
                f"{stamp} {e['slot']:<8} retry  {e['task']} {why} (attempt {used}/"
                f"{e.get('max_attempts', '?')}{wait}) {self._progress()}"
            )
        return f"{stamp} {e['slot']:<8} FAILED {e['task']} {why} {secs} {self._progress()}"


def attempt_number(data: dict[str, Any]) -> int:
    """The number of the attempt a running descriptor is on (the one rule, shared by status and
    watch): every attempt recorded so far, interrupted ones included, plus one, as the
    supervisor numbers them. Its log is ``attempt-<n>/output.log``."""
    return len(data.get("attempts", [])) + 1
