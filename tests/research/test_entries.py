"""The experiment journal's typed lines (research/entries.py): the lines older versions wrote
parse to the same entries, every kind goes back to the bytes it came from, a bad line is named
by file and line, and a results.tsv row is read by column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.core.errors import ResearchError
from gpuswarm.research import entries
from gpuswarm.research.entries import ResultRow
from gpuswarm.research.experiment import ExpPaths
from gpuswarm.research.journal import append, replay

DATA = Path(__file__).parent / "data"
# a real demo experiment's journal, written by the code before the lines were typed (issue 32)
OLD = DATA / "ledger_before_typed_entries.jsonl"


def old_append(record: dict[str, Any]) -> bytes:
    """A line as ``journal.append`` wrote it before its lines were typed."""
    return json.dumps(record, default=str, separators=(",", ":")).encode() + b"\n"


def test_an_old_journal_reads_back_byte_for_byte_and_every_kind_is_in_it() -> None:
    lines = OLD.read_bytes().splitlines(keepends=True)
    kinds = set()
    for raw in lines:
        entry = entries.parse(json.loads(raw))
        assert entry is not None, raw
        assert entries.to_json(entry) == raw  # the line as written, byte for byte
        assert json.loads(entries.to_json(entry)) == json.loads(raw)
        kinds.add(entry["ev"])
    assert {"init", "mode", "variant", "finished", "decided", "base", "seen"} <= kinds
    assert len(list(entries.read(OLD))) == len(lines)


def test_an_old_journal_replays_to_the_same_experiment(tmp_path: Path) -> None:
    paths = ExpPaths(tmp_path, tmp_path)
    assert not replay(paths).variants  # no ledger yet: nothing
    paths.ledger.write_bytes(OLD.read_bytes())
    state = replay(paths)
    raw = [json.loads(line) for line in OLD.read_bytes().splitlines()]
    decided = {e["id"]: e for e in raw if e["ev"] == "decided"}
    assert set(state.variants) == {e["id"] for e in raw if e["ev"] == "variant"}
    for vid, v in state.variants.items():
        assert v.decision == decided.get(vid)
        assert v.finished is not None and v.finished["ok"] in (True, False)
    assert state.base == [e for e in raw if e["ev"] == "base"][-1]["to"]
    assert len(state.rows) == sum(1 for e in decided.values() if e.get("row"))


def _lines(tmp_path: Path, records: list[dict[str, Any]]) -> ExpPaths:
    paths = ExpPaths(tmp_path, tmp_path)
    paths.ledger.write_bytes(b"".join(old_append(r) for r in records))
    return paths


def test_lines_without_the_optional_keys_still_replay(tmp_path: Path) -> None:
    """The first journals had no gpu_models, round, source, origin, meta, base_metric."""
    paths = _lines(
        tmp_path,
        [
            {"ts": 1.0, "ev": "init", "base": "b" * 40},
            {"ts": 2.0, "ev": "variant", "id": "v0001", "kind": "variant", "commit": "c" * 40,
             "parent": "b" * 40, "description": "halve LR"},
            {"ts": 3.0, "ev": "finished", "id": "v0001", "ok": True, "metric": 0.9},
            {"ts": 4.0, "ev": "decided", "id": "v0001", "status": "keep"},
            {"ts": 5.0, "ev": "controls"},
            {"ts": 6.0, "ev": "some-later-kind", "x": 1},  # a newer version's: skipped
        ],
    )  # fmt: skip
    state = replay(paths)
    v = state.variants["v0001"]
    assert (v.round, v.source, v.origin, v.meta) == (0, "manual", None, {})
    assert v.finished == {"ts": 3.0, "ev": "finished", "id": "v0001", "ok": True, "metric": 0.9}
    assert v.status == "keep" and state.rows == [] and state.paired
    assert state.pending_base is not None and state.pending_base.to == "c" * 40
    assert [e["ev"] for e in entries.read(paths.ledger)] == [
        "init", "variant", "finished", "decided", "controls"
    ]  # fmt: skip


def test_every_kind_round_trips_as_append_writes_it(tmp_path: Path) -> None:
    paths = ExpPaths(tmp_path, tmp_path)
    b, c = "b" * 40, "c" * 40
    made = [
        append(paths, "init", base=b, branch="autoresearch/t", tag="t", gpu_models={"H100": 2}),
        append(paths, "mode", mode="rounds"),
        append(paths, "config", changes={"noise_k": [2.0, 3.0]}),
        append(paths, "variant", id="v0001", kind="variant", commit=c, parent=b,
               description="halve LR", round=1, source="manual", origin=None,
               meta={"digest": "d", "proposer_tokens": 12, "proposer_usd": 0.01}),
        append(paths, "proposal", proposer="agent", outcome="made", prompt=1,
               description="halve LR", tokens_in=10, tokens_out=2, cost_usd=0.01),
        append(paths, "pruning", rule="median", k=2.0, grace=0.2),
        append(paths, "pruned", id="v0001", t=3.0, value=1.2, ref=1.0, noise=0.01,
               budget=10.0, rule="median", k=2.0, grace=0.2),
        append(paths, "finished", id="v0001", ok=True, metric=0.9, memory_gb=1.5,
               reason=None, summary={"val_bpb": 0.9}, gpu="0", slot="gpu0", host="h",
               accelerator="H100", started=10.0, ended=20.0, seconds=10.0, exit=0,
               log="variants/v0001.log", log_path="/x/v0001.log", tail="", energy_j=None,
               energy_mode=None, curve=[[1.0, 1.1]],
               diff={"files": 1, "insertions": 2, "deletions": 1}),
        append(paths, "decided", id="v0001", status="keep", reason="better than BASE",
               row=["ccccccc", "0.900000", "1.5", "keep", "[R1 gpu0] halve LR"],
               base_metric={"commit": c, "value": 0.9}),
        append(paths, "base", **{"from": b, "to": c, "id": "v0001"}),
        append(paths, "worktree", base=c),
        append(paths, "seen", ids=["v0001"]),
        append(paths, "sealed", n=1),
        append(paths, "controls", paired=True, every=4),
    ]  # fmt: skip
    lines = paths.ledger.read_bytes().splitlines(keepends=True)
    assert len(lines) == len(made) == len(entries.KINDS)
    assert {e["ev"] for e in made} == entries.KINDS
    for entry, raw in zip(made, lines, strict=True):
        assert entries.to_json(entry) == raw == old_append(json.loads(raw))
        assert entries.parse(json.loads(raw)) == entry
    assert list(entries.read(paths.ledger)) == made
    state = replay(paths)
    assert state.base == c and state.gpu_models == {"H100": 2} and state.sealed == {1}
    assert state.variants["v0001"].seen and state.paired
    assert ResultRow.of(state.rows[0]).description == "[R1 gpu0] halve LR"


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ({"ev": "variant", "id": "v0001", "kind": "variant", "parent": "b", "description": "x",
          "ts": 1.0}, "a 'variant' line without 'commit'"),
        ({"ev": "sealed", "n": "1"}, "a 'sealed' line's 'n' is str, not int"),
        ({"ev": "decided", "id": "v0001"}, "a 'decided' line without 'status'"),
    ],
)  # fmt: skip
def test_a_bad_line_is_named_by_file_and_line(
    tmp_path: Path, line: dict[str, Any], words: str
) -> None:
    paths = _lines(tmp_path, [{"ts": 1.0, "ev": "init", "base": "b"}, line])
    with pytest.raises(ResearchError) as err:
        replay(paths)
    assert f"{paths.ledger}:2: {words}" in str(err.value)


def test_a_torn_last_line_and_a_line_that_is_no_event_are_left_out(tmp_path: Path) -> None:
    paths = ExpPaths(tmp_path, tmp_path)
    paths.ledger.write_bytes(b'{"ts":1,"ev":"init","base":"b"}\nnot json\n[1]\n{"ts":2,"ev":"mo')
    assert [e["ev"] for e in entries.read(paths.ledger)] == ["init"]


def test_a_results_row_is_read_by_column() -> None:
    row = ResultRow.of(["abc1234", "0.000000", "0.0", "crash", "[R2] x (OOM)"])
    assert (row.commit, row.status, row.description) == ("abc1234", "crash", "[R2] x (OOM)")
    assert not row.measured and ResultRow.of([*row[:3], "keep", "y"]).measured
    assert list(row) == ["abc1234", "0.000000", "0.0", "crash", "[R2] x (OOM)"]
