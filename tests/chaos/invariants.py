"""The invariants every chaos scenario ends with, checked from the outside (files + processes).

:func:`check_run` reads a run directory the way an auditor would, trusting nothing gpuswarm says
about itself, and raises ``AssertionError`` listing every violation:

1. no task is lost: every task id of the run sits in exactly one state folder (pending, running,
   done, failed, skipped, cancelled), or in ``corrupt/`` only when the scenario corrupted it; no
   unknown id appears;
2. every task ends done exactly once, or failed with a reason: a done descriptor's last attempt
   exited 0 and it is the only attempt that did; exactly one ``done`` transition in the journal;
   a failed descriptor has a non-empty ``reason``; nothing is left in ``running/`` at the end;
3. side effects (optional): each task's command appends its ``GPUSWARM_ATTEMPT`` to
   ``<shared>/<task id>`` as its last action. Every attempt number appears at most once (no
   attempt completes twice); a done task's successful attempt appears exactly once; any other
   number must be an attempt that was cut off by a dead supervisor, a stop or a cancel
   (``lost``/``interrupted``/``cancelled``) whose process ran to completion anyway: the
   at-least-once re-execution a crash allows, reported as ``reexecuted``, never as a duplicate
   completion;
4. no process of the run survives it: no live process whose environment has
   ``GPUSWARM_RUN_DIR`` == the run dir (waiting up to ``settle`` seconds);
5. events agree with folders: the last state-changing event of each task names its folder
   (``started`` -> running, ``finished``/``recovered`` -> their ``state``, ``waiting`` ->
   running, ``requeued`` -> pending, ``corrupt`` -> corrupt, ``control`` with a task -> its
   ``state``; no event -> pending) and, for every
   task not in ``running/``, each recorded attempt has one ``started`` event, except that an
   attempt recorded as ``lost`` may have none: its supervisor may have died between the claim
   and that line (the bounds ``gpuswarm check`` applies too; such attempts are counted in
   ``Report.silent_lost``). Events are written before the rename they announce, so a crash may
   journal a move twice (``finished`` then ``recovered`` when recovery completes it): one
   completion, not two;
6. summary.json (when ``final``) counts what the folders hold, corrupt/ included, and its total
   is the number of tasks of the run: nothing vanishes from the report;
7. ``gpuswarm check RUN --json`` (when the installed gpuswarm has it) exits 0;
8. no temp file (``.tmp-*``, ``.retry-*``) is left in a state folder. A SIGKILL in the middle
   of a descriptor write leaves one; resume removes it, but a run finished by live supervisors
   (reclaim) keeps it (a known bug, pinned by a strict xfail in test_crash_points.py): the
   scenario that SIGKILLs one of several supervisors passes ``allow_temp_files=True`` (the files
   are still counted in ``Report.temp_files``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

STATES = (
    *("pending", "running", "done", "failed", "skipped", "cancelled"),
    *("blocked", "dependency_failed"),  # issue 35: tasks after prerequisites
)


def task_id_of(file_name: str) -> str:
    """``<rank 4><seq 9>_<id>.json[@owner@slot][.<reason>]`` -> ``<id>``."""
    stem = file_name.split("@", 1)[0]
    stem = stem[14:]
    cut = stem.rfind(".json")
    return stem[:cut] if cut >= 0 else stem


@dataclass
class Report:
    """What :func:`check_run` found (also the figures of the docs/reliability.md table)."""

    run_dir: Path
    states: dict[str, str] = field(default_factory=dict)  # task id -> folder
    descriptors: dict[str, dict[str, Any]] = field(default_factory=dict)
    corrupt: dict[str, str] = field(default_factory=dict)  # task id -> file name in corrupt/
    lost: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)  # attempts that completed twice
    reexecuted: list[str] = field(default_factory=list)  # cut-off attempts that ran to the end
    silent_lost: list[str] = field(default_factory=list)  # lost attempts without 'started'
    temp_files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    check: dict[str, Any] | None = None  # what `gpuswarm check --json` said

    def counts(self) -> Counter[str]:
        return Counter(self.states.values())

    def line(self) -> str:
        c = self.counts()
        return (
            f"{self.run_dir.name}: {dict(sorted(c.items()))} corrupt={len(self.corrupt)} "
            f"lost={len(self.lost)} orphans={len(self.orphans)} duplicates={len(self.duplicates)} "
            f"reexecuted={len(self.reexecuted)} silent_lost={len(self.silent_lost)} "
            f"temp_files={len(self.temp_files)}"
        )


# -- reading -----------------------------------------------------------------------------------
def read_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    out = []
    if path.exists():
        for raw in path.read_bytes().split(b"\n"):
            with contextlib.suppress(ValueError):
                if raw:
                    out.append(json.loads(raw))
    return out


def event_state(e: dict[str, Any]) -> str | None:
    """The folder a state-changing event says its task went to, or None."""
    ev = e.get("ev")
    if ev == "started":
        return "running"
    if ev == "requeued" and e.get("task"):
        return "pending"
    if ev in ("finished", "recovered"):
        state = str(e.get("state"))
        return "running" if state == "waiting" else state
    if ev == "corrupt":
        return "corrupt"
    if ev == "dependency" and e.get("state"):  # issue 35: a blocked task ended (or back)
        return str(e["state"])
    if ev == "control" and e.get("task") and e.get("state"):
        return str(e["state"])  # a person's cancel applied: cancelled
    return None


def event_task(e: dict[str, Any]) -> str | None:
    if isinstance(e.get("task"), str):
        return str(e["task"])
    if e.get("ev") == "corrupt" and isinstance(e.get("file"), str):
        return task_id_of(str(e["file"]))
    return None


def folders(run_dir: Path) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """task id -> [(state, file name)] by file name (contents may be corrupt); temp files."""
    where: dict[str, list[tuple[str, str]]] = {}
    temps: list[str] = []
    par = run_dir / ".parallel"
    for state in (*STATES, "corrupt"):
        if not (par / state).is_dir():
            continue  # skipped/, cancelled/ of a gpuswarm that has none
        for name in sorted(os.listdir(par / state)):
            if name.startswith("."):
                temps.append(f"{state}/{name}")
                continue
            where.setdefault(task_id_of(name), []).append((state, name))
    return where, temps


def side_effects(shared: Path, task_id: str) -> list[int]:
    path = shared / task_id
    if not path.exists():
        return []
    return [int(x) for x in path.read_text().split()]


# -- processes ---------------------------------------------------------------------------------
def run_processes(run_dir: Path) -> list[psutil.Process]:
    want = os.path.realpath(run_dir)
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            got = proc.environ().get("GPUSWARM_RUN_DIR")
            same = got is not None and os.path.realpath(got) == want
            if same and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def surviving_processes(run_dir: Path, settle: float) -> list[str]:
    """Processes of the run still alive after ``settle`` seconds (our zombies are reaped)."""
    deadline = time.monotonic() + settle
    while True:
        procs = run_processes(run_dir)
        for p in procs:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(p.pid, os.WNOHANG)
        alive = []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        if not alive or time.monotonic() > deadline:
            out = []
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    out.append(f"pid {p.pid} ppid {p.ppid()}: {' '.join(p.cmdline())[:100]}")
            return out
        time.sleep(0.05)


# -- the check ---------------------------------------------------------------------------------
def _ok(attempt: dict[str, Any]) -> bool:
    return attempt.get("kind") == "exited" and attempt.get("returncode") == 0


def _cut_off(attempt: dict[str, Any]) -> bool:
    """Cut off by a dead supervisor, a stop or a person's cancel (it may have run on to its
    end meanwhile: a cancelled attempt may exit 0 in its grace period)."""
    return bool(attempt.get("interrupted")) or attempt.get("kind") in ("lost", "cancelled")


@dataclass
class Journal:
    """What events.jsonl says per task: started events, completions, last state."""

    started: Counter[str] = field(default_factory=Counter)
    done_attempts: dict[str, set[Any]] = field(default_factory=dict)  # finished: done
    recovered_done: Counter[str] = field(default_factory=Counter)
    last: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)

    def completions(self, tid: str) -> int:
        """Distinct done completions: a ``recovered`` done only completes a journaled move."""
        finished = len(self.done_attempts.get(tid, ()))
        return finished or min(1, self.recovered_done[tid])


def journal(run_dir: Path) -> Journal:
    j = Journal()
    for e in read_events(run_dir):
        tid = event_task(e)
        if tid is None:
            continue
        if e.get("ev") == "started":
            j.started[tid] += 1
        state = event_state(e)
        if state is not None:
            j.last[tid] = (state, e)
        if state == "done" and e.get("ev") == "finished":
            j.done_attempts.setdefault(tid, set()).add(e.get("attempt"))
        elif state == "done":
            j.recovered_done[tid] += 1
    return j


def check_run(
    run_dir: Path,
    expected: Iterable[str] | set[str],
    *,
    shared: Path | None = None,
    corrupted: Iterable[str] = (),
    final: bool = True,
    settle: float = 10.0,
    use_check: bool = True,
    allow_temp_files: bool = False,
) -> Report:
    """Check every invariant; raise AssertionError naming all violations; return the report."""
    rep = Report(run_dir)
    expected = set(expected)
    _check_places(rep, expected, set(corrupted))
    if rep.temp_files and not allow_temp_files:
        rep.problems.append(f"temp files left behind: {rep.temp_files}")
    j = journal(run_dir)
    _check_outcomes(rep, j, final)
    if shared is not None:
        for tid, data in rep.descriptors.items():
            _check_effects(rep, tid, data, side_effects(shared, tid))
    if final:
        rep.orphans = surviving_processes(run_dir, settle)
    _check_events(rep, j)
    if final:
        _check_summary(rep, len(expected))
    if use_check:
        _check_with_cli(rep, allow_temp_files)

    print(f"invariants: {rep.line()}")
    for line in rep.silent_lost:
        print(f"  {line}")
    errors = rep.problems + [f"orphan: {o}" for o in rep.orphans] + rep.duplicates
    assert not errors, f"{run_dir}: {len(errors)} invariant violations:\n" + "\n".join(errors)
    return rep


def _check_places(rep: Report, expected: set[str], may_be_corrupt: set[str]) -> None:
    """1. nothing lost, nothing in two folders, nothing unknown; corrupt only if corrupted."""
    where, rep.temp_files = folders(rep.run_dir)
    for tid in sorted(expected - set(where)):
        rep.lost.append(tid)
        rep.problems.append(f"{tid}: lost (in no folder)")
    for tid in sorted(set(where) - expected):
        rep.problems.append(f"{tid}: unknown task in {where[tid]}")
    for tid, places in sorted(where.items()):
        if len(places) != 1:
            rep.problems.append(f"{tid}: in {len(places)} folders: {places}")
            continue
        state, name = places[0]
        rep.states[tid] = state
        if state == "corrupt":
            rep.corrupt[tid] = name
            if tid not in may_be_corrupt:
                rep.problems.append(f"{tid}: moved to corrupt/ ({name}) but was never corrupted")
            elif "." not in name[name.find(".json") + 5 :]:
                rep.problems.append(f"{tid}: corrupt/{name} carries no reason")
            continue
        try:
            data = json.loads((rep.run_dir / ".parallel" / state / name).read_bytes())
        except (OSError, ValueError) as exc:
            rep.problems.append(f"{tid}: {state}/{name} unreadable: {exc}")
            continue
        rep.descriptors[tid] = data
        if data.get("id") != tid:
            rep.problems.append(f"{tid}: {state}/{name} holds id {data.get('id')!r}")


def _check_outcomes(rep: Report, j: Journal, final: bool) -> None:
    """2. done exactly once (one attempt exited 0, one done transition), or failed with a reason."""
    for tid, data in rep.descriptors.items():
        state = rep.states[tid]
        attempts = data.get("attempts", [])
        if final and state == "running":
            rep.problems.append(f"{tid}: still in running/ after the run ended")
        if state == "done":
            ok = [a for a in attempts if _ok(a)]
            if not attempts or not _ok(attempts[-1]):
                rep.problems.append(f"{tid}: done but its last attempt did not exit 0: {attempts}")
            if len(ok) != 1:
                rep.duplicates.append(f"{tid}: {len(ok)} attempts exited 0")
            if j.completions(tid) > 1:
                rep.duplicates.append(f"{tid}: done by {j.done_attempts[tid]} in the journal")
        elif j.completions(tid):
            rep.problems.append(f"{tid}: journal says done, folder {state}")
        if state == "failed" and not data.get("reason"):
            rep.problems.append(f"{tid}: failed without a reason")


def _check_events(rep: Report, j: Journal) -> None:
    """5. the last state-changing event names the folder; one started event per attempt."""
    for tid, state in rep.states.items():
        said, ev = j.last.get(tid, ("pending", {}))
        if said != state:
            rep.problems.append(f"{tid}: last event says {said} ({ev}), folder {state}")
        if state in ("running", "corrupt"):
            continue
        attempts = rep.descriptors.get(tid, {}).get("attempts", [])
        lost = sum(1 for a in attempts if a.get("kind") == "lost")
        seen = j.started[tid]
        if not len(attempts) - lost <= seen <= len(attempts):
            rep.problems.append(f"{tid}: {seen} started events for attempts {attempts}")
        elif seen < len(attempts):
            rep.silent_lost.append(f"{tid}: {len(attempts) - seen} lost attempt(s) without start")


def _check_summary(rep: Report, total: int) -> None:
    """6. summary.json counts what the folders hold (corrupt/ too) and every task of the run."""
    path = rep.run_dir / "summary.json"
    if not path.exists():
        return
    summary = json.loads(path.read_text())
    counts = summary.get("counts", {})
    mine = rep.counts()
    for state in {*STATES, "corrupt", *counts}:
        if counts.get(state, 0) != mine.get(state, 0):
            rep.problems.append(f"summary counts {counts} != folders {dict(mine)}")
            break
    if summary.get("total") != total:
        rep.problems.append(f"summary total {summary.get('total')}, the run has {total} tasks")


def _check_with_cli(rep: Report, allow_temp_files: bool) -> None:
    """7. ``gpuswarm check`` agrees that the run is consistent."""
    verdict = cli_check(rep.run_dir)
    if verdict is None:
        return
    rep.check = verdict
    findings = [f for f in verdict.get("findings", []) if not f.get("repaired")]
    if allow_temp_files:
        findings = [f for f in findings if f.get("kind") != "temp-file"]
    if verdict.get("exit_code") != 0 and (findings or not verdict.get("findings")):
        rep.problems.append(f"gpuswarm check exit {verdict.get('exit_code')}: {findings}")


def _check_effects(rep: Report, tid: str, data: dict[str, Any], lines: list[int]) -> None:
    attempts = data.get("attempts", [])
    by_n = {int(a.get("n", i + 1)): a for i, a in enumerate(attempts)}
    for n, times in Counter(lines).items():
        if times > 1:
            rep.duplicates.append(f"{tid}: attempt {n} completed {times} times")
    for n in sorted(set(lines)):
        a = by_n.get(n)
        if a is None:
            rep.problems.append(f"{tid}: side effect of attempt {n}, which is not recorded")
        elif _cut_off(a):
            rep.reexecuted.append(f"{tid}: attempt {n} ({a.get('kind')}) ran to completion")
        elif not _ok(a):
            rep.problems.append(f"{tid}: side effect of attempt {n}, which ended {a}")
    for n, a in by_n.items():
        if _ok(a) and n not in lines:
            rep.problems.append(f"{tid}: attempt {n} exited 0 but left no side effect")
    if rep.states.get(tid) == "done" and not lines:
        rep.problems.append(f"{tid}: done without its side effect")


# -- gpuswarm check, when it exists ------------------------------------------------------------
def cli_check(run_dir: Path) -> dict[str, Any] | None:
    """What ``gpuswarm check RUN --json`` says, with ``exit_code`` (0 = consistent), or None
    when this gpuswarm has no ``check``. Called in-process (``gpuswarm.outputs.check.check_run``,
    what
    the command prints): a subprocess per scenario would cost the suite ~10 s."""
    try:
        from gpuswarm.outputs.check import check_run as gpuswarm_check
    except ImportError:
        return None
    report: dict[str, Any] = dict(gpuswarm_check(run_dir))
    report["exit_code"] = 0 if report.get("consistent") else 1
    return report
