"""One gpuswarm run in this process, its CPU counted per thread, with one mechanism switched off.

Run by ``bench/mechanisms.py`` (never by a user; nothing of gpuswarm reads the switch)::

    python bench/mechanism_child.py SWITCH CMDS WORKSPACE OUT.json

``SWITCH`` names a monkeypatch of :data:`mechanism_switches.SWITCHES` (``none``: the real
thing). The run is ``gpuswarm run -q --no-report --gpus sim:8 --workspace WORKSPACE CMDS``
through the CLI's own entry point; each thread's CPU time (``time.thread_time`` read by the
thread itself when it ends) is summed by role: main (split at the supervisor's start and end:
before, during, after), the slot loop, the committer, the log pump, the keeper, the heartbeat and
the waiter threads. ``OUT.json`` gets those sums in seconds.
"""

from __future__ import annotations

import cProfile
import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from mechanism_switches import SWITCHES

ROLES = {"slots": "loop", "keeper": "keeper", "heartbeat": "heartbeat", "log-pump": "pump"}
_cpu: dict[str, float] = defaultdict(float)
_lock = threading.Lock()
_marks: dict[str, float] = {}


def _role(name: str) -> str:
    if name.startswith("commit-"):
        return "committer"
    return ROLES.get(name, "other threads")


def _profiler(name: str) -> cProfile.Profile | None:
    """$BENCH_PROFILE=PREFIX: the loop and committer threads are profiled on their CPU clock."""
    if not os.environ.get("BENCH_PROFILE") or _role(name) not in ("loop", "committer"):
        return None
    return cProfile.Profile(time.thread_time)


def _count_threads() -> None:
    """Every thread adds its own CPU time to its role's sum when it ends."""
    run = threading.Thread.run

    def counted(self: threading.Thread) -> None:
        prof = _profiler(self.name)
        try:
            if prof is not None:
                prof.runcall(run, self)
            else:
                run(self)
        finally:
            if prof is not None:
                prof.dump_stats(f"{os.environ['BENCH_PROFILE']}.{_role(self.name)}")
            used = time.thread_time()
            with _lock:
                _cpu[_role(self.name)] += used

    threading.Thread.run = counted  # type: ignore[method-assign]


def _mark_supervisor() -> None:
    """The main thread's CPU at the supervisor's start and end (its per-task share: 'during')."""
    from gpuswarm.supervise.supervisor import Supervisor

    real = Supervisor.run

    def marked(self: Supervisor) -> None:
        _marks["start"] = time.thread_time()
        try:
            real(self)
        finally:
            _marks["end"] = time.thread_time()

    Supervisor.run = marked  # type: ignore[method-assign]


def main() -> int:
    switch, cmds, ws, out = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    _count_threads()
    _mark_supervisor()
    SWITCHES[switch].apply()
    from gpuswarm.cli import cli

    argv = ["run", "-q", "--no-report", "--gpus", "sim:8", "--workspace", ws, cmds]
    code = 0
    try:
        cli.main(argv, prog_name="gpuswarm", standalone_mode=False)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    total = time.thread_time()
    start, end = _marks.get("start", total), _marks.get("end", total)
    result = dict(_cpu)
    result.update({"main before": start, "main during": end - start, "main after": total - end})
    result["exit"] = code
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
