"""An attempt record: one entry of a descriptor's ``attempts`` list, built three ways (launched,
lost, orphan) and read back from the JSON written by every gpuswarm before it."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

from gpuswarm.core.models.kinds import EndKind, RecordError
from gpuswarm.core.records import descriptor_problem


@dataclass(slots=True)  # built per attempt on the hot path: a frozen init costs 8x more
class AttemptRecord:
    """One entry of a descriptor's ``attempts`` list.

    ``None`` means the key is absent from the JSON form, except that a launched attempt
    (``started`` set) always writes ``returncode``, ``signal`` and ``reason``, null or not.
    Built only by :meth:`launched`, :meth:`lost` and :meth:`orphan` (and :meth:`from_json`)."""

    n: int
    slot: str | None = None
    gpus: tuple[int, ...] | None = None
    started: float | None = None
    ended: float | None = None
    duration: float | None = None
    kind: str | None = None
    returncode: int | None = None
    signal: str | None = None
    reason: str | None = None
    oom: bool | None = None
    killed: int | None = None
    metrics: dict[str, float | int | str] | None = None  # parsed from its log (core/metrics)
    interrupted: bool = False
    host: str | None = None  # the machine it ran on, as slot ids spell it (``<host>-gpu3``)
    accelerator: str | None = None  # its GPUs' name ("NVIDIA H100 80GB HBM3", "sim")
    extra: dict[str, object] = field(default_factory=dict)  # keys this version does not know
    # -- GPU use, measured by the VRAM sampler (placement/vram.py); None: not measured -----
    peak_vram_mb: int | None = None  # the most GPU memory its processes held at once
    mean_vram_mb: int | None = None  # their mean over the attempt's looks
    peak_gpu_util: int | None = None  # utilisation % of its GPUs (shared where packed)
    mean_gpu_util: int | None = None
    # issue 37: GPU energy (J) from the total-energy counter (or integrated power), and whether
    # the attempt had its GPUs alone ("exclusive") or was apportioned a share ("shared")
    energy_j: float | None = None
    energy_mode: str | None = None
    # -- what an agent spent (issue 34; agents/usage.py): None when it reported nothing ----
    tokens_in: int | None = None  # every input token (cached ones included)
    tokens_cached: int | None = None  # of them, read from a prompt cache
    tokens_out: int | None = None  # every output token (reasoning included)
    cost_usd: float | None = None  # the CLI's figure, else priced; None: unknown (never 0)
    model: str | None = None
    usage_problem: str | None = None  # why the cost is unknown, or the usage unreadable

    # constructors ------------------------------------------------------------------------
    @classmethod
    def launched(
        cls,
        *,
        n: int,
        slot: str,
        gpus: tuple[int, ...] | list[int],
        started: float,
        ended: float,
        duration: float,
        kind: EndKind | str,
        returncode: int | None,
        signal: str | None,
        reason: str | None,
        oom: bool,
        killed: int,
        host: str | None = None,
        accelerator: str | None = None,
    ) -> AttemptRecord:
        """An attempt that ran (whatever its end); times rounded as every record has them."""
        return cls(
            n=n,
            slot=slot,
            gpus=tuple(gpus),
            started=round(started, 4),
            ended=round(ended, 4),
            duration=round(duration, 4),
            kind=kind.value if isinstance(kind, EndKind) else EndKind(kind).value,
            returncode=returncode,
            signal=signal,
            reason=reason,
            oom=oom,
            killed=killed,
            host=host,
            accelerator=accelerator,
        )

    @classmethod
    def lost(
        cls, *, n: int, reason: str, slot: str | None = None, interrupted: bool = False
    ) -> AttemptRecord:
        """An attempt whose supervisor died: its outcome is unknown."""
        return cls(n=n, slot=slot, kind=EndKind.LOST.value, reason=reason, interrupted=interrupted)

    @classmethod
    def orphan(
        cls, *, n: int, slot: str, started: float, ended: float, reason: str
    ) -> AttemptRecord:
        """An attempt of a dead supervisor judged done by the completion file it left."""
        return cls(
            n=n,
            slot=slot,
            started=round(started, 4),
            ended=round(ended, 4),
            duration=round(max(0.0, ended - started), 4),
            kind=EndKind.ORPHAN.value,
            returncode=None,
            signal=None,
            reason=reason,
            oom=False,
            killed=0,
        )

    def but(self, **changes: Any) -> AttemptRecord:
        """A copy with ``changes`` (``interrupted=True``, ``reason=...``, ``metrics=...``)."""
        out = copy.copy(self)  # dataclasses.replace costs ~10x more
        out.extra = dict(self.extra)
        for name, value in changes.items():
            setattr(out, name, value)
        return out

    # reading -----------------------------------------------------------------------------
    @property
    def counted(self) -> bool:
        """Counts against ``max_attempts`` (an interrupted attempt does not)."""
        return not self.interrupted

    @property
    def was_launched(self) -> bool:
        """It ran (and so has an ``attempt-<n>/output.log``); a lost record never did."""
        return self.started is not None

    @property
    def seconds(self) -> float:
        return float(self.duration or 0)

    @property
    def end_kind(self) -> EndKind | None:
        try:
            return EndKind(self.kind) if self.kind is not None else None
        except ValueError:
            return None

    # JSON --------------------------------------------------------------------------------
    @classmethod
    def from_json(cls, obj: Any, where: str = "attempt") -> AttemptRecord:
        """The record of a JSON object checked as :func:`descriptor_problem` checks it."""
        if not isinstance(obj, dict):
            raise RecordError(f"{where} is {type(obj).__name__}, not dict")
        problem = descriptor_problem({"task": {}, "attempts": [obj]}, task_fields=False)
        if problem is not None:
            raise RecordError(problem.replace("attempts[0]", where, 1))
        return cls._of(obj)

    @classmethod
    def _of(cls, obj: dict[str, Any]) -> AttemptRecord:
        """From an already checked JSON object (positional: read per row of 100k-task runs)."""
        get = obj.get
        gpus = get("gpus")
        extra = (
            {} if _FIELD_SET.issuperset(obj) else {k: obj[k] for k in obj if k not in _FIELD_SET}
        )
        return cls(
            get("n", 0),
            get("slot"),
            tuple(gpus) if gpus is not None else None,
            get("started"),
            get("ended"),
            get("duration"),
            get("kind"),
            get("returncode"),
            get("signal"),
            get("reason"),
            get("oom"),
            get("killed"),
            get("metrics"),
            bool(get("interrupted")),
            get("host"),
            get("accelerator"),
            extra,
            peak_vram_mb=get("peak_vram_mb"),
            mean_vram_mb=get("mean_vram_mb"),
            peak_gpu_util=get("peak_gpu_util"),
            mean_gpu_util=get("mean_gpu_util"),
            energy_j=get("energy_j"),
            energy_mode=get("energy_mode"),
            tokens_in=get("tokens_in"),
            tokens_cached=get("tokens_cached"),
            tokens_out=get("tokens_out"),
            cost_usd=get("cost_usd"),
            model=get("model"),
            usage_problem=get("usage_problem"),
        )

    def field_values(self) -> dict[str, object]:
        """Every field by name, absent ones as None (``gpus`` a list, unknown keys left out):
        what the api and the dashboard show of an attempt, so a new field reaches them."""
        out = {name: getattr(self, name) for name in _ATTEMPT_FIELDS}
        out["gpus"] = list(self.gpus or ())
        return out

    def to_json(self) -> dict[str, object]:
        """The JSON object: absent fields left out, null ones of a launched attempt kept, the
        keys this version does not know (``extra``: any JSON) after them. Spelled out field by
        field: it runs once per commit on the hot path."""
        out: dict[str, object] = {"n": self.n}
        self._put_run(out)
        self._put_end(out)
        return out

    def _put_run(self, out: dict[str, object]) -> None:
        if self.slot is not None:
            out["slot"] = self.slot
        if self.gpus is not None:
            out["gpus"] = list(self.gpus)
        if self.started is not None:
            out["started"] = self.started
        if self.ended is not None:
            out["ended"] = self.ended
        if self.duration is not None:
            out["duration"] = self.duration
        if self.kind is not None:
            out["kind"] = self.kind
        if self.host is not None:
            out["host"] = self.host
        if self.accelerator is not None:
            out["accelerator"] = self.accelerator

    def _put_end(self, out: dict[str, object]) -> None:
        launched = self.started is not None
        if launched or self.returncode is not None:
            out["returncode"] = self.returncode
        if launched or self.signal is not None:
            out["signal"] = self.signal
        if launched or self.reason is not None:
            out["reason"] = self.reason
        if self.oom is not None:
            out["oom"] = self.oom
        if self.killed is not None:
            out["killed"] = self.killed
        if self.metrics is not None:
            out["metrics"] = self.metrics
        if self.interrupted:
            out["interrupted"] = True
        self._put_gpu_use(out)
        if self.tokens_in is not None or self.cost_usd is not None or self.usage_problem:
            self._put_usage(out)
        if self.extra:
            out.update(self.extra)

    def _put_gpu_use(self, out: dict[str, object]) -> None:
        if self.peak_vram_mb is not None:
            out["peak_vram_mb"] = self.peak_vram_mb
        if self.mean_vram_mb is not None:
            out["mean_vram_mb"] = self.mean_vram_mb
        if self.peak_gpu_util is not None:
            out["peak_gpu_util"] = self.peak_gpu_util
        if self.mean_gpu_util is not None:
            out["mean_gpu_util"] = self.mean_gpu_util
        if self.energy_j is not None:
            out["energy_j"] = self.energy_j
        if self.energy_mode is not None:
            out["energy_mode"] = self.energy_mode

    def _put_usage(self, out: dict[str, object]) -> None:
        for key in ("tokens_in", "tokens_cached", "tokens_out", "cost_usd", "model"):
            out[key] = getattr(self, key)  # all five, null or not: cost null = unknown
        if self.usage_problem is not None:
            out["usage_problem"] = self.usage_problem


_ATTEMPT_FIELDS = tuple(f.name for f in fields(AttemptRecord) if f.name != "extra")
_FIELD_SET = frozenset(_ATTEMPT_FIELDS)
#: The fields of a task's last attempt that are results.tsv columns (and summary.json's rows):
#: "" where not measured.
ROW_FIELDS = ("peak_vram_mb",)  # issue 19: the last attempt's measured peak GPU memory
