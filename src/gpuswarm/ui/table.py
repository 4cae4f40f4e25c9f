"""The live table: one row per GPU slot, queue counts, a progress bar with ETA, recent failures.
It renders a :class:`~gpuswarm.core.runview.RunView` (the one reducer), fed by ledger events in
process or by tailing events.jsonl (``gpuswarm watch``, from ``store.reader.RunReader.view``); a
frame reads only the last few KiB of each running attempt's log, never a folder.

Where NVML works, each GPU row also shows utilisation and memory (sampled at most once a
second); elsewhere those columns are left out.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gpuswarm.core.logs import log_tail
from gpuswarm.core.models import State
from gpuswarm.core.redact import Redactor, inert
from gpuswarm.core.runview import RunView, SlotRow
from gpuswarm.outputs.spend import money, tokens_text
from gpuswarm.placement.nvml import open_query

REFRESH_PER_SECOND = 4
RECOUNT_SECONDS = 2.0  # a live run's view takes the queue's counts again this often


def clock(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h07m``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = int(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _natural(label: str) -> tuple[str, int]:
    digits = "".join(ch for ch in label if ch.isdigit())
    return (label.rstrip("0123456789"), int(digits) if digits else -1)


TASK_CAP = 120  # characters of a task's id and name a row can show at most
OUTPUT_CAP = 240  # and of its last output line
_SHRINKS = ("task", "last output")  # the columns that give way on a narrow terminal
_FLEX_MIN = 6  # each keeps this much (an ellipsis and a few characters) while it can


class SlotTable:
    """The slot table, fitted to the terminal's width when it is drawn: the slot id, the
    attempt, elapsed/timeout and the GPU line always show in full (no wrap, as wide as their
    widest cell); the task and the last output share what is left and end in an ellipsis."""

    HEADERS = ("slot", "task", "try", "elapsed", "last output")

    def __init__(self, *, gpu: bool = False) -> None:
        self.headers = (*self.HEADERS, "gpu") if gpu else self.HEADERS
        self.rows: list[dict[str, Text]] = []

    def add_row(self, cells: Mapping[str, str]) -> None:
        """One row of rich markup cells by header (a header it lacks: an empty cell)."""
        self.rows.append({h: Text.from_markup(cells.get(h, "")) for h in self.headers})

    def widths(self, total: int, headers: Sequence[str] | None = None) -> list[int]:
        """Each column's width for a terminal ``total`` cells wide (two spaces between)."""
        heads = self.headers if headers is None else headers
        natural = {h: max([len(h), *(r[h].cell_len for r in self.rows)]) for h in heads}
        fixed = sum(w for h, w in natural.items() if h not in _SHRINKS)
        room = total - 2 * (len(natural) - 1) - fixed
        task, out = (natural[h] for h in _SHRINKS)
        if task + out > room:  # the output gets what the task leaves, the task at most 2/5
            task = min(task, max(_FLEX_MIN, room * 2 // 5, room - out))
            out = max(_FLEX_MIN, room - task)
        natural.update(zip(_SHRINKS, (task, out), strict=True))
        return list(natural.values())

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        headers = self.headers
        widths = self.widths(options.max_width)
        if (
            len(headers) > len(self.HEADERS)
            and sum(widths) + 2 * (len(widths) - 1) > options.max_width
        ):
            headers = self.HEADERS  # too narrow for everything: the GPU line goes first
            widths = self.widths(options.max_width, headers)
        table = Table(box=None, pad_edge=False, show_edge=False, expand=False)
        for header, width in zip(headers, widths, strict=True):
            table.add_column(header, no_wrap=True, overflow="ellipsis", width=width)
        for row in self.rows:
            table.add_row(*(row[h] for h in headers))
        yield table


class LiveView:
    """Renders a :class:`RunView` with rich; ``log_of(task, attempt)`` locates attempt logs."""

    def __init__(
        self,
        state: RunView,
        log_of: Callable[[str, int], Path],
        *,
        title: str = "",
        header: Callable[[], str] | None = None,
        gpu_stats: Callable[[], dict[str, str]] | None = None,
        paused: Callable[[], tuple[bool, frozenset[str]]] | None = None,
        recount: Callable[[], dict[str, int]] | None = None,
        redactor: Redactor | None = None,
        groups: Callable[[], list[str]] | None = None,
    ) -> None:
        self.state = state
        self.groups = groups  # issue 35: one line per group (its progress), or none
        # the run's redactor (run_redactor); else this process's secrets, then shapes
        self.redactor = redactor if redactor is not None else Redactor.of_env(os.environ)
        self.paused = paused  # (run, slots) paused now; None: as the journal says
        # the queue's counts now (its folders), taken over every RECOUNT_SECONDS: a live run's
        # view hears only its own supervisor's events, not another process's add or cancel
        self.recount = recount
        self._counted = time.monotonic()
        self.log_of = log_of
        self.title = title
        self.header = header
        self.gpu_stats = gpu_stats

    def __call__(self, event: dict[str, Any]) -> None:  # a ledger listener
        self.state.apply(event, own=True)  # records this process emitted

    def render(self) -> RenderableType:
        now = time.time()
        if self.recount is not None and time.monotonic() - self._counted >= RECOUNT_SECONDS:
            self._counted = time.monotonic()
            with contextlib.suppress(OSError):
                fresh = self.recount()
                with self.state.lock:
                    self.state.counts.update(fresh)
        with self.state.lock:
            rows = sorted(self.state.slots.items(), key=lambda kv: _natural(kv[0]))
            counts = dict(self.state.counts)
            failures = list(self.state.failures)
            eta = self.state.eta(now)
            note = self.state.note
            waits = list(self.state.waiting_room.values())[-1:]  # issue 19: the first in line
            quarantined = dict(self.state.quarantined)
            run_paused, slots_paused = self.state.paused, frozenset(self.state.paused_slots)
            spent = live_spend(self.state, now)
        if self.paused is not None:
            run_paused, slots_paused = self.paused()
        total = max(1, sum(counts.values()))
        ended = tuple(s.value for s in State.terminal())
        finished = sum(counts.get(k, 0) for k in ended)
        apart = "".join(f"  {k} {counts[k]}" for k in (*ended[2:], "blocked") if counts.get(k))
        head = Text.from_markup(
            f"[bold]{escape(self.title)}[/]  done {counts.get('done', 0)}  failed "
            f"{counts.get('failed', 0)}  running {counts.get('running', 0)}  pending "
            f"{counts.get('pending', 0)}{apart}  ETA {clock(eta)}"
            + ("  [yellow]PAUSED (no new starts)[/]" if run_paused else "")
        )
        parts: list[RenderableType] = [head]
        if self.header is not None:
            parts.append(Text(self.header()))
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(total=total, completed=finished, width=50),
            f"{finished}/{sum(counts.values())}",
        )
        parts.append(bar)
        if spent:
            parts.append(Text(spent))
        for line in self.groups() if self.groups is not None else ():
            parts.append(Text(inert(f"  {line}"), style="cyan"))
        parts.append(self._table(rows, now, quarantined, slots_paused))
        for line in failures:
            parts.append(Text(inert(f"  ! {line}"), style="red"))
        if note:
            parts.append(Text(note, style="yellow"))
        for why in waits:
            parts.append(Text(inert(why), style="yellow"))
        return Group(*parts)

    def _table(
        self,
        rows: Sequence[tuple[str, SlotRow]],
        now: float,
        quarantined: dict[str, str],
        paused: frozenset[str] = frozenset(),
    ) -> SlotTable:
        stats = self.gpu_stats() if self.gpu_stats else {}
        table = SlotTable(gpu=bool(stats))
        for label, row in rows:
            why = quarantined.get(label)
            shown_label = label if why is None else f"{label} [red](QUARANTINED)[/]"
            if why == "probe":
                shown_label = f"{label} [yellow](probe)[/]"
            if label in paused:
                shown_label += " [yellow](paused)[/]"
            if why is not None and why != "probe" and not row.task:
                cells = {"task": "[red]QUARANTINED[/]", "last output": escape(why)[:OUTPUT_CAP]}
            elif row.task:
                limit = f"/{clock(row.timeout)}" if row.timeout else ""
                cells = {
                    "task": escape(inert(f"{row.task} {row.name}".strip()[:TASK_CAP])),
                    "try": str(row.attempt),
                    "elapsed": f"{clock(now - row.since)}{limit}",
                    "last output": self._last_line(row)[:OUTPUT_CAP],
                }
            else:
                cells = {"task": "[dim]idle[/]", "last output": f"[dim]{row.done} done[/]"}
            cells["slot"] = shown_label
            if stats:
                cells["gpu"] = stats.get(label, "")
            table.add_row(cells)
        return table

    def _last_line(self, row: SlotRow) -> str:
        tail = log_tail(self.log_of(row.task, row.attempt), max_lines=1, max_bytes=4096)
        # task output: no escape sequence for the terminal, no token or URL password on screen
        return escape(inert(self.redactor.text(tail.strip())))


def live_spend(state: RunView, now: float) -> str:
    """``spent $0.90  4.7k tokens  $1.20/h`` (issue 34; empty: no agent reported usage)."""
    if not state.spent_tokens and not state.spent_usd and not state.spent_unknown:
        return ""
    hours = max(now - state.started, 1.0) / 3600
    text = f"spent {money(state.spent_usd, state.spent_unknown)}  "
    text += f"{tokens_text(state.spent_tokens)} tokens  {money(state.spent_usd / hours)}/h"
    return text + (f"  ({state.spent_unknown} of unknown cost)" if state.spent_unknown else "")


@contextlib.contextmanager
def shown(view: LiveView, console: Console | None = None) -> Iterator[None]:
    """Show ``view`` live until the block ends (then print its last frame once)."""
    with Live(
        get_renderable=view.render,
        console=console or Console(stderr=True),
        refresh_per_second=REFRESH_PER_SECOND,
        transient=False,
        redirect_stdout=False,
        redirect_stderr=False,
    ):
        yield


@dataclass
class _Sampled:  # the last look of gpu_sampler: when, and per slot its line
    at: float = 0.0
    data: dict[str, str] = field(default_factory=dict)


def gpu_sampler(slots: Sequence[Any]) -> Callable[[], dict[str, str]] | None:
    """Per-slot ``util% used/total`` from NVML (:mod:`gpuswarm.placement.nvml`, sampled at most
    once a second), or None without it (``gpuswarm watch``; a live run shows its supervisor's
    sampler instead). Simulated GPUs never use it: their ids are not the machine's."""
    if not slots or any(getattr(s, "vendor", None) is None for s in slots):
        return None
    vendor = str(getattr(slots[0].vendor, "value", ""))
    query = open_query(vendor) if vendor in ("nvidia", "amd") else None
    if query is None:
        return None
    cache = _Sampled()

    def sample() -> dict[str, str]:
        now = time.monotonic()
        if now - cache.at < 1.0:
            return dict(cache.data)
        data = {}
        for slot in slots:
            parts = []
            for gpu in slot.devices_of(slot.gpu_ids):
                look = query.sample(gpu.uuid or gpu.index)
                if look.used_mb is not None and look.total_mb:
                    util = f"{look.util}% " if look.util is not None else ""
                    parts.append(f"{util}{look.used_mb / 1024:.1f}/{look.total_mb / 1024:.0f}G")
            data[slot.label] = " ".join(parts)
        cache.at, cache.data = now, data
        return data

    return sample
