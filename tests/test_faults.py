"""Named fault points: declared names only, each one reached by the code path it names.

The chaos crash points (tests/chaos/crashpoint.py) arm these names; here each one is proven to
fire where the chaos tests expect it, in-process and cheaply, so a moved or removed point fails a
fast test instead of making a crash test silently test nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuswarm.core import faults
from gpuswarm.core.events import Ev
from gpuswarm.core.fsutil import atomic_write_bytes
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store import staging
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import DirQueue

SRC = Path(__file__).resolve().parents[1] / "src" / "gpuswarm"
CHAOS = Path(__file__).resolve().parent / "chaos"


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    faults.disarm()
    yield
    faults.disarm()


class Hits:
    def __init__(self) -> None:
        self.specs: list[str] = []

    def __call__(self, spec: str) -> None:
        self.specs.append(spec)


def _queue(root: Path, n: int) -> DirQueue:
    paths = RunPaths(root)
    staging.create_layout(paths)
    tasks = [{"id": f"t{i}", "priority": 0} for i in range(n)]
    staging.write_pending(paths, (Descriptor.new(t, i) for i, t in enumerate(tasks)))
    return DirQueue(paths, durable=False)


def test_every_point_in_the_code_is_declared_and_every_declared_point_is_in_the_code() -> None:
    called = set()
    for path in SRC.rglob("*.py"):
        called |= set(re.findall(r"faults\.point\(\s*\"([^\"]+)\"", path.read_text()))
    assert called == set(faults.POINTS)


def test_unknown_names_and_actions_fail_loudly() -> None:
    with pytest.raises(faults.UnknownFaultPoint, match="unknown point"):
        faults.arm("queue.clamed:kill")
    with pytest.raises(faults.UnknownFaultPoint, match="unknown action"):
        faults.arm("queue.claimed:explode")
    with pytest.raises(faults.UnknownFaultPoint, match="expected"):
        faults.arm("queue.claimed")
    faults.arm("queue.claimed:raise")  # once anything is armed, an undeclared point raises
    with pytest.raises(faults.UnknownFaultPoint, match="not declared"):
        faults.point("queue.nowhere")


def test_an_unarmed_point_does_nothing() -> None:
    faults.point("queue.nowhere")  # nothing armed: not even the name is looked at


def test_nth_matching_call_fires_once() -> None:
    hits = Hits()
    faults.arm("ledger.emit.before?ev=finished&state=done:kill#2", action=hits)
    for state in ("done", "failed", "done", "done"):
        faults.point("ledger.emit.before", ev="finished", state=state)
    assert hits.specs == ["ledger.emit.before?ev=finished&state=done:kill#2"]


def test_raise_action() -> None:
    faults.arm("queue.claimed:raise")
    with pytest.raises(faults.FaultInjected):
        faults.point("queue.claimed")


def test_the_environment_arms_at_import() -> None:
    env = {**os.environ, faults.ENV: "queue.claimed:kill"}
    code = "from gpuswarm.core import faults; faults.point('queue.claimed'); print('alive')"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == -9, res
    assert "faults: SIGKILL at queue.claimed:kill" in res.stderr
    assert "alive" not in res.stdout


def test_ledger_points_fire_around_the_append(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "events.jsonl", durable=False)
    lines: list[int] = []

    def count_lines(spec: str) -> None:
        lines.append(len((tmp_path / "events.jsonl").read_bytes().splitlines()))

    faults.arm("ledger.emit.before?ev=finished&state=pending:kill", action=count_lines)
    faults.arm("ledger.emit.after?ev=finished&state=pending:kill", action=count_lines)
    ledger.emit(Ev.FINISHED, task="a", state="done")
    ledger.emit(Ev.FINISHED, task="b", state="pending")
    ledger.close()
    assert lines == [1, 2]  # before: its line not written yet; after: written


def test_claim_and_move_points_fire_at_the_right_moment(tmp_path: Path) -> None:
    q = _queue(tmp_path, 2)
    seen: list[tuple[str, str]] = []

    def on_claim(spec: str) -> None:
        (running,) = (tmp_path / ".parallel" / "running").iterdir()
        seen.append(("claimed", running.name))

    def on_saved(spec: str) -> None:
        (running,) = (tmp_path / ".parallel" / "running").iterdir()
        seen.append(("saved", json.loads(running.read_bytes())["state"]))

    faults.arm("queue.claimed:kill", action=on_claim)
    faults.arm("queue.move.saved?state=done:kill", action=on_saved)
    claimed = q.claim("o", 0)
    assert claimed is not None
    q.move(claimed, State.DONE)
    assert [k for k, _ in seen] == ["claimed", "saved"]
    assert seen[1][1] == "done"  # saved with its new state, still in running/


def test_the_temp_file_point_leaves_the_temp_file(tmp_path: Path) -> None:
    found: list[list[str]] = []

    def on_temp(spec: str) -> None:
        found.append(sorted(p.name for p in tmp_path.iterdir()))

    faults.arm("fsutil.temp_written:kill", action=on_temp)
    atomic_write_bytes(tmp_path / "d.json", b"{}", durable=False)
    (names,) = found
    assert len(names) == 1 and names[0].startswith(".tmp-d.json.")


@pytest.mark.parametrize(
    ("crash", "armed"),
    [
        ("claimed#3", "queue.claimed"),
        ("emit:started#3", "ledger.emit.before"),
        ("emitted:finished:state=done#2", "ledger.emit.after"),
        ("state-written:done", "queue.move.saved"),
        ("temp-left:done#2", "fsutil.temp_written"),
    ],
)
def test_crashpoint_arms_declared_points(crash: str, armed: str) -> None:
    sys.path.insert(0, str(CHAOS))
    try:
        import crashpoint
    finally:
        sys.path.remove(str(CHAOS))
    crashpoint.install(crash)
    assert list(faults._armed) == [armed]
    with pytest.raises(SystemExit, match="unknown point"):
        crashpoint.install("nowhere:x")
