"""Rendering results: the markdown table (latest.md, embedded in BENCHMARKS.md), JSON, terminal.

BENCHMARKS.md embeds the results between markers: the queue-control rows between
``CONTROL_BEGIN`` / ``CONTROL_END``, the others between ``BEGIN`` / ``END``; ``run.py --update-doc``
replaces the sections of the benchmarks it ran.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common import Row

BEGIN = "<!-- bench:results:begin (written by bench/run.py; do not edit by hand) -->"
END = "<!-- bench:results:end -->"
CONTROL_BEGIN = "<!-- bench:control:begin (written by bench/run.py; do not edit by hand) -->"
CONTROL_END = "<!-- bench:control:end -->"
COLUMNS = ["#", "measure", "tool", "value", "target", "status", "ratio", "notes"]


def fmt_number(value: float) -> str:
    size = abs(value)
    if 0 < size < 0.1:
        return f"{value:.3f}"
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def value_text(row: Row) -> str:
    if row.shown is not None:
        text = row.shown
    elif row.value is None:
        return "-"
    else:
        text = fmt_number(row.value)
    return f"{text} {row.unit}".strip()


def cells(row: Row) -> list[str]:
    return [
        row.bench,
        row.metric,
        row.tool,
        value_text(row),
        row.target,
        row.status(),
        row.ratio,
        row.note,
    ]


def _md_cell(text: str, bold: bool = False) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return f"**{text}**" if bold and text else text


def tally(rows: list[Row]) -> str:
    judged = [r for r in rows if r.target]
    met = sum(1 for r in judged if r.ok)
    unmeasured = sum(1 for r in judged if r.ok is None)
    text = f"targets met: {met} of {len(judged)}"
    return text + (f" ({unmeasured} not measured)" if unmeasured else "")


def markdown(rows: list[Row], machine: dict[str, str], run: dict[str, Any]) -> str:
    lines = [
        f"Run: `{run['command']}` on {run['date']}, {run['minutes']:.1f} min; {tally(rows)}.",
        "",
        "Machine:",
        "",
        *(f"- {key}: {value}" for key, value in machine.items()),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    for row in rows:
        out = cells(row)
        out[5] = _md_cell(out[5], bold=row.ok is False)
        lines.append(
            "| " + " | ".join(_md_cell(c) if i != 5 else c for i, c in enumerate(out)) + " |"
        )
    lines.append("")
    lines.append(
        "Ratios are gpuswarm's figure divided by the peer's (tasks/s: higher is better; "
        "times and CPU: lower is better). Rows marked skipped, n/a or not measured say why in "
        "their notes."
    )
    return "\n".join(lines) + "\n"


def write(out: Path, rows: list[Row], machine: dict[str, str], run: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(rows, machine, run)
    (out / "latest.md").write_text(md)
    payload = {"run": run, "machine": machine, "rows": [asdict(r) for r in rows]}
    (out / "latest.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return out / "latest.md"


def update_doc(doc: Path, md: str, begin: str = BEGIN, end_mark: str = END) -> bool:
    """Replace one results section of BENCHMARKS.md (between ``begin`` and ``end_mark``);
    False when its markers are missing."""
    text = doc.read_text() if doc.exists() else ""
    start, end = text.find(begin), text.find(end_mark)
    if start < 0 or end < start:
        return False
    doc.write_text(text[: start + len(begin)] + "\n\n" + md + "\n" + text[end:])
    return True


def print_table(rows: list[Row]) -> None:
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:
        for row in rows:
            print(" | ".join(cells(row)))
        return
    table = Table(show_lines=False, title="gpuswarm benchmarks")
    for col in COLUMNS:
        table.add_column(col, overflow="fold")
    for row in rows:
        out = [escape(c) for c in cells(row)]
        colour = {"met": "green", "NOT met": "bold red"}.get(out[5])
        if colour:
            out[5] = f"[{colour}]{out[5]}[/]"
        table.add_row(*out)
    Console(width=200).print(table)
    print(tally(rows))
