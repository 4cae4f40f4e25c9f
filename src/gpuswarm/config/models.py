"""The pydantic models of a gpuswarm config file, and the value types they use.

See :mod:`gpuswarm.config.load` for the documented schema. Every model forbids unknown keys and is
strict (``"3"`` is not an integer), except where a field says it coerces (env values, ``gpus``,
durations). Validators raise ``ValueError`` with a message that says what is wrong and how to fix
it; :mod:`gpuswarm.config.errors` adds the file, line and field path.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    model_validator,
)
from typing_extensions import Self

from gpuswarm.agents.preset import AgentUseField
from gpuswarm.agents.pricing import AgentUsage, Price
from gpuswarm.config.budget import BudgetConfig, Usd
from gpuswarm.config.depfields import DepList, GroupConfig, GroupName
from gpuswarm.config.errors import flag_error
from gpuswarm.config.halt import canonical_halt
from gpuswarm.config.notify import NotifyConfig
from gpuswarm.config.values import (
    IDENT,
    Duration,
    EnvName,
    EnvValue,
    GpuMemory,
    HomePath,
    MetricPattern,
    NonEmpty,
    RelativePath,
    Timeout,
    check_command_size,
    check_name_size,
)
from gpuswarm.config.yamlload import quote
from gpuswarm.core.paths import slugify
from gpuswarm.core.placeholders import GLOB_VARS, PLACEHOLDERS_AT_LAUNCH, PLACEHOLDERS_AT_LOAD
from gpuswarm.core.redact import redact_argv, redact_shapes
from gpuswarm.core.taskdump import TaskDump

_STRICT = ConfigDict(extra="forbid", strict=True)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Upper bounds of the bounded fields (a slot, a GPU or an attempt costs memory and processes).
MAX_GPUS = 1024  # GPUs of one task / one slot (as many as --gpus sim:N may simulate)
MAX_TASKS_PER_GPU = 256  # slots sharing one GPU
MAX_ATTEMPTS = 10_000  # attempts of one task; failures of the breaker
MAX_LOG_MB = 1_048_576.0  # 1 TiB per output.log


# -- task fields ----------------------------------------------------------------------------------
class TaskOptions(BaseModel):
    """Fields of a task; usable in ``defaults:`` and on any task entry."""

    model_config = _STRICT

    timeout: Timeout = None
    max_attempts: int = Field(default=1, ge=1, le=MAX_ATTEMPTS)
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    cwd: NonEmpty | None = None
    priority: int = Field(default=0, ge=-4999, le=4999)
    gpus: int | None = Field(default=None, ge=1, le=MAX_GPUS)
    done_when: RelativePath | None = None
    metrics: dict[NonEmpty, MetricPattern] = Field(default_factory=dict)
    shell: bool = False
    grace: Duration | None = None
    skip_exit_code: int | None = Field(default=None, ge=1, le=255)  # this exit ends it skipped
    agent: AgentUseField | None = None  # issue 20: a coding agent's CLI runs before the command
    # issue 19: the GPU memory it needs (MiB); placement packs tasks on a GPU while they fit
    gpu_memory: GpuMemory | None = None
    # the GPU model it runs on, where a run has several: words of the GPU's name, any case
    # ("H100", "A100 80GB"); slots of other models pass it by
    accelerator: NonEmpty | None = Field(default=None, max_length=200)
    # issue 34: an attempt whose agent spent more than this (USD) fails, not retried
    max_usd: Usd | None = None
    # issue 34: no log output, CPU or GPU activity for this long ends the attempt as stalled
    stall_after: Duration | None = None
    # issue 34: run each task k independent times ({repeat}: 1..k); the result fields that are
    # its score (mean and 95 % CI over the repeats) and its pass/fail (pass@1, pass@k)
    repeats: int | None = Field(default=None, ge=1, le=1000)
    score: NonEmpty | None = Field(default=None, max_length=200)
    passed: NonEmpty | None = Field(default=None, max_length=200)
    # issue 35: prerequisites (task ids or names; in a glob or matrix entry, templates of this
    # instance's values: "agent-{task_rel}") and the group it is counted, capped and acted on in
    after: DepList = Field(default_factory=list)  # start once these ended done
    after_any: DepList = Field(default_factory=list)  # once these ended in any state
    after_failed: DepList = Field(default_factory=list)  # only if one of these failed
    group: GroupName | None = None

    @classmethod
    def from_cli(cls, **options: object) -> TaskOptions:
        """Task options from command-line flags (``timeout="10m"``); None means not given.

        A bad value is a ConfigError naming the flag: ``--timeout: '10 minutes' is not a ...``.
        """
        given = {key: value for key, value in options.items() if value is not None}
        try:
            return cls.model_validate(given)
        except ValidationError as exc:
            raise flag_error(exc) from None


def _command(value: object) -> object:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("the command is empty; write the program and its arguments")
        check_command_size(value)
        return value
    if isinstance(value, list) and value and all(isinstance(a, str) for a in value):
        check_command_size(value)
        return value
    if isinstance(value, list) and value:
        raise ValueError("every element of an argv list must be a string; quote numbers")
    raise ValueError(
        "expected a string (split like a shell would, without running one) or a non-empty "
        "argv list such as [python, train.py]"
    )


def _matrix_key(key: str) -> str:
    if not IDENT.match(key):
        raise ValueError(f"matrix key {quote(key)} must be an identifier (letters, digits, '_')")
    if key in PLACEHOLDERS_AT_LAUNCH or key in PLACEHOLDERS_AT_LOAD or key in GLOB_VARS:
        raise ValueError(
            f"matrix key {quote(key)} clashes with a placeholder gpuswarm supplies; rename it"
        )
    return key


def _matrix_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise ValueError(f"matrix values must be strings or numbers, got {quote(value)}")


MatrixKey = Annotated[str, AfterValidator(_matrix_key)]
MatrixValue = Annotated[str, BeforeValidator(_matrix_value)]


class TaskEntry(TaskOptions):
    """One item of ``tasks:``: an explicit command, a ``glob:`` or a ``matrix:`` of tasks."""

    name: Annotated[NonEmpty, AfterValidator(check_name_size)] | None = None
    command: Annotated[str | list[str], BeforeValidator(_command)]
    glob: NonEmpty | None = None
    exclude: list[NonEmpty] = Field(default_factory=list)  # globs: matches end skipped, unrun
    matrix: dict[MatrixKey, Annotated[list[MatrixValue], Field(min_length=1)]] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> TaskEntry:
        if self.glob is not None and self.matrix is not None:
            raise ValueError(
                "an entry can have glob: or matrix:, not both; split it into two entries"
            )
        if self.matrix == {}:
            raise ValueError("matrix: is empty; give at least one key with a list of values")
        if self.exclude and self.glob is None:
            raise ValueError(
                "exclude: filters the matches of a glob: entry; add glob: or remove exclude:"
            )
        return self


# -- run level ------------------------------------------------------------------------------------
class ProvisionEntry(BaseModel):
    """A file or folder copied (private, writable: 0600/0700) into each slot's private HOME."""

    model_config = _STRICT

    src: NonEmpty
    dest: HomePath


