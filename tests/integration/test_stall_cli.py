"""Stalls, distinct from timeouts, through the real CLI (issue 34): ``stall_after:``.

Real processes: one that prints a question and waits (an agent at a prompt), one that computes
silently on the CPU, one that sleeps while its GPU (the fake NVML machine of tests/fakes/nvml,
``--gpus auto``) shows utilisation, or shows none, or its memory changes."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_driver import read_events, run_cli
from fakenvml import GPU_TASK, FakeMachine, gpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]
PY = sys.executable


def _rows(run: Path) -> dict[str, dict[str, str]]:
    with (run / "results.tsv").open() as f:
        return {r["task"]: r for r in csv.DictReader(f, delimiter="\t")}


def _attempts(run: Path, state: str) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for path in (run / ".parallel" / state).glob("*.json"):
        desc = json.loads(path.read_text())
        out[desc["id"]] = desc["attempts"]
    return out


def _run_dir(tmp_path: Path) -> Path:
    (run,) = (tmp_path / "ws/stall").glob("run_*")
    return run


def test_a_waiting_task_is_stalled_and_retried_a_busy_one_never(tmp_path: Path) -> None:
    (tmp_path / "busy.py").write_text(
        "import time\nt = time.time()\nwhile time.time() - t < 4:\n    pass\nprint('done')\n"
    )
    cfg = tmp_path / "stall.yaml"
    cfg.write_text(
        "name: stall\nworkspace: ws\n"
        "reliability: {breaker: {failures: 2, window: 60}}\n"
        "tasks:\n"
        "  - name: asks\n"
        '    command: "echo working; echo Use key $API_TOKEN, proceed? [y/N]; sleep 60"\n'
        "    env: {API_TOKEN: sk-stall-0123456789abcdef}\n"
        "    shell: true\n"
        "    stall_after: 2s\n"
        "    timeout: 50s\n"
        "    max_attempts: 2\n"
        "  - name: computes\n"  # silent for 4 s, one core busy: never stalled
        f"    command: [{PY}, busy.py]\n"
        "    stall_after: 1s\n"
        "  - {name: quick, command: 'true', matrix: {i: [1, 2, 3, 4]}}\n"
    )
    res = run_cli("run", cfg, "--gpus", "sim:2", "--plain", cwd=tmp_path, timeout=80)
    assert res.returncode == 1, res
    run = _run_dir(tmp_path)
    rows = _rows(run)
    assert rows["computes"]["state"] == "done", rows["computes"]
    asks = rows["asks"]
    assert asks["state"] == "failed" and asks["attempts"] == "2", asks
    assert "stalled: no output, under 1% of a core and no GPU activity for 2s" in asks["reason"]
    assert "its last output: 'Use key " in asks["reason"] and "proceed? [y/N]'" in asks["reason"]
    assert "sk-stall" not in asks["reason"]  # the task's secret, redacted
    (attempts,) = _attempts(run, "failed").values()
    assert [a["kind"] for a in attempts] == ["stalled", "stalled"]  # its own end kind
    assert all(a["duration"] < 20 for a in attempts), attempts  # not its 50 s timeout
    events = read_events(run)
    assert [e.get("task") for e in events if e["ev"] == "stalled"] == ["asks", "asks"]
    assert "sk-stall-0123456789abcdef" not in (run / "events.jsonl").read_text()
    assert not [e for e in events if e["ev"] == "quarantined"]  # never the breaker's
    summary = json.loads((run / "summary.json").read_text())
    assert summary["failure_reasons"][0][0].startswith("stalled: ")


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[FakeMachine]:
    m = FakeMachine(tmp_path / "nvml", [gpu(0, util=0), gpu(1, util=70)])
    yield m
    m.close()


def _gpu_config(tmp_path: Path, task: str) -> Path:
    cfg = tmp_path / "stall.yaml"
    cfg.write_text(
        "name: stall\nworkspace: ws\ngpus: auto\n"
        "tasks:\n"
        '  - name: "on{i}"\n'
        "    matrix: {i: [0, 1]}\n"
        f"    command: {PY} {GPU_TASK} {task}\n"
        "    stall_after: 1.5s\n"
    )
    return cfg


def test_a_silent_task_on_a_busy_gpu_is_never_stalled(tmp_path: Path, machine: FakeMachine) -> None:
    # each task holds 1000 MiB and sleeps, silent: gpu1 shows 70 % utilisation while it is
    # held (a training step), gpu0 none: only the task on gpu0 stalls
    cfg = _gpu_config(tmp_path, "--mb 1000 --hold 5")
    res = run_cli("run", cfg, "--plain", cwd=tmp_path, timeout=60, env=machine.env())
    run = _run_dir(tmp_path)
    rows = _rows(run)
    attempts = {**_attempts(run, "done"), **_attempts(run, "failed")}
    by_gpu = {a[0]["gpus"][0]: (rows[t]["state"], a[0]["kind"]) for t, a in attempts.items()}
    assert by_gpu == {0: ("failed", "stalled"), 1: ("done", "exited")}, (by_gpu, res)


def test_gpu_memory_that_changes_is_activity(tmp_path: Path, machine: FakeMachine) -> None:
    # no utilisation on gpu0, but what its task holds grows every second: never stalled
    machine.gpus[1]["util"] = 0
    machine.save()
    cfg = _gpu_config(tmp_path, "--mb 1000 --hold 5 --grow")
    res = run_cli("run", cfg, "--plain", cwd=tmp_path, timeout=60, env=machine.env())
    assert res.returncode == 0, res
    assert {r["state"] for r in _rows(_run_dir(tmp_path)).values()} == {"done"}
