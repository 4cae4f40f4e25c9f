"""The Slurm job gpuswarm runs in: its id, nodes, this node, and when it ends.

Everything is asked of Slurm itself: ``scontrol show hostnames`` expands the node list,
``squeue -h -j ID -o %L`` says the time left (``UNLIMITED``, ``minutes:seconds``,
``hours:minutes:seconds``, ``days-hours[:minutes[:seconds]]``); the end is now + that (no clock
or time zone of the controller's is parsed).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gpuswarm.core.errors import BackendError

STOP_BEFORE_VAR = "GPUSWARM_SLURM_STOP_BEFORE"
STOP_BEFORE_DEFAULT = 60.0  # seconds before the allocation's end that gpuswarm stops warm
_TIMEOUT = 30.0
_LEFT_RE = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def parse_time_left(text: str) -> float | None:
    """Seconds in Slurm's time format (``squeue %L``); None for ``UNLIMITED``/``NOT_SET``."""
    value = text.strip()
    m = _LEFT_RE.fullmatch(value)
    if not m:
        return None
    days, first, second, third = m.groups()
    parts = [int(p) for p in (first, second, third) if p is not None]
    if days is not None:  # days-hours[:minutes[:seconds]]
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
        return float(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)
    if len(parts) == 1:
        return float(parts[0] * 60)  # minutes
    if len(parts) == 2:
        return float(parts[0] * 60 + parts[1])  # minutes:seconds
    return float((parts[0] * 60 + parts[1]) * 60 + parts[2])


def _slurm(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"slurm: {argv[0]} failed: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-500:]
        raise BackendError(f"slurm: {' '.join(argv)} exited {done.returncode}: {said}")
    return done.stdout


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: tuple[str, ...]  # every node of the allocation, in Slurm's order
    node: str  # the node this process runs on
    ends_at: float | None  # epoch seconds (None: no time limit)
    stop_before: float
    notes: tuple[str, ...] = ()  # what could not be asked of Slurm (said once, at the start)

    @property
    def others(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if n != self.node)

    @property
    def stop_at(self) -> float | None:
        return None if self.ends_at is None else self.ends_at - self.stop_before


def stop_before(environ: Mapping[str, str], setting: float | None = None) -> float:
    """The margin before the end: ``GPUSWARM_SLURM_STOP_BEFORE`` (seconds, 0 allowed) over the
    run's ``slurm.stop_before`` (``--slurm-stop-before``), else 60 s."""
    raw = environ.get(STOP_BEFORE_VAR, "").strip()
    if not raw:
        return STOP_BEFORE_DEFAULT if setting is None else setting
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise BackendError(
            f"{STOP_BEFORE_VAR}={raw}: not a number of seconds (the time before the "
            "allocation's end gpuswarm stops warm); e.g. 120"
        )
    return value


def time_left(job_id: str) -> float | None:
    out = _slurm(["squeue", "-h", "-j", job_id, "-o", "%L"]).strip().splitlines()
    return parse_time_left(out[0]) if out else None


def current(environ: Mapping[str, str], setting: float | None = None) -> Allocation | None:
    """The allocation this process runs in on one of its nodes (None: not in one);
    ``setting``: the run's ``slurm.stop_before`` (None: it has none)."""
    job_id = environ.get("SLURM_JOB_ID", "").strip()
    node = environ.get("SLURMD_NODENAME", "").strip()
    if not job_id or not node:
        return None
    listed = environ.get("SLURM_JOB_NODELIST", "").strip() or node
    notes: list[str] = []
    try:  # a node without Slurm's commands (a container) still runs, on this node alone
        nodes = tuple(_slurm(["scontrol", "show", "hostnames", listed]).split())
    except BackendError as exc:
        nodes, notes = (node,), [f"{exc}: running on this node only (no worker elsewhere)"]
    try:
        left = time_left(job_id)
    except BackendError as exc:
        left = None
        notes.append(f"{exc}: the allocation's end is not known (claims are not bounded)")
    ends = None if left is None else time.time() + left
    margin = stop_before(environ, setting)
    return Allocation(job_id, nodes or (node,), node, ends, margin, tuple(notes))
