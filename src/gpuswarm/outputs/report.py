"""``report.html``: one self-contained page per run (inline CSS and JS, the timeline as a data URI).

It reads the queue once (``store.reader.RunReader``): rows for the task table, bars for the
timeline, and the descriptors of unfinished tasks for the failures section. Every user-controlled
text (names, reasons, logs) is redacted like ``gpuswarm status`` does and HTML-escaped. For 100k
tasks the table shows at most ``MAX_ROWS`` rows, failures first, and points to results.tsv for
the rest. The page's pieces (escaping, tables, the sort script) are ``outputs/html.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuswarm.core.fsutil import atomic_write_text
from gpuswarm.core.logs import log_tail
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import Redactor, env_secret_values
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.core.words import counted
from gpuswarm.outputs.costreport import cost_section
from gpuswarm.outputs.energy import energy_section
from gpuswarm.outputs.gpumem import OomRetry, gpu_memory_section, oom_retries
from gpuswarm.outputs.groups import GroupTally, groups_section
from gpuswarm.outputs.html import cell_text, esc, html_page, html_table, png_data_uri
from gpuswarm.outputs.passk import repeats_section
from gpuswarm.outputs.results import redact_rows, row_for
from gpuswarm.outputs.rowtypes import Row
from gpuswarm.outputs.slurmview import slurm_section
from gpuswarm.outputs.summaryjson import RunSummary
from gpuswarm.outputs.taskrow import FIXED_COLUMNS, TaskRow
from gpuswarm.outputs.timeline import (
    Bar,
    bars_from_descriptor,
    idle_stats,
    lane_key,
    timeline_png,
)
from gpuswarm.placement.devices import Gpu, GpuSet, Vendor
from gpuswarm.placement.gpus import plan_slots
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.reader import RunReader, last_attempt
from gpuswarm.store.runinfo import RunRecord

MAX_ROWS = 2000
MAX_FAILURES = 200
TAIL_LINES = 20


def select_rows(rows: Sequence[Row], limit: int = MAX_ROWS) -> tuple[list[Row], int]:
    """At most ``limit`` rows, unfinished and failed ones first (each group in task order);
    also how many were left out."""
    ordered = sorted(rows, key=lambda r: (r.values.state == State.DONE.value, r.values.task))
    return ordered[:limit], max(0, len(ordered) - limit)


# -- reading the run ---------------------------------------------------------------------------
@dataclass
class SlotTally:  # a slot's line of the report: its machines, attempts, exit 0s, busy s
    hosts: set[str] = field(default_factory=set)
    attempts: int = 0
    exited: int = 0
    busy: float = 0.0


class _Scan:
    """One pass over the queue: rows, bars, and the descriptors of tasks that are not done."""

    def __init__(self, reader: RunReader, summary: Mapping[str, Any], record: RunRecord) -> None:
        self.reader = reader
        self.rows: list[Row] = []
        self.bars: list[Bar] = []
        self.unfinished: list[tuple[str, Descriptor]] = []
        self.skipped: list[Row] = []
        self.cancelled: list[Row] = []
        secrets: set[str] = set()  # every task's own: one redactor (one pattern) for the run
        self.oom_retries: list[OomRetry] = []  # issue 19
        self.slots: dict[str, SlotTally] = {}  # slot label -> its node and its attempts
        self.groups = GroupTally()  # issue 35
        for state, _, data in reader.everything():
            self.groups.add(state, data)
            row = row_for(state, data)
            self.rows.append(row)
            self._count_slots(data)
            retried = oom_retries(row.values.task, data)
            self.bars += bars_from_descriptor(data, state.value)
            if data.env:
                secrets |= env_secret_values(data.env)
            self.oom_retries += retried
            if state is State.SKIPPED:
                self.skipped.append(row)
            elif state is State.CANCELLED:
                self.cancelled.append(row)
            elif state is not State.DONE:
                self.unfinished.append((state.value, data))
        known = {r.values.task for r in self.rows}
        for fail in summary.get("failures", []):  # descriptors moved to corrupt/
            if fail.get("state") == "corrupt" and str(fail.get("task")) not in known:
                entry = TaskRow.from_json(fail)
                self.rows.append(Row(values=TaskRow.corrupt(entry.task, entry.reason)))
        self.redactor: Redactor = run_redactor(record.to_json()).including(values=secrets)
        redact_rows(self.rows, self.redactor)
        for retry in self.oom_retries:
            retry["reason"] = self.redact(retry["task"], retry["reason"])

    def _count_slots(self, data: Descriptor) -> None:
        for att in data.attempts:
            if not att.slot:
                continue
            one = self.slots.setdefault(str(att.slot), SlotTally())
            if att.host:
                one.hosts.add(str(att.host))
            one.attempts += 1
            one.exited += att.kind == "exited" and att.returncode == 0
            if att.started is not None and att.ended is not None:
                one.busy += max(0.0, float(att.ended) - float(att.started))

    def redact(self, task: object, text: object) -> str:
        return self.redactor.text(cell_text(text))


def _lanes(record: RunRecord) -> list[str]:
    """Slot labels of the run (idle slots are lanes too); [] when run.json does not say."""
    try:
        vendor = Vendor(record.vendor or "sim")
        gpus = tuple(Gpu(i, "", vendor) for i in record.gpu_ids)
        gpu_set = GpuSet(vendor, gpus, record.gpus)
        slots = plan_slots(gpu_set, record.gpus_per_task, record.tasks_per_gpu)
    except Exception:  # a report must not fail on an odd run.json
        return []
    return [s.label for s in slots]


# -- sections ----------------------------------------------------------------------------------
def _seconds(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "?"
    minutes, sec = divmod(round(value), 60)
    hms = f"{minutes // 60}:{minutes % 60:02d}:{sec:02d}"
    return f"{value:.1f} s" if value < 120 else f"{hms} ({value:.0f} s)"


def _badge(kind: str, text: object) -> str:
    return f'<span class="badge b-{esc(kind)}">{esc(text)}</span>'


def _header(
    paths: RunPaths, summary: Mapping[str, Any], record: RunRecord, stats: Mapping[str, float]
) -> str:
    name = record.name or summary.get("name") or paths.root.parent.name
    ids = ",".join(str(i) for i in record.gpu_ids)
    label = str(summary.get("state") or ("complete" if summary.get("complete") else "unfinished"))
    state = _badge("ok" if label == "complete" else "no", label)
    badges = "".join(_badge(k, f"{k} {v}") for k, v in (summary.get("counts") or {}).items())
    meta = {
        "run": paths.root.name,
        "GPUs": f"{record.gpus or '?'} (ids {ids or '?'})",
        "written": summary.get("written", ""),
        "wall time": _seconds(summary.get("wall_seconds")),
        "task time (all attempts)": _seconds(summary.get("busy_seconds")),
    }
    busy = f"{100 * stats['busy_fraction']:.1f}%" if stats["span_seconds"] > 0 else "n/a"
    counts = summary.get("counts") or {}
    apart = "".join(
        f"<p>{esc(what)} {esc(counts[what])}: {why}, out of the pass rates</p>\n"
        for what, why in (("skipped", "not failed"), ("cancelled", "by hand, not failed"))
        if counts.get(what)
    )
    return (
        f"<h1>{esc(name)} {state}</h1>\n<p class=meta>"
        + " · ".join(f"{esc(k)} <b>{esc(v)}</b>" for k, v in meta.items())
        + f"</p>\n<p>{esc(counted(int(summary.get('total', 0)), 'task'))}: {badges}</p>\n"
        f"<p>GPU busy <b>{busy}</b> of the timeline span ({esc(_seconds(stats['span_seconds']))}; "
        f"idle {esc(_seconds(stats['idle_seconds']))} summed over lanes)</p>\n" + apart
    )


def _quarantines(summary: Mapping[str, Any]) -> str:
    """Slots the breaker took out of rotation, each with its reason and whether it came back."""
    found = [q for q in summary.get("quarantined") or [] if isinstance(q, Mapping)]
    if not found:
        return ""
    rows = "".join(
        f"<li>{_badge('no', 'quarantined')} <b>{esc(q.get('slot'))}</b> "
        f"(GPUs {esc(','.join(str(g) for g in q.get('gpus') or []))}): {esc(q.get('reason'))}"
        + (f"; lifted: {esc(q['lifted'])}" if q.get("lifted") else "; still out at the end")
        + "</li>"
        for q in found
    )
    return f"<h2>Quarantined slots</h2>\n<ul>{rows}</ul>\n"


def quarantined_lanes(summary: Mapping[str, Any]) -> dict[str, str]:
    """Lane -> mark for the timeline: slots quarantined at some point of the run."""
    out: dict[str, str] = {}
    for q in summary.get("quarantined") or []:
        if isinstance(q, Mapping) and q.get("slot"):
            out[str(q["slot"])] = "quarantined" if not q.get("lifted") else "was quarantined"
    return out


def _rate(true: int, of: int, what: str) -> str:
    return f"{true}/{of} of {what} ({100 * true / of:.1f}%)" if of else f"{true}/0 of {what}"


def _fields(fields: Mapping[str, Mapping[str, Any]]) -> str:
    rates = [
        {
            "field": k,
            "pass rate of done": _rate(f["true"], f["of_done"], "done"),
            "pass rate of all": _rate(f["true"], f["of_total"], "all"),
        }
        for k, f in fields.items()
        if f.get("kind") == "bool"
    ]
    nums = [
        {"field": k, **{c: f[c] for c in ("n", "mean", "median", "p90", "min", "max")}}
        for k, f in fields.items()
        if f.get("kind") == "number"
    ]
    out = "<h2>Metrics and results</h2>\n"
    if not rates and not nums:
        return out + "<p class=note>no metric or result fields</p>\n"
    if rates:
        out += html_table(("field", "pass rate of done", "pass rate of all"), rates) + "\n"
    if nums:
        out += html_table(("field", "n", "mean", "median", "p90", "min", "max"), nums) + "\n"
    return out


def _tasks(scan: _Scan, results_name: str) -> str:
    shown, hidden = select_rows(scan.rows)
    metric_cols = sorted({k for r in scan.rows for k in r.metrics})
    result_cols = sorted({k for r in scan.rows for k in r.result})
    columns = {
        **{c: c for c in FIXED_COLUMNS},
        **{f"metric:{c}": c for c in metric_cols},  # a metric may share a fixed column's name
        **{f"result.{c}": f"result.{c}" for c in result_cols},
    }
    table = [
        {
            **r.values.to_json(),
            **{f"metric:{c}": v for c, v in r.metrics.items()},
            **{f"result.{c}": v for c, v in r.result.items()},
        }
        for r in shown
    ]
    classes = [r.values.state for r in shown]
    note = ""
    if hidden:
        note = (
            f"<p class=note>{hidden} more tasks are not shown (the table keeps {len(shown)}, "
            f"failures first); every task is in {esc(results_name)}.</p>\n"
        )
    return (
        "<h2>Tasks</h2>\n<p class=note>click a header to sort</p>\n"
        + note
        + html_table(columns, table, row_classes=classes)
        + "\n"
    )


def _slots(scan: _Scan, lanes: Sequence[str]) -> str:
    """One row per slot the run has had: the machine it is on (a cluster's node), its
    attempts, how many exited 0, its busy time."""
    labels = sorted({*lanes, *scan.slots}, key=lane_key)
    if not labels:
        return ""
    table = []
    for label in labels:
        one = scan.slots.get(label) or SlotTally()
        host = ", ".join(sorted(one.hosts)) if one.hosts else ""
        table.append(
            {
                "slot": label,
                "node": host,
                "attempts": one.attempts,
                "exit 0": one.exited,
                "busy": _seconds(one.busy),
            }
        )
    return (
        "<h2>Slots</h2>\n<p class=note>every slot the run has had, with the machine it is on"
        "</p>\n" + html_table(["slot", "node", "attempts", "exit 0", "busy"], table) + "\n"
    )


def _failures(scan: _Scan) -> str:
    def order(item: tuple[str, Descriptor]) -> tuple[bool, str]:
        state, data = item
        return state != State.FAILED.value, data.id if data.has_id else "None"

    items = sorted(scan.unfinished, key=order)
    corrupt = [r for r in scan.rows if r.values.state == "corrupt"]
    if not items and not corrupt:
        return "<h2>Failures</h2>\n<p>none: every task is done.</p>\n"
    out = [f"<h2>Failures and unfinished tasks ({len(items) + len(corrupt)})</h2>"]
    for state, data in items[:MAX_FAILURES]:
        task = data.id if data.has_id else ""
        last = data.last_attempt
        reason = (
            data.reason
            or (last.reason if last is not None else None)
            or ("never started" if last is None else "")
        )
        name = data.name
        out.append(
            f'<div class="fail"><h3>{esc(task)} {_badge(state, state)} '
            f"{esc(scan.redact(task, name))}</h3>\n"
            f"<p>reason: <b>{esc(scan.redact(task, reason))}</b> · "
            f"attempts: {data.attempt_count}</p>"
        )
        n = last_attempt(data, started=True)  # the newest attempt that ran: it has a log
        if n is not None:
            try:
                log = scan.reader.paths.attempt_log(task, n)
                tail = scan.redact(task, log_tail(log, TAIL_LINES)) if log.exists() else ""
            except Exception:  # a bad id must not stop the report
                tail = ""
            label = f"last {TAIL_LINES} lines of attempt {n}'s log"
            out.append(f"<p class=note>{esc(label)}:</p><pre>{esc(tail) or '(no output)'}</pre>")
        out.append("</div>")
    if len(items) > MAX_FAILURES:
        out.append(
            f"<p class=note>{len(items) - MAX_FAILURES} more not shown; see results.tsv.</p>"
        )
    for r in corrupt:
        out.append(
            f'<div class="fail"><h3>{esc(r.values.task)} {_badge("corrupt", "corrupt")}</h3>'
            f"<p>reason: <b>{esc(r.values.reason)}</b></p></div>"
        )
    return "\n".join(out) + "\n"


def _skipped(scan: _Scan) -> str:
    """Tasks that ended skipped (a declared exit code, an exclude: glob) or cancelled (by a
    person): each listed apart."""
    return _apart(scan, "Skipped", scan.skipped, "not failed") + _apart(
        scan, "Cancelled", scan.cancelled, "by hand (gpuswarm cancel), not failed"
    )


def _apart(scan: _Scan, title: str, rows: list[Row], why: str) -> str:
    if not rows:
        return ""
    items = "".join(
        f"<li><b>{esc(r.values.task)}</b>: {esc(scan.redact(r.values.task, r.values.reason))}</li>"
        for r in rows[:MAX_ROWS]
    )
    return (
        f"<h2>{title} ({len(rows)})</h2>\n<p class=note>{why}; left out of the pass "
        f"rates</p>\n<ul>{items}</ul>\n"
    )


def write_report(paths: RunPaths, queue: DirQueue, summary: RunSummary, record: RunRecord) -> Path:
    """Write ``timeline.png`` and the self-contained ``report.html`` into the run folder."""
    scan = _Scan(RunReader(paths, queue), summary, record)
    lanes = scan.reader.slot_ids() or _lanes(record)  # every slot id the run has had
    stats = idle_stats(scan.bars, lanes)
    name = str(record.name or summary.get("name") or "")
    try:
        png = timeline_png(
            scan.bars,
            paths.timeline_png,
            title=name,
            lanes=lanes,
            marks=quarantined_lanes(summary),
        )
        image = f'<img class="timeline" alt="timeline of every attempt" src="{png_data_uri(png)}">'
    except Exception as exc:  # the page is still worth having without the chart
        image = f"<p class=note>timeline not available: {esc(exc)}</p>"
    body = (
        _header(paths, summary, record, stats)
        + _quarantines(summary)
        + slurm_section(paths.root, esc)  # issue 36: the worker jobs, the allocation
        + gpu_memory_section(summary, scan.oom_retries, scan.reader.held_gpus())
        + energy_section(summary)  # issue 37
        + cost_section(summary, scan.rows)  # issue 34: what the agents spent
        + repeats_section(summary)  # issue 34: mean and CI of scores, pass@k
        + _fields(summary.get("fields") or {})
        + groups_section(scan.groups.table())
        + "<h2>Timeline</h2>\n<p class=note>one lane per slot; hatched red: idle gaps</p>\n"
        + image
        + "\n"
        + _slots(scan, lanes)
        + _failures(scan)
        + _skipped(scan)
        + _tasks(scan, paths.results_tsv.name)
    )
    out = paths.report_html
    atomic_write_text(out, html_page(f"gpuswarm report: {name} {paths.root.name}", body))
    return out
