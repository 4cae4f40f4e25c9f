"""The docker CLI, for everything but an attempt's own ``docker run``: bounded calls, errors
that say what to do.

Each call is one short ``docker`` process with a timeout; nothing here blocks for long or goes
through a shell. The CLI (not the Engine API) is used so that ``DOCKER_HOST``, contexts and the
user's ``~/.docker`` config apply exactly as they do to the user's own ``docker`` commands.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuswarm.core.errors import BackendError

CALL_TIMEOUT = 30.0  # seconds one docker CLI call may take
LABEL = "gpuswarm"  # label prefix: gpuswarm.run, gpuswarm.owner, gpuswarm.task, ...
_FATAL = ("cannot connect to the docker daemon", "permission denied", "is the docker daemon")


@dataclass(frozen=True)
class ContainerState:
    """What ``docker inspect`` says of a container's state."""

    status: str  # created, running, exited, dead, ...
    running: bool
    exit_code: int
    oom_killed: bool
    error: str
    pid: int  # the host pid of its init (0 once it ended)
    started: bool  # it was started at all

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ContainerState:
        started_at = str(data.get("StartedAt") or "")
        return cls(
            status=str(data.get("Status") or ""),
            running=bool(data.get("Running")),
            exit_code=int(data.get("ExitCode") or 0),
            oom_killed=bool(data.get("OOMKilled")),
            error=str(data.get("Error") or ""),
            pid=int(data.get("Pid") or 0),
            started=bool(started_at) and not started_at.startswith("0001-"),
        )


@dataclass(frozen=True)
class Listed:
    """One container ``docker ps`` found (by name or label)."""

    name: str
    state: str
    labels: Mapping[str, str]

    @property
    def running(self) -> bool:
        return self.state in ("running", "paused", "restarting")