class HomeConfig(BaseModel):
    """Optional per-slot private HOME (with its own caches)."""

    model_config = _STRICT

    isolate: bool = False
    provision: list[ProvisionEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _provision_needs_isolate(self) -> HomeConfig:
        if self.provision and not self.isolate:
            raise ValueError(
                "provision: copies files into a private per-slot HOME, which needs "
                "isolate: true; set home.isolate: true or remove provision:"
            )
        return self


def check_run_name(name: str) -> str:
    """``name`` if it can be a run folder name, else ValueError with a suggestion."""
    if not _SAFE_NAME.match(name):
        if len(name) > 128 and _SAFE_NAME.match(name[:128]):  # only too long: no "e.g." of it
            raise ValueError(
                f"{quote(name)} is {len(name):,} characters; a run name is 128 at most"
            )
        raise ValueError(
            f"{quote(name)} cannot be a folder name; use letters, digits, '.', '_' and '-', "
            f"e.g. {quote(slugify(name))}"
        )
    return name


def _gpus(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return ",".join(str(v) for v in value)
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{quote(value)} is not a GPU selection; write auto, 0,1,2 or sim:N")


class BreakerConfig(BaseModel):
    """Quarantine a slot whose last ``failures`` attempts all failed within ``window``."""

    model_config = _STRICT

    failures: int = Field(default=5, ge=0, le=MAX_ATTEMPTS)  # 0 turns the breaker off
    window: Duration = 60.0
    cooldown: Duration = 300.0  # a quarantined slot is probed again after this long


class Reliability(BaseModel):
    """Leases, retries, the circuit breaker and log bounds (all have safe defaults)."""

    model_config = _STRICT

    lease_ttl: Duration = 30.0  # reclaim a task whose supervisor shows no heartbeat this long
    retry_backoff: Duration | None = 1.0  # before attempt n+1: backoff * 2**(n-1); null = none
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    max_log_mb: float = Field(  # each output.log stays under this size
        default=256.0, gt=0, le=MAX_LOG_MB, allow_inf_nan=False
    )
    # issue 19: an ended attempt's GPU waits at most this long for its memory to be freed
    gpu_release_timeout: Duration = 30.0


class BackendBlocks(BaseModel):
    """A model with a ``backend:`` and that backend's block (``<name>:``): the blocks are the
    backends' own models, composed in by :func:`gpuswarm.config.backends.config_model` (the
    core model validates as the whole one); a block goes with its backend only."""

    @model_validator(mode="after")
    def _backend_blocks(self) -> Self:
        from gpuswarm.config.backends import check_blocks  # it composes this model

        check_blocks(self)
        return self

    def backend_block(self) -> BaseModel | None:
        """The block of the model's own backend (None: it has none)."""
        from gpuswarm.config.backends import plugins

        if self.backend not in plugins():
            return None
        block = self.__dict__.get(self.backend)
        return block if isinstance(block, BaseModel) else None

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        """Validated as the whole model: every backend's block included."""
        from gpuswarm.config.backends import config_model

        whole = config_model(cls)
        if whole is cls:
            return super().model_validate(obj, **kwargs)
        return cast(Self, whole.model_validate(obj, **kwargs))

    if TYPE_CHECKING:  # a backend's block is a field of the composed model

        def __getattr__(self, name: str) -> Any: ...


def _non_empty_tasks(tasks: list[TaskEntry]) -> list[TaskEntry]:
    if not tasks:
        raise ValueError("the task list is empty; add at least one entry, e.g. - command: ...")
    return tasks


class RunConfig(BackendBlocks):
    """A whole config file."""

    model_config = _STRICT

    name: Annotated[str, AfterValidator(check_run_name)] | None = None
    workspace: NonEmpty | None = None
    gpus: Annotated[str | None, BeforeValidator(_gpus)] = None
    gpus_per_task: int = Field(default=1, ge=1, le=MAX_GPUS)
    tasks_per_gpu: int = Field(default=1, ge=1, le=MAX_TASKS_PER_GPU)
    grace: Duration = 10.0
    tasks_root: NonEmpty | None = None  # glob task ids: folder paths relative to this
    home: HomeConfig = Field(default_factory=HomeConfig)
    reliability: Reliability = Field(default_factory=Reliability)
    defaults: TaskOptions = Field(default_factory=lambda: TaskOptions())
    tasks: Annotated[list[TaskEntry], AfterValidator(_non_empty_tasks)]
    # issue 11: run once per slot before it claims anything; once after every slot finished
    preflight: list[NonEmpty] = Field(default_factory=list)
    after_all: NonEmpty | None = None
    # what runs the attempts (config/backends.py: each backend's block is its own settings
    # model, added to this one by config_model(); a backend's name is its block's key)
    backend: NonEmpty = "local"
    # issue 28: stop early, GNU parallel's --halt (config/halt.py); never = off
    halt: Annotated[str | None, BeforeValidator(canonical_halt)] = None
    notify: NotifyConfig | None = None  # issue 37: webhooks (config/notify.py)
    # issue 34: USD per million tokens per model, over the shipped table (agents/pricing.yaml)
    pricing: dict[NonEmpty, Price] = Field(default_factory=dict)
    budget: BudgetConfig | None = None  # issue 34: what the run's agents may spend
    groups: dict[GroupName, GroupConfig] = Field(default_factory=dict)  # issue 35

    @model_validator(mode="after")
    def _slots(self) -> RunConfig:
        if self.gpus_per_task > 1 and self.tasks_per_gpu > 1:
            raise ValueError(
                "gpus_per_task and tasks_per_gpu are both above 1; a slot either owns several "
                "GPUs or shares one, so set one of them to 1"
            )
        return self


class TaskSpec(BaseModel):
    """One resolved task, as the queue stores it. Templates are rendered at launch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str
    command: list[str] | str
    shell: bool = False
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    timeout: float | None = None
    grace: float = 10.0
    max_attempts: int = 1
    priority: int = 0
    gpus: int | None = None
    done_when: str | None = None
    metrics: dict[str, str] = Field(default_factory=dict)
    vars: dict[str, str] = Field(default_factory=dict)
    skip_exit_code: int | None = None
    skip_reason: str | None = None  # skipped without running (matched an ``exclude:`` glob)
    gpu_memory_mb: int | None = None  # issue 19: declared GPU memory (MiB); None: exclusive
    accelerator: str | None = None  # only GPUs of this model (placement.devices.model_matches)
    usage: AgentUsage | None = None  # issue 34: an agent task's usage record (agents/pricing.py)
    max_usd: float | None = None  # issue 34: an attempt that spent more fails, not retried
    stall_after: float | None = None  # issue 34: seconds of no activity that end an attempt
    repeat_of: str | None = None  # issue 34: a repeat's task (its id without -r<k>)
    repeat: int | None = None  # issue 34: which repeat (1..k)
    score: str | None = None  # issue 34: the result field that scores it
    passed: str | None = None  # issue 34: the result field that says it passed
    after: list[str] = Field(default_factory=list)  # issue 35: resolved task ids
    after_any: list[str] = Field(default_factory=list)
    after_failed: list[str] = Field(default_factory=list)
    group: str | None = None


def default_name(command: str | list[str]) -> str:
    """The name of an explicit task without ``name:``: its command, cut to 60 characters."""
    text = command if isinstance(command, str) else " ".join(redact_argv(command))
    return " ".join(redact_shapes(text).split())[:60]  # redacted before it is cut


def task_dump(task: TaskSpec) -> TaskDump:
    """``task``'s JSON form, as the queue stores it (every field: the keys of a TaskDump)."""
    return cast("TaskDump", task.model_dump(mode="json"))


def to_plain(model: BaseModel) -> dict[str, JsonValue]:
    """A JSON-ready dict of ``model`` (used for snapshots and fingerprints)."""
    return model.model_dump(mode="json")
