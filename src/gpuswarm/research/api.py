"""The research commands as functions: each settles the experiment, acts, and returns plain data
(the CLI prints it, or dumps it with --json)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuswarm import api
from gpuswarm.core.errors import ResearchError
from gpuswarm.core.fsutil import atomic_write_text
from gpuswarm.research import executor, exports, gitops, runner, variants
from gpuswarm.research.experiment import (
    DEFAULT_MEMORY_PATTERN,
    ExperimentConfig,
    ExpPaths,
    State,
    Variant,
    append,
    check_command,
    check_pattern,
    check_tag,
    check_timeout,
    drop_row,
    experiments_dir,
    file_sha256,
    flocked,
    load_config,
    locate,
    metric_pattern,
    replay,
    save_config,
)
from gpuswarm.research.settle import seal_round, settle, settle_locked, write_tsv

WAIT_POLL_SECONDS = 0.2
RUNNER_CHECK_SECONDS = 2.0


@dataclass(frozen=True)
class Experiment:
    paths: ExpPaths
    cfg: ExperimentConfig

    @classmethod
    def open(cls, where: Path, tag: str | None) -> Experiment:
        paths = locate(gitops.toplevel(where), tag)
        return cls(paths, load_config(paths))

    def settle(self) -> State:
        return settle(self.paths, self.cfg)


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
    policy: str = "greedy"
    noise_k: float = 2.0
    confirm: int = 0
    branch_prefix: str = "autoresearch/"
    shell: bool = False
    link: list[str] | None = None
    metric_regex: str | None = None
    memory_regex: str | None = None
    linger: float = 120.0
    checkout: bool = True
    mode: str = "rounds"


def init(where: Path, opts: InitOptions) -> dict[str, Any]:
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
    api.plan_gpus(opts.gpus)  # a bad --gpus fails before anything is written
    # --link adds to the default .venv link (replacing it would break `uv run` in every run)
    links = [p for p in (".venv",) if (repo / p).is_dir()]
    links += [p for p in opts.link or [] if p not in links]
    cfg = ExperimentConfig(
        tag=tag,
        branch=branch,
        edit=opts.edit,
        protect=opts.protect,
        command=opts.command,
        shell=opts.shell,
        metric=opts.metric,
        goal=opts.goal,  # type: ignore[arg-type]
        metric_pattern=opts.metric_regex or metric_pattern(opts.metric),
        timeout=opts.timeout,
        gpus=opts.gpus,
        policy=opts.policy,  # type: ignore[arg-type]
        noise_k=opts.noise_k,
        link=links,
        linger=opts.linger,
        memory_pattern=opts.memory_regex or DEFAULT_MEMORY_PATTERN,
        confirm=opts.confirm,
        protect_sums=_protect_sums(repo, head, opts.protect),
    )
    gitops.exclude(repo, "/.gpuswarm/")
    for ref in gitops.list_refs(repo, f"refs/gpuswarm/{tag}/"):  # of an earlier, removed run
        gitops.delete_ref(repo, ref)
    staging = root.with_name(f".{tag}.init")
    exports.remove_tree(staging)
    staging.mkdir(parents=True)
    paths = ExpPaths(repo, staging)
    cfg = cfg.model_copy(update={"run": executor.create_queue(paths, cfg)})
    save_config(paths, cfg)
    append(paths, "init", base=head, branch=branch, tag=tag)
    append(paths, "mode", mode=opts.mode)
    write_tsv(paths, cfg, replay(paths))
    staging.rename(root)  # one rename: an experiment exists whole or not at all
    gitops.create_branch(repo, branch, head)
    if opts.checkout:  # the seed's `git checkout -b`: same commit, so index and files stay
        gitops.git(repo, "symbolic-ref", "HEAD", f"refs/heads/{branch}")
    atomic_write_text(experiments_dir(repo) / "current", tag + "\n")
    paths = ExpPaths(repo, root)
    return {"tag": tag, "branch": branch, "base": head, "dir": str(root), **_files(paths)}


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
    gitops._check_path(rel)
    return gitops.blob(repo, head, rel) is None and (repo / rel).is_file()


def _protect_sums(repo: Path, head: str, protect: list[str]) -> dict[str, str]:
    """sha256 of each protected file that is not committed (a linked val.bin): a run that
    writes into it is caught by the checksum after it ends."""
    return {rel: file_sha256(repo / rel) for rel in protect if _untracked_file(repo, head, rel)}


def _files(paths: ExpPaths) -> dict[str, str]:
    return {"results": str(paths.results_tsv), "ledger": str(paths.ledger)}


# -- queueing variants -------------------------------------------------------------------------
def _queue(exp: Experiment, state: State, vs: list[Variant]) -> None:
    for v in vs:
        executor.enqueue(exp.paths, exp.cfg, v)
    runner.ensure_runner(exp.paths, exp.cfg)


def _baseline_needed(state: State) -> bool:
    in_flight = any(v.kind == "baseline" and v.commit == state.base for v in state.in_flight())
    return state.best is None and not in_flight


def _queue_baselines(exp: Experiment, state: State, repeat: int) -> list[Variant]:
    out = []
    for i in range(repeat):
        text = "baseline" if repeat == 1 else f"baseline (repeat {i + 1}/{repeat})"
        out.append(
            variants.record(
                exp.paths,
                exp.cfg,
                state,
                kind="baseline",
                commit=state.base,
                parent=state.base,
                description=text,
                source="baseline",
            )
        )
    return out


def baseline(exp: Experiment, repeat: int = 1) -> dict[str, Any]:
    if repeat < 1:
        raise ResearchError("--repeat: at least 1")
    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        vs = _queue_baselines(exp, state, repeat)
        _queue(exp, state, vs)
    return {"queued": [v.view() for v in vs], "base": state.base}


def try_variant(
    exp: Experiment,
    message: str,
    *,
    patch: Path | None = None,
    files: dict[str, bytes | None] | None = None,
    from_id: str | None = None,
    base: str | None = None,
    source: str = "manual",
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Snapshot an edit as a variant on BASE, restore the user's files, queue it; returns at once.

    The edit comes from the user's working tree (default), a patch, or ``files`` (proposers:
    the full new contents, made from ``base``; re-based when BASE has moved since).
    """
    message = " ".join(message.split())
    if not message:
        raise ResearchError("-m: say in a few words what this variant tries")
    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        if files is not None:
            commit = _from_proposal(exp, state, files, base or state.base, message)
        elif patch is not None:
            commit = variants.from_patch(exp.paths, exp.cfg, state, patch, message)
        elif from_id is not None:
            commit = _from_variant(exp, state, from_id, message)
        else:
            commit = variants.from_worktree(exp.paths, exp.cfg, state, message)
        same = variants.twin(exp.paths, state, commit)
        if same is not None:
            raise ResearchError(
                f"this variant's code is identical to {same}: it would measure nothing new, so "
                "it is not queued; change something else (your files are left as they are)"
            )
        queued = _queue_baselines(exp, state, 1) if _baseline_needed(state) else []
        v = variants.record(
            exp.paths,
            exp.cfg,
            state,
            kind="variant",
            commit=commit,
            parent=state.base,
            description=message,
            source=source,
            meta=meta,
        )
        if files is None and patch is None and from_id is None:
            if variants.on_branch(exp.paths, exp.cfg):
                variants.restore(exp.paths, exp.cfg, state.base)
            else:  # another branch's files: back to what they were, never BASE's
                start = variants.edit_start(exp.paths, exp.cfg, state)
                variants.restore(exp.paths, exp.cfg, start, journal=False)
        _queue(exp, state, [*queued, v])
    return {
        "id": v.id,
        "commit": v.commit,
        "parent": v.parent,
        "round": v.round,
        "baseline_queued": [b.id for b in queued],
        "diff": gitops.diff_stat(exp.paths.repo, v.parent, v.commit),
    }