class DockerCLI:
    """Runs ``docker`` with the supervisor's environment (``env``: its config folder kept)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self._exe: str | None = None

    @property
    def exe(self) -> str:
        """The docker CLI's path; BackendError when it is not installed."""
        if self._exe is None:
            found = shutil.which("docker", path=self.env.get("PATH"))
            if found is None:
                raise BackendError(
                    "backend: docker: the docker command is not installed (not on PATH); install "
                    "Docker (e.g. apt-get install docker.io) or use backend: local"
                )
            self._exe = found
        return self._exe

    def call(self, args: Sequence[str], *, timeout: float = CALL_TIMEOUT) -> tuple[int, str, str]:
        """``docker <args>``: (exit code, stdout, stderr); a hung call counts as exit 124."""
        try:
            done = subprocess.run(
                [self.exe, *args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return 124, "", f"docker {args[0]} did not answer within {timeout:g}s"
        except OSError as exc:
            return 127, "", f"cannot run docker: {exc.strerror or exc}"
        out = done.stdout.decode(errors="replace")
        return done.returncode, out, done.stderr.decode(errors="replace").strip()

    # -- checks before a run -----------------------------------------------------------------------
    def check_daemon(self) -> str:
        """The daemon's version; BackendError (with the fix) when it cannot be reached."""
        code, out, err = self.call(["version", "--format", "{{.Server.Version}}"])
        if code != 0 or not out.strip():
            hint = (
                "add your user to the docker group (or run as root)"
                if "permission denied" in err.lower()
                else "start it (systemctl start docker, or dockerd &) or set DOCKER_HOST"
            )
            raise BackendError(
                f"backend: docker: cannot reach the Docker daemon ({_first_line(err)}); {hint}. "
                "Nothing was started"
            )
        return out.strip()

    def check_image(self, image: str, where: str) -> None:
        """BackendError unless ``image`` is on the docker host (gpuswarm never pulls)."""
        code, _, err = self.call(["image", "inspect", "--format", "{{.Id}}", image])
        if code != 0:
            if any(f in err.lower() for f in _FATAL):
                raise BackendError(f"{where}: cannot ask the Docker daemon: {_first_line(err)}")
            raise BackendError(
                f"{where}: image {image!r} is not present on the docker host, and gpuswarm never "
                f"pulls: run `docker pull {image}` (or docker build / docker load it) first. "
                "Nothing was started"
            )

    # -- containers ------------------------------------------------------------------------------
    def inspect(self, name: str) -> ContainerState | None:
        """The container's state; None when there is no such container."""
        code, out, err = self.call(["container", "inspect", "--format", "{{json .State}}", name])
        if code != 0:
            if "no such" in err.lower():
                return None
            raise BackendError(f"docker inspect {name}: {_first_line(err)}")
        try:
            data = json.loads(out)
        except ValueError:
            raise BackendError(f"docker inspect {name}: unreadable answer") from None
        return ContainerState.parse(data if isinstance(data, dict) else {})

    def kill(self, name: str, signal: str = "KILL") -> bool:
        """Send ``signal`` to the container's init; False when it is not running (any more)."""
        code, _, _ = self.call(["kill", "--signal", signal, name])
        return code == 0

    def remove(self, names: Sequence[str]) -> None:
        """``docker rm -f``: kill (SIGKILL) and remove; containers already gone are fine."""
        if not names:
            return
        code, _, err = self.call(["rm", "--force", *names])
        gone = ("no such container", "is already in progress")  # or being removed by another
        if code != 0 and not any(g in err.lower() for g in gone):
            raise BackendError(f"docker rm {' '.join(names)}: {_first_line(err)}")

    def listed(self, label: str, value: str) -> list[Listed]:
        """Every container (running or not) labelled ``<LABEL>.<label>=<value>``."""
        return self._ps(f"label={LABEL}.{label}={value}")

    def named(self, pattern: str) -> list[Listed]:
        """Every container (running or not) whose name matches regular expression ``pattern``
        from its start (checked here again: docker's name filter also matches inside)."""
        start = re.compile(pattern)
        return [c for c in self._ps(f"name=^/?{pattern}") if start.match(c.name)]

    def _ps(self, where: str) -> list[Listed]:
        keys = ("task", "kind", "attempt", "slot")
        fields = "\t".join(
            ["{{.Names}}", "{{.State}}", *(f'{{{{.Label "{LABEL}.{k}"}}}}' for k in keys)]
        )
        code, out, err = self.call(["ps", "--all", "--filter", where, "--format", fields])
        if code != 0:
            raise BackendError(f"docker ps: {_first_line(err)}")
        found = []
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 2 + len(keys) and parts[0]:
                labels = dict(zip(keys, parts[2:], strict=True))
                found.append(Listed(parts[0].split(",")[0], parts[1], labels))
        return found


def _first_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0].strip() if lines else "no answer"


def host_pids(init_pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The host pids of every process in the pid namespace of ``init_pid`` (a container's init),
    init included; [] when that namespace cannot be read (a daemon on another host) or is this
    process's own (a container sharing the host's: its processes are not told apart from every
    other one, so only its init is signalled, through docker)."""
    try:
        target = (proc / str(init_pid) / "ns" / "pid").stat().st_ino
        if target == (proc / "self" / "ns" / "pid").stat().st_ino:
            return []
    except OSError:
        return []
    pids = []
    for path in proc.iterdir():
        entry = path.name
        if entry.isdigit():
            try:
                if (path / "ns" / "pid").stat().st_ino == target:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def signal_container(cli: DockerCLI, name: str, sig: signal.Signals) -> None:
    """Send ``sig`` to every process of running container ``name`` (their host pids); where
    they are out of sight (a daemon elsewhere) or docker does not answer, to its init, which
    passes it on. Nothing when the container is not running."""
    try:
        state = cli.inspect(name)
    except BackendError:
        cli.kill(name, sig.name.removeprefix("SIG"))
        return
    if state is None or not state.running:
        return
    pids = host_pids(state.pid) if state.pid > 0 else []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    if not pids:
        cli.kill(name, sig.name.removeprefix("SIG"))
