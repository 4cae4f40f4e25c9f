"""The typed records of a run: queue states, attempt end kinds, the lease, attempt records and the
descriptor. Each has one JSON form (what today's code writes, so old run folders still open) and
no module but this package reads or writes their raw keys. Import them from here
(``gpuswarm.core.models``); the modules inside are kinds, lease, attempt, descriptor and
budget (the descriptor's attempts, a mixin).

Why a :class:`Descriptor` is a typed view over its JSON object instead of a copy of it: a claim
and a commit happen once per task on the hot path, and the object read from disk is the object
written back (unknown keys a newer or older gpuswarm wrote ride along untouched). Wrapping costs
nothing; a copy in and out costs a conversion each way (measured: the view adds no work to a
claim; a frozen AttemptRecord cost ~12 us more per commit than the slotted one it is). A lease is
a small immutable value: a frozen dataclass.
"""

from __future__ import annotations

from gpuswarm.core.models.attempt import AttemptRecord
from gpuswarm.core.models.descriptor import Descriptor
from gpuswarm.core.models.kinds import DESCRIPTOR_VERSION, EndKind, RecordError, State
from gpuswarm.core.models.lease import LEASE_SEP, Lease, base_name

__all__ = [
    "DESCRIPTOR_VERSION",
    "LEASE_SEP",
    "AttemptRecord",
    "Descriptor",
    "EndKind",
    "Lease",
    "RecordError",
    "State",
    "base_name",
]