def _from_proposal(
    exp: Experiment, state: State, files: dict[str, bytes | None], base: str, message: str
) -> str:
    """A proposer's files were made from ``base``: commit them there, then carry the change onto
    BASE if it moved meanwhile (never write old-BASE contents over what was kept since)."""
    commit = variants.from_files(exp.paths, exp.cfg, base, files, message)
    if base == state.base:
        return commit
    moved = variants.rebase(exp.paths, exp.cfg, commit, base, state.base, message)
    if moved is None:
        raise ResearchError(
            f"the proposal was made on BASE {gitops.short(base)} and conflicts with what was "
            f"kept since (BASE is now {gitops.short(state.base)})"
        )
    return moved


def _from_variant(exp: Experiment, state: State, vid: str, message: str) -> str:
    """Variant ``vid``'s change, merged onto the current BASE."""
    v = _variant(state, vid)
    commit = variants.rebase(exp.paths, exp.cfg, v.commit, v.parent, state.base, message)
    if commit is None:
        raise ResearchError(
            f"{vid}'s change conflicts with BASE {gitops.short(state.base)}; make the edit again"
        )
    if gitops.tree_of(exp.paths.repo, commit) == gitops.tree_of(exp.paths.repo, state.base):
        raise ResearchError(f"{vid}'s change is already part of BASE {gitops.short(state.base)}")
    return commit


