"""Config files and command lists: load, validate, expand into tasks.

``gpuswarm run config.yaml`` reads a YAML file of this shape (every key but ``tasks`` optional)::

    name: kernels              # run name; default: the config file's stem (made a safe name)
    workspace: runs            # runs go to <workspace>/<name>/run_<ts>/; relative paths are
                               # relative to the config file's folder; default: runs
    gpus: auto                 # default for --gpus (auto | 0,1,2 | sim:N); the CLI wins.
                               # A number or a list of numbers is turned into "2" / "0,1,2"
    gpus_per_task: 1           # each worker slot owns k GPUs (torchrun/DDP); 1..1024
    tasks_per_gpu: 1           # m slots share one GPU (small jobs); 1..256; not both above 1
    grace: 10s                 # SIGTERM -> SIGKILL grace on timeout / shutdown
    tasks_root: tasks          # glob task ids: folder paths relative to this (default: here)
    home:                      # optional per-slot private HOME with its own caches
      isolate: false
      provision:               # private, writable copies into that HOME (needs isolate: true);
        - {src: ~/.codex/auth.json, dest: .codex/auth.json}   # src must exist; dest relative
    reliability:               # all optional, these are the defaults
      lease_ttl: 30s           # reclaim a task whose supervisor shows no heartbeat this long
      retry_backoff: 1s        # wait before attempt n+1: backoff * 2**(n-1); null = none
      breaker: {failures: 5, window: 60s}   # quarantine a slot whose last 5 attempts all
                                            # failed within 60s (0 failures = never)
      max_log_mb: 256          # each attempt's output.log keeps head + latest output under this
                               # (a finite number, at most 1048576 = 1 TiB)
      gpu_release_timeout: 30s # an ended attempt's GPU takes no task until its memory is freed
                               # (NVML); still held after this long: reported, skipped
    preflight: [nvidia-smi]    # shell commands once per slot before it claims anything
    after_all: python aggregate.py   # one shell command once every task has ended
    backend: local             # what runs each attempt: local (default) or docker
    docker:                    # backend: docker (see docs/docker.md); image is required
      image: kernels:latest    # present on the docker host: never pulled
      args: [--cap-add=SYS_PTRACE]   # extra `docker run` arguments (not -v/-e/--name/...)
      mounts:                  # src must exist (relative: to the config's folder)
        - {src: /data, dest: /data, read_only: true}
      gpu_flags: auto          # auto | nvidia | amd | cdi | none
      network: none            # docker's --network; default: docker's own
      shm_size: 16g
      pass_env: [ANTHROPIC_API_KEY]  # host variables passed by name (never on a command line)
    defaults:                  # any task field below, for every task that does not set it
      timeout: 2h
      max_attempts: 2
      env: {OMP_NUM_THREADS: "4"}
      done_when: task_result.yaml
    tasks:
      - name: baseline                           # explicit task
        command: python train.py --lr 0.1        # a string is split like a shell would (shlex),
      - name: shelly                             # but NOT run by one (shell syntax in it is
        command: "python a.py | tee out.txt"     # exit 2) ...
        shell: true                              # ... unless shell: true (/bin/sh -c)
      - name: argv
        command: [python, train.py, --lr, "0.2"] # or an argv list, used as is
      - glob: tasks/hip2hip/**/config.yaml       # one task per match, relative to the config's
        name: "{task_rel}"                       # folder; default name {task_rel}
        command: agent --task {task_dir} --out {workspace}
      - matrix: {lr: [0.1, 0.01], seed: [1, 2]}  # cartesian product, one task per combination
        name: "lr{lr}-s{seed}"
        command: python train.py --lr {lr} --seed {seed}

Task fields (``defaults:`` and every task entry; an entry's value wins, ``env`` merges per key):

- ``timeout``: a duration, or null for none (the default). ``grace``: a duration (default: the
  top-level ``grace``). Durations are seconds (``600``, ``2.5``) or ``90s``, ``10m``, ``2h``,
  ``1h30m``, ``1.5h``, ``2d``; they must be > 0.
- ``max_attempts``: 1..10000 (default 1). ``priority``: -4999..4999, higher runs first (default 0).
- ``env``: NAME -> string (numbers are turned into strings). ``cwd``: a folder, relative to the
  config's folder unless it starts with a placeholder (``"{workspace}"``); default: that folder.
- ``gpus``: GPUs the task needs, 1..gpus_per_task. ``shell``: run the command with ``/bin/sh -c``.
- ``gpu_memory``: the GPU memory the task needs (``20G``, ``512M``; binary units). Tasks share a
  GPU while their needs fit (``tasks_per_gpu``, when set, caps how many); see docs/gpu-memory.md.
- ``done_when``: a path relative to the task workspace that must exist and parse (YAML/JSON) for the
  task to count as done. ``metrics``: name -> regex with exactly one capture group.
- ``after``, ``after_any``, ``after_failed``, ``group`` and the top level ``groups:`` (issue 35):
  prerequisites and groups, :mod:`gpuswarm.config.deps` (README, docs/reliability.md).
- ``agent``: a coding agent's CLI run over the task folder before ``command`` (the evaluation):
  ``claude-code``, ``codex``, ``cursor``, ``gemini``, ``opencode``, ``aider``, or a mapping
  ``{preset: NAME, prompt | prompt_file, copy_from, workdir, files, model, effort, timeout, ...}``
  (any preset field overridden; ``preset: custom`` with ``program`` and ``args``). Turns on
  ``home.isolate`` (unless set false), provisions the agent's login files and adds its preflight
  check; see docs/agents.md.

Task entries: exactly one kind per entry, and every entry needs ``command``:

- explicit: ``name`` defaults to the command itself, cut to 60 characters;
- ``glob``: one task per selected folder (two entries that select one: one task when they
  agree or one excludes it, else exit 2; sorted; ``**`` searches subfolders; a matched folder
  is the task folder, a matched file stands for its folder unless the entry matched several
  files of it: then each is a task). Values: ``task_file`` (the match), ``task_dir`` (its
  folder), ``task_rel`` (task_dir relative to ``tasks_root``, default the config's folder,
  e.g. ``tasks/gpumode/softmax``; ``<folder>/<stem>`` for one of several files), and
  ``{config.<field>}`` (``{config.a.b}`` nested; ``{config.<field>|default}`` when a config
  may lack it; a list: its items joined by spaces): a field of the matched ``config.yaml``,
  also usable as ``timeout: "{config.performance_timeout}"``;
- ``matrix``: values ``{key}`` for each combination.

For glob and matrix entries, a ``name`` that uses none of the entry's values is a prefix:
``<name>-<task_rel>`` or ``<name or matrix<i>>-lr=0.1-seed=1``.

Placeholders (:mod:`gpuswarm.core.placeholders`): ``{key}`` in ``command``, ``cwd``,
``done_when`` and
``env`` values is filled at launch from the entry's values and :data:`PLACEHOLDERS_AT_LAUNCH`;
``name`` may use only the entry's values (it is fixed at load time). ``{{``/``}}`` are literal
braces; ``${VAR}`` is left for the shell. Unknown placeholders are refused at load time. With
``shell: true`` every value is quoted for the shell where it lands; ``{key!raw}`` splices it as
shell code (without a shell both forms give the value as it is).

Limits: a NUL byte or a lone surrogate (``"\\ud800"``) in any value, a raw control character,
nesting deeper than 64 levels, aliases that add over 1,000,000 values or refer to themselves,
``~user`` for a user this machine does not know and the sizes of :mod:`~gpuswarm.config.values`
(a task name 512 bytes, a command or argument 131,071, a workspace's folder name 255) are
refused with the file, line and field; the first 10 problems by line are listed. Task names
(and the ids made from them) are redacted like commands: the values of this process's and the
task's secret-looking variables, and by shape: ``--api-key sk-...`` becomes ``--api-key ***``.

The task id is the name made a safe file name (``gpumode/softmax`` -> ``gpumode-softmax``); ids must
be unique. Every error names the file, line and field, and says how to fix it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuswarm.config.agents import with_agents
from gpuswarm.config.backends import config_model, options_given, plugins, with_settings
from gpuswarm.config.cmdlist import command_config, command_lines
from gpuswarm.config.cmdrepeats import list_tasks
from gpuswarm.config.commands import CommandTasks, tasks_digest
from gpuswarm.config.errors import config_error
from gpuswarm.config.models import (
    RunConfig,
    TaskOptions,
    TaskSpec,
    check_run_name,
    to_plain,
)
from gpuswarm.config.tasks import expand_entries, task_id_for
from gpuswarm.config.values import check_folder_path, expand_user
from gpuswarm.config.yamlload import LineMap, Locator, load_yaml, paused_gc, quote
from gpuswarm.core.errors import ConfigError


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and its tasks, with every path made absolute."""

    config: RunConfig
    path: Path | None  # None for a command list read from stdin
    base_dir: Path  # the folder relative paths are resolved against
    tasks: list[TaskSpec] | CommandTasks  # CommandTasks: a command list, no model per line
    name: str
    workspace: Path  # absolute

    def with_overrides(
        self, *, name: str | None = None, workspace: Path | None = None
    ) -> LoadedConfig:
        """A copy with the CLI's ``--name`` / ``--workspace`` (relative to the current folder)."""
        if name is not None:
            try:
                check_run_name(name)
            except ValueError as exc:
                raise ConfigError(f"--name: {exc}") from None
        try:
            chosen = expand_user(workspace).absolute() if workspace else self.workspace
            check_folder_path(chosen)
        except ValueError as exc:
            raise ConfigError(f"--workspace: {exc}") from None
        return replace(self, name=name or self.name, workspace=chosen)

    def with_backend(self, backend: str | None, values: Mapping[str, Any]) -> LoadedConfig:
        """A copy with the CLI's ``--backend`` and a backend's own options (``values``: the
        command's keywords) over the config's: a backend's options alone choose it (``--image``
        means ``--backend docker`` over the default one), and are refused with another. The chosen
        backend's settings are its block with its options over it (ConfigError naming the
        flag); other backends' blocks are dropped."""
        given = options_given(values)
        if backend is None and not given:
            return self
        name = backend or self.config.backend
        if backend is None and given and name in (given[0].name, "local"):
            name = given[0].name  # its options alone choose it over the default backend
        for plugin in given:
            if plugin.name != name:
                assert plugin.refuse_options is not None
                raise ConfigError(plugin.refuse_options(name))
        update: dict[str, BaseModel | None] = {p.name: None for p in with_settings()}
        chosen = plugins().get(name)
        if chosen is not None and chosen.apply_options is not None:
            block = getattr(self.config, name, None) if self.config.backend == name else None
            if chosen in given or block is not None or chosen.needs_block:
                update[name] = chosen.apply_options(block, values)
        config = self.config.model_copy(update={"backend": name, **update})
        return replace(self, config=config)

    def resolve_path(self, text: str) -> Path:
        """``~`` expanded; relative paths joined to :attr:`base_dir` (ValueError: no such user)."""
        path = expand_user(text)
        return path if path.is_absolute() else self.base_dir / path


