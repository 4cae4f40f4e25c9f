"""Bringing an experiment up to date: record finished runs, apply decisions, move the branch.

Every research command settles first, under the experiment lock. Settling is idempotent and
finishes whatever a crash cut short: a variant journaled but never queued is queued; a keep
whose branch move is not journaled is moved (or found moved); exports of recorded variants are
removed. Order for a keep: the ``decided`` event (with its results.tsv row) is fsynced and
results.tsv rewritten, then the branch is moved (compare-and-swap), then ``base`` is journaled.
"""

from __future__ import annotations

import statistics

from gpuswarm.app import api
from gpuswarm.core.errors import ResearchError
from gpuswarm.core.fsutil import atomic_write_text
from gpuswarm.research import (
    controls,
    executor,
    exports,
    gitops,
    outcome,
    prune,
    rules,
    runner,
    variants,
)
from gpuswarm.research.announce import announce_kept
from gpuswarm.research.entries import ResultRow, VariantMeta, metric_of
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths, flocked
from gpuswarm.research.journal import ExperimentState, Variant, append, replay
from gpuswarm.research.policy import Decision, decide
from gpuswarm.research.proposercost import tsv_header, tsv_rows

HEADER = ["commit", "val_bpb", "memory_gb", "status", "description"]


def settle(paths: ExpPaths, cfg: ExperimentConfig) -> ExperimentState:
    with flocked(paths.lock):
        return settle_locked(paths, cfg)


def settle_locked(paths: ExpPaths, cfg: ExperimentConfig) -> ExperimentState:
    state = replay(paths)
    executor.remove_cut_writes(paths, cfg)
    _follow_branch(paths, cfg, state)
    variants.adopt_worktree(paths, cfg, state)
    queued = executor.tasks(paths, cfg) if state.in_flight() else {}
    if any(st is api.TaskState.RUNNING for st, _ in queued.values()):
        # claimed, so some runner ran them: if it is dead, whoever notices owns its leftovers
        # at once (a new runner's recovery kills the orphaned training processes, re-queues)
        runner.ensure_runner(paths, cfg)
    for v in state.in_flight():
        found = queued.get(v.id)
        if found is None:
            executor.enqueue(paths, cfg, v)  # journaled, but a crash came before it was queued
            continue
        out = outcome.outcome(paths, cfg, v, found)
        if out is None:
            continue
        extra: dict[str, object] = {}  # what outcome.py cannot know
        if v.pruned is not None and not out["ok"]:  # issue 38: the loop stopped it early
            extra.update(prune.finished_fields(cfg, state, v, out))
        if v.kind != "baseline":
            extra["diff"] = gitops.diff_stat(paths.repo, v.parent, v.commit)
        v.finished = append(paths, "finished", id=v.id, **{**out, **extra})
    while decisions := decide(cfg, state):
        for d in decisions:
            apply(paths, cfg, state, d)
    _withdraw_moot_reruns(paths, cfg, state)
    _platform_baseline(paths, cfg, state)
    _control_wanted(paths, cfg, state)
    _remove_exports(paths, state)
    if not paths.results_tsv.exists():
        write_tsv(paths, cfg, state)  # every decision rewrites it; this is for a fresh start
    return state


def _platform_baseline(paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState) -> None:
    """With several GPU models, a variant is compared with BASE's runs on its own model: queue
    one more baseline run when a result waits on a model BASE has not run on yet, pinned to
    that model (its task's ``accelerator``: only that model's slots claim it)."""
    if cfg.policy == "manual":
        return
    platform = rules.baseline_wanted(cfg, state)
    if platform is None:
        return
    description = f"baseline (wanted on {rules.short_platform(platform)})"
    _queue_base_run(paths, cfg, state, "baseline", description, {"platform": platform})


