"""Git plumbing for research loops.

Variants are built as commits on top of a base commit without touching the user's index, HEAD or
checked-out branch: every command that needs an index gets a private one (``GIT_INDEX_FILE`` in a
temporary folder), so a stale or held ``.git/index.lock`` never gets in the way. All commands run
as ``git -C repo ...`` argument lists, never through a shell.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gpuswarm.core.errors import GitError, ResearchError
from gpuswarm.research.entries import DiffStat

FALLBACK_NAME = "gpuswarm"
FALLBACK_EMAIL = "gpuswarm@localhost"
_ZERO = "0" * 40
# Variables that would point git at another repository, work tree or index than ``-C repo``.
_SCRUBBED = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_PREFIX", "GIT_COMMON_DIR")
# A private index must not spill split-index files into the user's .git.
_INDEX_OPTS = ("-c", "core.splitIndex=false")


def _run(
    argv: list[str], *, input: bytes | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    full_env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    full_env["GIT_TERMINAL_PROMPT"] = "0"
    if env:
        full_env.update(env)
    try:
        return subprocess.run(argv, input=input, capture_output=True, env=full_env, check=False)
    except FileNotFoundError as exc:
        raise GitError("git is not installed or not on PATH") from exc


def _fail(args: tuple[str, ...] | list[str], proc: subprocess.CompletedProcess[bytes]) -> GitError:
    err = proc.stderr.decode("utf-8", errors="replace").strip() or "(no output)"
    return GitError(f"`git {' '.join(args)}` failed (exit {proc.returncode}): {err}")


def _git_bytes(
    repo: Path,
    *args: str,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    ok: tuple[int, ...] = (0,),
) -> subprocess.CompletedProcess[bytes]:
    proc = _run(["git", "-C", str(repo), *args], input=input, env=env)
    if proc.returncode not in ok:
        raise _fail(args, proc)
    return proc


def git(
    repo: Path,
    *args: str,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> str:
    """Run ``git -C repo *args``; return stdout without its trailing newline.

    Raises GitError (with the command and git's stderr) on a non-zero exit when ``check``.
    """
    proc = _run(["git", "-C", str(repo), *args], input=input, env=env)
    if check and proc.returncode != 0:
        raise _fail(args, proc)
    return proc.stdout.decode("utf-8", errors="replace").rstrip("\n")


@contextmanager
def _temp_index() -> Iterator[dict[str, str]]:
    """Yield an env mapping that points git at a fresh private index file."""
    with tempfile.TemporaryDirectory(prefix="gpuswarm-index-") as tmp:
        yield {"GIT_INDEX_FILE": str(Path(tmp) / "index")}


def check_path(path: str) -> None:
    """``path`` is a file path relative to the repository root (ResearchError otherwise)."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise ResearchError(
            f"{path!r} is not a valid file path: paths must be relative to the repository root, "
            "use '/' separators and contain no '..', '.' or empty components"
        )


def toplevel(path: Path) -> Path:
    """The root of the work tree that contains ``path``."""
    proc = _run(["git", "-C", str(path), "rev-parse", "--show-toplevel"])
    out = proc.stdout.decode("utf-8", errors="replace").strip()
    if proc.returncode != 0 or not out:
        raise ResearchError(
            f"{path} is not inside a git repository; run `git init` there or pass -C"
        )
    return Path(out)


def rev_parse(repo: Path, rev: str) -> str | None:
    """Full sha of the commit ``rev`` names, or None when it does not resolve to a commit."""
    proc = _git_bytes(
        repo, "rev-parse", "-q", "--verify", "--end-of-options", f"{rev}^{{commit}}", ok=(0, 1)
    )
    out = proc.stdout.decode().strip()
    return out if proc.returncode == 0 and out else None


def short(sha: str) -> str:
    """Abbreviated sha (first 7 characters)."""
    return sha[:7]


def branch_exists(repo: Path, branch: str) -> bool:
    """Whether ``refs/heads/<branch>`` exists."""
    proc = _git_bytes(repo, "show-ref", "--verify", "-q", f"refs/heads/{branch}", ok=(0, 1))
    return proc.returncode == 0


def create_branch(repo: Path, branch: str, commit: str) -> None:
    """Create ``refs/heads/<branch>`` at ``commit``; GitError if it already exists."""
    ref = f"refs/heads/{branch}"
    if _run(["git", "check-ref-format", ref]).returncode != 0:
        raise ResearchError(f"{branch!r} is not a valid git branch name")
    update_ref(repo, ref, commit, None)


