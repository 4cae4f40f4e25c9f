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
in the slot's copy until then). Inside a provisioned folder, a symlink to a regular file of the
same folder is copied as that file; links to folders, dangling links, devices and FIFOs are
skipped; a link that leads out of the provisioned folder (``~/.claude/x -> ~/.ssh/id_rsa`` or
``/etc/shadow``) refuses the provisioning (ConfigError naming the link and its target), and so
does a file the invoking user does not own (as root, file modes would let it read anyone's): a
copy holds only the user's own files from the tree they named. Symlinks that a
task left inside the slot HOME on the way to a cache folder or a provision are removed (never
followed) before anything is written, so re-provisioning cannot write into the host's files.

:func:`is_secret_name`, :func:`redact_env` and :func:`redact_text` keep secret values out of
logs and messages; they live in :mod:`gpuswarm.core.redact` (by name and by value shape).
"""

from __future__ import annotations

import contextlib
import os
import pwd
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


def _read_regular(path: Path, *, follow: bool = True, shown: str = "") -> bytes | None:
    """Contents of ``path`` if it is a regular file of the invoking user, else None (``follow``:
    through a final symlink). A file of another user is a ConfigError naming it (``shown``: how
    it was reached, e.g. through a link)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except PermissionError as exc:
        raise ConfigError(f"cannot read provision file {path}: {exc.strerror}") from exc
    except OSError:  # dangling link, link loop (or a link where none was), vanished file
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    try:
        _owned(path, st, shown)
    except ConfigError:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _owned(path: Path, st: os.stat_result, shown: str = "") -> None:
    if stat.S_ISREG(st.st_mode) and st.st_uid != os.geteuid():
        raise ConfigError(
            f"provision source {shown or path} belongs to {_user(st.st_uid)}, not to you "
            f"({_user(os.geteuid())}): gpuswarm copies only your own files into slot HOMEs; "
            "remove it from what is provisioned, or copy it to a file of yours"
        )


def _vet(src: Path) -> None:
    """Refuse (ConfigError) before anything is written what the copy of ``src`` would refuse:
    a link out of the provisioned folder, a file of another user. The copy checks again on
    what it opens."""
    if not src.is_dir():
        with contextlib.suppress(OSError):
            _owned(src, src.stat())
        return
    root = Path(os.path.realpath(src))
    stack = [src]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # the copy says why
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink():
                target = _inside(path, root)
                if target is not None:
                    with contextlib.suppress(OSError):
                        _owned(target, target.stat(), f"{path} (-> {target})")
            elif entry.is_dir(follow_symlinks=False):
                stack.append(path)
            else:
                with contextlib.suppress(OSError):
                    _owned(path, entry.stat(follow_symlinks=False))


def _inside(link: Path, root: Path) -> Path | None:
    """Where a symlink in provisioned folder ``root`` leads (None: nowhere, it dangles); a
    ConfigError naming both when that is out of ``root``."""
    target = Path(os.path.realpath(link))
    if not os.path.lexists(target):
        return None
    if not target.is_relative_to(root):
        raise ConfigError(
            f"provision source {link} is a symlink to {target}, outside the provisioned folder "
            f"{root}: gpuswarm copies nothing from outside it into slot HOMEs; remove the link, "
            f"or provision {target} itself (home.provision: {{src, dest}})"
        )
    return target


def _linked(link: Path, root: Path) -> bytes | None:
    """The file a symlink in provisioned folder ``root`` stands for: its bytes when it is a
    regular file inside ``root``; None when it is dangling or no regular file (a folder, a
    FIFO); a ConfigError naming both when it leads out of ``root``."""
    target = _inside(link, root)
    if target is None:
        return None
    if target.is_dir():
        return None  # never descended into: a link to a folder is skipped
    return _read_regular(target, follow=False, shown=f"{link} (-> {target})")


COPY_FILE_MODE = 0o600  # private to the slot's user, writable: agents refresh their tokens
COPY_DIR_MODE = 0o700


def _write_private(path: Path, data: bytes) -> None:
    atomic_write_bytes(path, data, durable=False, mode=COPY_FILE_MODE)
    path.chmod(COPY_FILE_MODE)  # whatever the umask


# -- copies
def _copy_tree(src: Path, dst: Path, root: Path) -> None:
    """Fill ``dst`` from ``src`` (in provisioned folder ``root``, links resolved): folders
    0700, files 0600 (private, writable by the task)."""
    dst.mkdir(mode=COPY_DIR_MODE)
    try:
        entries = sorted(os.scandir(src), key=lambda e: e.name)
    except PermissionError as exc:
        raise ConfigError(f"cannot read provision folder {src}: {exc.strerror}") from exc
    for entry in entries:
        path = Path(entry.path)
        if entry.is_symlink():
            data = _linked(path, root)
        elif entry.is_dir(follow_symlinks=False):
            _copy_tree(path, dst / entry.name, root)
            continue
        else:
            data = _read_regular(path, follow=False)
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
    try:
        _copy_tree(src, tmp, Path(os.path.realpath(src)))
    except BaseException:
        _remove(tmp)  # a refused or failed copy leaves nothing half-made
        raise
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
    for prov in provisions:
        _vet(prov.src)
    _make_home(home)
    env = {"HOME": str(home)}
    for var, rel in CACHE_DIRS.items():
        env[var] = str(_real_dir(home, rel))
    for prov, dest in zip(provisions, dests, strict=True):
        _provision(prov, home, dest)
    return env
