"""The dashboard on a finished run (issue 33.1): its page shows what report.html shows, from the
run's own records (every descriptor's attempts, summary.json), not what a journal's tail says:
the failures with their reasons, each slot's attempts and busy share over the run's first start
to its last end, the quarantined slot; and only the actions that apply to an ended run.

One run is made per module with the real CLI on simulated GPUs (a few seconds): two tasks that
fail with their own exit codes, eight that fail on GPU 1 only (so that the breaker quarantines
that slot, cooldown long enough to keep it out), and one argv task whose words need quotes.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_driver import run_cli, wait_for
from dashkit import Served, browser_context, require_browser, screenshot, serve_here, sse_messages

from gpuswarm.core.paths import RunPaths
from gpuswarm.dashboard import finished as finished_view
from gpuswarm.store.reader import RunReader

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

# one run for the module (a few seconds of the real CLI), so its tests share one worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dashboard-finished")]

WAIT_MS = 15_000
GPU1_BROKEN = 'if [ "$GPUSWARM_HOST_GPU_ID" = 1 ]; then echo "CUDA error"; exit 1; fi; sleep 0.2'
ARGV = [sys.executable, "-c", "print('a b')", "it's"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> RunPaths:
    """A finished run with two failures (exit 3, exit 4) and the slot of GPU 1 quarantined."""
    base = tmp_path_factory.mktemp("finished")
    tasks: list[dict[str, Any]] = [
        {"name": "bad3", "command": "echo boom; exit 3", "shell": True, "max_attempts": 1},
        {"name": "bad4", "command": "echo boom; exit 4", "shell": True, "max_attempts": 1},
        {"name": "argv", "command": ARGV, "shell": False},
        # ends dependency_failed: apart from the failures, as summary.json counts it
        {"name": "after3", "command": "true", "shell": True, "after": ["bad3"]},
    ]
    tasks += [{"name": f"t{i}", "command": GPU1_BROKEN, "shell": True} for i in range(8)]
    config = {
        "name": "fin",
        "gpus": "sim:2",
        "reliability": {
            "retry_backoff": "0.1s",
            "breaker": {"failures": 2, "window": "60s", "cooldown": "300s"},
        },
        "defaults": {"max_attempts": 3},
        "tasks": tasks,
    }
    (base / "c.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    res = run_cli("run", base / "c.yaml", "--plain", cwd=base, timeout=120)
    assert res.returncode == 1, res  # finished with failures
    (run,) = sorted(p for p in (base / "runs").glob("*/run_*") if (p / "summary.json").is_file())
    summary = summary_of(RunPaths(run))
    assert summary["counts"]["failed"] == 2 and summary["quarantined"], summary
    assert summary["counts"]["dependency_failed"] == 1 and summary["not_done"] == 2, summary
    return RunPaths(run)


def summary_of(run: RunPaths) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(run.summary_json.read_text())
    return data


def records(run: RunPaths) -> tuple[dict[str, int], dict[str, float], tuple[float, float]]:
    """Per slot, from the descriptors (as report.html counts them): attempts, busy seconds
    (overlaps once); and the run's window, first start to last end."""
    attempts: dict[str, int] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    for _, _, desc in RunReader(run).everything():
        for a in desc.attempts:
            if a.slot:
                attempts[a.slot] = attempts.get(a.slot, 0) + 1
                if a.started is not None and a.ended is not None:
                    spans.setdefault(a.slot, []).append((a.started, a.ended))
    every = [s for lane in spans.values() for s in lane]
    window = (min(s for s, _ in every), max(e for _, e in every))
    busy = {}
    for slot, lane in spans.items():
        total, at = 0.0, window[0]
        for s, e in sorted(lane):
            total += max(0.0, e - max(s, at))
            at = max(at, e)
        busy[slot] = total
    return attempts, busy, window


@pytest.fixture(scope="module")
def served(finished: RunPaths) -> Iterator[Served]:
    with serve_here([finished.root.parent.parent]) as s:
        yield s


def run_id(served: Served) -> str:
    found = wait_for(lambda: (r := served.get("/api/runs")["runs"]) and r[0]["id"], 20, 0.1)
    return str(found)


def test_the_snapshot_of_a_finished_run_is_its_summary_and_its_records(
    finished: RunPaths, served: Served
) -> None:
    snap = served.get(f"/api/runs/{run_id(served)}")
    view, summary = snap["view"], summary_of(finished)
    assert not view["live"] and view["state"] == "finished with failures", view["state"]
    final = view["final"]
    assert [(f["task"], f["reason"]) for f in final["failures"]] == [
        (f["task"], f["reason"]) for f in summary["failures"]
    ]
    assert {f["reason"] for f in final["failures"]} == {"exit 3", "exit 4"}
    assert final["not_done"] == summary["not_done"] == 2
    out = {q["slot"] for q in summary["quarantined"] if not q.get("lifted")}
    assert {q["slot"] for q in final["quarantined"]} == out
    shown = {s["label"]: s for s in view["slots"]}
    assert {label for label, s in shown.items() if s["quarantined"] == "quarantined"} == out
    attempts, busy, window = records(finished)
    assert final["window"] == pytest.approx(list(window), abs=1e-3)
    span = window[1] - window[0]
    for slot, n in attempts.items():
        assert shown[slot]["done"] == n and final["slots"][slot]["attempts"] == n, slot
        assert final["slots"][slot]["busy_share"] == pytest.approx(busy[slot] / span, abs=2e-3)
        # the Gantt gets every attempt that ran there, not the journal tail's
        assert len(snap["lanes"][slot]) == n, slot
    total = sum(busy.values()) / (span * len(shown))
    assert final["busy_share"] == pytest.approx(total, abs=2e-3)