# -- settings ----------------------------------------------------------------------------------
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
)


def configure(where: Path, tag: str | None, changes: dict[str, Any]) -> dict[str, Any]:
    """Show the experiment's settings, or change some (journaled as one ``config`` event; they
    apply to variants queued and decisions made from now on). Works on stored settings a runner
    could not use, so they can be fixed."""
    from gpuswarm.core.fsutil import read_json

    paths = locate(gitops.toplevel(where), tag)
    with flocked(paths.lock):
        try:
            raw: dict[str, Any] = dict(read_json(paths.config))
        except (OSError, ValueError) as exc:
            raise ResearchError(f"{paths.config}: unreadable experiment settings ({exc})") from None
        unknown = set(changes) - set(CHANGEABLE)
        if unknown:  # pragma: no cover - the CLI offers only these
            raise ResearchError(f"cannot change {', '.join(sorted(unknown))}")
        if "link" in changes:
            for rel in changes["link"]:
                gitops._check_path(rel)
        diff = {k: [raw.get(k), v] for k, v in changes.items() if raw.get(k) != v}
        cfg = _validated({**raw, **changes})
        if diff:
            save_config(paths, cfg)
            append(paths, "config", changes=diff)
    shown = {k: getattr(cfg, k) for k in ("tag", "branch", "edit", "protect", "metric", "goal")}
    shown.update({k: getattr(cfg, k) for k in CHANGEABLE})
    return {"settings": shown, "changed": diff, "file": str(paths.config)}


def _validated(merged: dict[str, Any]) -> ExperimentConfig:
    """The settings as the experiment would store them, or a ResearchError naming the field."""
    from pydantic import ValidationError

    if int(merged.get("confirm", 0)) < 0:
        raise ResearchError(f"--confirm {merged['confirm']}: the number of re-runs, 0 or more")
    try:
        return ExperimentConfig.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: "
            f"{str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ResearchError(problems) from None


def restore(exp: Experiment) -> dict[str, Any]:
    """Put the editable files back to BASE (drops uncommitted edits of them)."""
    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        variants.restore(exp.paths, exp.cfg, state.base)
    return {"base": state.base, "files": exp.cfg.edit}


# -- waiting and looking -----------------------------------------------------------------------
def wait(
    exp: Experiment,
    *,
    mode: str = "all",
    timeout: float | None = None,
    ids: list[str] | None = None,
) -> dict[str, Any]:
    """Block until any / all of the variants in flight (or ``ids``) are recorded; report them,
    and those recorded since the last wait, once."""
    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        seal_round(exp.paths, state)  # the agent's round ends with its wait
    fresh = [v.id for v in state.variants.values() if v.finished is None or not v.seen]
    targets = ids or fresh
    for vid in targets:
        if vid not in state.variants:
            raise ResearchError(f"no variant {vid} in experiment {exp.cfg.tag}")
    deadline = None if timeout is None else time.monotonic() + timeout
    looked = 0.0
    watch = runner.RunnerWatch(exp.paths, exp.cfg)
    while True:
        done = [t for t in targets if state.variants[t].finished is not None]
        if (mode == "any" and done) or len(done) == len(targets):
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        if time.monotonic() - looked > RUNNER_CHECK_SECONDS:
            watch.check()  # e.g. after `research stop` or a crash
            looked = time.monotonic()
        time.sleep(WAIT_POLL_SECONDS)
        if executor.finished_ids(exp.paths, exp.cfg) & (set(targets) - set(done)):
            state = exp.settle()
            watch.progressed()
    state = exp.settle()
    finished = [state.variants[t].view() for t in targets if state.variants[t].finished]
    if finished:
        append(exp.paths, "seen", ids=[v["id"] for v in finished])
    return {
        **_headline(exp, state),
        "finished": finished,
        "waiting": [t for t in targets if state.variants[t].finished is None],
        "timed_out": any(state.variants[t].finished is None for t in targets),
    }