# -- loading ---------------------------------------------------------------------------------------
def _read_text(path: Path, source: str) -> str:
    try:
        path = expand_user(path)
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a folder; pass the YAML file inside it") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{source}: not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read it: {exc.strerror}") from None


def read_stdin() -> str:
    """A command list from stdin, decoded as UTF-8 (whatever the locale says) or ConfigError."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text stream (tests): already str
        return sys.stdin.read()
    data: bytes = buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"<stdin>: not UTF-8 text (byte {exc.start}); convert it, e.g. with iconv -t UTF-8"
        ) from None


def _safe_name(text: str) -> str:
    return task_id_for(text)


def _validate(data: Any, where: Locator) -> RunConfig:
    if data is None:
        raise ConfigError(
            f"{where.source}: the file is empty; it needs at least a tasks: list, "
            "e.g. 'tasks: [{command: python train.py}]'"
        )
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"{type(data).__name__} {quote(data)}"
        raise where.error(
            (), f"the file must be a mapping of settings (name:, tasks:, ...), not {kind}"
        )
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, data, where, config_model(RunConfig)) from None


def _check_provision(loaded: LoadedConfig, where: Locator) -> None:
    for index, entry in enumerate(loaded.config.home.provision):
        try:
            src = loaded.resolve_path(entry.src)
        except ValueError as exc:
            raise where.error(("home", "provision", index, "src"), str(exc)) from None
        if not os.path.exists(src):  # noqa: PTH110 (pathlib raises ENAMETOOLONG: a traceback)
            raise where.error(
                ("home", "provision", index, "src"),
                f"{src} does not exist; fix the path or remove this entry",
            )


@paused_gc()
def load_config(
    path: Path, *, repeats: int | None = None, known: Collection[str] = frozenset()
) -> LoadedConfig:
    """Read, validate and expand a YAML config file. Any problem is a located ConfigError.
    ``repeats`` (``run --repeats``): the ``defaults.repeats`` (issue 34). ``known``: task ids
    a run already has, which ``after:`` may name (``gpuswarm add``, issue 35)."""
    path = Path(path)
    source = str(path)
    data, lines = load_yaml(_read_text(path, source), source)
    where = Locator(source, lines)
    config = with_agents(_validate(data, where))  # issue 20: agents' homes and checks
    if repeats is not None:
        defaults = config.defaults.model_copy(update={"repeats": repeats})
        config = config.model_copy(update={"defaults": defaults})
    base_dir = path.expanduser().resolve().parent
    loaded = LoadedConfig(
        config=config,
        path=path,
        base_dir=base_dir,
        tasks=expand_tasks(config, base_dir, source, lines=lines, known=known),
        name=config.name or _safe_name(path.stem),
        workspace=_workspace(config.workspace, base_dir, where),
    )
    _check_provision(loaded, where)
    return loaded


def _workspace(workspace: str | None, base_dir: Path, where: Locator | None = None) -> Path:
    try:
        path = expand_user(workspace or "runs")
        return check_folder_path(path if path.is_absolute() else base_dir / path)
    except ValueError as exc:
        raise (where or Locator("<config>")).error(("workspace",), str(exc)) from None


def expand_tasks(
    config: RunConfig, base_dir: Path, source: str, *, lines: LineMap | None = None,
    known: Collection[str] = frozenset(),
) -> list[TaskSpec]:  # fmt: skip
    """The tasks of ``config`` (relative paths against ``base_dir``); errors name ``source``.

    ``lines`` (from :func:`gpuswarm.config.yamlload.load_yaml`) adds line numbers to error messages.
    """
    return expand_entries(config, base_dir, Locator(source, lines or {}), known=known)


# -- command lists ---------------------------------------------------------------------------------
@paused_gc()
def load_command_list(
    source: Path | None,
    text: str | None = None,
    *,
    shell: bool = True,
    base_dir: Path,
    name: str | None = None,
    defaults: TaskOptions | None = None,
    direct: bool = False,
) -> LoadedConfig:
    """Tasks from a GNU-parallel style list: one command per line (blank lines and lines
    starting with ``#`` skipped), each run by ``/bin/sh -c`` (GNU parallel's way; ``direct``: as
    its argv when it needs no shell, config/direct.py), or split into arguments (shlex rules)
    when ``shell`` is False (``--no-shell``). Task ids are ``cmd-<line number>`` (zero padded to
    at least 5 digits), names the line cut to 60 characters. ``source`` None means stdin (read
    unless ``text`` is given). The run name defaults to the file's stem or ``stdin``.
    """
    label = str(source) if source is not None else "<stdin>"
    if text is None:
        text = _read_text(source, label) if source is not None else read_stdin()
    base = defaults or TaskOptions()
    opts = base.model_copy(update={"shell": shell})
    lines = command_lines(text)
    if not lines:
        raise ConfigError(
            f"{label}: no commands (blank lines and lines starting with # are skipped); "
            "put one command per line"
        )
    base_dir = base_dir.expanduser().resolve()
    grace = RunConfig.model_fields["grace"].default
    tasks = list_tasks(lines, opts, label, base_dir, grace, source, direct)  # --repeats too
    if name is not None:
        try:
            check_run_name(name)
        except ValueError as exc:
            raise ConfigError(f"--name: {exc}") from None
    run_name = name or _safe_name(source.stem if source is not None else "stdin")
    config = command_config(run_name, base_dir, opts, lines, label)
    workspace = _workspace(config.workspace, base_dir)
    return LoadedConfig(config, source, base_dir, tasks, run_name, workspace)


# -- fingerprints ----------------------------------------------------------------------------------
def _digest(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def config_fingerprint(config: RunConfig) -> str:
    """A stable hash of the whole config: key order does not matter, any value does."""
    return _digest(to_plain(config))


def spec_hash(loaded: LoadedConfig) -> str:
    """A stable hash of what a run executes: the resolved tasks (any order) and the slot layout.

    It leaves out what a resume may change freely: ``gpus``, ``name`` and ``workspace``.
    """
    config = loaded.config
    layout = {
        "gpus_per_task": config.gpus_per_task,
        "tasks_per_gpu": config.tasks_per_gpu,
        "home": to_plain(config.home),
    }
    return tasks_digest(loaded.tasks, layout)
