"""``backend: slurm``'s settings: the config's ``slurm:`` block (the ``--slurm-*`` flags over
it, :mod:`.plugin`): what each worker job asks Slurm for.

The slurm backend's own model, registered by :mod:`.plugin` (the core config model knows
nothing of it): a bad field is a ConfigError naming the config file's line and ``slurm.<field>``,
before anything is made. Imports only config's values (and pydantic): loading it never loads the
backend.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuswarm.config.values import Duration

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
    # each worker job's workers stop warm this long before its end (exec/slurm/allocation.py)
    stop_before: Duration = 60.0

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
