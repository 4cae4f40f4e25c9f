"""Groups in the claim path (issue 35): ``groups: {NAME: {max_parallel: N}}`` and
``gpuswarm pause --group NAME``.

:meth:`GroupGate.wrap` adds a refusal to the claim's placement predicate (``DirQueue.claim``'s
``accept``) for a task of a paused group, or of a group that has ``max_parallel`` tasks in
running/ already. A run without caps and without a paused group gets the predicate back as it
was: its claim path is untouched. A pending task's group is read from its descriptor once (then
kept by task id); the running count is a listing of running/ (a slot's worth of names). Claims
of this host's supervisors take turns (``packing``'s claim lock), so on one host the cap is
exact; a supervisor on another host may claim in the same instant.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from gpuswarm.core.errors import RunDirError
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.names import task_id_of
from gpuswarm.store.runinfo import RunRecord, read_record

Accept = Callable[[str], bool]
LOOK_EVERY = 0.25  # seconds between looks at the paused groups' folder


def caps_of(info: RunRecord) -> dict[str, int]:
    """``max_parallel`` per group, from run.json's config."""
    groups = info.config.get("groups")
    out: dict[str, int] = {}
    for name, cfg in (groups or {}).items():
        cap = cfg.get("max_parallel") if isinstance(cfg, dict) else None
        if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
            out[str(name)] = cap
    return out


def gate_of(paths: RunPaths) -> GroupGate:
    """The gate of a run (no caps when its run.json cannot be read: a bare queue)."""
    try:
        info = read_record(paths.run_json)
    except RunDirError:
        info = RunRecord()
    return GroupGate(paths, caps_of(info))


class GroupGate:
    def __init__(self, paths: RunPaths, caps: dict[str, int]) -> None:
        self.paths = paths
        self.caps = caps
        self._groups: dict[str, str | None] = {}  # task id -> group
        self._paused: frozenset[str] = frozenset()
        self._looked = 0.0
        self._refused = False  # a cap or a pause refused a task since the last look

    def paused(self) -> frozenset[str]:
        now = time.monotonic()
        if now - self._looked >= LOOK_EVERY:
            self._looked = now
            try:
                self._paused = frozenset(os.listdir(self.paths.paused_groups))
            except FileNotFoundError:
                self._paused = frozenset()
        return self._paused

    def wrap(self, accept: Accept | None) -> Accept | None:
        """``accept`` with the groups' refusals added (itself when nothing is capped or
        paused)."""
        paused = self.paused()
        if not self.caps and not paused:
            return accept

        def gated(name: str) -> bool:
            group = self._group(State.PENDING, name)
            if group is not None and (group in paused or self._full(group)):
                self._refused = True
                return False
            return accept is None or accept(name)

        return gated

    def take_refused(self) -> bool:
        """Whether a task was refused since the last call (the loop claims again when woken:
        a running task of the group ends, in running/ until its commit)."""
        refused, self._refused = self._refused, False
        return refused

    def _full(self, group: str) -> bool:
        cap = self.caps.get(group)
        if cap is None:
            return False
        try:
            names = os.listdir(self.paths.state_dir(State.RUNNING.value))
        except FileNotFoundError:
            return False
        running = sum(
            1 for n in names if not n.startswith(".") and self._group(State.RUNNING, n) == group
        )
        return running >= cap

    def _group(self, state: State, name: str) -> str | None:
        tid = task_id_of(name)
        if tid in self._groups:
            return self._groups[tid]
        try:
            raw = json.loads((self.paths.state_dir(state.value) / name).read_bytes())
            group = raw["task"].get("group")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # gone (claimed meanwhile) or unreadable: the claim tells
        found = group if isinstance(group, str) else None
        self._groups[tid] = found
        return found