def _headline(exp: Experiment, state: State) -> dict[str, Any]:
    return {
        "tag": exp.cfg.tag,
        "branch": exp.cfg.branch,
        "base": state.base,
        "best": state.best,
        "metric": exp.cfg.metric,
        "goal": exp.cfg.goal,
        "mode": state.mode,
        "round": state.round,
        "files": variants.files_case(exp.paths, exp.cfg, state),
    }


def status(exp: Experiment, last: int = 10) -> dict[str, Any]:
    state = exp.settle()
    now = time.time()
    live = executor.running(exp.paths, exp.cfg)
    in_flight = []
    for v in state.in_flight():
        run = live.get(v.id)
        in_flight.append(
            {
                **v.view(),
                "status": "running" if run else "queued",  # one state field, never two
                "slot": run["slot"] if run else None,
                "elapsed": round(now - run["since"], 1) if run else None,
            }
        )
    undecided = [v.view() for v in state.undecided() if v.finished is not None]
    return {
        **_headline(exp, state),
        "best_recorded": best_recorded(exp.cfg, state),
        "experiments": len(state.rows),
        "kept": sum(1 for r in state.rows if r[3] == "keep"),
        "in_flight": in_flight,
        "undecided": undecided,
        "last": [
            {
                "id": vid,
                "commit": r[0],
                "metric": None if r[3] == "crash" else float(r[1]),  # numbers, as in the TSV
                "memory_gb": float(r[2]),
                "status": r[3],
                "description": r[4],
            }
            for vid, r in list(zip(state.row_ids, state.rows, strict=False))[-last:]
            if last > 0
        ],
        "runner": bool(runner.runner_pids(exp.paths)),
        "timeout": exp.cfg.timeout,
        **_files(exp.paths),
    }


def best_recorded(cfg: ExperimentConfig, state: State) -> dict[str, Any] | None:
    """The best metric any run measured (kept or not): BASE's metric is what the policy kept,
    this is what was seen (a lucky re-run, a discarded winner under noise-aware)."""
    runs = [v for v in state.variants.values() if v.finished and v.finished.get("ok")]
    runs = [v for v in runs if v.finished and v.finished.get("metric") is not None]
    if not runs:
        return None
    sign = 1.0 if cfg.goal == "min" else -1.0
    top = min(runs, key=lambda v: sign * float((v.finished or {})["metric"]))
    return {
        "id": top.id,
        "metric": float((top.finished or {})["metric"]),
        "status": top.status,
        "commit": top.commit,
    }


def log(exp: Experiment) -> dict[str, Any]:
    """Every variant with every field the ledger has: host, times, the summary block, diff
    stats, the log tail and path, the decision and its reason, the proposer's notes."""
    state = exp.settle()
    out = []
    for v in state.variants.values():
        fin = v.finished or {}
        out.append(
            {
                **v.view(),
                "source": v.source,
                "origin": v.origin,
                "meta": v.meta,
                "host": fin.get("host"),
                "started": fin.get("started"),
                "ended": fin.get("ended"),
                "exit": fin.get("exit"),
                "summary": fin.get("summary") or {},
                "diff": fin.get("diff"),
                "tail": fin.get("tail") or "",
                "decision": None
                if v.decision is None
                else {k: v.decision.get(k) for k in ("status", "reason", "row", "ts")},
            }
        )
    return {**_headline(exp, state), "variants": out}


