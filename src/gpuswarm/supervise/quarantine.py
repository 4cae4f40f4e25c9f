"""Slots out of rotation: the loop's side of the breaker (:mod:`.breaker` holds the rule).

A slot whose breaker trips is quarantined: a file says so (remove it to lift the quarantine by
hand), the journal says why, and after its cool-down it claims one probe task. Only the loop
thread calls these methods, except :meth:`Quarantine.cooling` (the keeper).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque

from gpuswarm.core.events import Ev
from gpuswarm.exec.base import AttemptEnd
from gpuswarm.placement.gpus import Slot
from gpuswarm.store.quarantines import (
    Quarantined,
    QuarantineInfo,
    quarantine_file,
    write_quarantine,
)
from gpuswarm.supervise.breaker import Breaker
from gpuswarm.supervise.context import Shared


class Quarantine:
    def __init__(self, run: Shared) -> None:
        self.run = run
        cfg = run.cfg
        self.breaker = Breaker(cfg.breaker_failures, cfg.breaker_window, cfg.breaker_cooldown)
        self.quarantined: list[Quarantined] = []  # summary.json's record of every quarantine
        self._cooling: dict[int, tuple[float, Slot]] = {}  # quarantined: slot -> (probe at, slot)
        self._qfiles: set[int] = set()  # quarantined slots whose file was written (can be lifted)

    def cooling(self) -> bool:
        return bool(self._cooling)

    def lets(
        self, slot: Slot, task_id: str, end: AttemptEnd, neutral: bool, free: deque[Slot]
    ) -> bool:
        """Feed the breaker; False when ``slot`` is quarantined now (it stays out of rotation).
        Successes elsewhere may incriminate slots that are running something else meanwhile:
        those are quarantined when their attempt ends (or now, when they are free)."""
        verdict = self.breaker.record(slot.label, task_id, end, neutral=neutral)
        if verdict == "lift":
            self._unquarantine(slot, "its probe attempt succeeded")
        elif verdict in ("trip", "again"):
            self._quarantine(slot, end, again=verdict == "again")
            return False
        if end.ok:
            for label in self.breaker.others_tripped():
                other = next((s for s in free if s.label == label), None)
                if other is not None:
                    free.remove(other)
                    self._quarantine(other, None, again=False)
        return True

    def _quarantine(self, slot: Slot, end: AttemptEnd | None, *, again: bool) -> None:
        run = self.run
        cooldown = self.breaker.quarantined(slot.label)
        n = run.cfg.breaker_failures
        if again:
            reason = f"its probe attempt failed too ({end.reason if end else '?'})"
        else:
            last = f" (last: {end.reason})" if end is not None else ""
            reason = (
                f"its last {n} attempts failed within {run.cfg.breaker_window:g}s while the "
                f"same work succeeded on other slots{last}; check this GPU and its driver"
            )
        probe_at = time.time() + cooldown
        info: QuarantineInfo = {
            "gpus": list(slot.gpu_ids),
            "reason": reason,
            "probe_at": round(probe_at, 3),
        }
        with run.lock:
            self._cooling[slot.index] = (time.monotonic() + cooldown, slot)
        open_ = [q for q in self.quarantined if q["slot"] == slot.label and q["lifted"] is None]
        if open_:  # a failed probe: the same quarantine goes on
            q = open_[-1]
            q["gpus"], q["reason"], q["probe_at"] = info["gpus"], reason, info["probe_at"]
            q["probes"] = q.get("probes", 0) + 1
        else:
            gpus, at = info["gpus"], info["probe_at"]
            self.quarantined.append(
                {"slot": slot.label, "gpus": gpus, "reason": reason, "probe_at": at, "lifted": None}
            )
        try:
            write_quarantine(run.paths, slot.label, run.cfg.owner, info)
            self._qfiles.add(slot.index)
        except OSError:  # shown in the journal and summary still; probed after the cool-down
            self._qfiles.discard(slot.index)
        run.ledger.emit(
            Ev.QUARANTINED,
            slot=slot.label,
            gpus=list(slot.gpu_ids),
            reason=reason,
            probe_in=round(cooldown, 1),
        )

    def _unquarantine(self, slot: Slot, why: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            quarantine_file(self.run.paths, slot.label, self.run.cfg.owner).unlink()
        for q in self.quarantined:
            if q["slot"] == slot.label and q["lifted"] is None:
                q["lifted"] = why
        self.run.ledger.emit(Ev.UNQUARANTINED, slot=slot.label, reason=why)

    def back_in_rotation(self, free: deque[Slot]) -> None:
        """Quarantined slots whose cool-down is over claim one probe task; slots lifted by hand
        (their quarantine file removed) come back with a clean slate."""
        run = self.run
        with run.lock:
            if not self._cooling:
                return
            cooling = dict(self._cooling)
        now = time.monotonic()
        for index, (due, slot) in cooling.items():
            path = quarantine_file(run.paths, slot.label, run.cfg.owner)
            by_hand = index in self._qfiles and not path.exists()
            if not by_hand and due > now:
                continue
            with run.lock:
                self._cooling.pop(index, None)
            if by_hand:
                self.breaker.lifted(slot.label)
                self._unquarantine(slot, "lifted by hand")
            else:
                self.breaker.probe(slot.label)
                run.ledger.emit(Ev.UNQUARANTINED, slot=slot.label, reason="probe", probe=True)
            free.append(slot)
            run.more_work()

    def remove_files(self) -> None:
        """At the end: summary.json keeps the record; the quarantine files are live state."""
        for _, slot in list(self._cooling.values()):
            with contextlib.suppress(FileNotFoundError):
                quarantine_file(self.run.paths, slot.label, self.run.cfg.owner).unlink()
