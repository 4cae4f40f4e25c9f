"""The typed records (core/models.py): descriptors written by the code before them still read
and write back unchanged, mistyped ones are rejected with the finding ``check`` reports."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuswarm.core.models import AttemptRecord, Descriptor, EndKind, Lease, RecordError, State
from gpuswarm.core.records import descriptor_problem
from gpuswarm.store.names import claim_name, lease_of, reclaim_name, reclaimed_from

# what the code before the models wrote: a launched+judged attempt, a stop's interrupted one,
# recovery's and reclaim's lost ones, an orphan judged done
OLD_ATTEMPTS: list[dict[str, Any]] = [
    {
        "n": 1,
        "slot": "h-gpu0",
        "gpus": [0],
        "started": 1.5,
        "ended": 2.25,
        "duration": 0.75,
        "kind": "exited",
        "returncode": 1,
        "signal": None,
        "reason": "exit 1",
        "oom": False,
        "killed": 0,
        "metrics": {"loss": 0.5},
    },
    {
        "n": 2,
        "slot": "h-gpu0",
        "gpus": [],
        "started": 3.0,
        "ended": 4.0,
        "duration": 1.0,
        "kind": "signaled",
        "returncode": None,
        "signal": "SIGTERM",
        "reason": "stopped",
        "oom": False,
        "killed": 2,
        "interrupted": True,
    },
    {"n": 3, "slot": "gpu1", "interrupted": True, "kind": "lost", "reason": "its supervisor died"},
    {"n": 4, "kind": "lost", "reason": "its supervisor h:1:2 died"},
    {
        "n": 5,
        "slot": "",
        "started": 5.0,
        "ended": 6.0,
        "duration": 1.0,
        "kind": "orphan",
        "returncode": None,
        "signal": None,
        "reason": "finished after ...",
        "oom": False,
        "killed": 0,
        "future_key": [1, 2],
    },
]
OLD_DESCRIPTOR: dict[str, Any] = {
    "v": 1,
    "id": "t0",
    "seq": 0,
    "task": {"id": "t0", "name": "t0", "max_attempts": 3, "priority": 2},
    "attempts": OLD_ATTEMPTS,
    "budget_from": 1,
    "interruptions": 2,
    "reason": None,
    "state": "done",
    "result": {"acc": 0.9},
    "moved_from": "x.json@h:1:2@0.1",
}


def test_old_descriptor_round_trips_unchanged() -> None:
    raw = json.dumps(OLD_DESCRIPTOR).encode()
    desc = Descriptor.parse(raw)
    assert desc.to_json() == OLD_DESCRIPTOR
    assert [a.to_json() for a in desc.attempts] == OLD_ATTEMPTS
    assert desc.id == "t0" and desc.priority == 2 and desc.max_attempts == 3
    assert desc.state == State.DONE.value and desc.result == {"acc": 0.9}
    assert desc.attempts_used == 2  # from budget 1: n=2,3 interrupted; n=4, n=5 count
    assert desc.next_attempt == 6 and desc.busy_seconds == 2.75
    assert [a.n for a in desc.counted_attempts] == [1, 4, 5]
    assert desc.attempts[4].extra == {"future_key": [1, 2]}


def test_constructors_write_the_old_shapes() -> None:
    launched = AttemptRecord.launched(
        n=1,
        slot="h-gpu0",
        gpus=[0],
        started=1.5,
        ended=2.25,
        duration=0.75,
        kind=EndKind.EXITED,
        returncode=1,
        signal=None,
        reason="exit 1",
        oom=False,
        killed=0,
    ).but(metrics={"loss": 0.5})
    assert launched.to_json() == OLD_ATTEMPTS[0]
    lost = AttemptRecord.lost(n=3, slot="gpu1", reason="its supervisor died", interrupted=True)
    assert lost.to_json() == OLD_ATTEMPTS[2]
    assert AttemptRecord.lost(n=4, reason="its supervisor h:1:2 died").to_json() == OLD_ATTEMPTS[3]
    orphan = AttemptRecord.orphan(n=5, slot="", started=5.0, ended=6.0, reason="finished after ...")
    assert orphan.to_json() == {k: v for k, v in OLD_ATTEMPTS[4].items() if k != "future_key"}


def test_new_descriptor_is_the_old_one() -> None:
    task = {"id": "a", "priority": 0}
    assert Descriptor.new(task, 7).raw == {
        "v": 1,
        "id": "a",
        "seq": 7,
        "task": task,
        "attempts": [],
        "budget_from": 0,
        "interruptions": 0,
        "reason": None,
        "state": "pending",
    }


@pytest.mark.parametrize(
    ("change", "finding"),
    [
        ({"attempts": "x"}, "attempts is str, not list"),
        ({"attempts": [1]}, "attempts[0] is int, not dict"),
        ({"attempts": [{"n": "1"}]}, "attempts[0].n is str, not int"),
        ({"attempts": [{"n": 1, "interrupted": 1}]}, "attempts[0].interrupted is int, not bool"),
        ({"budget_from": True}, "budget_from is bool, not int"),
        ({"task": {"id": 3}}, "task.id is int, not str"),
        ({"retry_at": "soon"}, "retry_at is str, not int or float or null"),
    ],
)
def test_mistyped_descriptor_rejected_with_the_finding(
    change: dict[str, Any], finding: str
) -> None:
    data = {**OLD_DESCRIPTOR, **change}
    with pytest.raises(RecordError) as caught:
        Descriptor.from_json(data)
    assert str(caught.value) == finding == descriptor_problem(data)
    with pytest.raises(RecordError, match="not a descriptor object"):
        Descriptor.from_json([1])
    with pytest.raises(RecordError, match="empty file"):
        Descriptor.parse(b"")


def test_attempt_from_json_names_the_field() -> None:
    with pytest.raises(RecordError, match=r"^attempt\.gpus is str, not list$"):
        AttemptRecord.from_json({"n": 1, "gpus": "0"})
    assert AttemptRecord.from_json(OLD_ATTEMPTS[0]).to_json() == OLD_ATTEMPTS[0]


def test_attempt_host_and_accelerator_round_trip() -> None:
    """The machine and GPU model an attempt ran on are kept (research compares per platform)."""
    record = AttemptRecord.launched(
        n=1, slot="h-gpu0", gpus=[0], started=1.0, ended=2.0, duration=1.0,
        kind=EndKind.EXITED, returncode=0, signal=None, reason=None, oom=False, killed=0,
        host="h", accelerator="NVIDIA H100 80GB HBM3",
    )  # fmt: skip
    obj = record.to_json()
    assert (obj["host"], obj["accelerator"]) == ("h", "NVIDIA H100 80GB HBM3")
    back = AttemptRecord.from_json(json.loads(json.dumps(obj)))
    assert (back.host, back.accelerator, back.extra) == ("h", "NVIDIA H100 80GB HBM3", {})
    assert "host" not in AttemptRecord.lost(n=2, reason="x").to_json()
    with pytest.raises(RecordError, match=r"attempt\.accelerator is int, not str"):
        AttemptRecord.from_json({"n": 1, "accelerator": 3})


def test_record_of_names_the_host_and_the_slots_gpus() -> None:
    from gpuswarm.core.paths import host_slug
    from gpuswarm.exec.base import AttemptEnd
    from gpuswarm.exec.plan import accelerator_of, record_of
    from gpuswarm.placement.devices import Gpu, Vendor
    from gpuswarm.placement.gpus import Slot

    a100, h100 = Gpu(0, "A100", Vendor.SIM), Gpu(1, "H100", Vendor.SIM)
    slot = Slot(0, (0,), Vendor.SIM, devices=(a100,))
    end = AttemptEnd(
        kind=EndKind.EXITED, returncode=0, signal=None, reason="exited 0", oom=False,
        started=1.0, ended=2.0, pid=None, killed=0,
    )  # fmt: skip
    record = record_of(end, slot, (0,), 1)
    assert (record.host, record.accelerator) == (host_slug(), "A100")
    assert accelerator_of(Slot(0, (0, 1), Vendor.SIM, devices=(a100, h100)), (0, 1)) == (
        "A100 + H100"
    )
    assert accelerator_of(Slot(0, (0,), Vendor.SIM), (0,)) is None


def test_lease_format() -> None:
    name = claim_name("0500000000001_t.json", "h:1:2", 3, 9)
    assert name == "0500000000001_t.json@h:1:2@3.9"
    assert Lease.parse(name) == Lease("h:1:2", 3, "9") and lease_of(name) == ("h:1:2", 3)
    assert Lease.parse("0500000000001_t.json") is None
    again = reclaim_name(name, "h:4:5")
    assert Lease.parse(again) == Lease("h:4:5", -1, again.rsplit(".", 1)[1])
    assert reclaimed_from(again, name) and reclaim_name(again, "h:6:7").endswith(again[-9:])
    assert not reclaimed_from(again, "0500000000001_t.json@h:1:2@3.10")


def test_view_writes_through() -> None:
    desc = Descriptor.new({"id": "a"}, 0)
    desc.add_attempt(AttemptRecord.lost(n=1, reason="r"))
    desc.retry_at = 3.5
    assert desc.take_retry_at() == 3.5 and "retry_at" not in desc.raw
    desc.note_interrupted()
    desc.fresh_budget()
    assert desc.raw["budget_from"] == 1 and desc.interruptions == 1 and desc.attempts_used == 0


def test_host_slug_follows_a_changed_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slug is kept per name, the name asked each time: a renamed host is seen at once."""
    import socket

    from gpuswarm.core.paths import host_slug

    monkeypatch.setattr(socket, "gethostname", lambda: "node a.example")
    assert host_slug() == host_slug() == "node-a.example"
    monkeypatch.setattr(socket, "gethostname", lambda: "b")
    assert host_slug() == "b"
