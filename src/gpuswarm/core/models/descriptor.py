"""The descriptor: a task in the queue, its spec, attempts, budget and where it stands."""

from __future__ import annotations

import json
from typing import Any

from gpuswarm.core.models.budget import AttemptBudget
from gpuswarm.core.models.kinds import DESCRIPTOR_VERSION, RecordError, State
from gpuswarm.core.records import descriptor_problem, parse_descriptor
from gpuswarm.core.taskdump import TaskDump


class Descriptor(AttemptBudget):
    """A task in the queue: its spec (``task``), its attempts, its budget and where it stands.

    A typed view over the descriptor's JSON object (:attr:`raw`, the one form written to disk):
    every read and write of a descriptor goes through these properties (its attempts' through
    :class:`~gpuswarm.core.models.budget.AttemptBudget`, its mixin)."""

    __slots__ = ("raw",)

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    # construction ------------------------------------------------------------------------
    @classmethod
    def new(cls, task: TaskDump | dict[str, Any], seq: int) -> Descriptor:
        """A fresh pending descriptor of ``task`` (a TaskSpec dump), the ``seq``-th submitted."""
        return cls(
            {
                "v": DESCRIPTOR_VERSION,
                "id": task["id"],
                "seq": seq,
                "task": task,
                "attempts": [],
                "budget_from": 0,
                "interruptions": 0,
                "reason": None,
                "state": State.PENDING.value,
            }
        )

    @classmethod
    def from_json(cls, obj: Any, *, task_fields: bool = True) -> Descriptor:
        """The descriptor of a parsed JSON value; RecordError naming the finding when it is
        no descriptor (``attempts is str, not list``). ``task_fields=False`` leaves the task's
        own fields to the caller (a claim validates the whole task)."""
        problem = descriptor_problem(obj, task_fields=task_fields)
        if problem is not None:
            raise RecordError(problem)
        return cls(obj)

    @classmethod
    def parse(cls, raw: bytes) -> Descriptor:
        """The descriptor in a file's bytes; RecordError saying why not (empty, not JSON,
        mistyped), in the words :func:`parse_descriptor` uses."""
        data, problem = parse_descriptor(raw)
        if data is None:
            raise RecordError(problem or "unusable")
        return cls(data)

    @classmethod
    def loads(cls, raw: bytes | str, *, task_fields: bool = True) -> Descriptor:
        """Like :meth:`parse`, but a file that is no JSON raises json's own ValueError (a
        claim names the file it sets aside by that message)."""
        return cls.from_json(json.loads(raw), task_fields=task_fields)

    def to_json(self) -> dict[str, Any]:
        return self.raw

    # identity ----------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return str(self.raw["id"])

    @property
    def has_id(self) -> bool:
        return "id" in self.raw

    def default_id(self, task_id: str) -> None:
        """Name a descriptor that lacks its id (hand-edited) by its file's task id."""
        self.raw.setdefault("id", task_id)

    @property
    def name(self) -> str:
        """The task's display name ("" when the spec has none)."""
        return str(self.task.get("name", ""))

    @property
    def seq(self) -> int:
        return int(self.raw.get("seq", 0))

    @property
    def inputs(self) -> dict[str, str]:
        """The values the task was made from (a matrix combination, a glob match's fields)."""
        found = self.task.get("vars")
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    @property
    def task(self) -> dict[str, Any]:
        """The task spec's JSON form (a TaskSpec dump; config validates it)."""
        task: dict[str, Any] = self.raw["task"]
        return task

    @task.setter
    def task(self, spec: TaskDump | dict[str, Any]) -> None:
        self.raw["task"] = spec

    @property
    def priority(self) -> int:
        return int(self.task.get("priority", 0))

    @property
    def max_attempts(self) -> int:
        return int(self.task.get("max_attempts", 1))

    # issue 35: prerequisites and groups --------------------------------------------------
    def _ids(self, key: str) -> list[str]:
        found = self.task.get(key)
        return [str(t) for t in found] if isinstance(found, list) else []

    @property
    def after(self) -> list[str]:
        """Task ids that must end done before it starts."""
        return self._ids("after")

    @property
    def after_any(self) -> list[str]:
        """Task ids that must end (in any state) before it starts."""
        return self._ids("after_any")

    @property
    def after_failed(self) -> list[str]:
        """Task ids of which one must fail for it to start (ended otherwise: it is skipped)."""
        return self._ids("after_failed")

    @property
    def has_prerequisites(self) -> bool:
        return bool(self.after or self.after_any or self.after_failed)

    @property
    def group(self) -> str | None:
        group = self.task.get("group")
        return group if isinstance(group, str) and group else None

    @property
    def env(self) -> dict[str, str]:
        """The task's own environment (its values may be secrets: outputs redact them)."""
        env: dict[str, str] = self.task.get("env") or {}
        return env

    @property
    def timeout(self) -> float | None:
        """Seconds, as written (an int stays an int in JSON outputs)."""
        timeout: float | None = self.task.get("timeout")
        return timeout

    @property
    def skip_reason(self) -> str | None:
        why = self.task.get("skip_reason")
        return str(why) if why else None

    # where it stands ---------------------------------------------------------------------
    @property
    def state(self) -> str | None:
        """The recorded state (a :class:`State` value; in running/ the move it began)."""
        state = self.raw.get("state")
        return state if isinstance(state, str) else None

    @state.setter
    def state(self, state: State) -> None:
        self.raw["state"] = state.value

    @property
    def moved_from(self) -> str | None:
        """The leased name a begun move started from (recovery finishes that move)."""
        begun = self.raw.get("moved_from")
        return begun if isinstance(begun, str) else None

    @moved_from.setter
    def moved_from(self, name: str) -> None:
        self.raw["moved_from"] = name

    @property
    def reason(self) -> str | None:
        reason: str | None = self.raw.get("reason")
        return reason

    @reason.setter
    def reason(self, reason: str | None) -> None:
        self.raw["reason"] = reason

    @property
    def result(self) -> dict[str, object] | None:
        """The completion file's values (``metrics.flatten``'s: the task's own JSON)."""
        result: dict[str, object] | None = self.raw.get("result")
        return result

    @result.setter
    def result(self, result: dict[str, object] | None) -> None:
        self.raw["result"] = result

    @property
    def retry_at(self) -> float | None:
        """When a failed attempt's backoff ends (set while it waits in running/)."""
        at = self.raw.get("retry_at")
        return float(at) if at is not None else None

    @retry_at.setter
    def retry_at(self, at: float | None) -> None:
        if at is None:
            self.raw.pop("retry_at", None)
        else:
            self.raw["retry_at"] = at

    def take_retry_at(self) -> float | None:
        """Clear the backoff mark and return what it was (None: it was not waiting)."""
        at = self.raw.pop("retry_at", None)
        return float(at) if at is not None else None

    # GPU memory (issue 19) -----------------------------------------------------------------
    @property
    def gpu_memory_mb(self) -> int | None:
        """The GPU memory its next attempt reserves, raised after a CUDA out-of-memory end
        (None: the task's own ``gpu_memory``, or none)."""
        mb = self.raw.get("gpu_memory_mb")
        return mb if isinstance(mb, int) and not isinstance(mb, bool) and mb > 0 else None

    @gpu_memory_mb.setter
    def gpu_memory_mb(self, mb: int | None) -> None:
        if mb is None:
            self.raw.pop("gpu_memory_mb", None)
        else:
            self.raw["gpu_memory_mb"] = int(mb)

    # transitions' bookkeeping ------------------------------------------------------------
    def mark_skipped(self, reason: str) -> None:
        """Created skipped (an ``exclude:`` glob matched it): listed, never run."""
        self.raw["state"] = State.SKIPPED.value
        self.raw["reason"] = reason

    def mark_blocked(self) -> None:
        """Waiting for its prerequisites (blocked/): a new task, or one brought back by a
        retry of the prerequisite that failed."""
        self.raw["state"] = State.BLOCKED.value
        self.raw["reason"] = None

    def mark_dependency_failed(self, reason: str) -> None:
        """A prerequisite did not succeed: ended without running (issue 35)."""
        self.raw["state"] = State.DEPENDENCY_FAILED.value
        self.raw["reason"] = reason

    def mark_cancelled(self, reason: str) -> None:
        """Cancelled by a person (``gpuswarm cancel``): ended, never retried, no failure."""
        self.raw["state"] = State.CANCELLED.value
        self.raw["reason"] = reason
        self.raw.pop("retry_at", None)

    def set_priority(self, priority: int) -> None:
        """The task's new priority (``gpuswarm priority``): it decides its queue name's rank."""
        task = self.raw.get("task")
        if isinstance(task, dict):
            task["priority"] = priority

    def fresh_budget(self) -> None:
        """A failed (or cancelled) task retried: earlier attempts stop counting; marked as a
        begun retry."""
        self.raw["budget_from"] = self.attempt_count
        self.raw["reason"] = None
        self.raw["state"] = State.PENDING.value

    def __repr__(self) -> str:
        return f"Descriptor({self.raw!r})"

    @property
    def id_if_any(self) -> str | None:
        """The id, or None where the descriptor lacks one (a hand-edited file, journaled as
        it is)."""
        found = self.raw.get("id")
        return None if found is None else str(found)
