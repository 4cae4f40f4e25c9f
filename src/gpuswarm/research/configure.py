"""Making an experiment (``research init``: checks, the branch, the core run, the journal; one
rename so it exists whole or not at all) and showing or changing its settings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from gpuswarm.app import api
from gpuswarm.config.backends import backend_names, options_given, plugins
from gpuswarm.core.errors import ConfigError, ResearchError
from gpuswarm.core.fsutil import atomic_write_text, read_json
from gpuswarm.research import executor, exports, gitops
from gpuswarm.research.experiment import (
    DEFAULT_MEMORY_PATTERN,
    ExperimentConfig,
    ExpPaths,
    check_command,
    check_pattern,
    check_tag,
    check_timeout,
    experiments_dir,
    file_sha256,
    flocked,
    locate,
    metric_pattern,
    save_settings,
)
from gpuswarm.research.journal import append, replay
from gpuswarm.research.payloads import Configured, Made
from gpuswarm.research.ruleopts import RuleSettings
from gpuswarm.research.session import files_of
from gpuswarm.research.settle import write_tsv


# -- init --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InitOptions:
    tag: str
    edit: list[str]
    command: str
    protect: list[str]
    metric: str = "val_bpb"
    goal: str = "min"
    timeout: float = 600.0
    gpus: str = "auto"
    policy: str = "noise-aware"
    noise_k: float = 2.0
    confirm: int = 0
    rules: RuleSettings | None = None  # the decision rules' settings (research/rules.py)
    branch_prefix: str = "autoresearch/"
    shell: bool = False
    link: list[str] | None = None
    metric_regex: str | None = None
    memory_regex: str | None = None
    progress_regex: str | None = None  # issue 38: metric_progress_regex ("": the default)
    linger: float = 120.0
    checkout: bool = True
    mode: str = "rounds"
    backend: str = "local"  # what runs every variant (config/backends.py)
    # its options' values, by keyword (``--image``, ``--ray-address``, ...): its settings
    backend_values: Mapping[str, object] = field(default_factory=dict)
    notify: str | None = None  # issue 37: --notify URL (kept improvements, failures)


def init(where: Path, opts: InitOptions) -> Made:
    repo = gitops.toplevel(where)
    tag = check_tag(opts.tag)
    branch = f"{opts.branch_prefix}{tag}"
    root = experiments_dir(repo) / tag
    if gitops.branch_exists(repo, branch):
        raise ResearchError(
            f"branch {branch} already exists: an experiment is a fresh run; pick another --tag"
        )
    if root.exists():
        raise ResearchError(f"{root} already exists; pick another --tag (or remove that folder)")
    head = gitops.rev_parse(repo, "HEAD")
    if head is None:
        raise ResearchError(f"{repo} has no commit yet; commit the files first")
    _check_files(repo, head, opts)
    backend, settings = _backend_settings(opts)
    # a bad --gpus fails before anything is written (a cluster's backend: the cluster answers)
    plan = api.plan_gpus(opts.gpus, backend=backend, settings=settings)
    if backend != "local":  # e.g. the daemon answers and the image is there, before anything
        api.check_backend(backend, settings, repo)
    # --link adds to the default .venv link (replacing it would break `uv run` in every run)
    links = [p for p in (".venv",) if (repo / p).is_dir()]
    links += [p for p in opts.link or [] if p not in links]
    _check_rules(opts.rules or {})
    cfg = _validated(
        dict(
            tag=tag,
            branch=branch,
            edit=opts.edit,
            protect=opts.protect,
            command=opts.command,
            shell=opts.shell,
            metric=opts.metric,
            goal=opts.goal,
            metric_pattern=opts.metric_regex or metric_pattern(opts.metric),
            timeout=opts.timeout,
            gpus=opts.gpus,
            policy=opts.policy,
            noise_k=opts.noise_k,
            link=links,
            linger=opts.linger,
            memory_pattern=opts.memory_regex or DEFAULT_MEMORY_PATTERN,
            metric_progress_regex=opts.progress_regex or "",
            confirm=opts.confirm,
            protect_sums=_protect_sums(repo, head, opts.protect),
            backend=backend,
            **({backend: settings} if settings is not None else {}),
            notify={"url": opts.notify} if opts.notify else None,
            **(opts.rules or {}),
        )
    )
    gitops.exclude(repo, "/.gpuswarm/")
    for ref in gitops.list_refs(repo, f"refs/gpuswarm/{tag}/"):  # of an earlier, removed run
        gitops.delete_ref(repo, ref)
    staging = root.with_name(f".{tag}.init")
    exports.remove_tree(staging)
    staging.mkdir(parents=True)
    paths = ExpPaths(repo, staging)
    cfg = cfg.model_copy(update={"run": executor.create_queue(paths, cfg)})
    save_settings(paths, cfg)
    models = dict(Counter(plan.names))  # the platforms a baseline is run on, one per model
    append(paths, "init", base=head, branch=branch, tag=tag, gpu_models=models)
    append(paths, "mode", mode=opts.mode)
    write_tsv(paths, cfg, replay(paths))
    staging.rename(root)  # one rename: an experiment exists whole or not at all
    api.index_moved_run(
        (root / cfg.run).resolve(), (staging / cfg.run).resolve(), f"research-{tag}"
    )
    gitops.create_branch(repo, branch, head)
    if opts.checkout:  # the seed's `git checkout -b`: same commit, so index and files stay
        gitops.git(repo, "symbolic-ref", "HEAD", f"refs/heads/{branch}")
    atomic_write_text(experiments_dir(repo) / "current", tag + "\n")
    paths = ExpPaths(repo, root)
    return {"tag": tag, "branch": branch, "base": head, "dir": str(root), **files_of(paths)}


INIT = "research init"  # the command whose backend options these are


def _backend_settings(opts: InitOptions) -> tuple[str, BaseModel | None]:
    """``--backend NAME`` and its options (a backend's options alone choose it over local:
    ``--image`` means ``--backend docker``) as the experiment's backend and its settings."""
    values = opts.backend_values
    given = options_given(values)
    backend = opts.backend
    if given and backend == "local":
        backend = given[0].name
    for plugin in given:
        if plugin.name != backend:
            flags = ", ".join(o.decls[0] for o in plugin.options_for(INIT) if o.given(values))
            raise ResearchError(f"{flags} need --backend {plugin.name}")
    chosen = plugins().get(backend)
    if chosen is None:
        raise ResearchError(f"--backend {backend}: unknown; known: {', '.join(backend_names())}")
    if chosen.apply_options is None:
        return backend, chosen.defaults()
    try:
        return backend, chosen.apply_options(None, values)
    except ConfigError as exc:
        raise ResearchError(str(exc)) from None


