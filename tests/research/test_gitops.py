"""Git plumbing for research loops, against real repositories in tmp_path (no mocks)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuswarm.core.errors import GitError, ResearchError
from gpuswarm.research import gitops

TRAIN = "".join(f"line {i}\n" for i in range(1, 13)).encode()
RUN_SH = b"#!/bin/sh\necho run\n"


@pytest.fixture(autouse=True)
def _hermetic_git(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ignore the developer's global/system git config and identity variables."""
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    for var in ("NAME", "EMAIL"):
        for who in ("AUTHOR", "COMMITTER"):
            monkeypatch.delenv(f"GIT_{who}_{var}", raising=False)


def _init(path: Path, *, identity: bool = True) -> str:
    path.mkdir(parents=True, exist_ok=True)
    gitops.git(path, "init", "-q", "-b", "master")
    if identity:
        gitops.git(path, "config", "user.name", "Test User")
        gitops.git(path, "config", "user.email", "test@example.com")
    (path / "train.py").write_bytes(TRAIN)
    (path / "prepare.py").write_bytes(b"print('prepare')\n")
    (path / "run.sh").write_bytes(RUN_SH)
    (path / "run.sh").chmod(0o755)
    (path / "data").mkdir()
    (path / "data" / "notes.txt").write_bytes(b"notes\n")
    gitops.git(path, "add", "-A")
    who = () if identity else ("-c", "user.name=Init", "-c", "user.email=init@example.com")
    gitops.git(path, *who, "commit", "-q", "-m", "base")
    sha = gitops.rev_parse(path, "HEAD")
    assert sha is not None
    return sha


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    _init(path)
    return path


def _base(repo: Path) -> str:
    sha = gitops.rev_parse(repo, "HEAD")
    assert sha is not None
    return sha


def _snapshot(repo: Path) -> dict[str, object]:
    """Everything of the user's state the plumbing must leave alone."""
    tree: dict[str, tuple[bytes, int]] = {}
    for dirpath, dirnames, filenames in os.walk(repo):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            p = Path(dirpath) / name
            tree[p.relative_to(repo).as_posix()] = (p.read_bytes(), p.stat().st_mode)
    return {
        "index": (repo / ".git" / "index").read_bytes(),
        "HEAD": (repo / ".git" / "HEAD").read_bytes(),
        "head_sha": gitops.rev_parse(repo, "HEAD"),
        "status": gitops.git(repo, "--no-optional-locks", "status", "--porcelain"),
        "tree": tree,
    }


def _dirty(repo: Path) -> None:
    """A user mid-edit: a modified file, a staged new file, an untracked file."""
    (repo / "prepare.py").write_bytes(b"print('user edit')\n")
    (repo / "staged.py").write_bytes(b"staged\n")
    gitops.git(repo, "add", "staged.py")
    (repo / "untracked.txt").write_bytes(b"scratch\n")


def _changed(repo: Path, a: str, b: str) -> list[str]:
    return gitops.git(repo, "diff-tree", "-r", "--name-only", "--no-commit-id", a, b).split()


def test_commit_files_parent_and_only_that_file(repo: Path) -> None:
    base = _base(repo)
    new = gitops.commit_files(repo, base, {"train.py": b"variant\n"}, "variant 1\n\nbody")
    assert gitops.rev_parse(repo, f"{new}^") == base
    assert gitops.git(repo, "rev-list", "--count", f"{base}..{new}") == "1"
    assert _changed(repo, base, new) == ["train.py"]
    assert gitops.blob(repo, new, "train.py") == b"variant\n"
    assert gitops.blob(repo, new, "prepare.py") == b"print('prepare')\n"
    assert gitops.git(repo, "log", "-1", "--format=%B", new).startswith("variant 1\n\nbody")
    # The repo's own identity is used when configured.
    assert gitops.git(repo, "log", "-1", "--format=%an <%ae>|%cn", new) == (
        "Test User <test@example.com>|Test User"
    )


