"""Self-contained HTML pages: inline CSS, a sortable-table script, escaped cells, PNGs as data
URIs. Nothing is loaded from anywhere, so a page works offline and leaks nothing when opened.
Used by the run report (``outputs/report.py``) and the research report.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222}.note{color:#666;font-style:italic}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#555}.meta b{color:#222}.fail h3{font-size:14px;margin:14px 0 4px}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;margin:2px 6px 2px 0;color:#fff}
.b-done,.b-ok{background:#2ca02c}.b-failed,.b-no{background:#d62728}.b-running{background:#1f77b4}
.b-pending{background:#888}.b-corrupt{background:#8c564b}img.timeline{max-width:100%}
table{border-collapse:collapse;margin:6px 0;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0}table.sortable th{cursor:pointer;user-select:none}
table.sortable th:after{content:" \\2195";color:#bbb}
table.sortable th.asc:after{content:" \\25B2";color:#333}
table.sortable th.desc:after{content:" \\25BC";color:#333}
tr.failed td{background:#fdecea}tr.pending td,tr.running td{background:#fff8e1}
tr.corrupt td{background:#efebe9}tr.keep td{background:#e8f5e9}
pre{background:#f7f7f7;border:1px solid #e3e3e3;padding:8px;overflow-x:auto;font-size:12px}
"""
# nothing may be loaded from anywhere: the page works offline and leaks nothing when opened
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

SORT_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  var heads = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, col) {
    th.addEventListener("click", function () {
      var asc = !th.classList.contains("asc");
      Array.prototype.forEach.call(heads, function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(asc ? "asc" : "desc");
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var num = /^\\s*[-+]?(\\d+\\.?\\d*|\\.\\d+)(e[-+]?\\d+)?\\s*$/i;
      rows.sort(function (a, b) {
        var x = a.cells[col].textContent, y = b.cells[col].textContent;
        if (x === "" || y === "") return x === y ? 0 : (x === "" ? 1 : -1);
        var c = num.test(x) && num.test(y) ? parseFloat(x) - parseFloat(y)
          : x.localeCompare(y, undefined, {numeric: true});
        return asc ? c : -c;
      });
      var frag = document.createDocumentFragment();
      rows.forEach(function (r) { frag.appendChild(r); });
      body.appendChild(frag);
    });
  });
});
"""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def html_page(title: str, body: str) -> str:
    """A complete, self-contained page: inline CSS and the table-sorting JS, nothing loaded."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style></head>\n<body>\n{body}\n"
        f"<script>{SORT_JS}</script>\n</body></html>\n"
    )


def cell_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def html_table(
    columns: Sequence[str] | Mapping[str, str],
    rows: Sequence[Mapping[str, object] | Sequence[object]],
    *,
    sortable: bool = True,
    row_classes: Sequence[str] | None = None,
) -> str:
    """An HTML table of escaped cells, each row a mapping by column key (what every table of
    the reports passes: a column added or moved cannot shift another's values; a plain
    sequence is taken cell by cell). ``columns``: the keys in order, each its own header, or
    key -> header. ``sortable`` tables sort by a click on a header."""
    heads = columns if isinstance(columns, Mapping) else {c: c for c in columns}
    head = "".join(f"<th>{esc(c)}</th>" for c in heads.values())
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{esc(row_classes[i])}"' if row_classes and row_classes[i] else ""
        values = [row.get(k) for k in heads] if isinstance(row, Mapping) else row
        cells = "".join(f"<td>{esc(cell_text(v))}</td>" for v in values)
        body.append(f"<tr{cls}>{cells}</tr>")
    klass = ' class="sortable"' if sortable else ""
    return (
        f"<table{klass}><thead><tr>{head}</tr></thead><tbody>\n"
        + "\n".join(body)
        + "</tbody></table>"
    )


def png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")
