"""``docker.args`` read the way ``docker run`` reads them, and the options refused in them.

The docker CLI parses its options with spf13/pflag: ``--name value`` and ``--name=value``; short
options bundle (``-dit``), a short option that takes a value takes the rest of its word
(``-v/:/host``, ``-eX=1``, ``-u0``, ``-p8080:80``) or, when nothing is left, the next argument
(``-e X=1``), and ``-e=X=1`` is ``X=1``; a value is taken whatever it starts with (in
``--cap-add -v``, ``-v`` is the capability). Parsing the list the same way finds a refused option
in any spelling, and never mistakes a value for an option.

Every option of ``docker run`` (docker/cli ``cli/command/container/opts.go`` and ``run.go``,
hidden aliases and platform-only ones included: ``--net``, ``--net-alias``, ``--dns-opt``,
``--cpu-count``, ...) is in :data:`BOOLEAN` or :data:`VALUED`. An option that is in neither is
refused, naming it: gpuswarm cannot know whether it takes a value (so what the next argument
is), nor what it does to the container. A word that is no option (docker would take it for the
image, and gpuswarm's image for the command) and ``--`` are refused too.
"""

from __future__ import annotations

from dataclasses import dataclass

# options that take no value (``--rm``, ``-d``; ``--rm=false`` is allowed by pflag too)
BOOLEAN = frozenset({
    "detach", "disable-content-trust", "help", "init", "interactive", "no-healthcheck",
    "oom-kill-disable", "privileged", "publish-all", "quiet", "read-only", "rm", "sig-proxy",
    "tty", "use-api-socket",
})  # fmt: skip
# options that take one (``--memory 64g``, ``--memory=64g``, ``-m64g``)
VALUED = frozenset({
    "add-host", "annotation", "attach", "blkio-weight", "blkio-weight-device", "cap-add",
    "cap-drop", "cgroup-parent", "cgroupns", "cidfile", "cpu-count", "cpu-percent",
    "cpu-period", "cpu-quota", "cpu-rt-period", "cpu-rt-runtime", "cpu-shares", "cpus",
    "cpuset-cpus", "cpuset-mems", "detach-keys", "device", "device-cgroup-rule",
    "device-read-bps", "device-read-iops", "device-write-bps", "device-write-iops", "dns",
    "dns-opt", "dns-option", "dns-search", "domainname", "entrypoint", "env", "env-file",
    "expose", "gpus", "group-add", "health-cmd", "health-interval", "health-retries",
    "health-start-interval", "health-start-period", "health-timeout", "hostname",
    "io-maxbandwidth", "io-maxiops", "ip", "ip6", "ipc", "isolation", "kernel-memory", "label",
    "label-file", "link", "link-local-ip", "log-driver", "log-opt", "mac-address", "memory",
    "memory-reservation", "memory-swap", "memory-swappiness", "mount", "name", "net",
    "net-alias", "network", "network-alias", "oom-score-adj", "pid", "pids-limit", "platform",
    "publish", "pull", "restart", "runtime", "security-opt", "shm-size", "stop-signal",
    "stop-timeout", "storage-opt", "sysctl", "tmpfs", "ulimit", "user", "userns", "uts",
    "volume", "volume-driver", "volumes-from", "workdir",
})  # fmt: skip
SHORT = {
    "a": "attach", "c": "cpu-shares", "d": "detach", "e": "env", "h": "hostname",
    "i": "interactive", "l": "label", "m": "memory", "p": "publish", "P": "publish-all",
    "q": "quiet", "t": "tty", "u": "user", "v": "volume", "w": "workdir",
}  # fmt: skip

_MOUNTS = "give host folders in docker.mounts ({src, dest, read_only}): they go in with the "
_MOUNTS += "run's queue masked, and a missing source is an error instead of a root-owned folder"
_OWN = "gpuswarm sets it itself (it names, labels, attaches and runs every container as you, "
_OWN += "and finds and removes them by that)"
_ENV = "environment variables go by name: add the name to docker.pass_env, or set it in env:"
REFUSED = {
    "volume": _MOUNTS,
    "mount": _MOUNTS,
    "volumes-from": _MOUNTS,
    "use-api-socket": "it mounts the docker socket (the task would control the engine): "
    "mount it through docker.mounts if you accept that",
    "env": _ENV,
    "env-file": _ENV,
    "label": _OWN,
    "label-file": _OWN,
    "user": _OWN,
    "name": _OWN,
    "detach": _OWN,
    "rm": _OWN,
    "init": _OWN,
    "log-driver": _OWN,
    "workdir": _OWN,
    "interactive": _OWN,
    "tty": _OWN,
    "attach": _OWN,
    "pull": _OWN + "; the image is never pulled",
    "cidfile": _OWN,
    "restart": "gpuswarm retries a task itself (max_attempts); docker restarting its container "
    "would run the task again behind its back",
    "help": "docker would print its help and run nothing",
    "pid": "gpuswarm ends an attempt by signalling every process of the container's own pid "
    "namespace: sharing the host's (or another container's) would signal every process there",
}