def update_ref(repo: Path, ref: str, new: str, old: str | None) -> None:
    """Compare-and-swap ``ref`` from ``old`` (None: must not exist) to ``new``; GitError if not."""
    git(repo, "update-ref", ref, new, "" if old is None else old)


def delete_ref(repo: Path, ref: str) -> None:
    """Delete ``ref``; nothing happens when it does not exist."""
    git(repo, "update-ref", "-d", ref)


def list_refs(repo: Path, prefix: str) -> dict[str, str]:
    """``{refname: sha}`` for every ref under ``prefix`` (e.g. ``refs/research/``)."""
    out = git(repo, "for-each-ref", "--format=%(objectname) %(refname)", prefix)
    refs: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, name = line.partition(" ")
        refs[name] = sha
    return refs


def _ls_tree(repo: Path, commit: str, path: str) -> tuple[str, str, str] | None:
    """(mode, type, sha) of ``path`` at ``commit``, or None when absent."""
    check_path(path)
    out = git(repo, "--literal-pathspecs", "ls-tree", "-z", commit, "--", path)
    for entry in out.split("\0"):
        meta, _, name = entry.partition("\t")
        if name == path:
            mode, kind, sha = meta.split()
            return mode, kind, sha
    return None


def blob(repo: Path, commit: str, path: str) -> bytes | None:
    """Content of ``path`` at ``commit``, or None when it is absent (or a folder)."""
    entry = _ls_tree(repo, commit, path)
    if entry is None or entry[1] != "blob":
        return None
    return _git_bytes(repo, "cat-file", "blob", entry[2]).stdout


def file_mode(repo: Path, commit: str, path: str) -> str | None:
    """Git mode of the file ``path`` at ``commit`` ('100644', '100755', '120000'), or None."""
    entry = _ls_tree(repo, commit, path)
    return entry[0] if entry is not None and entry[1] == "blob" else None


def _identity_env(repo: Path) -> dict[str, str]:
    """Fallback author/committer for repos (and environments) that configure none."""
    env: dict[str, str] = {}
    for key, role, value in (("name", "NAME", FALLBACK_NAME), ("email", "EMAIL", FALLBACK_EMAIL)):
        if git(repo, "config", f"user.{key}", check=False):
            continue
        for who in ("AUTHOR", "COMMITTER"):
            if not os.environ.get(f"GIT_{who}_{role}"):
                env[f"GIT_{who}_{role}"] = value
    return env


def _commit_tree(repo: Path, tree: str, parent: str, message: str) -> str:
    argv = ("commit-tree", "--no-gpg-sign", tree, "-p", parent, "-F", "-")
    return git(repo, *argv, input=message.encode(), env=_identity_env(repo))


def commit_files(repo: Path, parent: str, files: Mapping[str, bytes | None], message: str) -> str:
    """New commit on ``parent`` whose tree is parent's with ``files`` replaced (None: removed).

    A replaced file keeps the parent's mode; a new one is 100644. Returns the commit sha.
    """
    for path in files:
        check_path(path)
    records: list[bytes] = []
    for path, content in files.items():
        if content is None:
            records.append(f"0 {_ZERO}\t{path}\0".encode())
            continue
        sha = git(repo, "hash-object", "-w", "--stdin", input=content)
        mode = file_mode(repo, parent, path) or "100644"
        records.append(f"{mode} {sha}\t{path}\0".encode())
    with _temp_index() as env:
        git(repo, *_INDEX_OPTS, "read-tree", parent, env=env)
        if records:
            info = b"".join(records)
            git(repo, *_INDEX_OPTS, "update-index", "-z", "--index-info", input=info, env=env)
        tree = git(repo, *_INDEX_OPTS, "write-tree", env=env)
    return _commit_tree(repo, tree, parent, message)


def tree_of(repo: Path, commit: str) -> str:
    """Sha of the tree of ``commit``."""
    return git(repo, "rev-parse", "--verify", "--end-of-options", f"{commit}^{{tree}}")


def trees(repo: Path, commits: list[str]) -> dict[str, str]:
    """commit -> the sha of its tree, for many commits in one git call."""
    unique = list(dict.fromkeys(commits))
    if not unique:
        return {}
    out = git(repo, "rev-parse", *(f"{c}^{{tree}}" for c in unique))  # shas: no options
    return dict(zip(unique, out.split(), strict=True))


