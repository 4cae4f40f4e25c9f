"""results.tsv rows of a big stopped run (issue 31): the row of a task never attempted and the
sort of 100k rows are built the cheap way, with the same cells and the same order."""

from __future__ import annotations

import random

from gpuswarm.core.models import Descriptor, State
from gpuswarm.outputs.results import _order, row_for, sort_rows, to_tsv
from gpuswarm.outputs.rowtypes import Row
from gpuswarm.outputs.taskrow import FIXED_COLUMNS, TaskRow


def _task(i: int, **extra: object) -> dict[str, object]:
    return {"id": f"t{i}", "name": f"job {i}", "command": "true", **extra}


def test_a_never_attempted_row_has_every_column_in_order_and_empty_attempt_cells() -> None:
    desc = Descriptor.new(_task(7, vars={"lr": 0.1}), 3)
    desc.reason = "waiting"
    row = row_for(State.PENDING, desc)
    assert list(row.values.to_json()) == list(FIXED_COLUMNS)
    fixed = {"task": "t7", "name": "job 7", "state": "pending", "attempts": 0, "reason": "waiting"}
    assert row.values.to_json() == {**dict.fromkeys(FIXED_COLUMNS, ""), **fixed}
    assert (row.seq, row.busy, row.last, row.inputs) == (3, 0, None, {"lr": "0.1"})
    assert row.metrics == {} and row.result == {} and row.spend is None and row.repeat is None


def test_a_never_attempted_row_is_the_row_of_an_attempt_less_dict() -> None:
    """A JSON dict (callers not yet typed) without an ``attempts`` key: the same row."""
    raw = Descriptor.new(_task(1), 0).raw
    del raw["attempts"]
    assert to_tsv([row_for(State.PENDING, raw)]) == to_tsv(
        [row_for(State.PENDING, Descriptor.new(_task(1), 0))]
    )


def test_an_attempted_row_still_takes_its_last_attempts_cells() -> None:
    desc = Descriptor.new(_task(2), 0)
    desc.raw["attempts"] = [{"n": 1, "returncode": 3, "duration": 1.5, "gpus": [0]}]
    row = row_for(State.FAILED, desc)
    assert (row.values["attempts"], row.values["exit"], row.values["gpus"]) == (1, "3", "0")
    assert row.busy == 1.5


def test_sort_rows_is_the_order_of_seq_then_natural_ids() -> None:
    rng = random.Random(31)
    rows = []
    for i in range(400):
        row = Row()
        row.values = TaskRow(task=f"t{rng.randrange(50)}x{rng.randrange(300)}")
        row.seq = rng.choice([float(i), float(rng.randrange(5)), float("inf")])
        rows.append(row)
    expected = sorted(rows, key=_order)
    sort_rows(rows)
    assert [(r.seq, r.values.task) for r in rows] == [(r.seq, r.values.task) for r in expected]