class DockerArgsError(ValueError):
    """One argument of ``docker.args`` that cannot be passed; the message names it."""


@dataclass(frozen=True)
class Option:
    """One option as docker reads it: its long name, its value (None: a boolean option given
    bare), and the argument(s) it was written in."""

    name: str
    value: str | None
    written: str


def parse(args: list[str]) -> list[Option]:
    """``args`` read as ``docker run`` reads its options (DockerArgsError on the first argument
    docker would not take as an option gpuswarm knows)."""
    out: list[Option] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            raise DockerArgsError(
                f"{_q(arg)} would end docker's options: the next argument would be taken for the "
                "image; give only options"
            )
        if len(arg) < 2 or not arg.startswith("-"):
            raise DockerArgsError(
                f"{_q(arg)} is no option: docker would take it for the image (and gpuswarm's "
                "image for the command); give only options, each value after its option"
            )
        if arg.startswith("--"):
            out.append(_long(arg, rest))
        else:
            out.extend(_shorts(arg, rest))
    return out


def _long(arg: str, rest: list[str]) -> Option:
    body = arg[2:]
    if body.startswith(("-", "=")):
        raise DockerArgsError(f"{_q(arg)}: bad option syntax (docker refuses it)")
    name, eq, value = body.partition("=")
    kind = _kind(name, arg)
    if eq:
        return Option(name, value, arg)
    if kind == "bool":
        return Option(name, None, arg)
    if not rest:
        raise DockerArgsError(f"{_q(arg)} needs a value: give it as {arg}=VALUE")
    value = rest.pop(0)
    return Option(name, value, f"{arg} {value}")


def _shorts(arg: str, rest: list[str]) -> list[Option]:
    """One ``-xyz`` word: boolean letters bundle; a valued letter takes the rest of the word
    (after an ``=`` right behind it, if any) or the next argument."""
    out = []
    letters = arg[1:]
    while letters:
        letter, letters = letters[0], letters[1:]
        name = SHORT.get(letter)
        if name is None:
            raise DockerArgsError(
                f"{_q(arg)}: -{letter} is no docker run option gpuswarm knows; write the long "
                "--name of the option"
            )
        if letters.startswith("=") and len(letters) > 1:
            out.append(Option(name, letters[1:], arg))
            break
        if name in BOOLEAN:
            out.append(Option(name, None, arg))
            continue
        if letters:
            out.append(Option(name, letters, arg))
            break
        if not rest:
            raise DockerArgsError(f"{_q(arg)} needs a value: -{letter} VALUE")
        value = rest.pop(0)
        out.append(Option(name, value, f"{arg} {value}"))
    return out


def _kind(name: str, arg: str) -> str:
    if name in BOOLEAN:
        return "bool"
    if name in VALUED:
        return "value"
    raise DockerArgsError(
        f"{_q(arg)}: --{name} is no docker run option gpuswarm knows (it cannot tell whether it "
        "takes a value, nor what it does to the container); check the spelling against "
        "`docker run --help`"
    )


def refusal(args: list[str]) -> str | None:
    """Why ``args`` cannot be given to ``docker run`` (the first problem, naming the argument
    as written), or None when every argument may be passed."""
    try:
        options = parse(args)
    except DockerArgsError as exc:
        return f"args: {exc}"
    first = next((o for o in options if o.name in REFUSED), None)
    if first is None:
        return None
    # every refused option of that argument (a bundle such as -itv/:/host holds several)
    names = [o.name for o in options if o.written == first.written and o.name in REFUSED]
    spelled = (
        ""
        if first.written.startswith(f"--{first.name}") and len(names) == 1
        else (" (" + ", ".join(f"--{n}" for n in names) + ")")
    )
    why = "; ".join(dict.fromkeys(REFUSED[n] for n in names))
    return f"args: {_q(first.written)}{spelled} is refused: {why}"


def _q(text: str) -> str:
    short = text if len(text) <= 80 else text[:77] + "..."
    return repr(short)