def _queue_base_run(
    paths: ExpPaths,
    cfg: ExperimentConfig,
    state: ExperimentState,
    kind: str,
    description: str,
    meta: VariantMeta | None,
) -> Variant:
    """Journal and queue one more run of BASE (a baseline or a control) and see that a runner
    serves it."""
    v = variants.record(
        paths,
        cfg,
        state,
        kind=kind,
        commit=state.base,
        parent=state.base,
        description=description,
        source=kind,
        meta=meta,
    )
    executor.enqueue(paths, cfg, v)
    runner.ensure_runner(paths, cfg)
    return v


def queue_control(
    paths: ExpPaths,
    cfg: ExperimentConfig,
    state: ExperimentState,
    why: str,
    platform: str | None = None,
) -> Variant:
    """Queue a control run: BASE again, the reference of the variants of its period (with
    several GPU models, pinned to ``platform``'s GPUs when given)."""
    pinned: VariantMeta | None = (
        {"platform": platform} if platform and rules.multi_platform(state) else None
    )
    description = f"control: BASE {gitops.short(state.base)} ({why})"
    return _queue_base_run(paths, cfg, state, "control", description, pinned)


def _control_wanted(paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState) -> None:
    """With paired decisions, a result that waits for a BASE run of its own period (none ran
    beside or after it: a keep just moved BASE, or the loop's cadence has not come round)
    gets one now, so that no decision stalls."""
    platform = controls.wanted(state) if cfg.policy != "manual" else None
    if platform is not None:
        queue_control(paths, cfg, state, "the period of a result that waits for one", platform)


def _follow_branch(paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState) -> None:
    """Finish a keep a crash cut short; adopt a branch someone moved forward outside gpuswarm."""
    tip = gitops.rev_parse(paths.repo, f"refs/heads/{cfg.branch}")
    if tip is None:
        raise ResearchError(
            f"branch {cfg.branch} is gone; the experiment cannot go on without it "
            f"(re-create it at BASE: git branch {cfg.branch} {state.base})"
        )
    move = state.pending_base
    if move is not None:
        if tip == move.frm:
            gitops.update_ref(paths.repo, f"refs/heads/{cfg.branch}", move.to, move.frm)
            tip = move.to
        if tip == move.to:
            _based(paths, state, move.frm, move.to, move.id)
            return
    if tip != state.base:
        if not gitops.is_ancestor(paths.repo, state.base, tip):
            raise ResearchError(
                f"branch {cfg.branch} was moved outside gpuswarm to {gitops.short(tip)}, which "
                f"does not contain BASE {gitops.short(state.base)}; move it back with "
                f"`git branch -f {cfg.branch} {state.base}`"
            )
        _based(paths, state, state.base, tip, None)  # a new BASE without a metric: re-baseline
        if variants.on_branch(paths, cfg):  # the user's commit (or reset, merge) on the branch:
            append(paths, "worktree", base=tip)  # git wrote the files; edits start from there
            state.worktree_base = tip


def _based(paths: ExpPaths, state: ExperimentState, frm: str, to: str, vid: str | None) -> None:
    append(paths, "base", **{"from": frm, "to": to, "id": vid})
    state.base = to
    state.pending_base = None


def apply(paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState, d: Decision) -> None:
    v = state.variants[d.id]
    if d.status == "rebase":
        _rebase(paths, cfg, state, v, d)
        return
    if d.status == "confirm":
        _confirm(paths, cfg, state, v, d.runs or cfg.confirm)
        return
    metric = None
    if d.status == "keep" and v.kind not in ("confirm", "control"):
        assert v.finished is not None
        if v.kind == "baseline" and rules.multi_platform(state):
            metric = {"commit": v.commit, "value": _shown_metric(state, v.commit)}
        elif v.kind == "baseline":
            runs = [*state.baselines.get(v.commit, []), metric_of(v.finished)]
            metric = {"commit": v.commit, "value": statistics.fmean(runs)}
        else:
            value = d.metric if d.metric is not None else metric_of(v.finished)
            metric = {"commit": v.commit, "value": value}
    _decided(paths, cfg, state, v, d.status, d.reason, metric, note=d.note)
    if d.status == "keep" and v.kind in ("variant", "combo"):
        _advance(paths, cfg, state, v)
        announce_kept(paths, cfg, v, metric)  # issue 37: the webhook, if any