def test_commit_files_modes_new_and_removed(repo: Path) -> None:
    base = _base(repo)
    files: dict[str, bytes | None] = {
        "run.sh": b"#!/bin/sh\necho v2\n",
        "data/new.txt": b"new\n",
        "prepare.py": None,
    }
    new = gitops.commit_files(repo, base, files, "modes")
    assert gitops.file_mode(repo, new, "run.sh") == "100755"
    assert gitops.file_mode(repo, new, "data/new.txt") == "100644"
    assert gitops.blob(repo, new, "prepare.py") is None
    assert gitops.file_mode(repo, new, "prepare.py") is None
    assert sorted(_changed(repo, base, new)) == ["data/new.txt", "prepare.py", "run.sh"]
    same = gitops.commit_files(repo, base, {}, "empty")
    assert gitops.tree_of(repo, same) == gitops.tree_of(repo, base)


def test_blob_and_mode_of_missing_path(repo: Path) -> None:
    base = _base(repo)
    assert gitops.blob(repo, base, "nope.py") is None
    assert gitops.file_mode(repo, base, "nope.py") is None
    assert gitops.blob(repo, base, "data") is None  # a folder, not a file
    assert gitops.blob(repo, base, "data/notes.txt") == b"notes\n"
    assert gitops.file_mode(repo, base, "train.py") == "100644"
    assert gitops.file_mode(repo, base, "run.sh") == "100755"


@pytest.mark.parametrize("bad", ["../x.py", "/etc/passwd", "a/../b.py", "", "a//b", "./t.py"])
def test_bad_paths_rejected(repo: Path, bad: str) -> None:
    base = _base(repo)
    objects_before = gitops.git(repo, "count-objects")
    with pytest.raises(ResearchError):
        gitops.commit_files(repo, base, {"train.py": b"ok\n", bad: b"x"}, "bad")
    assert gitops.git(repo, "count-objects") == objects_before
    with pytest.raises(ResearchError):
        gitops.blob(repo, base, bad)


@pytest.mark.parametrize("stale_lock", [False, True], ids=["no-lock", "stale-index-lock"])
def test_plumbing_leaves_user_state_alone(repo: Path, tmp_path: Path, stale_lock: bool) -> None:
    base = _base(repo)
    _dirty(repo)
    if stale_lock:
        (repo / ".git" / "index.lock").write_bytes(b"")
    before = _snapshot(repo)

    variant = gitops.commit_files(repo, base, {"train.py": b"edited\n" + TRAIN[7:]}, "v")
    assert gitops.changed_paths(repo, base) == ["prepare.py"]
    gitops.export(repo, variant, tmp_path / "export")
    onto = gitops.commit_files(repo, base, {"data/notes.txt": b"newer\n"}, "onto")
    merged = gitops.merge_onto(repo, variant, onto, "merged")
    assert merged is not None
    gitops.update_ref(repo, "refs/research/exp/best", merged, None)
    gitops.update_ref(repo, "refs/research/exp/best", variant, merged)
    gitops.create_branch(repo, "research/exp", variant)
    assert gitops.list_refs(repo, "refs/research/") == {"refs/research/exp/best": variant}
    assert gitops.diff_stat(repo, base, merged)["files"] == 2
    assert gitops.diff_text(repo, base, variant)

    assert _snapshot(repo) == before
    assert (repo / ".git" / "index.lock").exists() == stale_lock


def test_changed_paths(repo: Path) -> None:
    base = _base(repo)
    assert gitops.changed_paths(repo, base) == []
    (repo / "train.py").write_bytes(TRAIN + b"more\n")
    (repo / "prepare.py").unlink()
    (repo / "run.sh").chmod(0o644)
    (repo / "untracked.py").write_bytes(b"not tracked\n")
    # Staged but not committed: index differs from base, work tree equals base -> not changed.
    (repo / "data" / "notes.txt").write_bytes(b"staged edit\n")
    gitops.git(repo, "add", "data/notes.txt")
    (repo / "data" / "notes.txt").write_bytes(b"notes\n")
    (repo / "staged_new.py").write_bytes(b"new\n")
    gitops.git(repo, "add", "staged_new.py")
    assert gitops.changed_paths(repo, base) == ["prepare.py", "run.sh", "train.py"]


