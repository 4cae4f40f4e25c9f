"""``backend: slurm``'s settings (the ``slurm:`` block; ``--slurm-nodes``, ``--slurm-time``,
``--slurm-partition`` over it): what each worker job asks Slurm for.

Validated here, before anything is made (a bad field is a ConfigError naming ``slurm.<field>``
and the config file): the core config keeps the block as given (issue 32 moves backend
settings into the backends' own models).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuswarm.core.errors import ConfigError

_TIME_RE = re.compile(r"\d+(-\d+)?(:\d+){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
_NAME_RE = re.compile(r"[A-Za-z0-9_.,:+=@-]+")


class SlurmSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None  # sbatch --time: 4:00:00, 1-00:00:00, 90 (minutes)
    nodes: int = Field(default=1, ge=1, le=10_000)
    gpus_per_node: int | None = Field(default=None, ge=1, le=1024)
    sbatch_args: list[str] = Field(default_factory=list)  # extra sbatch arguments, as given
    setup: list[str] = Field(default_factory=list)  # shell lines run before the workers
    max_jobs: int = Field(default=10, ge=1, le=10_000)  # worker jobs submitted at most, in all
    poll: float = Field(default=2.0, gt=0, le=300)  # seconds between looks at squeue

    @field_validator("partition", "account", "qos")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not a Slurm name (letters, digits, _.,:+=@-)")
        return value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _TIME_RE.fullmatch(value.strip()):
            raise ValueError(
                f"{value!r} is not a Slurm time (minutes, HH:MM:SS, D-HH:MM:SS, UNLIMITED)"
            )
        return value.strip() if value is not None else None

    def sbatch_options(self) -> list[str]:
        """The sbatch arguments of one worker job (the script and the output paths aside)."""
        out = [f"--nodes={self.nodes}", "--ntasks-per-node=1"]
        for flag, value in (
            ("--partition", self.partition),
            ("--account", self.account),
            ("--qos", self.qos),
            ("--time", self.time),
        ):
            if value:
                out.append(f"{flag}={value}")
        if self.gpus_per_node:
            out.append(f"--gres=gpu:{self.gpus_per_node}")
        return [*out, *self.sbatch_args]


def settings_of(raw: Any, where: str) -> SlurmSettings:
    """The ``slurm:`` block as settings; a bad one is a ConfigError naming the field."""
    try:
        return SlurmSettings.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "slurm"
        raise ConfigError(f"{where}: slurm.{field}: {err['msg']}") from None
