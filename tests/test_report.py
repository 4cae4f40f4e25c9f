"""report.html and timeline.png: built from a real run of the CLI on simulated GPUs, plus units.

The run has done tasks with a metric and a result file, a plain failure, a task that prints the
value of a secret variable, a task whose name and output are a ``<script>`` payload (retried
once), and a timeout. The report must show them all, escaped, with the secret redacted, and load
nothing from anywhere.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from PIL import Image

from gpuswarm.core.fsutil import dumps
from gpuswarm.core.paths import RunPaths
from gpuswarm.outputs.html import html_table, png_data_uri
from gpuswarm.outputs.report import MAX_ROWS, select_rows, write_report
from gpuswarm.outputs.rowtypes import Row
from gpuswarm.outputs.summaryjson import RunSummary
from gpuswarm.outputs.taskrow import TaskRow
from gpuswarm.outputs.timeline import (
    Bar,
    bars_from_descriptor,
    bars_from_queue,
    idle_stats,
    lane_key,
    timeline_png,
)
from gpuswarm.store.leases import host_slug
from gpuswarm.store.names import descriptor_name
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runinfo import RunRecord
from gpuswarm.store.staging import create_layout

PY = sys.executable
SECRET = "hunter2-very-secret-value"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

TASK_PY = """
import json, os, sys, time
mode = sys.argv[1]
if mode == "ok":
    i = int(sys.argv[2])
    time.sleep(0.1)
    print(f"loss={i}.5")
    with open("res.json", "w") as fh:
        json.dump({"ok": i != 2, "score": i}, fh)
elif mode == "secret":
    print("line before")
    print("token is", os.environ["MY_API_TOKEN"])
    sys.exit(3)
elif mode == "xss":
    print("<script>alert(2)</script> & more")
    sys.exit(1)
"""


def _config(folder: Path) -> dict[str, Any]:
    script = str(folder / "task.py")
    return {
        "name": "rep",
        "reliability": {"retry_backoff": None},
        "tasks": [
            {
                "name": "ok{i}",
                "matrix": {"i": [0, 1, 2, 3]},
                "command": [PY, script, "ok", "{i}"],
                "cwd": "{workspace}",
                "metrics": {"loss": r"loss=([0-9.]+)"},
                "done_when": "res.json",
            },
            {"name": "fails", "command": "false"},
            {"name": "leaky", "command": [PY, script, "secret"], "env": {"MY_API_TOKEN": SECRET}},
            {
                "name": "<script>alert(1)</script>",
                "command": [PY, script, "xss"],
                "max_attempts": 2,
            },
            {"name": "slow", "command": "sleep 5", "timeout": 0.5},
        ],
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunPaths, Path]:
    """One real run (3 simulated GPUs) and its report, shared by the tests of this module."""
    folder = tmp_path_factory.mktemp("report")
    (folder / "task.py").write_text(TASK_PY)
    (folder / "rep.yaml").write_text(json.dumps(_config(folder)))  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSWARM_", "CUDA_"))}
    proc = subprocess.run(
        [PY, "-m", "gpuswarm", "run", "--gpus", "sim:3", "-q", "rep.yaml"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # some tasks fail on purpose
    (root,) = sorted(folder.glob("runs/rep/run_*"))
    paths = RunPaths(root)
    summary = json.loads(paths.summary_json.read_text())
    info = RunRecord.from_json(json.loads(paths.run_json.read_text()))
    return paths, write_report(paths, DirQueue(paths), summary, info)


TASKS = ("ok0", "ok1", "ok2", "ok3", "fails", "leaky", "script-alert-1-script", "slow")


def test_report_is_self_contained(run: tuple[RunPaths, Path]) -> None:
    paths, report = run
    assert report == paths.root / "report.html"
    page = report.read_text()
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(\w+:)?//""", page, re.I)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert not re.search(r"<script[^>]*\bsrc=", page)
    uri = re.search(r'<img [^>]*src="(data:image/png;base64,[^"]+)"', page)
    assert uri is not None
    png = base64.b64decode(uri.group(1).split(",", 1)[1])
    assert png == (paths.root / "timeline.png").read_bytes()
    assert not list(paths.root.glob(".tmp-*"))  # atomic writes leave no temp files


