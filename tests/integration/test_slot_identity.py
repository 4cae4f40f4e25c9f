"""Slot identity is unique within a run and names host + GPU, everywhere (issue 11 item 3).

`run` on sim:4 and `work --gpus sim:2` attached to the same run used slot numbers 0..n each, so
the private HOMEs homes/slot-0 and homes/slot-1 were shared by two attempts at once, `status`
showed two "slot 0" rows and the timeline painted both on one lane. Now every slot registers an
id (``<host>-gpu3``, ``<host>-gpu3.1`` for a second slot on that GPU) in ``.parallel/slots/``.
"""

from __future__ import annotations

import itertools
import json
import shlex
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from cli_driver import read_events, run_cli, start_cli, wait_for, wait_for_run
from integration_support import queue_files

from gpuswarm.core.paths import slugify
from gpuswarm.store.leases import host_slug

pytestmark = pytest.mark.slow  # CLI processes: part of CI, not of the fast suite

TASKS = 18


def _config(tmp_path: Path, log: Path) -> Path:
    record = (
        f'echo "$HOME $GPUSWARM_SLOT_ID $(date +%s.%N) start" >> {shlex.quote(str(log))}; '
        "sleep 1.5; "
        f'echo "$HOME $GPUSWARM_SLOT_ID $(date +%s.%N) end" >> {shlex.quote(str(log))}'
    )
    lines = [
        "name: ids",
        "workspace: ws",
        "gpus: sim:4",
        "home: {isolate: true}",
        "tasks:",
    ]
    for i in range(TASKS):
        lines += [f"  - name: t{i:02d}", "    shell: true", f"    command: {json.dumps(record)}"]
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _intervals(log: Path) -> dict[str, list[tuple[float, float, str]]]:
    """HOME -> [(start, end, slot id)] of every attempt, from the tasks' own lines."""
    opened: dict[tuple[str, str], float] = {}
    out: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for line in log.read_text().splitlines():
        home, slot, stamp, what = line.split()
        if what == "start":
            opened[(home, slot)] = float(stamp)
        else:
            out[home].append((opened.pop((home, slot)), float(stamp), slot))
    return out


def _overlaps(spans: list[tuple[float, float, Any]]) -> list[tuple[Any, Any]]:
    spans = sorted(spans)
    return [(a, b) for a, b in itertools.pairwise(spans) if b[0] < a[1]]


def test_run_and_work_on_one_host_get_distinct_slots_homes_rows_and_lanes(
    tmp_path: Path,
) -> None:
    log = tmp_path / "attempts.log"
    config = _config(tmp_path, log)
    run = start_cli("run", "--plain", config, cwd=tmp_path, log_dir=tmp_path / "_logs")
    work = None
    try:
        run_dir = wait_for_run(tmp_path / "ws")
        wait_for(lambda: any(e["ev"] == "started" for e in read_events(run_dir)), 20)
        work = start_cli(
            "work", run_dir, "--gpus", "sim:2", "--plain", cwd=tmp_path, log_dir=tmp_path / "_l2"
        )
        wait_for(
            lambda: sum(e["ev"] == "supervisor_started" for e in read_events(run_dir)) == 2, 20
        )

        def six_rows() -> list[dict[str, Any]] | None:
            rep = run_cli("status", run_dir, "--json", cwd=tmp_path)
            rows: list[dict[str, Any]] = json.loads(rep.stdout)["running"]
            return rows if len(rows) == 6 else None

        rows = wait_for(six_rows, 30, 0.1, what="six running rows in status")
        slots = [r["slot"] for r in rows]
        assert len(set(slots)) == 6, rows  # was: two "slot 0" and two "slot 1" rows
        assert len({r["owner"] for r in rows}) == 2, rows
        assert all(r["host"] == host_slug() for r in rows), rows
        assert run.wait(90).returncode == 0, run.stderr()
        assert work.wait(90).returncode == 0, work.stderr()
    finally:
        run.kill_group()
        if work is not None:
            work.kill_group()

    host = host_slug()
    ids = sorted((run_dir / ".parallel" / "slots").iterdir())
    assert [p.name for p in ids] == sorted(
        [f"{host}-gpu{i}" for i in range(4)] + [f"{host}-gpu0.1", f"{host}-gpu1.1"]
    )
    # homes: one per slot id, never two attempts at the same time in one HOME
    by_home = _intervals(log)
    assert sorted(Path(h).name for h in by_home) == [p.name for p in ids]
    for home, spans in by_home.items():
        assert Path(home).parent == run_dir / "homes"
        assert not _overlaps(spans), (home, _overlaps(spans))
        assert {s[2] for s in spans} == {Path(home).name}  # HOME and GPUSWARM_SLOT_ID agree
    # events and the timeline's lanes (each attempt's slot): six lanes, no overlap in one lane
    started = {e["slot"] for e in read_events(run_dir) if e["ev"] == "started"}
    assert started == {p.name for p in ids}
    lanes: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for task, places in queue_files(run_dir).items():
        ((state, path),) = places
        assert state == "done", (task, state)
        for att in json.loads(path.read_text())["attempts"]:
            lanes[att["slot"]].append((att["started"], att["ended"], task))
    assert set(lanes) == {p.name for p in ids}
    for lane, spans in lanes.items():
        assert not _overlaps(spans), (lane, _overlaps(spans))
    results = (run_dir / "results.tsv").read_text()
    assert sum(1 for _ in results.splitlines()) == TASKS + 1
    assert slugify(host, 60) == host