def changed_paths(repo: Path, base: str) -> list[str]:
    """Sorted paths tracked in ``base`` whose working-tree file differs from ``base``.

    Modified, deleted and mode-changed files count; untracked files and the user's index don't.
    """
    work = str(Path(repo).resolve())
    with _temp_index() as env:
        git(repo, *_INDEX_OPTS, "read-tree", base, env=env)
        refresh = ("update-index", "-q", "--refresh")
        git(repo, *_INDEX_OPTS, f"--work-tree={work}", *refresh, env=env, check=False)
        out = git(repo, f"--work-tree={work}", "diff-files", "-z", "--name-only", env=env)
    return sorted(p for p in out.split("\0") if p)


def export(repo: Path, commit: str, dest: Path) -> None:
    """Write the full tree of ``commit`` into ``dest`` (absent or empty), keeping exec bits."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ResearchError(f"{dest} must be an empty folder (or not exist) to export into")
    dest.mkdir(parents=True, exist_ok=True)
    with _temp_index() as env:
        git(repo, *_INDEX_OPTS, "read-tree", commit, env=env)
        git(
            repo,
            *_INDEX_OPTS,
            f"--work-tree={dest.resolve()}",
            "checkout-index",
            "-a",
            "-f",
            env=env,
        )


def merge_onto(repo: Path, commit: str, onto: str, message: str) -> str | None:
    """Replay ``commit`` onto ``onto`` with a three-way merge (git >= 2.38).

    Returns the new commit (parent ``onto``), or None when the changes conflict.
    """
    args = ("merge-tree", "--write-tree", onto, commit)
    proc = _run(["git", "-C", str(repo), *args])
    if proc.returncode == 1:
        return None
    if proc.returncode != 0:
        error = _fail(args, proc)
        raise GitError(f"{error} (merge-tree --write-tree needs git >= 2.38)")
    tree = proc.stdout.decode().split("\n", 1)[0].strip()
    return _commit_tree(repo, tree, onto, message)


def diff_stat(repo: Path, a: str, b: str) -> DiffStat:
    """``{"files", "insertions", "deletions"}`` between commits ``a`` and ``b``."""
    out = git(repo, "diff", "--no-ext-diff", "--no-color", "--no-renames", "--numstat", a, b, "--")
    stat: DiffStat = {"files": 0, "insertions": 0, "deletions": 0}
    for line in out.splitlines():
        ins, dels, _ = line.split("\t", 2)
        stat["files"] += 1
        stat["insertions"] += int(ins) if ins.isdigit() else 0
        stat["deletions"] += int(dels) if dels.isdigit() else 0
    return stat


def diff_text(repo: Path, a: str, b: str, max_bytes: int = 100_000) -> str:
    """Unified diff from ``a`` to ``b``, cut at a line end near ``max_bytes`` with a marker."""
    out = _git_bytes(repo, "diff", "--no-ext-diff", "--no-color", a, b, "--").stdout
    if len(out) <= max_bytes:
        return out.decode("utf-8", errors="replace")
    cut = out.rfind(b"\n", 0, max_bytes) + 1 or max_bytes
    head = out[:cut].decode("utf-8", errors="replace")
    if not head.endswith("\n"):
        head += "\n"
    return head + f"... diff truncated ({cut} of {len(out)} bytes shown)\n"


def is_ancestor(repo: Path, a: str, b: str) -> bool:
    """Whether commit ``a`` is an ancestor of (or equal to) commit ``b``."""
    return _git_bytes(repo, "merge-base", "--is-ancestor", a, b, ok=(0, 1)).returncode == 0


def exclude(repo: Path, pattern: str) -> None:
    """Add ``pattern`` to the repo's ``info/exclude`` unless it is already there."""
    if not pattern.strip() or "\n" in pattern or "\r" in pattern:
        raise ResearchError(f"{pattern!r} is not a single exclude pattern")
    path = Path(git(repo, "rev-parse", "--git-path", "info/exclude"))
    if not path.is_absolute():
        path = repo / path
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    if pattern in text.splitlines():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sep = "" if not text or text.endswith("\n") else "\n"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(f"{sep}{pattern}\n")


def git_version() -> tuple[int, int]:
    """(major, minor) of the installed git."""
    proc = _run(["git", "--version"])
    match = re.search(r"(\d+)\.(\d+)", proc.stdout.decode("utf-8", errors="replace"))
    if proc.returncode != 0 or match is None:
        raise _fail(["--version"], proc)
    return int(match.group(1)), int(match.group(2))