def test_report_content(run: tuple[RunPaths, Path]) -> None:
    paths, report = run
    page = report.read_text()
    for task in TASKS:
        assert f"<td>{task}</td>" in page, task
    assert "3/4 of done (75.0%)" in page and "3/8 of all (37.5%)" in page
    assert "exit 3" in page and "exit 1" in page and "timeout after 0.5s" in page
    assert "line before" in page and "token is ***" in page  # the log tail, redacted
    assert SECRET not in page
    assert "&lt;script&gt;alert(2)&lt;/script&gt; &amp; more" in page  # escaped log tail
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # escaped task name
    assert "<script>alert" not in page
    assert "run_" in page and paths.root.name in page and "sim:3" in page
    assert "finished with failures" in page and "GPU busy" in page
    assert "not shown" not in page  # 8 rows: no cap note
    # one row per slot, with the machine it is on (a cluster's node, this host here)
    slots = page.split("<h2>Slots</h2>", 1)[1].split("<h2>", 1)[0]
    host = host_slug()
    for gpu in range(3):
        assert f"<td>{host}-gpu{gpu}</td><td>{host}</td>" in slots, slots


def test_timeline_png_is_valid(run: tuple[RunPaths, Path]) -> None:
    paths, _ = run
    data = (paths.root / "timeline.png").read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    with Image.open(io.BytesIO(data)) as img:
        img.verify()
    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
    assert 1000 <= width <= 2000 and 300 <= height <= 1200, (width, height)


def test_bars_from_queue_one_per_attempt(run: tuple[RunPaths, Path]) -> None:
    paths, _ = run
    bars = bars_from_queue(DirQueue(paths))
    by_task: dict[str, list[str]] = {}
    for bar in bars:
        by_task.setdefault(bar.task, []).append(bar.outcome)
        assert bar.lane in {f"{host_slug()}-gpu{i}" for i in range(3)} and bar.end >= bar.start
    assert by_task == {
        **{f"ok{i}": ["done"] for i in range(4)},
        "fails": ["failed"],
        "leaky": ["failed"],
        "script-alert-1-script": ["retried", "failed"],
        "slow": ["timeout"],
    }
    assert [b.start for b in bars] == sorted(b.start for b in bars)


# -- units ---------------------------------------------------------------------------------------
T0 = 1_700_000_000.0


def _bar(lane: str, start: float, end: float, outcome: str = "done", task: str = "t") -> Bar:
    return Bar(lane, task, T0 + start, T0 + end, outcome)


def test_idle_stats_exact() -> None:
    bars = [_bar("a", 0, 10), _bar("a", 15, 20), _bar("b", 0, 5), _bar("b", 10, 20, "failed")]
    assert idle_stats(bars) == {"busy_fraction": 0.75, "idle_seconds": 10.0, "span_seconds": 20.0}
    # an idle slot is a lane too; overlapping bars on one lane count once
    more = [*bars, _bar("b", 12, 18)]
    assert idle_stats(more, ["c"]) == {
        "busy_fraction": 0.5,
        "idle_seconds": 30.0,
        "span_seconds": 20.0,
    }
    assert idle_stats([]) == {"busy_fraction": 0.0, "idle_seconds": 0.0, "span_seconds": 0.0}


def test_outcomes_of_attempts() -> None:
    def att(n: int, **kw: Any) -> dict[str, Any]:
        return {"n": n, "slot": "gpu1", "started": T0 + n, "ended": T0 + n + 0.5, **kw}

    data = {
        "id": "x",
        "attempts": [
            att(1, kind="exited", returncode=1),
            att(2, kind="cancelled", interrupted=True),
            {"n": 3, "slot": "slot 1", "kind": "lost", "interrupted": True},  # no times: no bar
            att(4, kind="timeout"),
            att(5, kind="exited", returncode=0),
        ],
    }
    outcomes = [b.outcome for b in bars_from_descriptor(data, "done")]
    assert outcomes == ["retried", "interrupted", "timeout", "done"]
    waiting = {"id": "y", "attempts": [att(1, kind="exited", returncode=2)]}
    assert [b.outcome for b in bars_from_descriptor(waiting, "pending")] == ["retried"]
    assert [b.outcome for b in bars_from_descriptor(waiting, "failed")] == ["failed"]


