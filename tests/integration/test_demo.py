"""`gpuswarm demo` end to end, with a reduced budget: the README's first command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from integration_support import run_processes

pytestmark = pytest.mark.slow
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
def test_demo_runs_a_research_loop_and_writes_its_reports(gpuswarm: Any, tmp_path: Path) -> None:
    res = gpuswarm(
        "demo",
        "--dir",
        tmp_path / "d",
        "--experiments",
        "6",
        "--budget",
        "0.5",
        "--seed",
        "3",
        "--json",
        timeout=110,
    )
    assert res.returncode == 0, str(res)
    data = json.loads(res.stdout)
    repo = Path(data["repo"])
    assert repo.parent == tmp_path / "d"  # outside the user's tree, where it was asked
    rows = [r.split("\t") for r in Path(data["results"]).read_text().splitlines()]
    assert rows[0] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    # the first baseline runs twice by default (noise-aware: the spread of identical code)
    assert [r[3] for r in rows[1:3]] == ["keep", "keep"]
    assert all("baseline (repeat" in r[4] for r in rows[1:3]), rows[1:3]
    assert len(rows) - 1 >= 8  # the baselines and at least the 6 experiments asked for
    assert {r[3] for r in rows[1:]} <= {"keep", "discard", "crash"}
    assert data["baseline"] is not None and data["best"] <= data["baseline"]
    assert Path(data["plot"]).read_bytes()[:8] == PNG
    html = Path(data["report"]).read_text()
    assert "data:image/png;base64," in html and "https://" not in html
    for row in rows[1:]:
        assert row[0] in html  # every experiment's commit is in the report
    assert not run_processes(tmp_path, under=True, var="GPUSWARM_EXPERIMENT")  # runner stopped
    assert not run_processes(tmp_path, under=True)


@pytest.mark.timeout(120)
def test_demo_plain_output_is_one_line_per_decision(gpuswarm: Any, tmp_path: Path) -> None:
    res = gpuswarm(
        "demo",
        "--dir",
        tmp_path / "d",
        "--experiments",
        "3",
        "--budget",
        "0.3",
        "--seed",
        "1",
        timeout=110,
    )  # not a terminal: plain lines, no live table
    assert res.returncode == 0, str(res)
    assert "\x1b[" not in res.output  # no cursor movement or colours in a pipe
    assert "demo repository:" in res.stderr
    decisions = [
        line for line in res.output.splitlines() if " keep " in line or " discard " in line
    ]
    assert decisions, res.output
    assert "best val_bpb" in res.stdout and "report:" in res.stdout
