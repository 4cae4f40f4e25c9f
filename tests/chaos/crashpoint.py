"""Run the gpuswarm CLI with a SIGKILL planted at one precise point of its code.

usage: python crashpoint.py POINT -- CLI-ARGS...

The process SIGKILLs itself (nothing after that point runs, exactly like ``kill -9``) the Nth
time it reaches POINT:

- ``emit:EV[:KEY=VALUE][#N]``: just before writing the Nth event EV whose field KEY is VALUE;
  every transition renames first and journals second, so this is "the rename happened, its
  event was never written";
- ``emitted:EV[:KEY=VALUE][#N]``: just after writing that event (a transition fully done);
- ``claimed[#N]``: just after the Nth claim's rename into running/, before anything is launched;
- ``state-written:STATE[#N]``: inside ``DirQueue.move``, after the descriptor with its new
  ``state`` was written in running/, before the rename that moves it there;
- ``temp-left:STATE[#N]``: inside that write, with its temp file written and not yet renamed
  over the descriptor (``fsutil.atomic_write_bytes`` killed before its ``os.replace``);
- ``cancel-ended[#N]``: an attempt a control request cancelled has ended (its processes are
  gone), before its commit began (nothing of it saved or journaled);
- ``group-synced[#N]``: a group commit of several outcomes made their saved descriptors
  durable; none is in place, journaled or renamed yet;
- ``group-saved[#N]``: inside such a group, the Nth descriptor (default 2: the first is
  journaled and renamed, the second saved in place, not journaled) was saved.

Used by test_crash_points.py to hit, every time, the windows that random kills hit rarely.
Each point arms a named fault point of ``gpuswarm.core.faults`` (the code calls
``faults.point(NAME)`` at that moment): a point that was moved keeps its name, and a name the code
no longer declares fails loudly instead of never firing.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gpuswarm.core import faults


def _in_running_with_state(state: str) -> faults.Predicate:
    def when(ctx: dict[str, Any]) -> bool:
        path, data = ctx["path"], ctx["data"]
        return bool(path.parent.name == "running" and json.loads(data).get("state") == state)

    return when


def _several(ctx: dict[str, Any]) -> bool:
    return int(ctx["count"]) >= 2


def _in_group_kill(nth: int) -> None:
    """SIGKILL at the ``nth`` save of the first group commit of at least ``nth`` outcomes."""
    group = {"left": 0}

    def synced(spec: str) -> None:
        return None

    def started(ctx: dict[str, Any]) -> bool:
        if int(ctx["count"]) >= nth and group["left"] == 0:
            group["left"] = nth
        return False  # never fires: it only notes the group

    def saved(ctx: dict[str, Any]) -> bool:
        if group["left"] <= 0:
            return False
        group["left"] -= 1
        return group["left"] == 0

    faults.arm("queue.group.synced:kill", when=started, action=synced)
    faults.arm("queue.move.saved:kill", when=saved)


def install(point: str) -> None:
    """Arm the fault point that ``point`` (the grammar of the module docstring) names."""
    spec, _, nth = point.partition("#")
    kind, _, rest = spec.partition(":")
    count = f"#{nth}" if nth else ""
    if kind in ("emit", "emitted"):
        ev, _, match = rest.partition(":")
        query = "&".join(filter(None, [f"ev={ev}", match]))
        where = "before" if kind == "emit" else "after"
        faults.arm(f"ledger.emit.{where}?{query}:kill{count}")
    elif kind == "claimed" and not rest:
        faults.arm(f"queue.claimed:kill{count}")
    elif kind == "state-written":
        faults.arm(f"queue.move.saved?state={rest}:kill{count}")
    elif kind == "cancel-ended" and not rest:
        faults.arm(f"committer.cancel.ended:kill{count}")
    elif kind == "group-synced" and not rest:
        faults.arm(f"queue.group.synced:kill{count}", when=_several)
    elif kind == "group-saved" and not rest:
        _in_group_kill(int(nth or 2))
    elif kind == "temp-left":
        faults.arm(f"fsutil.temp_written:kill{count}", when=_in_running_with_state(rest))
    else:
        raise SystemExit(f"crashpoint: unknown point {point!r}")


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        raise SystemExit(__doc__)
    install(sys.argv[1])
    from gpuswarm.cli import main as cli_main

    sys.argv = ["gpuswarm", *sys.argv[3:]]
    cli_main()


if __name__ == "__main__":
    main()
