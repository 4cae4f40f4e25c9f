"""Real-container test kit: the offline test image, "is there an engine", containers by label.

There is no registry in CI (nothing is ever pulled), so the image the tests run is built here:
a rootfs with empty ``usr/ etc/ proc/ sys/ dev/``, ``tmp/`` (1777), a real empty ``sbin/``
(``--init`` mounts ``/sbin/docker-init`` there), ``bin -> usr/bin``, ``lib -> usr/lib``,
``lib64 -> usr/lib64``, imported with ``docker import`` as :data:`IMAGE`. Tasks run in it with
the host's ``/usr`` bind-mounted read-only (:data:`USR_MOUNT`) and ``--network none``: ``sh``,
coreutils and ``/usr/bin/python3`` (stdlib only) then work inside.

- :func:`docker_available`: a ``docker`` client that reaches an engine;
- :func:`require_docker`: skip without an engine, fail instead when ``GPUSWARM_REQUIRE_DOCKER=1``
  (CI sets it: a CI machine without an engine must not pass by skipping every container test);
- :func:`build_test_image`: build :data:`IMAGE` once (idempotent; safe under pytest-xdist: a file
  lock, then ``docker image inspect`` before building);
- :func:`containers` / :func:`containers_under` / :func:`remove_containers`: gpuswarm's
  containers (label ``gpuswarm.run``), for the leak check of ``tests/conftest.py``;
- :class:`ContainerWatcher`: every container of some folders' runs seen while a run runs;
- :data:`USR_MOUNT` / :data:`USR_CLI_ARGS`: the ``/usr`` mount and no network, for a config's
  ``docker:`` block or ``gpuswarm run --image ...``.

It is also a pytest plugin (``tests/conftest.py`` imports its hook and fixtures; elsewhere
``-p dockerkit``): a test marked ``docker`` is skipped or failed as :func:`require_docker` says;
after it, every gpuswarm container whose run folder is under its ``tmp_path`` (or a folder it
added to ``docker_roots``) is removed, and one that was still there fails the test: a container
left behind is a leak, a bug of the backend. ``docker_image``: the test image's tag.
``pythonpath`` in pyproject.toml puts this folder on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

IMAGE = "gpuswarm-test:base"
REQUIRE_ENV = "GPUSWARM_REQUIRE_DOCKER"
USR_MOUNT = {"src": "/usr", "dest": "/usr", "read_only": True}
# the labels every container of gpuswarm carries (the backend's contract)
LABELS = ("run", "owner", "task", "attempt", "slot", "kind")


def docker_required() -> bool:
    """CI asks for a real engine: container tests fail instead of skipping without one."""
    return os.environ.get(REQUIRE_ENV) == "1"


@functools.lru_cache(maxsize=1)
def docker_available() -> bool:
    """A ``docker`` client on PATH that reaches an engine (``docker info`` succeeds)."""
    if shutil.which("docker") is None:
        return False
    try:
        proc = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def require_docker() -> None:
    """Skip the calling test when no engine is reachable; fail it under CI's requirement."""
    if docker_available():
        return
    why = "no Docker engine is reachable (docker info fails)"
    if docker_required():
        pytest.fail(f"{why}, and {REQUIRE_ENV}=1 asks for one", pytrace=False)
    pytest.skip(why)


