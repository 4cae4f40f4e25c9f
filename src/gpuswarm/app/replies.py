"""What a queue verb says back (:func:`gpuswarm.app.control.execute`): one typed shape per verb,
the JSON ``gpuswarm <verb> --json``, the dashboard's actions and the api give as they are."""

from __future__ import annotations

from typing import TypedDict, final


class _Row(TypedDict):
    task: str
    was: str  # its state before
    now: str  # its state after (or "cancel requested", "gone")
    note: str


class TaskRow(_Row, total=False):
    """One task a cancel, retry or requeue named."""

    attempt: int | None  # a running task's cancel: the attempt it was asked of


@final
class AddReply(TypedDict):
    run: str
    added: int
    ids: list[str]  # the first ones (adding.SHOWN_IDS)
    renamed: dict[str, str]  # an id the run had already -> its new one (the first ones)
    renamed_count: int
    live: bool
    hint: str  # how to run them when no supervisor is live


@final
class CancelReply(TypedDict):
    run: str
    tasks: list[TaskRow]
    live: bool
    timed_out: bool  # --wait: a running task had not stopped in time


@final
class RetryReply(TypedDict):
    """A retry's or a requeue's."""

    run: str
    tasks: list[TaskRow]
    retried: int
    live: bool
    hint: str


class _Paused(TypedDict):
    run: str
    changed: bool
    paused: bool


@final
class PauseReply(_Paused, total=False):
    """A pause's or an unpause's: of the run or a slot, or (``group``) of a group."""

    slot: str | None
    paused_slots: list[str]
    live: bool
    group: str


@final
class PriorityReply(TypedDict):
    run: str
    task: str
    priority: int
    was: int | None


Reply = AddReply | CancelReply | RetryReply | PauseReply | PriorityReply
