"""Every field of an attempt's record reaches every reader without code of its own (issue 32,
step 6): the test sets each field of ``AttemptRecord`` (iterating the model, so a new field is
covered as soon as it is declared) and finds it in the results row (results.tsv and summary.json
are built from it), in the api's answer and in the dashboard's JSON for the task."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from dashkit import serve_here

from gpuswarm.app import api
from gpuswarm.core.models import AttemptRecord
from gpuswarm.core.models.attempt import ROW_FIELDS
from gpuswarm.outputs.aggregate import write_outputs
from gpuswarm.outputs.results import collect, to_tsv
from gpuswarm.outputs.taskrow import TaskRow
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runinfo import RunRecord

# values a run can really hold (the rest are made up per type below); interrupted stays False
# so the attempt is the one the task is judged by
CHOSEN: dict[str, Any] = {
    "n": 1,
    "gpus": [0, 1],
    "kind": "exit",
    "interrupted": False,
    "metrics": {"loss": 0.5},
    "energy_mode": "shared",
}


def _made_up(i: int, f: dataclasses.Field[Any]) -> Any:
    kind = str(f.type)
    if kind.startswith("bool"):
        return True
    if kind.startswith("int"):
        return 100 + i
    if kind.startswith("float"):
        return 1000.25 + i
    if kind.startswith("str"):
        return f"value-of-{f.name}"
    raise AssertionError(f"AttemptRecord.{f.name}: no test value for a {kind}; add one here")


def every_field() -> dict[str, Any]:
    out = {}
    for i, f in enumerate(dataclasses.fields(AttemptRecord)):
        if f.name != "extra":
            out[f.name] = CHOSEN[f.name] if f.name in CHOSEN else _made_up(i, f)
    return out


def _run(tmp_path: Path, attempt: dict[str, Any]) -> tuple[api.RunPaths, api.TaskRef]:
    spec = api.NewRunSpec(
        workspace=tmp_path,
        folder="queue",
        name="fields",
        base_dir=tmp_path,
        gpus=api.plan_gpus("sim:2"),
        source="test",
    )
    run = api.create_run(spec)
    api.submit(run, api.TaskSpec(id="t1", name="t1", command=["true"]), 1)
    queue = DirQueue(run)
    claimed = queue.claim("owner", 0)
    assert claimed is not None
    claimed.data["attempts"] = [attempt]
    queue.move(claimed, api.TaskState.DONE)
    return run, api.task_states(run)["t1"]


def test_the_test_sets_every_field_to_a_value_other_than_its_default() -> None:
    values = every_field()
    for f in dataclasses.fields(AttemptRecord):
        if f.name in values and f.name != "interrupted":
            assert values[f.name] != f.default, f.name


@pytest.mark.timeout(120)
def test_every_attempt_field_reaches_the_row_the_api_and_the_dashboard(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    want = every_field()
    run, ref = _run(tmp_path, want)

    # the results row (what results.tsv and summary.json are built from)
    (row,) = collect(DirQueue(run))
    assert row.last is not None
    assert row.last.field_values() == want
    header, cells = (line.split("\t") for line in to_tsv([row]).splitlines())
    for name in ROW_FIELDS:
        assert row.values[name] == want[name]
        assert cells[header.index(name)] == str(want[name])
    assert TaskRow.from_json(row.values.to_json()) == row.values  # the row model reads back
    write_outputs(run, DirQueue(run), RunRecord.from_json({"run_dir": str(run.root)}), None)
    summary = json.loads(run.summary_json.read_text())
    assert summary["gpu_memory"]["measured"] == 1
    assert summary["gpu_memory"]["peak_vram_mb"]["max"] == want["peak_vram_mb"]
    assert summary["energy"]["measured"] == 1
    assert summary["energy"]["shared_j"] == round(want["energy_j"], 3)
    header, cells = (line.split("\t") for line in run.results_tsv.read_text().splitlines())
    for name in ROW_FIELDS:  # results.tsv as written, by column name
        assert cells[header.index(name)] == str(want[name])

    # the api
    last = api.last_attempt(run, ref)
    assert last is not None
    for name, value in want.items():
        got = getattr(last, name)
        assert (list(got) if name == "gpus" else got) == value, name

    # the dashboard's task view
    with serve_here([tmp_path]) as served:
        (listed,) = served.get("/api/runs")["runs"]
        detail = served.get(f"/api/runs/{listed['id']}/tasks/t1")
    (shown,) = detail["attempts"]
    assert {k: shown[k] for k in want} == want