# -- manual decisions ----------------------------------------------------------------------------
def keep(exp: Experiment, vid: str, reason: str = "kept by hand") -> dict[str, Any]:
    from gpuswarm.research.policy import Decision
    from gpuswarm.research.settle import apply

    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        v = _variant(state, vid)
        if v.finished is None or not v.finished.get("ok"):
            raise ResearchError(
                f"{vid} has {'not finished' if v.finished is None else 'crashed'}"
                "; only a finished variant with a metric can be kept"
            )
        if v.decision is not None and v.decision["status"] != "discard":
            raise ResearchError(f"{vid} is already {v.decision['status']}")
        if v.kind == "baseline":
            raise ResearchError(f"{vid} is a baseline run; BASE is already what it measured")
        if v.parent != state.base:
            raise ResearchError(
                f"{vid} was measured on BASE {gitops.short(v.parent)}, and BASE is now "
                f"{gitops.short(state.base)}; re-evaluate it there with "
                f"`gpuswarm research try --from {vid} -m '...'`"
            )
        if v.decision is not None:  # overriding the policy: its one row is replaced
            drop_row(state, v)
        apply(exp.paths, exp.cfg, state, Decision(vid, "keep", reason))
    files = variants.files_case(exp.paths, exp.cfg, state)
    return {"id": vid, "status": "keep", "base": state.base, "files": files}


def discard(exp: Experiment, vid: str, reason: str = "discarded by hand") -> dict[str, Any]:
    from gpuswarm.research.policy import Decision
    from gpuswarm.research.settle import apply

    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        v = _variant(state, vid)
        if v.finished is None:
            return _withdraw(exp, state, v, reason)
        if v.decision is not None:
            raise ResearchError(f"{vid} is already {v.decision['status']}")
        apply(exp.paths, exp.cfg, state, Decision(vid, "discard", reason))
    return {"id": vid, "status": "discard", "base": state.base}


def _withdraw(exp: Experiment, state: State, v: Variant, reason: str) -> dict[str, Any]:
    """A queued variant taken back before it runs: journaled, no results.tsv row (it measured
    nothing); a running one is refused (it is measuring already)."""
    if v.kind == "confirm":
        raise ResearchError(f"{v.id} is a confirmation run of {v.origin}; it cannot be withdrawn")
    if not executor.withdraw(exp.paths, exp.cfg, v.id):
        raise ResearchError(
            f"{v.id} is running already; wait for it (or `gpuswarm research stop`, which puts "
            "running variants back in the queue, then discard it)"
        )
    why = reason if reason != "discarded by hand" else "withdrawn by hand before it ran"
    append(exp.paths, "finished", id=v.id, ok=False, metric=None, reason=why, withdrawn=True)
    append(exp.paths, "decided", id=v.id, status="withdrawn", reason=why, row=None)
    exports.remove_export(exp.paths, v.id)
    return {"id": v.id, "status": "withdrawn", "base": state.base}


def _variant(state: State, vid: str) -> Variant:
    if vid not in state.variants:
        known = ", ".join(list(state.variants)[-5:]) or "none yet"
        raise ResearchError(f"no variant {vid!r} (latest: {known})")
    return state.variants[vid]


def plot(exp: Experiment, output: Path | None = None) -> Path:
    from gpuswarm.research.plot import PlotRow, progress_png

    state = exp.settle()
    rows = [
        PlotRow(
            metric=None if r[3] == "crash" else float(r[1]),
            status=r[3],
            description=re.sub(r"^\[[^\]]*\]\s*", "", r[4]),  # without the [R3 gpu2] tag
        )
        for r in state.rows
    ]
    return progress_png(
        rows,
        output or exp.paths.progress_png,
        metric=exp.cfg.metric,
        goal=exp.cfg.goal,
        title=f"autoresearch/{exp.cfg.tag}",
        best=state.best,  # as the report and status say it (the mean of repeated baselines)
    )


def report(exp: Experiment) -> dict[str, str]:
    """progress.png and report.html of the experiment as it stands."""
    from gpuswarm.research.report import write_research_report

    png = plot(exp)
    state = replay(exp.paths)
    html = write_research_report(exp.paths, exp.cfg, state, png)
    return {"plot": str(png), "report": str(html), "results": str(exp.paths.results_tsv)}