def _check_files(repo: Path, head: str, opts: InitOptions) -> None:
    if not opts.edit:
        raise ResearchError("--edit: name at least one file a variant may change, e.g. train.py")
    for flag, files in (("--edit", opts.edit), ("--protect", opts.protect)):
        for rel in files:
            if flag == "--protect" and _untracked_file(repo, head, rel):
                continue  # a linked data file: protected by its checksum
            if gitops.blob(repo, head, rel) is None:
                raise ResearchError(
                    f"{flag} {rel}: not a file committed at HEAD {gitops.short(head)}; commit "
                    "it first (paths are relative to the repository root)"
                )
    both = set(opts.edit) & set(opts.protect)
    if both:
        raise ResearchError(f"{', '.join(sorted(both))}: a file cannot be editable and protected")
    if opts.confirm < 0:
        raise ResearchError(f"--confirm {opts.confirm}: the number of re-runs, 0 or more")
    try:  # what the runner needs must be usable: refused here, never at its every start
        check_command(opts.command, opts.shell)
        check_timeout(opts.timeout)
        for flag, pattern in (
            ("--metric-regex", opts.metric_regex),
            ("--memory-regex", opts.memory_regex),
        ):
            if pattern is not None:
                check_pattern(flag, pattern)
    except ValueError as exc:
        raise ResearchError(str(exc)) from None


