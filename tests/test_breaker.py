"""The slot circuit breaker's rule (issue 11 item 2), in-process on synthetic attempt ends."""

from __future__ import annotations

import itertools

from gpuswarm.core.models import EndKind
from gpuswarm.exec.base import AttemptEnd
from gpuswarm.supervise.breaker import Breaker

_clock = itertools.count()


def end(ok: bool, kind: EndKind = EndKind.EXITED, code: int | None = None) -> AttemptEnd:
    t = float(next(_clock))
    rc = 0 if ok else (1 if code is None else code)
    return AttemptEnd(kind, rc, None, "exit", False, t, t + 0.1, 1, 0)


def test_failures_every_slot_sees_blame_no_slot() -> None:
    b = Breaker(failures=3, window=60, cooldown=10)
    verdicts = [b.record(f"gpu{i % 2}", f"bad{i}", end(False)) for i in range(10)]
    verdicts += [b.record(f"gpu{i % 2}", f"good{i}", end(True)) for i in range(100)]
    assert "trip" not in verdicts and b.others_tripped() == []


def test_a_slot_failing_while_the_others_succeed_is_blamed() -> None:
    b = Breaker(failures=3, window=60, cooldown=10)
    assert b.record("gpu0", "a", end(True)) == ""
    assert b.record("gpu1", "b", end(False)) == ""
    assert b.record("gpu1", "c", end(False)) == ""
    assert b.record("gpu0", "d", end(True)) == ""
    assert b.record("gpu1", "e", end(False)) == "trip"


def test_a_streak_is_blamed_once_its_tasks_succeed_elsewhere() -> None:
    b = Breaker(failures=2, window=60, cooldown=10)
    assert b.record("gpu1", "x", end(False)) == ""
    assert b.record("gpu1", "y", end(False)) == ""  # no evidence yet: gpu0 has ended nothing
    assert b.record("gpu0", "x", end(True)) == ""
    assert b.others_tripped() == ["gpu1"]


def test_skips_and_setup_errors_never_count() -> None:
    b = Breaker(failures=2, window=60, cooldown=10)
    for i in range(5):
        assert b.record("gpu1", f"s{i}", end(False, code=3), neutral=True) == ""
        assert b.record("gpu1", f"n{i}", end(False, EndKind.NOT_FOUND)) == ""
        b.record("gpu0", f"ok{i}", end(True))
    assert b.others_tripped() == []


def test_one_slot_alone_is_never_blamed() -> None:
    b = Breaker(failures=2, window=60, cooldown=10)
    assert all(b.record("gpu0", f"t{i}", end(False)) == "" for i in range(10))


def test_a_probe_lifts_on_success_and_doubles_the_cooldown_on_failure() -> None:
    b = Breaker(failures=1, window=60, cooldown=10)
    assert b.record("gpu1", "b", end(False)) == ""  # the others' successes must come after
    b.record("gpu0", "a", end(True))
    assert b.others_tripped() == ["gpu1"]
    assert b.quarantined("gpu1") == 10
    b.probe("gpu1")
    assert b.record("gpu1", "c", end(False)) == "again"
    assert b.quarantined("gpu1") == 20
    b.probe("gpu1")
    assert b.record("gpu1", "d", end(True)) == "lift"
