"""Making variant commits (from the user's edits, a patch, or a proposer's files) and putting the
user's editable files back to BASE.

A variant is BASE plus a change to the editable files only. It is built with a temporary index
(gitops), so the user's index, HEAD and branch are never touched, and kept alive by a ref
``refs/gpuswarm/<tag>/<id>``. The user's editable files track BASE: ``try`` restores them after
snapshotting, and a keep updates them when they are clean. ``worktree_base`` (journaled) is the
BASE they were last restored to: an edit made on an older BASE is merged onto the current one.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import tempfile
from pathlib import Path

from gpuswarm.core.errors import ResearchError
from gpuswarm.research import gitops
from gpuswarm.research.entries import VariantMeta
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths
from gpuswarm.research.journal import ExperimentState, Variant, append
from gpuswarm.research.payloads import FilesCase


def variant_ref(cfg: ExperimentConfig, variant_id: str) -> str:
    return f"refs/gpuswarm/{cfg.tag}/{variant_id}"


def record(
    paths: ExpPaths,
    cfg: ExperimentConfig,
    state: ExperimentState,
    *,
    kind: str,
    commit: str,
    parent: str,
    description: str,
    source: str,
    origin: str | None = None,
    meta: VariantMeta | None = None,
    round: int | None = None,
) -> Variant:
    """Journal a new variant (its ref first, so the commit outlives any gc)."""
    vid = state.next_id()
    gitops.git(paths.repo, "update-ref", variant_ref(cfg, vid), commit)
    e = append(
        paths,
        "variant",
        id=vid,
        kind=kind,
        commit=commit,
        parent=parent,
        description=" ".join(description.split()),
        round=state.round if round is None else round,
        source=source,
        origin=origin,
        meta=meta or {},
    )
    desc, ts = e["description"], e["ts"]
    v = Variant(vid, kind, commit, parent, desc, int(e["round"]), source, ts, origin)
    v.meta, v.mode = meta or {}, state.mode
    state.variants[vid] = v
    return v


def twin(paths: ExpPaths, state: ExperimentState, commit: str) -> str | None:
    """What ``commit``'s code is identical to (same tree): BASE, or a variant already queued,
    running or decided ("v0003 (discard)"); None when it is new. Identical code measures
    nothing new: it is never run or kept."""
    commits = [state.base, commit, *(v.commit for v in state.variants.values())]
    tree = gitops.trees(paths.repo, commits)
    if tree[commit] == tree[state.base]:
        return f"BASE {gitops.short(state.base)}"
    for v in state.variants.values():
        if v.decision is not None and v.decision["status"] == "withdrawn":
            continue  # it never ran: trying it again is fine
        if tree[v.commit] == tree[commit]:
            where = v.decision["status"] if v.decision is not None else "in flight"
            return f"{v.id} ({where}: {v.description})"
    return None


def _editable_text(paths: ExpPaths, rel: str) -> bytes | None:
    try:
        return (paths.repo / rel).read_bytes()
    except FileNotFoundError:
        return None


def edit_start(paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState) -> str:
    """The commit the user's files were made from: the last BASE gpuswarm wrote into them while
    HEAD is on the experiment branch, else HEAD's commit (gpuswarm never wrote there)."""
    if on_branch(paths, cfg):
        return state.worktree_base
    return gitops.rev_parse(paths.repo, "HEAD") or state.worktree_base


def from_worktree(
    paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState, message: str
) -> str:
    """A commit on BASE holding the user's current edits of the editable files."""
    start = edit_start(paths, cfg, state)
    _refuse_outside_edits(paths, cfg, start)
    edits = {
        rel: data
        for rel in cfg.edit
        if (data := _editable_text(paths, rel)) != gitops.blob(paths.repo, start, rel)
    }
    if not edits:
        raise ResearchError(
            f"no change to {', '.join(cfg.edit)} since BASE {gitops.short(start)}; edit "
            "the file(s) first, or pass --patch FILE"
        )
    commit = gitops.commit_files(paths.repo, start, edits, message)
    if start == state.base:
        return commit
    # another branch's HEAD may differ from BASE in more than the editable files: carry over
    # only the edit of those (a variant is BASE plus a change to them, nothing else)
    files_only = not on_branch(paths, cfg)
    moved = rebase(paths, cfg, commit, start, state.base, message, files_only=files_only)
    if moved is None:
        raise ResearchError(
            f"your edit of {', '.join(edits)} was made on BASE {gitops.short(start)}, and "
            f"it conflicts with what was kept since (BASE is now {gitops.short(state.base)}); "
            f"see `git diff {gitops.short(start)} {gitops.short(commit)}`, then run "
            "`gpuswarm research restore` and make the edit again"
        )
    return moved


