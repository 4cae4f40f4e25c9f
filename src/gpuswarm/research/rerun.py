"""``research try --rerun ID`` (issue 38): run a variant again, in full.

A pruned variant was stopped by a rule that can be wrong (the noise is an estimate); this
measures it again to the end. The same commit runs when its parent is still BASE; otherwise its
change is carried onto today's BASE (as ``--from`` does). The new variant is marked ``full``:
no loop prunes it. Identical code to the variant re-run is the point, so the twin check that
refuses it elsewhere does not apply (identical to BASE still is refused).
"""

from __future__ import annotations

from typing import Any

from gpuswarm.core.errors import ResearchError
from gpuswarm.research import executor, gitops, runner, variants
from gpuswarm.research.experiment import flocked
from gpuswarm.research.figures import CHANGES
from gpuswarm.research.session import Experiment
from gpuswarm.research.settle import settle_locked


def rerun(exp: Experiment, vid: str, message: str | None = None) -> dict[str, Any]:
    """Queue variant ``vid`` again, to run in full; returns what ``try`` returns."""
    with flocked(exp.paths.lock):
        state = settle_locked(exp.paths, exp.cfg)
        old = state.variants.get(vid)
        if old is None:
            known = ", ".join(list(state.variants)[-5:]) or "none yet"
            raise ResearchError(f"no variant {vid!r} (latest: {known})")
        if old.kind not in CHANGES:
            raise ResearchError(
                f"{vid} is a {old.kind} run, not a change; `research baseline` runs BASE again"
            )
        if old.finished is None:
            raise ResearchError(f"{vid} has not finished yet; re-run it once it has")
        commit, text = old.commit, message or f"{old.description} (re-run of {vid} in full)"
        if old.parent != state.base:
            moved = variants.rebase(exp.paths, exp.cfg, old.commit, old.parent, state.base, text)
            if moved is None:
                raise ResearchError(
                    f"{vid}'s change conflicts with BASE {gitops.short(state.base)}; make the "
                    "edit again"
                )
            commit = moved
        if gitops.tree_of(exp.paths.repo, commit) == gitops.tree_of(exp.paths.repo, state.base):
            short = gitops.short(state.base)
            raise ResearchError(f"{vid}'s change is already part of BASE {short}")
        v = variants.record(
            exp.paths,
            exp.cfg,
            state,
            kind="variant",
            commit=commit,
            parent=state.base,
            description=text,
            source="rerun",
            meta={"rerun": vid, "full": True},
        )
        executor.enqueue(exp.paths, exp.cfg, v)
        runner.ensure_runner(exp.paths, exp.cfg)
    return {
        "id": v.id,
        "commit": v.commit,
        "parent": v.parent,
        "round": v.round,
        "baseline_queued": [],
        "diff": gitops.diff_stat(exp.paths.repo, v.parent, v.commit),
        "rerun": vid,
    }
