"""What a slot actor (``actor.py``) answers the driver (``handle.py``, ``slots.py``,
``backend.py``) through Ray: one typed shape per method."""

from __future__ import annotations

from typing import TypedDict


class EndWire(TypedDict):
    """An ``AttemptEnd`` on the wire (``actor.end_dict``)."""

    kind: str
    returncode: int | None
    signal: str | None
    reason: str
    oom: bool
    started: float
    ended: float
    pid: int | None
    killed: int


class ActorInfo(TypedDict):
    """``SlotActor.info``: where the actor runs."""

    host: str
    node: str
    gpus: list[int]
    pid: int


class _Setup(TypedDict):
    rc: int | None
    tail: str
    ran: bool


class SetupReply(_Setup, total=False):
    """``SlotActor.setup``: the per-node setup's exit code and its output's tail."""

    reason: str


class StartReply(TypedDict, total=False):
    """``SlotActor.start``: started (its pid), or the folders the node still needs."""

    pid: int | None
    started: bool
    need_tree: bool
    need_home: bool


class _Poll(TypedDict):
    known: bool  # False: the actor has no such attempt (nothing else is said)


class PollReply(_Poll, total=False):
    """``SlotActor.poll``: new log bytes, and the outcome once every byte was handed over."""

    data: bytes
    offset: int
    end: EndWire
    files: list[tuple[str, bytes]]
    error: str | None


class HeldAttempt(TypedDict):
    """``SlotActor.attempts``: one attempt the actor holds (a reattaching driver's)."""

    token: str
    identity: dict[str, str]
    ended: bool
    log: str
    workspace: str
