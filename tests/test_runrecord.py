"""run.json's read model (store/runinfo.py ``RunRecord``): what the builder writes, and what
older files lack, read back to the same values and written back byte for byte."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.core.errors import RunDirError
from gpuswarm.core.fsutil import atomic_write_json, dumps
from gpuswarm.store.runinfo import RunInfo, RunRecord, read_record


def _written(tmp_path: Path) -> dict[str, Any]:
    """run.json as the code writes it (the builder, then create_run's two keys)."""
    info = RunInfo(
        name="sweep",
        workspace=tmp_path / "runs",
        source="sweep.yaml",
        base_dir=tmp_path,
        gpus="0,1",
        vendor="nvidia",
        gpu_ids=[0, 1],
        slot_count=4,
        settings={"lease_ttl": 12.5, "halt": None, "budget_usd": 3.0},
        config={"backend": "docker", "docker": {"image": "x"}, "groups": {"a": {}}},
        fingerprint="abc",
        gpus_per_task=1,
        tasks_per_gpu=2,
        isolate=True,
        provision=[{"src": "~/.netrc", "dest": ".netrc"}],
        task_count=7,
    ).to_json()
    return {**info, "run_dir": "run_2026-01-01_00-00-00", "created": "2026-01-01T00:00:00"}


def test_a_written_run_json_reads_back_and_round_trips(tmp_path: Path) -> None:
    raw = _written(tmp_path)
    path = tmp_path / "run.json"
    atomic_write_json(path, raw)
    record = read_record(path)
    assert record.name == "sweep"
    assert record.workspace == str(tmp_path / "runs")
    assert record.base_dir == str(tmp_path)
    assert record.gpu_ids == (0, 1)
    assert (record.gpus_per_task, record.tasks_per_gpu, record.slot_count) == (1, 2, 4)
    assert record.home == {"isolate": True, "provision": [{"src": "~/.netrc", "dest": ".netrc"}]}
    assert record.settings["lease_ttl"] == 12.5
    assert record.backend == "docker"
    assert record.task_count == 7
    assert len(record.hosts) == 1
    assert record.run_dir == "run_2026-01-01_00-00-00"
    assert not record.absent and not record.extra
    assert record.to_json() == raw
    assert dumps(record.to_json()) == path.read_bytes()  # the same bytes, keys in order


def test_an_older_run_json_keeps_what_it_lacks_absent(tmp_path: Path) -> None:
    raw = _written(tmp_path)
    for key in ("home", "hosts", "task_count", "fingerprint", "tasks_per_gpu", "gpuswarm"):
        del raw[key]
    record = RunRecord.from_json(raw)
    assert record.home == {} and record.hosts == () and record.task_count == 0
    assert record.fingerprint == "" and record.tasks_per_gpu == 1
    assert record.to_json() == raw
    assert list(record.to_json()) == list(raw)
    moved = record.with_values(fingerprint="new")
    assert moved.to_json() == {**raw, "fingerprint": "new"}
    assert RunRecord.from_json(moved.to_json()) == moved


def test_a_bare_run_json_reads_as_the_defaults() -> None:
    record = RunRecord.from_json({})
    assert record == RunRecord(absent=record.absent)
    assert record.backend == "local" and record.base_dir == "." and record.slot_count == 1
    assert record.to_json() == {}


def test_keys_of_another_version_and_nulls_are_kept() -> None:
    raw: dict[str, Any] = {"name": None, "future": {"x": [1]}, "slot_count": 2, "created": "t"}
    record = RunRecord.from_json(raw)
    assert record.name == "" and record.slot_count == 2
    assert record.extra == {"name": None, "future": {"x": [1]}}
    assert record.to_json() == raw
    assert json.loads(dumps(record.to_json())) == raw


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("slot_count", "4"),
        ("gpus_per_task", True),
        ("gpu_ids", [0, "1"]),
        ("hosts", "h"),
        ("settings", []),
        ("config", "docker"),
        ("home", {"isolate": "yes"}),
        ("home", {"provision": [{"src": "a"}]}),
        ("name", 3),
    ],
)
def test_a_bad_field_is_named(tmp_path: Path, key: str, value: object) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**_written(tmp_path), key: value}))
    with pytest.raises(RunDirError, match=rf"run\.json: field '{key}' is not valid"):
        read_record(path)


def test_an_unreadable_run_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text("{not json")
    with pytest.raises(RunDirError, match=r"run\.json: unreadable run snapshot"):
        read_record(path)
    path.write_text("[1]")
    with pytest.raises(RunDirError, match=r"run\.json: not a JSON object"):
        read_record(path)
