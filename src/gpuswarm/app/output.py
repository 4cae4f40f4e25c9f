"""What a supervised run shows and writes around the supervisor: the terminal reporter (a live
table, lines, or nothing), report.html + timeline.png, and the message of a run a full disk
stopped. Every function here is a view: none changes the queue.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TextIO

from gpuswarm.core.errors import DiskFullError
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.runview import RunView, SlotRow
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.outputs.aggregate import write_outputs
from gpuswarm.outputs.groups import group_lines, tally_run
from gpuswarm.outputs.report import write_report
from gpuswarm.outputs.summaryjson import RunSummary
from gpuswarm.placement.gpus import Slot
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runinfo import RunRecord
from gpuswarm.store.runs import open_record, open_run
from gpuswarm.store.spool import spooled_ids
from gpuswarm.ui.terminal import PlainReporter, is_terminal, paused_now


@dataclass(frozen=True)
class Output:
    """Where and how much the supervisor prints."""

    stream: TextIO | None = None
    quiet: bool = False
    live: bool = False  # a live table when the stream is a terminal (else one line per event)
    report: bool = True  # write report.html + timeline.png at the end


def reporter(
    paths: RunPaths,
    queue: DirQueue,
    ledger: Ledger,
    slots: list[Slot],
    output: Output,
    gpu_stats: Callable[[], dict[str, str]] | None = None,
) -> AbstractContextManager[None]:
    """Subscribe the terminal output to the journal: a live table, lines, or nothing.
    ``gpu_stats``: the supervisor's per-slot GPU line (its VRAM sampler's), else NVML's."""
    if output.quiet:
        return nullcontext()
    stream = output.stream or sys.stderr
    counts = counted(queue)

    def recount() -> dict[str, int]:
        return {s.value: n for s, n in counted(queue).items()}

    if not (output.live and is_terminal(stream)):
        ledger.subscribe(PlainReporter(counts, stream, recount=recount))
        return nullcontext()
    from gpuswarm.ui.table import LiveView, gpu_sampler, shown  # rich: here

    state = RunView({s.value: n for s, n in counts.items()})
    for slot in slots:
        state.slots[slot.label] = SlotRow()
    view = LiveView(
        state,
        paths.attempt_log,
        title=paths.root.name,
        gpu_stats=gpu_stats if gpu_stats is not None else gpu_sampler(slots),
        paused=paused_now(paths),
        recount=recount,
        redactor=run_redactor(open_run(paths.root)[1]),
        groups=GroupLines(queue, sum(counts.values())),
    )
    ledger.subscribe(view)
    return shown(view)


def counted(queue: DirQueue) -> dict[State, int]:
    """The queue's counts, a streamed enqueue's tasks not yet in pending/ counted as pending
    (the run's size is shown whole from its first line on)."""
    counts = queue.counts()
    if queue.paths.enqueue_spool.exists():
        counts[State.PENDING] += len(spooled_ids(queue.paths))
    return counts


class GroupLines:
    """The live table's group lines (issue 35): every group's progress, taken from the
    descriptors every :data:`GROUP_SECONDS` (runs of up to :data:`GROUP_TASKS` tasks: beyond,
    ``gpuswarm status --group`` shows them)."""

    def __init__(self, queue: DirQueue, tasks: int) -> None:
        self.queue = queue
        self.on = tasks <= GROUP_TASKS
        self._lines: list[str] = []
        self._taken = -GROUP_SECONDS

    def __call__(self) -> list[str]:
        now = time.monotonic()
        if self.on and now - self._taken >= GROUP_SECONDS:
            self._taken = now
            with contextlib.suppress(OSError):
                self._lines = group_lines(tally_run(self.queue).table())[:MAX_GROUP_LINES]
        return self._lines


GROUP_SECONDS = 5.0
GROUP_TASKS = 5_000
MAX_GROUP_LINES = 8


def write_report_safely(
    paths: RunPaths, queue: DirQueue, summary: RunSummary, info: RunRecord, out: Output
) -> None:
    """report.html + timeline.png; a failure here is reported, never the run's failure."""
    try:
        write_report(paths, queue, summary, info)
    except Exception as exc:  # the results are written already; the report is a view of them
        say(out, f"gpuswarm: could not write the report ({type(exc).__name__}: {exc})")


def after_disk_full(paths: RunPaths, queue: DirQueue, exc: OSError) -> DiskFullError:
    """The run stopped on a full disk: write the outputs if they still fit, say what to do."""
    where = f" ({exc.filename})" if exc.filename else ""
    try:
        _, info = open_record(paths.root)
        write_outputs(paths, queue, info, None)
        wrote = "summary.json and results.tsv are written"
    except OSError:
        wrote = "summary.json and results.tsv could not be written"
    return DiskFullError(
        f"the disk is full: {exc.strerror}{where}; the run stopped, {wrote}, and the queue "
        f"is intact: free some space, then run: gpuswarm resume {paths.root}"
    )


def say(output: Output, text: str) -> None:
    if not output.quiet:
        stream = output.stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()