def _untracked_file(repo: Path, head: str, rel: str) -> bool:
    gitops.check_path(rel)
    return gitops.blob(repo, head, rel) is None and (repo / rel).is_file()


def _protect_sums(repo: Path, head: str, protect: list[str]) -> dict[str, str]:
    """sha256 of each protected file that is not committed (a linked val.bin): a run that
    writes into it is caught by the checksum after it ends."""
    return {rel: file_sha256(repo / rel) for rel in protect if _untracked_file(repo, head, rel)}


# -- settings ----------------------------------------------------------------------------------
RULES = (
    "noise_confirm",
    "baseline_repeats",
    "gain_per_line",
    "simplify",
    "equal_within",
    "vram_share",
    "vram_gain",
    "base_platform",
)


class SettingChanges(RuleSettings, total=False):
    """``research config``'s changes (``CHANGEABLE``), in the order they were given."""

    command: str
    shell: bool
    policy: str
    noise_k: float
    confirm: int
    timeout: float
    linger: float
    link: list[str]
    metric_pattern: str
    memory_pattern: str
    metric_progress_regex: str


CHANGEABLE = (
    "command",
    "shell",
    "timeout",
    "link",
    "policy",
    "noise_k",
    "confirm",
    "linger",
    "metric_pattern",
    "memory_pattern",
    "metric_progress_regex",
    *RULES,
)


def _check_rules(rules: RuleSettings) -> None:
    """The decision rules' settings given to init, checked as the config command checks them."""
    unknown = set(rules) - set(RULES)
    if unknown:  # pragma: no cover - the CLI offers only these
        raise ResearchError(f"unknown rule setting(s) {', '.join(sorted(unknown))}")


def configure(where: Path, tag: str | None, changes: SettingChanges) -> Configured:
    """Show the experiment's settings, or change some (journaled as one ``config`` event; they
    apply to variants queued and decisions made from now on). Works on stored settings a runner
    could not use, so they can be fixed."""
    paths = locate(gitops.toplevel(where), tag)
    with flocked(paths.lock):
        try:
            raw: dict[str, object] = dict(read_json(paths.config))
        except (OSError, ValueError) as exc:
            raise ResearchError(f"{paths.config}: unreadable experiment settings ({exc})") from None
        unknown = set(changes) - set(CHANGEABLE)
        if unknown:  # pragma: no cover - the CLI offers only these
            raise ResearchError(f"cannot change {', '.join(sorted(unknown))}")
        if "link" in changes:
            for rel in changes["link"]:
                gitops.check_path(rel)
        diff = {k: [raw.get(k), v] for k, v in changes.items() if raw.get(k) != v}
        cfg = _validated({**raw, **changes})
        if diff:
            save_settings(paths, cfg)
            append(paths, "config", changes=diff)
    shown = {k: getattr(cfg, k) for k in ("tag", "branch", "edit", "protect", "metric", "goal")}
    shown.update({k: getattr(cfg, k) for k in CHANGEABLE})
    return {"settings": shown, "changed": diff, "file": str(paths.config)}


def _validated(merged: Mapping[str, object]) -> ExperimentConfig:
    """The settings as the experiment would store them (the stored file's, any JSON, with the
    changes over them), or a ResearchError naming the field."""
    confirm = merged.get("confirm", 0)
    if isinstance(confirm, int | float | str) and int(confirm) < 0:
        raise ResearchError(f"--confirm {confirm}: the number of re-runs, 0 or more")
    try:
        return ExperimentConfig.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(
            (f"{'.'.join(str(p) for p in e['loc'])}: " if e["loc"] else "")
            + str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors()
        )
        raise ResearchError(problems) from None