def test_changed_paths_same_size_edit(repo: Path) -> None:
    """An edit that keeps size (and maybe mtime) is still found: content is hashed."""
    base = _base(repo)
    (repo / "train.py").write_bytes(TRAIN.replace(b"line 1\n", b"LINE 1\n"))
    assert gitops.changed_paths(repo, base) == ["train.py"]


def test_export(repo: Path, tmp_path: Path) -> None:
    base = _base(repo)
    dest = tmp_path / "out" / "variant"
    gitops.export(repo, base, dest)
    assert (dest / "train.py").read_bytes() == TRAIN
    assert (dest / "run.sh").read_bytes() == RUN_SH
    assert (dest / "data" / "notes.txt").read_bytes() == b"notes\n"
    assert os.access(dest / "run.sh", os.X_OK)
    assert not (dest / "train.py").stat().st_mode & stat.S_IXUSR
    assert not (dest / ".git").exists()
    assert sorted(p.name for p in dest.iterdir()) == ["data", "prepare.py", "run.sh", "train.py"]
    empty = tmp_path / "empty"
    empty.mkdir()
    gitops.export(repo, base, empty)
    assert (empty / "train.py").read_bytes() == TRAIN
    with pytest.raises(ResearchError):
        gitops.export(repo, base, dest)  # not empty any more


def test_merge_onto(repo: Path) -> None:
    base = _base(repo)
    variant = gitops.commit_files(repo, base, {"train.py": TRAIN.replace(b"line 1\n", b"V\n")}, "v")
    newer = TRAIN.replace(b"line 10\n", b"ONTO\n")
    onto = gitops.commit_files(repo, base, {"train.py": newer}, "onto")
    merged = gitops.merge_onto(repo, variant, onto, "variant on newer base")
    assert merged is not None
    assert gitops.rev_parse(repo, f"{merged}^") == onto
    assert gitops.git(repo, "rev-list", "--count", f"{onto}..{merged}") == "1"
    content = gitops.blob(repo, merged, "train.py")
    assert content == newer.replace(b"line 1\n", b"V\n")
    assert content is not None and b"V\n" in content and b"ONTO\n" in content
    assert gitops.is_ancestor(repo, onto, merged)
    assert not gitops.is_ancestor(repo, variant, merged)

    clash = gitops.commit_files(repo, base, {"train.py": TRAIN.replace(b"line 10\n", b"X\n")}, "x")
    assert gitops.merge_onto(repo, clash, onto, "conflict") is None


def test_update_ref_compare_and_swap(repo: Path) -> None:
    base = _base(repo)
    c1 = gitops.commit_files(repo, base, {"train.py": b"1\n"}, "c1")
    c2 = gitops.commit_files(repo, base, {"train.py": b"2\n"}, "c2")
    ref = "refs/research/exp/best"
    gitops.update_ref(repo, ref, c1, None)
    with pytest.raises(GitError, match="update-ref"):
        gitops.update_ref(repo, ref, c2, None)  # exists already
    with pytest.raises(GitError):
        gitops.update_ref(repo, ref, c2, base)  # wrong old value
    assert gitops.rev_parse(repo, ref) == c1
    gitops.update_ref(repo, ref, c2, c1)
    assert gitops.rev_parse(repo, ref) == c2
    assert gitops.list_refs(repo, "refs/research/") == {ref: c2}
    gitops.delete_ref(repo, ref)
    gitops.delete_ref(repo, ref)  # already gone: no error
    assert gitops.rev_parse(repo, ref) is None
    assert gitops.list_refs(repo, "refs/research/") == {}


