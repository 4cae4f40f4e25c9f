"""The lease: who holds a running descriptor, written in its file name."""

from __future__ import annotations

from dataclasses import dataclass

LEASE_SEP = "@"


@dataclass(frozen=True)
class Lease:
    """Who holds a running descriptor: in its file name, ``<name>@<owner>@<slot>.<claim>``.

    ``owner`` is ``host:pid:start``; ``slot`` the owner's slot index (-1: a reclaimer, no slot
    runs it); ``claim`` makes each claim's name unique (a claim counter, or for a reclaimer the
    checksum of the name the task was claimed under)."""

    owner: str
    slot: int
    claim: str = ""

    @classmethod
    def parse(cls, file_name: str) -> Lease | None:
        """The lease in a running file's name; None for a name without one."""
        parts = file_name.split(LEASE_SEP)
        if len(parts) != 3:
            return None
        slot, _, claim = parts[2].partition(".")
        try:
            return cls(parts[1], int(slot), claim)
        except ValueError:
            return None

    @property
    def suffix(self) -> str:
        """What a claim appends to the descriptor's name."""
        tail = f"{self.slot}.{self.claim}" if self.claim else str(self.slot)
        return f"{LEASE_SEP}{self.owner}{LEASE_SEP}{tail}"

    def file_name(self, base: str) -> str:
        return base + self.suffix

    @property
    def reclaimer(self) -> bool:
        return self.slot < 0

    @staticmethod
    def owner_mark(owner: str) -> str:
        """The part of every file name leased by ``owner`` (temp files of its writes too)."""
        return f"{LEASE_SEP}{owner}{LEASE_SEP}"


def base_name(file_name: str) -> str:
    """The descriptor name without a lease suffix."""
    return file_name.split(LEASE_SEP, 1)[0]