def docker(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the docker client; ``check``: a failure is an AssertionError with its stderr."""
    proc = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} -> rc {proc.returncode}: {proc.stderr}")
    return proc


def image_present(tag: str) -> bool:
    return docker("image", "inspect", tag, check=False).returncode == 0


# -- the test image --------------------------------------------------------------------------
def _rootfs_tar(path: Path) -> None:
    """The image's whole content: a few empty folders and the usr symlinks, owned by root."""

    def add(name: str, kind: bytes, mode: int, target: str = "") -> None:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.uid, info.gid = kind, mode, 0, 0
        info.linkname = target
        tar.addfile(info)

    with tarfile.open(path, "w") as tar:
        add(".", tarfile.DIRTYPE, 0o755)
        for name in ("usr", "etc", "proc", "sys", "dev", "sbin"):
            add(name, tarfile.DIRTYPE, 0o755)
        add("tmp", tarfile.DIRTYPE, 0o1777)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            add(link, tarfile.SYMTYPE, 0o777, target)


@contextlib.contextmanager
def _file_lock(name: str) -> Iterator[None]:
    """An exclusive flock on ``<tmp>/<name>``: one builder across xdist workers."""
    path = Path(tempfile.gettempdir()) / name
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_test_image(tag: str = IMAGE) -> str:
    """Build ``tag`` (the offline test image) unless it is there; return the tag.

    Idempotent; under pytest-xdist the workers take a file lock, and the one that gets it first
    builds (``docker import`` sets the tag atomically, so a reader never sees half an image).
    """
    require_docker()
    if image_present(tag):
        return tag
    with _file_lock("gpuswarm-test-image.lock"):
        if image_present(tag):
            return tag
        with tempfile.TemporaryDirectory(prefix="gpuswarm-rootfs-") as tmp:
            tar = Path(tmp) / "rootfs.tar"
            _rootfs_tar(tar)
            docker(
                "import", "--message", "gpuswarm test image (run with /usr mounted)", str(tar), tag
            )
    return tag


# -- containers by label -------------------------------------------------------------------------
@dataclass(frozen=True)
class Container:
    id: str
    name: str
    state: str
    labels: dict[str, str]  # gpuswarm.<key> labels without the prefix: run, owner, task, ...

    def __str__(self) -> str:
        return f"{self.name} ({self.id[:12]}, {self.state}) {self.labels}"


def containers(run: str | os.PathLike[str] | None = None, **labels: str) -> list[Container]:
    """Every container (running or not) with a ``gpuswarm.run`` label; ``run``: of that run
    folder only; ``labels``: ``owner="..."`` etc. must match as well."""
    argv = ["ps", "-a", "--no-trunc", "--filter"]
    argv.append("label=gpuswarm.run" if run is None else f"label=gpuswarm.run={run}")
    for key, value in labels.items():
        argv += ["--filter", f"label=gpuswarm.{key}={value}"]
    fields = ["{{.ID}}", "{{.Names}}", "{{.State}}"]
    fields += [f'{{{{json (.Label "gpuswarm.{key}")}}}}' for key in LABELS]
    argv += ["--format", "\t".join(fields)]
    out = []
    for line in docker(*argv).stdout.splitlines():
        cid, name, state, *values = line.split("\t")
        found = {k: json.loads(v) for k, v in zip(LABELS, values, strict=True)}
        out.append(Container(cid, name, state, {k: v for k, v in found.items() if v}))
    return out


def containers_under(roots: Iterable[str | os.PathLike[str]]) -> list[Container]:
    """gpuswarm's containers whose run folder is one of ``roots`` or below one."""
    prefixes = [str(Path(r).resolve()) for r in roots]
    return [
        c
        for c in containers()
        if any(
            c.labels.get("run", "") == p or c.labels.get("run", "").startswith(p + os.sep)
            for p in prefixes
        )
    ]


def remove_containers(found: Iterable[Container]) -> None:
    ids = [c.id for c in found]
    if ids:
        docker("rm", "-f", *ids, check=False)


def wait_no_containers(
    roots: Iterable[str | os.PathLike[str]], timeout: float = 5.0
) -> list[Container]:
    """gpuswarm's containers under ``roots`` still there after up to ``timeout`` s ([]: none).

    The wait covers a removal still in flight when a CLI returned (``docker rm`` of an ended
    attempt); a container still there after it is a leak.
    """
    roots = list(roots)
    deadline = time.monotonic() + timeout
    while True:
        left = containers_under(roots)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


class ContainerWatcher:
    """Polls gpuswarm's containers under ``roots`` in a thread until :meth:`stop`: every
    container seen (id -> :class:`Container`) and each poll's running ones (``snapshots``)."""

    def __init__(self, roots: Iterable[str | os.PathLike[str]], interval: float = 0.2) -> None:
        self.roots = list(roots)
        self.interval = interval
        self.seen: dict[str, Container] = {}
        self.snapshots: list[list[Container]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> ContainerWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                found = containers_under(self.roots)
            except (AssertionError, subprocess.TimeoutExpired) as exc:  # keep polling
                self.errors.append(str(exc))
                found = []
            for c in found:
                self.seen.setdefault(c.id, c)
            self.snapshots.append([c for c in found if c.state == "running"])
            self._stop.wait(self.interval)


# -- config --------------------------------------------------------------------------------------
# USR_MOUNT and no network for the command line (``gpuswarm run --backend docker --image IMG ...``)
USR_CLI_ARGS = ["--mount", "/usr:/usr:ro", "--network", "none"]


# -- the pytest plugin -----------------------------------------------------------------------
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("docker") is not None:
        require_docker()


@pytest.fixture
def docker_roots(request: pytest.FixtureRequest) -> Iterator[list[Path]]:
    """Folders whose runs' containers must all be gone after the test (``tmp_path`` first);
    a test running gpuswarm elsewhere appends its folder."""
    roots: list[Path] = [request.getfixturevalue("tmp_path")]
    yield roots
    left = wait_no_containers(roots)
    remove_containers(left)
    if left:
        pytest.fail(
            "containers left behind (removed now): " + "; ".join(map(str, left)), pytrace=False
        )


@pytest.fixture(autouse=True)
def _docker_leak_check(request: pytest.FixtureRequest) -> None:
    """Every ``docker``-marked test gets the leak check of ``docker_roots``."""
    if request.node.get_closest_marker("docker") is not None:
        request.getfixturevalue("docker_roots")


@pytest.fixture
def docker_image() -> str:
    """The offline test image's tag, built on first use."""
    return build_test_image()
