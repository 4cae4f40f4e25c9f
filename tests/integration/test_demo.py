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


@pytest.mark.timeout(150)
def test_every_view_gives_the_same_baseline_best_and_kept(gpuswarm: Any, tmp_path: Path) -> None:
    """Issue 29, item 4: stdout, `research status`, report.html, progress.png's title and the
    dashboard take baseline, best, experiments and kept from one definition
    (research/figures.py); a re-based winner is printed as re-based, never as a discard."""
    import re

    from gpuswarm.core.words import counted
    from gpuswarm.dashboard.experiments import ExperimentHub
    from gpuswarm.research.journal import replay
    from gpuswarm.research.plot import summary_line
    from gpuswarm.research.readouts import plot_rows
    from gpuswarm.research.session import Experiment
    from gpuswarm.research.views import live_header

    res = gpuswarm(
        "demo", "--dir", tmp_path / "d", "--experiments", "8", "--budget", "0.4", "--seed", "3",
        timeout=140,
    )  # fmt: skip
    assert res.returncode == 0, str(res)
    line = re.search(
        r"best val_bpb (\d+\.\d{6}) \(baseline (\d+\.\d{6}), [-\d.]+% lower\) after (\d+) "
        r"experiments, (\d+) changes? kept",
        res.stdout,
    )
    assert line is not None, res.stdout
    best, baseline, experiments, kept = line.groups()
    repo = Path(re.search(r"repository: (\S+)", res.stdout).group(1))  # type: ignore[union-attr]

    status = json.loads(
        gpuswarm("research", "status", "-C", repo, "--tag", "demo", "--json").stdout
    )
    assert f"{status['best']:.6f}" == best and f"{status['baseline']:.6f}" == baseline
    assert (status["experiments"], status["kept"]) == (int(experiments), int(kept))
    assert status["modes"] == "async"  # the loop's, though the setting went back to rounds
    # the baseline is the mean of the two first baseline runs, not the first of them
    rows = [r.split("\t") for r in Path(status["results"]).read_text().splitlines()[1:]]
    first_two = [float(r[1]) for r in rows[:2]]
    assert abs(sum(first_two) / 2 - float(baseline)) < 1e-6

    html = (Path(status["results"]).parent / "report.html").read_text()
    assert f"best val_bpb <b>{best}</b> (baseline {baseline}" in html
    counts = f"{counted(int(experiments), 'experiment')}, {counted(int(kept), 'change')} kept"
    assert counts in html and "mode async" in html

    exp = Experiment.open(repo, "demo")
    state = replay(exp.paths)
    title = summary_line(plot_rows(state), "val_bpb", "min", state.best)
    assert title.startswith(f"{experiments} experiments, {kept} kept, best val_bpb {best}")

    live = live_header(exp.cfg, state, "async")  # the loop's live view
    assert f"best val_bpb {best}  {counts}" in live, live

    head = ExperimentHub("e1", exp.paths.root, "r1").header(None)
    assert f"{head['best']:.6f}" == best and f"{head['baseline']:.6f}" == baseline
    assert (head["experiments"], head["kept"]) == (int(experiments), int(kept))

    for out in res.output.splitlines():  # a re-based winner reads as such
        if "(re-based, see v" in out:
            assert " re-based " in out and " discard " not in out, out
