"""The pydantic models of a gpuswarm config file, and the value types they use.

See :mod:`gpuswarm.config.load` for the documented schema. Every model forbids unknown keys and is
strict (``"3"`` is not an integer), except where a field says it coerces (env values, ``gpus``,
durations). Validators raise ``ValueError`` with a message that says what is wrong and how to fix
it; :mod:`gpuswarm.config.errors` adds the file, line and field path.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpuswarm.agents.preset import AgentUseField
from gpuswarm.config import dockerargs
from gpuswarm.config.errors import flag_error
from gpuswarm.config.halt import canonical_halt
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
from gpuswarm.core.redact import redact_argv, redact_shapes, redact_tree

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


class MountEntry(BaseModel):
    """A host folder or file at ``dest`` inside every container (``backend: docker``)."""

    model_config = _STRICT

    src: NonEmpty  # a host path (relative: to the config's folder); it must exist
    dest: NonEmpty  # an absolute path inside the container
    read_only: bool = False

    @model_validator(mode="after")
    def _absolute_dest(self) -> MountEntry:
        if not self.dest.startswith("/") or "\0" in self.dest or ":" in self.dest:
            raise ValueError(
                f"dest {quote(self.dest)} must be an absolute path inside the container without "
                "':', e.g. /data"
            )
        if ":" in self.src or "\0" in self.src:
            raise ValueError(f"src {quote(self.src)} must be a path without ':'")
        return self


GpuFlags = Literal["auto", "nvidia", "amd", "cdi", "none"]
_SHM_SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$")


class DockerConfig(BaseModel):
    """``backend: docker``: each attempt in a container of ``image`` (see docs/docker.md)."""

    model_config = _STRICT

    image: NonEmpty  # present on the docker host: never pulled
    args: list[str] = Field(default_factory=list)  # extra ``docker run`` arguments
    mounts: list[MountEntry] = Field(default_factory=list)
    gpu_flags: GpuFlags = "auto"
    network: NonEmpty | None = None  # docker's --network (None: docker's default)
    shm_size: NonEmpty | None = None  # docker's --shm-size, e.g. 16g
    pass_env: list[EnvName] = Field(default_factory=list)  # host variables passed by name

    @model_validator(mode="after")
    def _checked(self) -> DockerConfig:
        if self.shm_size is not None and not _SHM_SIZE.match(self.shm_size):
            raise ValueError(f"shm_size {quote(self.shm_size)} is not a size; write e.g. 16g")
        if redact_tree(self.args) != self.args or redact_tree(self.image) != self.image:
            raise ValueError(
                "args look like they carry a secret (a token, a password in a URL); pass "
                "secrets by name with pass_env, never on a command line"
            )
        why = dockerargs.refusal(self.args)  # read as docker reads them: any spelling
        if why is not None:
            raise ValueError(why)
        return self


# -- issue 16: backend: ray ------------------------------------------------------------------
_RAY_ADDRESS = re.compile(r"auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}")


class RayConfig(BaseModel):
    """``backend: ray``: one slot actor per GPU on every node of a Ray cluster (docs/cluster.md)."""

    model_config = _STRICT

    address: NonEmpty = "auto"  # auto | HOST:PORT | ray://HOST:PORT (Ray Client)
    namespace: NonEmpty = "gpuswarm"  # the Ray namespace the run's slot actors are named in
    shared_path: NonEmpty | None = None  # a folder every node sees at this path (large artifacts)
    ship: Literal["auto", "always", "never"] = "auto"  # the task's folder to nodes without it
    max_ship_mb: float = Field(default=256.0, gt=0)  # a shipped folder (packed) at most
    max_result_mb: float = Field(default=16.0, gt=0)  # what an attempt's folder sends home at most
    setup: NonEmpty | None = None  # run once per node before its first attempt (uv sync, data)
    setup_timeout: Duration = 3600.0
    # the head not answering this long: the run stops, its in-flight attempts lost and queued
    # again (below Ray's gcs_rpc_server_reconnect_timeout_s, 60 s, after which Ray ends drivers)
    head_timeout: Duration = 30.0

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if not _RAY_ADDRESS.fullmatch(value):
            raise ValueError(
                f"address {quote(value)} is not auto, HOST:PORT or ray://HOST:PORT "
                "(the head's address, as `ray start --head` prints it)"
            )
        return value


def _non_empty_tasks(tasks: list[TaskEntry]) -> list[TaskEntry]:
    if not tasks:
        raise ValueError("the task list is empty; add at least one entry, e.g. - command: ...")
    return tasks


class RunConfig(BaseModel):
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
    backend: NonEmpty = "local"  # what runs the attempts: local, docker, wrapped; see exec.base
    docker: DockerConfig | None = None  # backend: docker's settings
    ray: RayConfig | None = None  # backend: ray's settings (issue 16; default: address auto)
    # backend: slurm's settings (issue 36): validated by exec/slurm/settings.py's own model
    slurm: dict[str, Any] | None = None
    # issue 28: stop early, GNU parallel's --halt (config/halt.py); never = off
    halt: Annotated[str | None, BeforeValidator(canonical_halt)] = None

    @model_validator(mode="after")
    def _ray(self) -> RunConfig:
        if self.ray is not None and self.backend != "ray":
            raise ValueError(
                f"ray: is set but backend is {quote(self.backend)}; add backend: ray "
                "(or remove the ray: block)"
            )
        return self

    @model_validator(mode="after")
    def _slurm(self) -> RunConfig:
        if self.slurm is not None and self.backend != "slurm":
            raise ValueError(
                f"slurm: is set but backend is {quote(self.backend)}; add backend: slurm "
                "(or remove the slurm: block)"
            )
        return self

    @model_validator(mode="after")
    def _docker(self) -> RunConfig:
        if self.backend == "docker" and self.docker is None:
            raise ValueError(
                "backend: docker needs a docker: block with the image, e.g. "
                "docker: {image: myimage:tag}"
            )
        if self.docker is not None and self.backend != "docker":
            raise ValueError(
                f"docker: is set but backend is {quote(self.backend)}; add backend: docker "
                "(or remove the docker: block)"
            )
        return self

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


def default_name(command: str | list[str]) -> str:
    """The name of an explicit task without ``name:``: its command, cut to 60 characters."""
    text = command if isinstance(command, str) else " ".join(redact_argv(command))
    return " ".join(redact_shapes(text).split())[:60]  # redacted before it is cut


def to_plain(model: BaseModel) -> dict[str, Any]:
    """A JSON-ready dict of ``model`` (used for snapshots and fingerprints)."""
    return model.model_dump(mode="json")
