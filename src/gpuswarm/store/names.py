"""The names of queue files: ``<rank><seq>_<task-id>.json``, plus the lease in a running one.

The one place that knows the format (the lease part is :class:`gpuswarm.core.models.Lease`);
the queue, recovery, ``check``, ``status`` and research read names through these functions.
"""

from __future__ import annotations

import zlib

from gpuswarm.core.models import LEASE_SEP, Lease, base_name

PRIORITY_LIMIT = 4999
_RANK_SEQ = 14  # 4 digits of rank, 9 of seq, then "_"


def descriptor_name(priority: int, seq: int, task_id: str) -> str:
    """``<rank><seq>_<task-id>.json``: lexicographic order = higher priority, then earlier seq."""
    if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
        raise ValueError(f"priority {priority} outside -{PRIORITY_LIMIT}..{PRIORITY_LIMIT}")
    return f"{5000 - priority:04d}{seq:09d}_{task_id}.json"


def lease_of(file_name: str) -> tuple[str, int] | None:
    """``(owner, slot)`` encoded in a running descriptor's name (``@owner@slot.claim``)."""
    lease = Lease.parse(file_name)
    return (lease.owner, lease.slot) if lease is not None else None


def task_id_of(file_name: str) -> str:
    stem = base_name(file_name) if LEASE_SEP in file_name else file_name
    return stem[_RANK_SEQ:-5] if stem.endswith(".json") else stem[_RANK_SEQ:]


def seq_of(file_name: str) -> int:
    """The submission seq in a queue file's name; -1 for a name without one."""
    stem = base_name(file_name) if LEASE_SEP in file_name else file_name
    digits = stem[4 : _RANK_SEQ - 1]
    return int(digits) if digits.isdigit() else -1


def corrupt_task_id(name: str) -> str | None:
    """The task id of a file in corrupt/ (``<descriptor name>[@lease].<reason>``)."""
    end = name.find(".json")
    return name[_RANK_SEQ:end] if end > _RANK_SEQ else None


def corrupt_reason(name: str) -> str:
    """The reason part of a file in corrupt/ (what the quarantine wrote after the name)."""
    return name.split(".json", 1)[1].lstrip(".").split(LEASE_SEP)[-1]


def claim_name(base: str, owner: str, slot: int, claim: int) -> str:
    """The running file's name of claim number ``claim`` of ``base`` by ``owner``'s slot."""
    return Lease(owner, slot, str(claim)).file_name(base)


def reclaim_name(name: str, me: str) -> str:
    """The name a reclaimer gives a dead owner's running file: it encodes the claim's name.

    The suffix is a checksum of the name the task was claimed under; a reclaim of a reclaim
    keeps it, so recovery can always tell the move that claim began.
    """
    lease = Lease.parse(name)
    if lease is not None and lease.reclaimer and lease.claim:
        suffix = lease.claim
    else:
        suffix = f"{zlib.crc32(name.encode()):08x}"
    return Lease(me, -1, suffix).file_name(base_name(name))


def reclaimed_from(name: str, begun: str) -> bool:
    """Whether running file ``name`` is a reclaim of the claim named ``begun``."""
    lease = Lease.parse(name)
    return (
        lease is not None and lease.reclaimer and lease.claim == f"{zlib.crc32(begun.encode()):08x}"
    )


def leased_by(name: str, owners: list[str]) -> bool:
    """Whether ``name`` (a running file, or a temp file of its write) is leased by one of
    ``owners``: their names carry the claimed file's name, so the owner is in them."""
    return any(Lease.owner_mark(owner) in name for owner in owners)


__all__ = [
    "PRIORITY_LIMIT",
    "base_name",
    "claim_name",
    "corrupt_reason",
    "corrupt_task_id",
    "descriptor_name",
    "lease_of",
    "leased_by",
    "reclaim_name",
    "reclaimed_from",
    "seq_of",
    "task_id_of",
]