def _withdraw_moot_reruns(paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState) -> None:
    """Confirmation re-runs of a variant decided without them (discarded because another
    variant moved BASE meanwhile, say) would hold GPUs for nothing: a queued one is taken out,
    a running one is cancelled; each is journaled withdrawn (no results.tsv row)."""
    for c in state.in_flight():
        origin = state.variants.get(c.origin or "")
        if c.kind != "confirm" or origin is None or origin.decision is None:
            continue
        if not executor.withdraw(paths, cfg, c.id):
            executor.cancel(paths, cfg, c.id, f"re-run of {origin.id}, decided without it")
        why = (
            f"withdrawn: {origin.id} was decided ({origin.decision['status']}) before this "
            "re-run ended"
        )
        c.finished = append(
            paths, "finished", id=c.id, ok=False, metric=None, reason=why, withdrawn=True
        )
        c.decision = append(paths, "decided", id=c.id, status="withdrawn", reason=why, row=None)


def _shown_metric(state: ExperimentState, commit: str) -> float:
    """BASE's metric as status shows it with several platforms: the mean of its runs on the
    platform that moves BASE by default (the majority), else anywhere."""
    for where in (rules.majority_platform(state), None):
        found = [rules.ok_metric(r) for r in rules.runs_of(state, commit, where)]
        runs = [m for m in found if m is not None]
        if runs:
            return statistics.fmean(runs)
    raise AssertionError(f"no run of {commit}")  # pragma: no cover - called for a finished run


def _confirm(
    paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState, v: Variant, n: int
) -> None:
    """Queue the ``n`` re-runs that confirm (or not) a would-be keep; ``v`` stays undecided."""
    for i in range(n):
        run = variants.record(
            paths,
            cfg,
            state,
            kind="confirm",
            commit=v.commit,
            parent=v.parent,
            description=f"{v.description} (confirmation {i + 1}/{n})",
            source="confirm",
            origin=v.id,
            round=v.round,
        )
        executor.enqueue(paths, cfg, run)


def _decided(
    paths: ExpPaths,
    cfg: ExperimentConfig,
    state: ExperimentState,
    v: Variant,
    status: str,
    reason: str,
    metric: dict[str, object] | None,
    *,
    note: str = "",
) -> None:
    row = tsv_row(state, v, status, note)
    v.decision = append(
        paths, "decided", id=v.id, status=status, reason=reason, row=row, base_metric=metric
    )
    state.rows.append(row)
    state.row_ids.append(v.id)
    if metric is not None:
        state.base_metric[str(metric["commit"])] = float(metric["value"])  # type: ignore[arg-type]
        if v.kind == "baseline":
            state.baselines.setdefault(v.commit, []).append(metric_of(v.finished))
    write_tsv(paths, cfg, state)  # the row is on disk before the branch moves


def _advance(paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState, v: Variant) -> None:
    old = state.base
    # the files follow a keep only where gpuswarm wrote them last and nobody edited them since;
    # with HEAD on another branch (--no-checkout, `git checkout master`) they are never touched
    follow = variants.on_branch(paths, cfg)
    clean = follow and variants.worktree_clean(paths, cfg, state.worktree_base)
    gitops.update_ref(paths.repo, f"refs/heads/{cfg.branch}", v.commit, old)
    _based(paths, state, old, v.commit, v.id)
    if follow:  # HEAD follows the branch: keep `git status` clean
        variants.sync_index(paths, cfg, v.commit)
    if clean:  # nobody is editing: the editable files follow BASE
        variants.restore(paths, cfg, v.commit)
        state.worktree_base = v.commit