def test_lanes_sort_naturally() -> None:
    lanes = ["gpu10", "gpu2", "gpu0#1", "gpu0", "gpu1+2"]
    assert sorted(lanes, key=lane_key) == ["gpu0", "gpu0#1", "gpu1+2", "gpu2", "gpu10"]


def test_timeline_of_hand_made_bars(tmp_path: Path) -> None:
    bars = [
        _bar("gpu0", 0, 40, "done"),
        _bar("gpu0", 70, 100, "retried"),  # a 30 s idle gap on gpu0
        _bar("gpu1", 0, 30, "timeout"),
        _bar("gpu1", 30, 100, "interrupted"),
        _bar("gpu10", 5, 95, "failed"),
    ]
    out = timeline_png(bars, tmp_path / "t.png", title="hand $made$", lanes=["gpu3"])
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size[0] > img.size[1] > 0
    empty = timeline_png([], tmp_path / "empty.png")
    assert empty.read_bytes().startswith(PNG_SIGNATURE)
    assert png_data_uri(empty).startswith("data:image/png;base64,")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.png", "t.png"]


def test_html_table_escapes_and_sorts() -> None:
    table = html_table(
        ["a<b", "n"], [["<i>x</i>", 1.5], ["y & z", None]], row_classes=["failed", ""]
    )
    assert 'class="sortable"' in table and "<th>a&lt;b</th>" in table
    assert "<td>&lt;i&gt;x&lt;/i&gt;</td><td>1.5</td>" in table
    assert '<tr class="failed">' in table and "<td>y &amp; z</td><td></td>" in table
    assert 'class="sortable"' not in html_table(["a"], [[1]], sortable=False)


def _row(task: str, state: str) -> Row:
    return Row(values=TaskRow(task=task, state=state))


def test_select_rows_caps_failures_first() -> None:
    rows = [_row(f"t{i:05d}", "failed" if i % 21 == 0 else "done") for i in range(2100)]
    shown, hidden = select_rows(rows)
    assert len(shown) == MAX_ROWS and hidden == 100
    failed = sum(1 for r in rows if r.values["state"] == "failed")
    assert all(r.values["state"] == "failed" for r in shown[:failed])
    few, none = select_rows(rows[:10])
    assert none == 0 and [r.values["task"] for r in few][:2] == ["t00000", "t00001"]


def test_report_caps_the_table(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run_x")
    create_layout(paths)
    for i in range(2100):
        state = "failed" if i < 3 else "done"
        start = T0 + i // 3 * 2.0
        desc = {
            "v": 1,
            "id": f"t{i}",
            "seq": i,
            "task": {"id": f"t{i}", "name": f"task {i}"},
            "attempts": [
                {
                    "n": 1,
                    "slot": f"gpu{i % 3}",
                    "gpus": [i % 3],
                    "started": start,
                    "ended": start + 1.5,
                    "duration": 1.5,
                    "kind": "exited",
                    "returncode": 1 if state == "failed" else 0,
                    "reason": "exit 1",
                }
            ],
            "reason": "exit 1" if state == "failed" else None,
            "state": state,
        }
        (paths.state_dir(state) / descriptor_name(0, i, f"t{i}")).write_bytes(dumps(desc))
    summary = cast(
        RunSummary,
        {"name": "big", "total": 2100, "counts": {"done": 2097, "failed": 3}, "fields": {}},
    )
    info = RunRecord.from_json(
        {"name": "big", "gpus": "sim:3", "gpu_ids": [0, 1, 2], "vendor": "sim"}
    )
    page = write_report(paths, DirQueue(paths), summary, info).read_text()
    assert page.count("<tr class=") == MAX_ROWS
    assert "100 more tasks are not shown" in page and "results.tsv" in page
    assert "<td>t0</td>" in page and "(no output)" in page  # failed ones are shown, logs absent
    assert "GPU busy <b>75.0%</b>" in page


def test_importing_does_not_import_matplotlib() -> None:
    code = (
        "import sys, gpuswarm.outputs.timeline, gpuswarm.outputs.report; "
        "print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
