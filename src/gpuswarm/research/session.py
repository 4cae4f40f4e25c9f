"""An experiment as the research commands act on it: opening it, queueing baselines and
variants (the user's edit, a patch, another variant, a proposer's files), restoring BASE's files
and the manual decisions (keep, discard, withdraw). Each function settles the experiment first,
acts, and returns plain data (the CLI prints it, or dumps it with --json)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuswarm.core.errors import ResearchError
from gpuswarm.core.redact import name_redactor
from gpuswarm.research import executor, exports, gitops, rules, runner, variants
from gpuswarm.research.entries import VariantMeta
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths, flocked, load_settings, locate
from gpuswarm.research.journal import ExperimentState, Variant, append, drop_row
from gpuswarm.research.payloads import Decided, Files, Queued, Restored, Tried
from gpuswarm.research.policy import Decision
from gpuswarm.research.settle import apply, settle, settle_locked


@dataclass(frozen=True)
class Experiment:
    paths: ExpPaths
    cfg: ExperimentConfig

    @classmethod
    def open(cls, where: Path, tag: str | None) -> Experiment:
        paths = locate(gitops.toplevel(where), tag)
        return cls(paths, load_settings(paths))

    def settle(self) -> ExperimentState:
        return settle(self.paths, self.cfg)


def files_of(paths: ExpPaths) -> Files:
    return {"results": str(paths.results_tsv), "ledger": str(paths.ledger)}


# -- queueing variants -------------------------------------------------------------------------
def _queue(exp: Experiment, state: ExperimentState, vs: list[Variant]) -> None:
    for v in vs:
        executor.enqueue(exp.paths, exp.cfg, v)
    runner.ensure_runner(exp.paths, exp.cfg)


def _baseline_needed(state: ExperimentState) -> bool:
    in_flight = any(v.kind == "baseline" and v.commit == state.base for v in state.in_flight())
    return state.best is None and not in_flight


def _queue_baselines(exp: Experiment, state: ExperimentState, repeat: int) -> list[Variant]:
    """``repeat`` runs of BASE; with several GPU models, dealt to the models in turn, each run
    pinned to its model (its task's ``accelerator``), so every model gets its own baseline."""
    models = sorted(state.gpu_models) if len(state.gpu_models) > 1 else []
    out = []
    for i in range(repeat):
        text = "baseline" if repeat == 1 else f"baseline (repeat {i + 1}/{repeat})"
        model = models[i % len(models)] if models else None
        if model is not None:
            text += f" on {model}"
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
                meta={"platform": model} if model is not None else None,
            )
        )
    return out


def baseline(exp: Experiment, repeat: int = 1) -> Queued:
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
    meta: VariantMeta | None = None,
) -> Tried:
    """Snapshot an edit as a variant on BASE, restore the user's files, queue it; returns at once.

    The edit comes from the user's working tree (default), a patch, or ``files`` (proposers:
    the full new contents, made from ``base``; re-based when BASE has moved since).
    """
    message = name_redactor().name(" ".join(message.split()))  # an agent may echo a secret
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
        repeats = rules.auto_repeats(exp.cfg, state)  # enough runs for a spread, by default
        queued = _queue_baselines(exp, state, repeats) if _baseline_needed(state) else []
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
    exp: Experiment, state: ExperimentState, files: dict[str, bytes | None], base: str, message: str
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


def _from_variant(exp: Experiment, state: ExperimentState, vid: str, message: str) -> str:
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


def restore(exp: Experiment) -> Restored:
    """Put the editable files back to BASE (drops uncommitted edits of them)."""
    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        variants.restore(exp.paths, exp.cfg, state.base)
    return {"base": state.base, "files": exp.cfg.edit}


# -- manual decisions ----------------------------------------------------------------------------
def keep(exp: Experiment, vid: str, reason: str = "kept by hand") -> Decided:
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


def discard(exp: Experiment, vid: str, reason: str = "discarded by hand") -> Decided:
    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        v = _variant(state, vid)
        if v.finished is None:
            return _withdraw(exp, state, v, reason)
        if v.decision is not None:
            raise ResearchError(f"{vid} is already {v.decision['status']}")
        apply(exp.paths, exp.cfg, state, Decision(vid, "discard", reason))
    return {"id": vid, "status": "discard", "base": state.base}


def _withdraw(exp: Experiment, state: ExperimentState, v: Variant, reason: str) -> Decided:
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


def _variant(state: ExperimentState, vid: str) -> Variant:
    if vid not in state.variants:
        known = ", ".join(list(state.variants)[-5:]) or "none yet"
        raise ResearchError(f"no variant {vid!r} (latest: {known})")
    return state.variants[vid]
