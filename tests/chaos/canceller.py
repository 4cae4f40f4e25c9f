"""Cancel each task of a live run just as its first attempt ends (test_cancel_race.py).

usage: python canceller.py RUN_DIR PLAN.json OUT.jsonl STOP_FILE

PLAN maps task ids to seconds: once a task is first seen in running/ (a listing every 2 ms),
it is cancelled that long after, by ``control_ops.cancel_tasks``, what ``gpuswarm cancel``
calls: a process of its own, as a person's command is, serialised with the run's other
commands by the control lock. Each call is one line of OUT: the task, the command's row (the
attempt its request is bound to) and the call's wall-clock start and end. It creates STOP_FILE
once it is ready and waits for the test to remove it (the run starts then); it ends once every
task was cancelled, or when STOP_FILE exists again (the run is over).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    from gpuswarm.app.control import cancel_tasks
    from gpuswarm.store.names import task_id_of

    run_dir, plan_path, out_path, stop = (Path(a) for a in sys.argv[1:5])
    plan: dict[str, float] = json.loads(plan_path.read_text())
    running = run_dir / ".parallel" / "running"
    due: dict[str, float] = {}
    left = set(plan)
    stop.touch()  # ready: the test removes it, starts the run, and creates it at its end
    while stop.exists():
        time.sleep(0.002)
    with out_path.open("a") as out:
        while left and not stop.exists():
            now = time.monotonic()
            for name in os.listdir(running):
                if name.startswith("."):  # a temp file of a write, no lease
                    continue
                tid = task_id_of(name)
                if tid in left and tid not in due:
                    due[tid] = now + plan[tid]
            for tid in sorted((t for t in left if t in due and due[t] <= now), key=due.__getitem__):
                t0 = time.time()
                (row,) = cancel_tasks(run_dir, [tid], reason="race", wait=None)["tasks"]
                line = {"task": tid, "row": row, "t0": t0, "t1": time.time()}
                out.write(json.dumps(line) + "\n")
                out.flush()
                left.discard(tid)
            time.sleep(0.002)
    return 0


if __name__ == "__main__":
    sys.exit(main())