def _rebase(
    paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState, v: Variant, d: Decision
) -> None:
    combo = next((c for c in state.variants.values() if c.origin == v.id), None)
    if combo is None:
        message = f"{v.description} (re-based onto {gitops.short(state.base)})"
        commit = variants.rebase(paths, cfg, v.commit, v.parent, state.base, message)
        if commit is None:
            reason = f"{d.reason}; conflicts with BASE {gitops.short(state.base)}"
            _decided(paths, cfg, state, v, "discard", reason, None)
            return
        same = variants.twin(paths, state, commit)
        if same is not None:  # nothing new to measure: never run or keep an empty change
            what = "already part of" if same.startswith("BASE") else "on BASE identical to"
            reason = f"{d.reason}; its change is {what} {same}, not re-evaluated"
            _decided(paths, cfg, state, v, "discard", reason, None)
            return
        combo = variants.record(
            paths,
            cfg,
            state,
            kind="combo",
            commit=commit,
            parent=state.base,
            description=f"{_change_of(state, v)} + BASE {gitops.short(state.base)}",
            source=v.source,
            origin=v.id,
        )
        executor.enqueue(paths, cfg, combo)
    reason = f"{d.reason}; re-evaluating on BASE {gitops.short(state.base)} as {combo.id}"
    # a discard better than the running best reads as a bug unless the row says why
    _decided(paths, cfg, state, v, "discard", reason, None, note=f"re-based, see {combo.id}")


def _change_of(state: ExperimentState, v: Variant) -> str:
    """The description of the change a (possibly re-based again) variant carries."""
    while v.kind == "combo" and v.origin in state.variants:
        v = state.variants[v.origin]
    return v.description


def seal_round(paths: ExpPaths, state: ExperimentState) -> None:
    """Close the open round to new variants (rounds mode): it is decided once all are in."""
    if state.mode == "rounds" and any(v.round == state.round for v in state.variants.values()):
        append(paths, "sealed", n=state.round)
        state.sealed.add(state.round)
        state.round += 1


def _remove_exports(paths: ExpPaths, state: ExperimentState) -> None:
    if not paths.variants.is_dir():
        return
    for entry in paths.variants.iterdir():
        v = state.variants.get(entry.name)
        if v is None or v.finished is not None:
            exports.remove_tree(entry)


# -- results.tsv -------------------------------------------------------------------------------
def tsv_row(state: ExperimentState, v: Variant, status: str, note: str = "") -> list[str]:
    """The seed's five columns: 7-char commit, metric (6 decimals), memory GB (.1f), status,
    description (tagged ``[R3 gpu2]`` in rounds mode); crashes read ``0.000000  0.0``."""
    fin = v.finished or {}
    crash = status in ("crash", "pruned")  # pruned (issue 38): no final metric either
    metric = 0.0 if crash else float(fin.get("metric") or 0.0)
    memory = 0.0 if crash else float(fin.get("memory_gb") or 0.0)
    gpu = f"gpu{fin['gpu']}" if fin.get("gpu") not in (None, "") else ""
    if rules.multi_platform(state) and rules.platform_of(v):  # which baseline it is compared with
        gpu = " ".join(filter(None, (gpu, rules.short_platform(rules.platform_of(v)))))
    text = v.description
    if v.kind == "baseline":
        several = "repeat" in text or "wanted" in text or rules.multi_platform(state)
        tag = f"[{gpu}] " if gpu and several else ""
    elif (v.mode or state.mode) == "rounds":  # the mode it was made in (a loop's, say)
        tag = f"[R{v.round} {gpu}] " if gpu else f"[R{v.round}] "
    else:
        tag = f"[{gpu}] " if gpu else ""
    if crash:
        text = f"{text} ({fin.get('reason') or 'crash'})"
    elif note:
        text = f"{text} ({note})"
    desc = " ".join((tag + text).replace("\t", " ").split())
    return list(ResultRow(gitops.short(v.commit), f"{metric:.6f}", f"{memory:.1f}", status, desc))


def write_tsv(paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState) -> None:
    header = tsv_header([HEADER[0], cfg.metric, *HEADER[2:]], state)  # issue 34
    lines = ["\t".join(header), *("\t".join(row) for row in tsv_rows(state))]
    atomic_write_text(paths.results_tsv, "\n".join(lines) + "\n")