def _refuse_outside_edits(paths: ExpPaths, cfg: ExperimentConfig, base: str) -> None:
    outside = [p for p in gitops.changed_paths(paths.repo, base) if p not in cfg.edit]
    if not outside:
        return
    protected = [p for p in outside if p in cfg.protect]
    what = f"protected file(s) {', '.join(protected)}" if protected else ", ".join(outside[:8])
    raise ResearchError(
        f"changes outside the editable files ({', '.join(cfg.edit)}): {what}; a variant may "
        "change only those. Undo them (e.g. `git checkout -- <file>`) or start an experiment "
        "with more --edit files"
    )


def from_patch(
    paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState, patch: Path, message: str
) -> str:
    """A commit on BASE with a unified diff applied (to the editable files only)."""
    if not patch.is_file():
        raise ResearchError(f"--patch {patch}: no such file")
    repo = paths.repo
    listed = gitops.git(repo, "apply", "--numstat", str(patch.resolve()), check=False)
    touched = [line.split("\t")[-1] for line in listed.splitlines() if line.count("\t") >= 2]
    outside = [p for p in touched if p not in cfg.edit]
    if not touched or outside:
        raise ResearchError(
            f"--patch {patch}: it must change only {', '.join(cfg.edit)}"
            + (f" (it changes {', '.join(outside)})" if outside else " (it changes nothing)")
        )
    with tempfile.TemporaryDirectory(prefix="gpuswarm-patch-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        gitops.git(repo, "read-tree", state.base, env=env)
        proc = gitops.git(
            repo, "apply", "--cached", "--recount", str(patch.resolve()), env=env, check=False
        )
        tree = gitops.git(repo, "write-tree", env=env)
        files = {p: gitops.blob(repo, tree, p) for p in touched}
    if all(files[p] == gitops.blob(repo, state.base, p) for p in touched):
        raise ResearchError(f"--patch {patch}: does not apply to BASE {gitops.short(state.base)}")
    del proc
    return gitops.commit_files(repo, state.base, files, message)


def from_files(
    paths: ExpPaths, cfg: ExperimentConfig, base: str, files: dict[str, bytes | None], message: str
) -> str:
    """A commit on ``base`` with the given contents of editable files (proposers)."""
    outside = [p for p in files if p not in cfg.edit]
    if outside:
        raise ResearchError(f"a variant may change only {', '.join(cfg.edit)}: not {outside}")
    return gitops.commit_files(paths.repo, base, files, message)


def restore(paths: ExpPaths, cfg: ExperimentConfig, base: str, *, journal: bool = True) -> None:
    """Write ``base``'s editable files into the user's working tree, verify, and journal it
    (``journal``: the files are at a BASE; not when they were put back to another branch's)."""
    for rel in cfg.edit:
        want = gitops.blob(paths.repo, base, rel)
        target = paths.repo / rel
        if want is None:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            continue
        mode = 0o755 if gitops.file_mode(paths.repo, base, rel) == "100755" else 0o644
        tmp = target.with_name(f".{target.name}.gpuswarm-{os.getpid()}")
        tmp.write_bytes(want)
        tmp.chmod(mode)
        os.replace(tmp, target)
        if target.read_bytes() != want:
            raise ResearchError(f"{target}: could not be restored to BASE (it changed meanwhile)")
    if journal:
        append(paths, "worktree", base=base)


def adopt_worktree(paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState) -> None:
    """HEAD is on the branch and the files are exactly BASE's (the user committed them, or
    checked the branch out again): they are at BASE now, so they follow the next keeps."""
    if state.worktree_base == state.base or not on_branch(paths, cfg):
        return
    if worktree_clean(paths, cfg, state.base):
        append(paths, "worktree", base=state.base)
        state.worktree_base = state.base


def files_case(paths: ExpPaths, cfg: ExperimentConfig, state: ExperimentState) -> FilesCase:
    """Which case the user's editable files are in, said plainly: they follow every keep only
    while HEAD is on the experiment branch and they hold what gpuswarm last wrote there."""
    head = gitops.git(paths.repo, "symbolic-ref", "-q", "--short", "HEAD", check=False)
    files = ", ".join(cfg.edit)
    s = "" if len(cfg.edit) > 1 else "s"  # "train.py follows", "a.py, b.py follow"
    if not on_branch(paths, cfg):
        where = f"on {head}" if head else "detached"
        return {
            "follows": False,
            "case": "other-branch",
            "message": f"HEAD is {where}, not {cfg.branch}: gpuswarm leaves your files alone "
            f"(`git checkout {cfg.branch}` to see BASE)",
        }
    if not worktree_clean(paths, cfg, state.worktree_base):
        return {
            "follows": False,
            "case": "edited",
            "message": f"{files} edited since BASE {gitops.short(state.worktree_base)}: not "
            "updated by keeps; `research try` carries the edit onto BASE, `research restore` "
            "drops it",
        }
    if state.worktree_base != state.base:
        return {
            "follows": True,
            "case": "behind",
            "message": f"{files} {'is' if s else 'are'} at {gitops.short(state.worktree_base)} "
            "(what gpuswarm "
            f"wrote last), BASE is {gitops.short(state.base)}: the next keep brings them to "
            "BASE, or `research restore` now",
        }
    return {
        "follows": True,
        "case": "following",
        "message": f"{files} follow{s} BASE (HEAD is on {cfg.branch})",
    }


def worktree_clean(paths: ExpPaths, cfg: ExperimentConfig, base: str) -> bool:
    """Whether the user's editable files are exactly ``base``'s (nothing being edited)."""
    return all(_editable_text(paths, rel) == gitops.blob(paths.repo, base, rel) for rel in cfg.edit)


def on_branch(paths: ExpPaths, cfg: ExperimentConfig) -> bool:
    head = gitops.git(paths.repo, "symbolic-ref", "-q", "HEAD", check=False)
    return head == f"refs/heads/{cfg.branch}"


def sync_index(paths: ExpPaths, cfg: ExperimentConfig, base: str) -> None:
    """Point the user's index entries of the editable files at ``base`` (after a keep moved the
    checked-out branch). Best effort: a locked index is left as it is."""
    lines = []
    for rel in cfg.edit:
        mode = gitops.file_mode(paths.repo, base, rel)
        if mode is not None:
            sha = gitops.git(paths.repo, "rev-parse", f"{base}:{rel}")
            lines.append(f"{mode} {sha}\t{rel}")
    if lines:
        gitops.git(
            paths.repo,
            "update-index",
            "--index-info",
            input="\n".join(lines).encode() + b"\n",
            check=False,
        )


# -- re-basing a change onto a newer BASE ------------------------------------------------------
Change = tuple[int, int, list[bytes]]  # replace base lines [i1, i2) with these


def _changes(base: list[bytes], new: list[bytes]) -> list[Change]:
    matcher = difflib.SequenceMatcher(None, base, new, autojunk=False)
    return [(i1, i2, new[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def _clash(a: Change, b: Change) -> bool:
    if a == b:
        return False  # the same change on both sides
    (a1, a2, _), (b1, b2, _) = a, b
    if a1 == a2 and b1 == b2:
        return a1 == b1  # two insertions at one place: their order is unknown
    if a1 == a2:
        return b1 < a1 < b2
    if b1 == b2:
        return a1 < b1 < a2
    return max(a1, b1) < min(a2, b2)


def merge_lines(base: bytes, ours: bytes, theirs: bytes) -> bytes | None:
    """Three-way merge by lines where changes to *adjacent* lines do not conflict (git's merge
    does: two tweaked constants on consecutive lines would never combine). None on overlap."""
    lines = base.splitlines(keepends=True)
    mine = _changes(lines, ours.splitlines(keepends=True))
    other = _changes(lines, theirs.splitlines(keepends=True))
    if any(_clash(a, b) for a in mine for b in other):
        return None
    combined = sorted({(c[0], c[1], tuple(c[2])) for c in mine + other}, reverse=True)
    for i1, i2, new in combined:
        lines[i1:i2] = list(new)
    return b"".join(lines)


def rebase(
    paths: ExpPaths,
    cfg: ExperimentConfig,
    commit: str,
    parent: str,
    onto: str,
    message: str,
    *,
    files_only: bool = False,
) -> str | None:
    """``commit`` (a change of ``parent``) re-applied onto ``onto``; None on a real conflict.
    ``files_only``: merge the editable files only, by lines (never git's whole-tree merge)."""
    merged = None if files_only else gitops.merge_onto(paths.repo, commit, onto, message)
    if merged is not None:
        return merged
    files: dict[str, bytes | None] = {}
    for rel in cfg.edit:
        base, ours, theirs = (gitops.blob(paths.repo, c, rel) for c in (parent, onto, commit))
        if base is None or ours is None or theirs is None:
            return None  # a file added or removed on one side: leave it to git
        result = merge_lines(base, ours, theirs)
        if result is None:
            return None
        files[rel] = result
    return gitops.commit_files(paths.repo, onto, files, message)
