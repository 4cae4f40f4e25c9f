"""One experiment: its folder, its settings and their checks, its locks (the journal and its
replay into a State are ``journal.py``).

An experiment lives in ``<repo>/.gpuswarm/research/<tag>/`` (git ignores it through
``.git/info/exclude``)::

    experiment.json   the settings (``research init``; changed only by ``research config``)
    ledger.jsonl      append-only, fsynced: one JSON line per event; the state is its replay
    results.tsv       the seed's five columns, one row per decided experiment (rendered)
    queue/run_*/      the core run whose tasks are the variants (a variant run is a task)
    variants/<id>/    the export of a variant's commit it runs in, removed once it is recorded
    lock, serve.lock  flocks: state changes; the background runner

Events: ``init`` (BASE, the GPU models of ``--gpus``), ``variant`` (created: commit, parent,
description, kind, round), ``finished`` (what the run produced, on which host and GPU model),
``decided`` (keep / discard / crash, the reason and the results.tsv row), ``config`` (settings
changed by ``research config``, old and new), ``base`` (the
branch moved), ``worktree`` (the user's editable files were restored to a BASE), ``sealed``
(a round takes no more variants: ``wait`` or the loop said so), ``mode``, ``seen``. The row is
journaled before the branch moves; recovery finishes a move a crash cut short.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from gpuswarm.config.models import BackendBlocks
from gpuswarm.config.notify import NotifyConfig
from gpuswarm.config.values import check_command_size
from gpuswarm.core.errors import ResearchError
from gpuswarm.core.fsutil import atomic_write_json, read_json
from gpuswarm.core.models.attempt import ROW_FIELDS
from gpuswarm.research.amounts import AMOUNT_FIELDS, parse_amount
from gpuswarm.research.progress import check_progress_pattern, default_pattern

EXPERIMENTS = Path(".gpuswarm") / "research"
TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: The memory line a training script prints, named as the attempt record's measured peak
#: (``AttemptRecord``'s field of that name, its one results row field): the printed value
#: stands in for the measured one.
(MEMORY_METRIC,) = ROW_FIELDS
DEFAULT_MEMORY_PATTERN = rf"^\s*{MEMORY_METRIC}:\s*([-+0-9.eE]+)"
DEFAULT_FAIL_PATTERN = r"^FAIL\b"


MAX_TIMEOUT = 7 * 86400.0  # a research run is a fixed budget: a week bounds any of them


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in chunks (data files can be large)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def metric_pattern(metric: str) -> str:
    return rf"^\s*{re.escape(metric)}:\s*([-+0-9.eEnaif]+)"


def check_pattern(flag: str, pattern: str, *, group: bool = True) -> str:
    """``pattern`` if it compiles (and has a group 1 holding the number, when ``group``)."""
    try:
        compiled = re.compile(pattern, re.MULTILINE)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"{flag} {pattern!r} is not a valid regular expression ({exc})") from None
    if group and compiled.groups < 1:
        raise ValueError(
            f"{flag} {pattern!r} has no group: put the number in parentheses, e.g. "
            "'^val_loss: ([0-9.]+)'"
        )
    return pattern


def check_command(command: str, shell: bool) -> str:
    """``command`` if it can be run: words that split (unbalanced quotes do not), or a shell
    script /bin/sh can parse."""
    import shlex
    import subprocess

    if not command.strip():
        raise ValueError("--command is empty: give the command that trains, e.g. 'uv run train.py'")
    if "\0" in command:
        raise ValueError("--command holds a NUL byte")
    try:
        check_command_size(command)  # issue 30: no exec could start it
    except ValueError as exc:
        raise ValueError(f"--command: {exc}") from None
    if shell:
        proc = subprocess.run(
            ["/bin/sh", "-n", "-c", command], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise ValueError(
                f"--command {command!r} is not valid shell ({proc.stderr.strip()[:200]})"
            )
        return command
    try:
        shlex.split(command)
    except ValueError as exc:
        raise ValueError(
            f"--command {command!r} cannot be split into words ({exc}); balance its quotes"
        ) from None
    return command


def check_timeout(seconds: float) -> float:
    if not 0 < seconds <= MAX_TIMEOUT:
        raise ValueError(
            f"--timeout {seconds:g}s: a run's budget is at most {MAX_TIMEOUT / 86400:g} days "
            "(e.g. 10m, 2h, 3d)"
        )
    return seconds


class ExperimentConfig(BackendBlocks):
    """What ``research init`` was told. Stored once in experiment.json."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str
    branch: str
    edit: list[str]
    protect: list[str] = Field(default_factory=list)
    command: str
    shell: bool = False
    metric: str = "val_bpb"
    goal: Literal["min", "max"] = "min"
    metric_pattern: str
    memory_pattern: str = DEFAULT_MEMORY_PATTERN
    fail_pattern: str = DEFAULT_FAIL_PATTERN
    # issue 38: intermediate values (elapsed, value); "": `progress: elapsed=<s> <metric>=<v>`
    metric_progress_regex: str = ""
    timeout: float = 600.0
    gpus: str = "auto"
    policy: Literal["greedy", "noise-aware", "manual"] = "noise-aware"
    noise_k: float = 2.0
    confirm: int = 0  # re-runs of a would-be keep before it is kept (the mean decides)
    # the decision rules (docs/research.md "Decisions"; research/rules.py): amounts are a
    # share of BASE's metric ("0.01%") or absolute metric units ("0.0001")
    noise_confirm: int = 2  # noise-aware: re-runs of a would-be keep within the noise
    baseline_repeats: int = 0  # runs of the first baseline; 0: 2 per platform (noise-aware)
    gain_per_line: str = "0.01%"  # a keep adding N lines (net) must gain N x this ("0": off)
    simplify: bool = True  # fewer lines with an equal metric (within the noise) is a keep
    equal_within: str = "0.05%"  # "equal" where no noise estimate exists yet
    vram_share: float = 0.10  # a keep raising peak memory by more than this share...
    vram_gain: str = "0.5%"  # ...must gain at least this
    base_platform: str = "majority"  # whose wins move BASE: majority | any | <accelerator>
    link: list[str] = Field(default_factory=list)
    # --protect of untracked (linked) files: path -> sha256 at init, checked after every run
    protect_sums: dict[str, str] = Field(default_factory=dict)
    linger: float = 120.0  # the background runner waits this long for new variants
    run: str = ""  # the core run, relative to the experiment folder
    # what runs each variant (config/backends.py); its settings are its block (``<name>:``)
    backend: str = "local"
    notify: NotifyConfig | None = None  # issue 37: webhooks of the core run (kept, failures)

    @model_validator(mode="after")
    def _runnable(self) -> ExperimentConfig:
        """Settings a runner could not use are refused when read, never at every start."""
        check_command(self.command, self.shell)
        check_pattern("--metric-regex", self.metric_pattern)
        check_pattern("--memory-regex", self.memory_pattern)
        check_pattern("fail_pattern", self.fail_pattern, group=False)
        check_progress_pattern(self.progress_pattern)
        check_timeout(self.timeout)
        check_rules(self)
        return self

    @property
    def progress_pattern(self) -> str:
        """The pattern of a progress line (issue 38): the setting, else the default."""
        return self.metric_progress_regex or default_pattern(self.metric)