def test_a_large_finished_run_paints_first_and_its_view_follows(
    finished: RunPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading every descriptor of a 100,000-task run takes seconds: the page's first snapshot
    comes without it (the journal's lanes), and the run's view follows as an update."""
    monkeypatch.setattr(finished_view, "SYNC_TASKS", 0)  # this run counts as a large one
    with serve_here([finished.root]) as s:
        rid = run_id(s)
        with s.client(timeout=20).stream("GET", f"/api/runs/{rid}/events") as r:
            got = sse_messages(r, 1)
            while got[-1]["data"]["view"]["final"] is None:
                got += sse_messages(r, 1)
    assert got[0]["event"] == "snapshot" and got[0]["data"]["view"]["final"] is None
    final = got[-1]["data"]["view"]["final"]
    assert got[-1]["event"] == "update" and final["not_done"] == 2, got[-1]
    attempts, _, _ = records(finished)
    assert {k: v["attempts"] for k, v in final["slots"].items()} == attempts
    assert {k: len(v) for k, v in got[-1]["data"]["lanes"].items()} == attempts


def test_a_run_that_ended_without_a_summary_lists_its_failures_from_its_records(
    finished: RunPaths, tmp_path: Path
) -> None:
    """A crashed supervisor writes no summary.json: the failures come from the descriptors,
    as the summary would have listed them (a dependency_failed task is none, issue 35)."""
    copy = tmp_path / "runs" / "fin" / finished.root.name
    shutil.copytree(finished.root, copy)
    (copy / "summary.json").unlink()
    expected = summary_of(finished)
    with serve_here([copy]) as s:
        final = s.get(f"/api/runs/{run_id(s)}")["view"]["final"]
    assert sorted((f["task"], f["state"], f["reason"]) for f in final["failures"]) == sorted(
        (f["task"], f["state"], f["reason"]) for f in expected["failures"]
    )
    assert final["not_done"] == expected["not_done"] and not final["summary"]
    assert {q["slot"] for q in final["quarantined"]} <= {q["slot"] for q in expected["quarantined"]}


def test_the_task_page_gives_the_command_as_a_shell_takes_it(served: Served) -> None:
    rid = run_id(served)
    rows = served.get(f"/api/runs/{rid}/tasks?q=argv")["rows"]
    assert len(rows) == 1, rows
    task = served.get(f"/api/runs/{rid}/tasks/{rows[0]['id']}")
    assert shlex.split(task["command_line"]) == ARGV, task["command_line"]


@pytest.mark.browser
def test_the_page_of_a_finished_run_shows_what_its_summary_says(
    finished: RunPaths, served: Served, tmp_path: Path
) -> None:
    require_browser()
    summary = summary_of(finished)
    attempts, busy, window = records(finished)
    rid = run_id(served)
    with browser_context(tmp_path / "profile") as ctx:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(served.url)
        page.click(f"[data-run='{rid}'] a")
        page.wait_for_selector("[data-testid=failures] li", timeout=WAIT_MS)
        screenshot(page, "finished-run", tmp_path / "shots")
        shown = {
            li.get_attribute("data-task"): li.locator(".reason").inner_text()
            for li in page.locator("[data-testid=failures] li[data-task]").all()
        }
        assert shown == {f["task"]: f["reason"] for f in summary["failures"]}
        for slot, n in attempts.items():
            lane = page.locator(f".lane[data-slot='{slot}']")
            assert lane.locator("[data-testid=slot-attempts]").get_attribute("data-attempts") == (
                str(n)
            )
            note = lane.locator("[data-testid=idle-note]")
            share = busy[slot] / (window[1] - window[0])  # of first start -> last end
            shown_share = float(note.get_attribute("data-busy") or -1)
            assert shown_share == pytest.approx(share, abs=2e-3), (slot, shown_share, share)
            assert f"busy {round(100 * shown_share)}% of the run" in note.inner_text()
            assert int(lane.locator("svg.gantt").get_attribute("data-bars") or 0) == n
        out = {q["slot"] for q in summary["quarantined"] if not q.get("lifted")}
        badges = page.locator(".lane:has([data-testid=quarantined])")
        assert {b.get_attribute("data-slot") for b in badges.all()} == out
        assert page.locator(f"[data-testid=quarantines] li[data-slot='{next(iter(out))}']").count()
        # only the actions an ended run has: retry, and the add-then-resume hint
        assert page.locator("[data-action=retry-failed]").count() == 1
        for gone in ("pause", "unpause", "add", "pause-slot", "unpause-slot"):
            assert page.locator(f"[data-action={gone}]").count() == 0, gone
        hint = page.locator("[data-testid=ended-hint]").inner_text()
        assert f"gpuswarm add {finished.root} LIST" in hint
        assert f"gpuswarm resume {finished.root}" in hint
        # the header's counts and the table's tabs are one snapshot
        page.wait_for_selector("[data-filter=failed]", timeout=WAIT_MS)
        for state, n in summary["counts"].items():
            head = page.locator(f"#run-head [data-count='{state}'] b")
            if head.count():
                assert head.inner_text() == str(n), state
                tab = page.locator(f"[data-filter={state}]").get_attribute("data-n")
                assert tab == str(n), state
        # a task's page: the command copy-pasteable, dates in ISO 8601
        page.click("[data-testid=task-table] tr:has-text('argv') a")
        page.wait_for_selector("[data-testid=attempts-table] td", timeout=WAIT_MS)
        screenshot(page, "finished-task", tmp_path / "shots")
        command = page.locator("#task-head dd.mono").first.inner_text()
        assert shlex.split(command) == ARGV, command
        started = page.locator("[data-testid=attempts-table] tbody td").nth(3).inner_text()
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d", started), started
        page.close()
        assert not errors, errors
