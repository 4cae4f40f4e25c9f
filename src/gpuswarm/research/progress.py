"""A run's intermediate values (issue 38): the lines a training script prints while it trains,
``progress: elapsed=<seconds> <metric>=<value>`` by default (``metric_progress_regex``).

A variant's output is untrusted, so every read here is bounded: the live check reads only the
log's last bytes, the whole-log parse reads at most ``SCAN_BYTES`` in chunks and skips lines
longer than ``MAX_LINE`` (a huge line is never held whole), and a curve keeps at most
``MAX_POINTS`` points (evenly thinned, the last one always kept), so what the ledger stores per
run is a few kilobytes whatever the script printed.

A curve is a list of ``[elapsed, value]`` pairs, elapsed ascending (a point going back in time
is dropped), values finite.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from pathlib import Path

Curve = list[list[float]]

MAX_LINE = 4096  # bytes: a longer line is not a progress line (skipped unread)
SCAN_BYTES = 64 << 20  # the most of one log read when its run is recorded
TAIL_BYTES = 64 << 10  # the live check reads this much of a running log's end
MAX_POINTS = 200  # points kept per curve
_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"


def default_pattern(metric: str) -> str:
    """``progress: elapsed=12.5 val_bpb=1.234`` (anything may sit between and after the two)."""
    return rf"progress:.*?\belapsed=\s*{_NUMBER}s?\b.*?\b{re.escape(metric)}=\s*{_NUMBER}"


def check_progress_pattern(pattern: str) -> str:
    """``pattern`` if it compiles with two groups (elapsed seconds, then the value), or with
    named groups ``elapsed`` and ``value``; ValueError naming the setting otherwise."""
    try:
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(
            f"metric_progress_regex {pattern!r} is not a valid regular expression ({exc})"
        ) from None
    named = {"elapsed", "value"} <= set(compiled.groupindex)
    if not named and compiled.groups < 2:
        raise ValueError(
            f"metric_progress_regex {pattern!r} needs two groups, the elapsed seconds and the "
            "value (or named groups elapsed and value), e.g. "
            "'progress: elapsed=([0-9.]+) val_bpb=([0-9.]+)'"
        )
    return pattern


def _point(compiled: re.Pattern[str], line: str) -> tuple[float, float] | None:
    m = compiled.search(line)
    if m is None:
        return None
    try:
        if {"elapsed", "value"} <= set(compiled.groupindex):
            t, v = float(m.group("elapsed")), float(m.group("value"))
        else:
            t, v = float(m.group(1)), float(m.group(2))
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(t) and math.isfinite(v)) or t < 0:
        return None
    return t, v


def parse_lines(compiled: re.Pattern[str], lines: Iterable[str]) -> Curve:
    """The progress points of ``lines`` (each already at most MAX_LINE long), in time order."""
    out: Curve = []
    for raw in lines:
        for line in raw.split("\r"):  # \r-updated progress bars hold several lines
            p = _point(compiled, line)
            if p is not None and (not out or p[0] >= out[-1][0]):
                out.append([p[0], p[1]])
    return out


def _lines(path: Path, start: int, limit: int) -> Iterable[str]:
    """The complete lines of ``path`` from byte ``start``, at most ``limit`` bytes read, lines
    longer than MAX_LINE skipped without being held."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; a generator owns it
    except OSError:
        return
    with fh:
        fh.seek(start)
        left, buf, skipping = limit, b"", start > 0  # mid-file: the first line is partial
        while left > 0:
            chunk = fh.read(min(1 << 20, left))
            if not chunk:
                break
            left -= len(chunk)
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    if len(buf) > MAX_LINE:
                        buf, skipping = b"", True  # a huge line: drop it as it streams by
                    break
                line, buf = buf[:nl], buf[nl + 1 :]
                if not skipping and len(line) <= MAX_LINE:
                    yield line.decode("utf-8", "replace")
                skipping = False
        if buf and not skipping and len(buf) <= MAX_LINE:
            yield buf.decode("utf-8", "replace")  # the last line, even without its newline


def read_curve(path: Path, pattern: str) -> Curve:
    """The whole log's curve (bounded: SCAN_BYTES read, MAX_POINTS kept)."""
    compiled = re.compile(pattern)
    points: Curve = []
    for part in _chunks(_lines(path, 0, SCAN_BYTES), 4096):
        points.extend(parse_lines(compiled, part))
        if len(points) > 4 * MAX_POINTS:  # a flood of lines: thin as it comes
            points = thin(_ordered(points), 2 * MAX_POINTS)
    return thin(_ordered(points), MAX_POINTS)


def tail_curve(path: Path, pattern: str) -> Curve:
    """The progress points in a running log's last TAIL_BYTES (the live check's look)."""
    try:
        size = path.stat().st_size
    except OSError:
        return []
    start = max(0, size - TAIL_BYTES)
    return parse_lines(re.compile(pattern), _lines(path, start, TAIL_BYTES))


def _chunks(items: Iterable[str], n: int) -> Iterable[list[str]]:
    part: list[str] = []
    for item in items:
        part.append(item)
        if len(part) >= n:
            yield part
            part = []
    if part:
        yield part


def _ordered(points: Curve) -> Curve:
    out: Curve = []
    for t, v in points:
        if not out or t >= out[-1][0]:
            out.append([t, v])
    return out


def thin(curve: Curve, n: int = MAX_POINTS) -> Curve:
    """At most ``n`` points of ``curve``, evenly spread, the first and last kept."""
    if len(curve) <= n:
        return [list(p) for p in curve]
    step = (len(curve) - 1) / (n - 1)
    return [list(curve[round(i * step)]) for i in range(n)]


def valid_curve(raw: object) -> Curve:
    """A curve as the ledger holds it (``[[t, v], ...]``); anything malformed reads as none."""
    if not isinstance(raw, list):
        return []
    out: Curve = []
    for p in raw[: 4 * MAX_POINTS]:
        if (
            isinstance(p, list | tuple)
            and len(p) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in p)
            and all(math.isfinite(float(x)) for x in p)
            and (not out or float(p[0]) >= out[-1][0])
        ):
            out.append([float(p[0]), float(p[1])])
    return out


def at(curve: Sequence[Sequence[float]], t: float) -> float | None:
    """The curve's value at elapsed ``t``, linearly interpolated between its points; None
    outside the span it covers (before its first point or after its last)."""
    if not curve or t < curve[0][0] or t > curve[-1][0]:
        return None
    i = bisect_left(curve, t, key=lambda p: p[0])
    if curve[i][0] == t:
        return float(curve[i][1])
    (t0, v0), (t1, v1) = curve[i - 1], curve[i]
    if t1 == t0:
        return float(v1)
    return float(v0 + (v1 - v0) * (t - t0) / (t1 - t0))