def check_rules(cfg: ExperimentConfig) -> None:
    """The rule settings of ``cfg`` are usable (ValueError naming the field otherwise)."""
    for name in AMOUNT_FIELDS:
        parse_amount(name, getattr(cfg, name))
    if not math.isfinite(cfg.vram_share) or cfg.vram_share < 0:
        raise ValueError(f"vram_share {cfg.vram_share}: a share such as 0.1 (10%), 0 or more")
    if not math.isfinite(cfg.noise_k) or cfg.noise_k < 0:
        raise ValueError(f"noise_k {cfg.noise_k}: 0 or more")
    for name in ("confirm", "noise_confirm", "baseline_repeats"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} {getattr(cfg, name)}: 0 or more")
    if not cfg.base_platform.strip():
        raise ValueError("base_platform is empty: majority, any, or an accelerator's name")


@dataclass(frozen=True)
class ExpPaths:
    repo: Path
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "experiment.json"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def results_tsv(self) -> Path:
        return self.root / "results.tsv"

    @property
    def progress_png(self) -> Path:
        return self.root / "progress.png"

    @property
    def variants(self) -> Path:
        return self.root / "variants"

    def export_dir(self, variant_id: str) -> Path:
        if not re.fullmatch(r"v\d{4,}", variant_id):
            raise ResearchError(f"{variant_id!r} is not a variant id (they look like v0007)")
        return self.variants / variant_id

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    @property
    def loop_lock(self) -> Path:
        """Held (flock) by the one ``research loop`` of the experiment; says who holds it."""
        return self.root / "loop.lock"

    @property
    def serve_lock(self) -> Path:
        return self.root / "serve.lock"

    @property
    def daemon_log(self) -> Path:
        return self.root / "runner.log"

    @property
    def prompts(self) -> Path:
        return self.root / "prompts"


def experiments_dir(repo: Path) -> Path:
    return repo / EXPERIMENTS


def check_tag(tag: str) -> str:
    if not TAG_RE.fullmatch(tag):
        raise ResearchError(
            f"--tag {tag!r}: use letters, digits, '.', '_' or '-' (at most 64, no leading "
            "punctuation), e.g. --tag mar5"
        )
    return tag


def locate(repo: Path, tag: str | None) -> ExpPaths:
    """The experiment named ``tag``, or the one ``research init`` made last in this repo."""
    base = experiments_dir(repo)
    if tag is None:
        current = base / "current"
        try:
            tag = current.read_text().strip()
        except FileNotFoundError:
            raise ResearchError(
                f"no experiment in {repo}; start one with `gpuswarm research init --tag <tag> "
                "--edit train.py --command '...'`"
            ) from None
    paths = ExpPaths(repo, base / check_tag(tag))
    if not paths.config.is_file():
        known = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
        raise ResearchError(
            f"no experiment tagged {tag!r} in {repo} (known: {', '.join(known) or 'none'}); "
            "pass --tag"
        )
    return paths


def load_settings(paths: ExpPaths) -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(read_json(paths.config))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: "
            f"{str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ResearchError(
            f"{paths.config}: the experiment's settings cannot be used ({problems}); change "
            "them with `gpuswarm research config`, or start a new experiment"
        ) from None
    except (OSError, ValueError) as exc:
        raise ResearchError(f"{paths.config}: unreadable experiment settings ({exc})") from None


def save_settings(paths: ExpPaths, cfg: ExperimentConfig) -> None:
    atomic_write_json(paths.config, cfg.model_dump(mode="json"))


@contextlib.contextmanager
def flocked(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive flock on ``path``; yields False (without waiting) when not ``blocking``
    and someone else holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