def test_branches(repo: Path) -> None:
    base = _base(repo)
    assert gitops.branch_exists(repo, "master")
    assert not gitops.branch_exists(repo, "research/a")
    gitops.create_branch(repo, "research/a", base)
    assert gitops.branch_exists(repo, "research/a")
    with pytest.raises(GitError):
        gitops.create_branch(repo, "research/a", base)
    with pytest.raises(ResearchError):
        gitops.create_branch(repo, "bad..name", base)
    assert gitops.git(repo, "symbolic-ref", "HEAD") == "refs/heads/master"


def test_rev_parse_short_tree_and_errors(repo: Path) -> None:
    base = _base(repo)
    assert len(base) == 40
    assert gitops.rev_parse(repo, "master") == base
    assert gitops.rev_parse(repo, "no-such-rev") is None
    assert gitops.rev_parse(repo, "--all") is None
    assert gitops.short(base) == base[:7]
    assert gitops.tree_of(repo, base) == gitops.git(repo, "rev-parse", f"{base}^{{tree}}")
    with pytest.raises(GitError, match=r"rev-parse.*no-such-rev"):
        gitops.git(repo, "rev-parse", "--verify", "no-such-rev")
    assert gitops.git(repo, "rev-parse", "--verify", "no-such-rev", check=False) == ""


def test_diff_stat_and_text(repo: Path) -> None:
    base = _base(repo)
    files: dict[str, bytes | None] = {
        "train.py": TRAIN.replace(b"line 1\n", b"one\ntwo\n"),
        "prepare.py": None,
        "weights.bin": bytes(range(256)),
    }
    new = gitops.commit_files(repo, base, files, "d")
    assert gitops.diff_stat(repo, base, new) == {"files": 3, "insertions": 2, "deletions": 2}
    text = gitops.diff_text(repo, base, new)
    assert "+one" in text and "-line 1" in text and "truncated" not in text
    cut = gitops.diff_text(repo, base, new, max_bytes=60)
    assert cut.endswith("bytes shown)\n") and "diff truncated" in cut
    assert len(cut.splitlines()[0]) < 60
    assert gitops.diff_stat(repo, base, base) == {"files": 0, "insertions": 0, "deletions": 0}


def test_toplevel(repo: Path, tmp_path: Path) -> None:
    assert gitops.toplevel(repo / "data").resolve() == repo.resolve()
    outside = tmp_path / "plain"
    outside.mkdir()
    with pytest.raises(ResearchError, match="not inside a git repository"):
        gitops.toplevel(outside)


def test_exclude_idempotent(repo: Path) -> None:
    path = repo / ".git" / "info" / "exclude"
    path.unlink(missing_ok=True)
    gitops.exclude(repo, ".gpuswarm/")
    gitops.exclude(repo, ".gpuswarm/")
    assert path.read_text().splitlines().count(".gpuswarm/") == 1
    path.write_text("# mine\n*.log")  # no trailing newline
    gitops.exclude(repo, ".gpuswarm/")
    gitops.exclude(repo, "*.log")
    gitops.exclude(repo, ".gpuswarm/")
    assert path.read_text() == "# mine\n*.log\n.gpuswarm/\n"
    (repo / ".gpuswarm").mkdir()
    (repo / ".gpuswarm" / "state").write_bytes(b"x")
    assert ".gpuswarm" not in gitops.git(repo, "status", "--porcelain")


def test_fallback_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    path = tmp_path / "anon"
    base = _init(path, identity=False)
    assert gitops.git(path, "config", "user.name", check=False) == ""
    new = gitops.commit_files(path, base, {"train.py": b"x\n"}, "anon")
    assert gitops.git(path, "log", "-1", "--format=%an <%ae>|%cn <%ce>", new) == (
        "gpuswarm <gpuswarm@localhost>|gpuswarm <gpuswarm@localhost>"
    )
    onto = gitops.commit_files(path, base, {"prepare.py": b"y\n"}, "onto")
    merged = gitops.merge_onto(path, new, onto, "merged")
    assert merged is not None
    assert gitops.git(path, "log", "-1", "--format=%an", merged) == "gpuswarm"


def test_git_version() -> None:
    major, minor = gitops.git_version()
    assert (major, minor) >= (2, 38)
