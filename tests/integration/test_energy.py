"""Issue 37, part 3: energy per attempt through the real CLI, on a fake NVML machine
(tests/fakes/nvml/pynvml.py: its energy counter is a file the tasks advance,
``fake_gpu_task.py --energy-j J``)."""

from __future__ import annotations

import csv
import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_driver import find_runs, run_cli
from fakenvml import GPU_TASK, FakeMachine, gpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
TASK = f"{shlex.quote(sys.executable)} {shlex.quote(str(GPU_TASK))}"


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[list[FakeMachine]]:
    made: list[FakeMachine] = []
    yield made
    for m in made:
        m.close()


def _run(tmp_path: Path, m: FakeMachine, body: str) -> Path:
    cfg = tmp_path / "e.yaml"
    cfg.write_text("name: energy\nworkspace: ws\ngpus: auto\n" + body)
    res = run_cli("run", cfg, "--plain", cwd=tmp_path, env=m.env(), timeout=90)
    assert res.returncode == 0, res
    (run,) = find_runs(tmp_path / "ws")
    return run


def _attempts(run: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in (run / ".parallel" / "done").glob("*.json"):
        desc = json.loads(path.read_text())
        out[desc["id"]] = desc["attempts"][-1]
    return out


def _rows(run: Path) -> dict[str, dict[str, str]]:
    with (run / "results.tsv").open() as f:
        return {r["task"]: r for r in csv.DictReader(f, delimiter="\t")}


def test_a_counter_advancing_1000_j_during_a_task_reports_1000_j(
    tmp_path: Path, machine: list[FakeMachine]
) -> None:
    m = FakeMachine(tmp_path / "nvml", [gpu(0)])
    machine.append(m)
    run = _run(
        tmp_path,
        m,
        f"tasks:\n  - name: burn\n    command: {TASK} --mb 1000 --hold 1.2 --energy-j 1000\n",
    )
    a = _attempts(run)["burn"]
    assert abs(a["energy_j"] - 1000) <= 1 and a["energy_mode"] == "exclusive", a
    row = _rows(run)["burn"]
    assert abs(float(row["energy_j"]) - 1000) <= 1 and row["energy_mode"] == "exclusive", row
    summary = json.loads((run / "summary.json").read_text())
    assert abs(summary["energy"]["total_j"] - 1000) <= 1, summary["energy"]
    assert summary["energy"]["measured"] == 1 and "rule" in summary["energy"]
    assert (
        "1000" in (run / "report.html").read_text() or "1,000" in (run / "report.html").read_text()
    )


def test_two_tasks_sharing_a_gpu_split_by_the_memory_they_hold(
    tmp_path: Path, machine: list[FakeMachine]
) -> None:
    """Each task advances the counter by 400 J half-way through while both run: each
    interval's energy is split 1:3, as the 1000 MiB and 3000 MiB they hold."""
    m = FakeMachine(tmp_path / "nvml", [gpu(0)])
    machine.append(m)
    run = _run(
        tmp_path,
        m,
        "tasks_per_gpu: 2\ntasks:\n"
        f"  - name: small\n    command: {TASK} --mb 1000 --hold 2.4 --energy-j 400\n"
        f"  - name: big\n    command: {TASK} --mb 3000 --hold 2.4 --energy-j 400\n",
    )
    got = _attempts(run)
    small, big = got["small"], got["big"]
    assert small["energy_mode"] == big["energy_mode"] == "shared", got
    assert abs(small["energy_j"] + big["energy_j"] - 800) <= 1, got
    assert abs(small["energy_j"] - 200) <= 5 and abs(big["energy_j"] - 600) <= 5, got


def test_without_the_counter_the_power_draw_is_integrated(
    tmp_path: Path, machine: list[FakeMachine]
) -> None:
    m = FakeMachine(tmp_path / "nvml", [gpu(0, energy="none", power_mw=200_000)])
    machine.append(m)
    run = _run(tmp_path, m, f"tasks:\n  - name: p\n    command: {TASK} --mb 1000 --hold 1.5\n")
    a = _attempts(run)["p"]
    assert a["energy_mode"] == "exclusive", a
    assert 100 <= a["energy_j"] <= 320, a  # ~200 W over the looks of a 1.5 s hold
