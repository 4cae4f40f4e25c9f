"""Per-slot private HOME with its own caches, private provisioned credentials, secret redaction.

Each slot runs its attempts with ``HOME`` set to a private folder (mode 0700) and every cache
variable in :data:`CACHE_VARS` pointing inside it, so tasks running side by side never share
(and corrupt) Torch extension builds, Triton kernels, MIOpen databases, Matplotlib or CUDA JIT
caches, temporary files or agent state (``CODEX_HOME``).

A :class:`Provision` copies one host file or folder (e.g. ``~/.codex/auth.json``) into the slot
HOME: the copy is private to the slot's user and writable by the task (files 0600, folders 0700),
because agents (Claude Code, Cursor, Codex) refresh tokens and keep state there. The source is
never written, linked or mounted: a copy is bytes, so a task cannot change the host's original,
and it is written under a temporary name and renamed into place, so a half-copied credential is
never visible. Each supervisor start provisions afresh from the source (a refreshed token lives
in the slot's copy until then). Inside a provisioned folder, symlinks are copied as the
file they point to when that is a regular file and skipped otherwise (links to folders, dangling
links, devices, FIFOs): a copy never descends into a folder outside the source. Symlinks that a
task left inside the slot HOME on the way to a cache folder or a provision are removed (never
followed) before anything is written, so re-provisioning cannot write into the host's files.

:func:`is_secret_name`, :func:`redact_env` and :func:`redact_text` keep secret values out of
logs and messages; they live in :mod:`gpuswarm.core.redact` (by name and by value shape).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.core.errors import ConfigError
from gpuswarm.core.fsutil import atomic_write_bytes

CACHE_DIRS: dict[str, str] = {
    "XDG_CACHE_HOME": ".cache",
    "TORCH_EXTENSIONS_DIR": ".cache/torch_extensions",
    "TRITON_CACHE_DIR": ".triton/cache",
    "MIOPEN_USER_DB_PATH": ".config/miopen",
    "MIOPEN_CUSTOM_CACHE_DIR": ".cache/miopen",
    "MPLCONFIGDIR": ".config/matplotlib",
    "CUDA_CACHE_PATH": ".nv/ComputeCache",
    "TMPDIR": "tmp",
    "XDG_CONFIG_HOME": ".config",
    "XDG_DATA_HOME": ".local/share",
    "CODEX_HOME": ".codex",
}
"""Cache variable -> folder relative to the slot HOME."""
CACHE_VARS: tuple[str, ...] = tuple(CACHE_DIRS)


@dataclass(frozen=True)
class Provision:
    """Copy ``src`` (absolute host path, file or folder) to ``dest`` (relative to the HOME)."""

    src: Path
    dest: str


# -- destinations
def check_provision_dest(dest: str) -> str:
    """``dest`` normalised (``a//./b`` -> ``a/b``) if it stays inside HOME, else ConfigError.

    Refused: empty, absolute, ``~``-prefixed, containing ``..`` or a NUL byte, and destinations
    that are or contain a cache folder (gpuswarm makes those per slot; a copy would replace them).
    """
    where = f"provision dest {dest!r}"
    if not dest or "\0" in dest:
        raise ConfigError(f"{where}: give a path relative to the slot HOME, e.g. .codex/auth.json")
    if dest.startswith(("/", "~")):
        raise ConfigError(
            f"{where} must be relative to the slot HOME: write "
            f"'{dest.lstrip('~/') or '.codex/auth.json'}', not {dest!r}"
        )
    parts = [p for p in dest.split("/") if p not in ("", ".")]
    if ".." in parts or not parts:
        raise ConfigError(f"{where} must name a path inside the slot HOME, without '..'")
    norm = "/".join(parts)
    for var, rel in CACHE_DIRS.items():
        if rel == norm or rel.startswith(norm + "/"):
            raise ConfigError(
                f"{where} would replace the {var} folder ~/{rel} (the slot's own cache, made "
                f"by gpuswarm); provision the files inside it instead, e.g. '{rel}/<file>'"
            )
    return norm


def _check_provisions(provisions: Sequence[Provision]) -> list[str]:
    dests = [check_provision_dest(p.dest) for p in provisions]
    for prov in provisions:
        if not prov.src.is_absolute():
            raise ConfigError(
                f"provision source {str(prov.src)!r} must be an absolute path (expand '~' first)"
            )
        if not prov.src.exists():
            raise ConfigError(f"provision source {prov.src} does not exist; create it or drop it")
    for i, a in enumerate(dests):
        for b in dests[i + 1 :]:
            if a == b or b.startswith(a + "/") or a.startswith(b + "/"):
                raise ConfigError(f"provision dests {a!r} and {b!r} overlap; keep one of them")
    return dests


# -- file-system helpers
def _make_writable(path: Path) -> None:
    """chmod 0700 every real folder of a tree (not through symlinks) so it can be removed."""
    path.chmod(0o700)
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                _make_writable(Path(entry.path))


def _remove(path: Path) -> None:
    """Remove a file, symlink (not its target) or read-only folder tree; missing is fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        _make_writable(path)
        shutil.rmtree(path)
    else:
        path.unlink()


def _real_dir(home: Path, rel: str) -> Path:
    """``home/rel`` as real folders all the way down: symlinks and files in the way are removed."""
    path = home
    for part in rel.split("/"):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = 0
        if not stat.S_ISDIR(mode):
            _remove(path)
            path.mkdir(mode=0o700)
    return path


def _read_regular(path: Path) -> bytes | None:
    """Contents of ``path`` (following a symlink) if it is a regular file, else None."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except PermissionError as exc:
        raise ConfigError(f"cannot read provision file {path}: {exc.strerror}") from exc
    except OSError:  # dangling link, link loop, vanished file
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


COPY_FILE_MODE = 0o600  # private to the slot's user, writable: agents refresh their tokens
COPY_DIR_MODE = 0o700


def _write_private(path: Path, data: bytes) -> None:
    atomic_write_bytes(path, data, durable=False, mode=COPY_FILE_MODE)
    path.chmod(COPY_FILE_MODE)  # whatever the umask


# -- copies
def _copy_tree(src: Path, dst: Path) -> None:
    """Fill ``dst`` from ``src``: folders 0700, files 0600 (private, writable by the task)."""
    dst.mkdir(mode=COPY_DIR_MODE)
    try:
        entries = sorted(os.scandir(src), key=lambda e: e.name)
    except PermissionError as exc:
        raise ConfigError(f"cannot read provision folder {src}: {exc.strerror}") from exc
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _copy_tree(Path(entry.path), dst / entry.name)
            continue
        data = _read_regular(Path(entry.path))
        if data is not None:
            _write_private(dst / entry.name, data)
    dst.chmod(COPY_DIR_MODE)


def _remove_leftovers(target: Path) -> None:
    """Remove temp copies of ``target`` that an interrupted earlier provisioning left behind."""
    prefixes = (f".tmp-{target.name}.", f".old-{target.name}.")
    with os.scandir(target.parent) as entries:
        stale = [Path(e.path) for e in entries if e.name.startswith(prefixes)]
    for path in stale:
        _remove(path)


def _provision_folder(src: Path, target: Path) -> None:
    tmp = target.parent / f".tmp-{target.name}.{os.getpid()}"
    old = target.parent / f".old-{target.name}.{os.getpid()}"
    _copy_tree(src, tmp)
    if os.path.lexists(target):
        target.rename(old)
    tmp.rename(target)
    _remove(old)


def _provision_file(src: Path, target: Path) -> None:
    data = _read_regular(src)
    if data is None:
        raise ConfigError(f"provision source {src} is neither a regular file nor a folder")
    if target.is_symlink() or (os.path.lexists(target) and not target.is_file()):
        _remove(target)
    _write_private(target, data)


def _provision(prov: Provision, home: Path, dest: str) -> None:
    parent, _, name = dest.rpartition("/")
    target = (_real_dir(home, parent) if parent else home) / name
    _remove_leftovers(target)
    if prov.src.is_dir():
        _provision_folder(prov.src, target)
    else:
        _provision_file(prov.src, target)


def _make_home(home: Path) -> None:
    if home.is_symlink():
        raise ConfigError(f"slot HOME {home} is a symlink; remove it so gpuswarm can create it")
    if home.exists() and not home.is_dir():
        raise ConfigError(f"slot HOME {home} exists and is not a folder; remove it")
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.chmod(0o700)


def prepare_home(home: Path, provisions: Sequence[Provision]) -> dict[str, str]:
    """Create (or refresh) a slot HOME and return the variables to add to an attempt's env.

    ``HOME`` and every :data:`CACHE_VARS` variable point inside ``home``. Provisions are checked
    before anything is written; each is copied afresh, replacing any earlier copy.
    """
    home = home.absolute()
    dests = _check_provisions(provisions)
    _make_home(home)
    env = {"HOME": str(home)}
    for var, rel in CACHE_DIRS.items():
        env[var] = str(_real_dir(home, rel))
    for prov, dest in zip(provisions, dests, strict=True):
        _provision(prov, home, dest)
    return env
