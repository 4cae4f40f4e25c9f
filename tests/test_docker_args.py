"""``docker.args`` read as ``docker run`` reads them (issue 30): a refused option is refused in
every spelling docker accepts (joined short options, ``--flag=value``, bundles), a value is never
taken for an option, and what gpuswarm does not know is refused, naming the argument.

The last test holds the option table against the docker CLI installed here (marked docker)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from pydantic import ValidationError

from gpuswarm.config.models import RunConfig
from gpuswarm.exec.docker.runargs import BOOLEAN, SHORT, VALUED, Option, parse, refusal


def config(args: list[str]) -> dict[str, object]:
    return {
        "backend": "docker",
        "docker": {"image": "i:1", "args": args},
        "tasks": [{"command": "x"}],
    }


# every spelling docker takes for an option gpuswarm refuses, and the option it is
REFUSED = [
    (["--mount", "type=bind,source=/,destination=/host"], "mount"),
    (["--mount=type=bind,source=/,destination=/host"], "mount"),
    (["-v/:/host"], "volume"),
    (["-v", "/:/host"], "volume"),
    (["-v=/:/host"], "volume"),
    (["--volume", "/:/host"], "volume"),
    (["--volume=/:/host"], "volume"),
    (["-itv/:/host"], "interactive"),  # every refused letter of a bundle is named
    (["--volumes-from", "other"], "volumes-from"),
    (["--volumes-from=other"], "volumes-from"),
    (["--use-api-socket"], "use-api-socket"),
    (["-eX=1"], "env"),
    (["-e", "X=1"], "env"),
    (["-e=X=1"], "env"),
    (["--env=X=1"], "env"),
    (["--env", "X=1"], "env"),
    (["--env-file", "/etc/environment"], "env-file"),
    (["--env-file=f"], "env-file"),
    (["-u0"], "user"),
    (["-u", "0"], "user"),
    (["-u=0"], "user"),
    (["--user=0"], "user"),
    (["--user", "root"], "user"),
    (["-d"], "detach"),
    (["-dt"], "detach"),
    (["-Pd"], "detach"),
    (["-d=true"], "detach"),
    (["--detach"], "detach"),
    (["--detach=false"], "detach"),
    (["-l", "gpuswarm.run=/elsewhere"], "label"),
    (["-lgpuswarm.run=/elsewhere"], "label"),
    (["--label", "gpuswarm.run=/elsewhere"], "label"),
    (["--label=gpuswarm.run=/elsewhere"], "label"),
    (["-Pl", "gpuswarm.owner=x"], "label"),
    (["--label-file", "labels.txt"], "label-file"),
    (["--name", "mine"], "name"),
    (["--name=mine"], "name"),
    (["--rm"], "rm"),
    (["--init=false"], "init"),
    (["--log-driver=json-file"], "log-driver"),
    (["-w/tmp"], "workdir"),
    (["--workdir", "/tmp"], "workdir"),
    (["-i"], "interactive"),
    (["-t"], "tty"),
    (["-a", "stdin"], "attach"),
    (["-astdin"], "attach"),
    (["--pull=always"], "pull"),
    (["--cidfile", "/tmp/c"], "cidfile"),
    (["--restart=always"], "restart"),
    (["--help"], "help"),
    (["--pid=host"], "pid"),
    (["--pid", "container:other"], "pid"),
    (["--cap-add=SYS_PTRACE", "-m64g", "-e", "X=1"], "env"),  # after allowed ones
]


@pytest.mark.parametrize(("args", "option"), REFUSED)
def test_a_refused_option_is_refused_in_every_spelling(args: list[str], option: str) -> None:
    assert option in {o.name for o in parse(args)}
    why = refusal(args)
    assert why is not None and "is refused" in why, why
    written = [a for a in args if a.startswith("-")][-1 if option == "env" else 0]
    assert repr(written)[1:-1] in why  # the argument as the user wrote it
    if not written.startswith(f"--{option}"):
        assert f"--{option}" in why.split(" is refused")[0]  # and the option(s) it spells
    with pytest.raises(ValidationError, match="is refused"):
        RunConfig.model_validate(config(args))


# spellings that are allowed, and how docker reads them
ALLOWED = [
    (["--cap-add=SYS_PTRACE"], [Option("cap-add", "SYS_PTRACE", "--cap-add=SYS_PTRACE")]),
    (["--ulimit", "core=0"], [Option("ulimit", "core=0", "--ulimit core=0")]),
    (["-m64g"], [Option("memory", "64g", "-m64g")]),
    (["-p8080:80"], [Option("publish", "8080:80", "-p8080:80")]),
    (["-Pp", "80"], [Option("publish-all", None, "-Pp"), Option("publish", "80", "-Pp 80")]),
    (["-c=512"], [Option("cpu-shares", "512", "-c=512")]),
    (["-q"], [Option("quiet", None, "-q")]),
    (["--read-only"], [Option("read-only", None, "--read-only")]),
    (["--privileged=false"], [Option("privileged", "false", "--privileged=false")]),
    # a value is taken whatever it looks like: here "-v" is a (bad) capability, no mount
    (["--cap-add", "-v"], [Option("cap-add", "-v", "--cap-add -v")]),
    (["-h", "-e"], [Option("hostname", "-e", "-h -e")]),
    (["--net=none"], [Option("net", "none", "--net=none")]),  # docker's hidden aliases
    (["--tmpfs", "/scratch"], [Option("tmpfs", "/scratch", "--tmpfs /scratch")]),
]


def test_every_refused_option_of_a_bundle_is_named_with_its_reason() -> None:
    why = refusal(["-itv/:/host"])
    assert why is not None and "(--interactive, --tty, --volume) is refused" in why, why
    assert "gpuswarm sets it itself" in why and "docker.mounts" in why


@pytest.mark.parametrize(("args", "options"), ALLOWED)
def test_allowed_spellings_are_read_as_docker_reads_them(
    args: list[str], options: list[Option]
) -> None:
    assert parse(args) == options
    assert refusal(args) is None
    RunConfig.model_validate(config(args))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--frobnicate"], "--frobnicate is no docker run option gpuswarm knows"),
        (["--frobnicate=1"], "--frobnicate is no docker run option gpuswarm knows"),
        (["-Z"], "-Z is no docker run option gpuswarm knows"),
        (["-dZ"], "-Z is no docker run option"),
        (["alpine"], "docker would take it for the image"),
        (["-"], "docker would take it for the image"),
        (["--", "sh"], "would end docker's options"),
        (["---mount=x"], "bad option syntax"),
        (["--=x"], "bad option syntax"),
        (["--memory"], "needs a value"),
        (["-m"], "needs a value"),
    ],
)
def test_what_docker_would_not_take_as_a_known_option_is_refused(
    args: list[str], message: str
) -> None:
    why = refusal(args)
    assert why is not None and message in why, why
    with pytest.raises(ValidationError, match=re.escape(message)):
        RunConfig.model_validate(config(args))


def test_a_refusal_of_a_flag_names_the_flag() -> None:
    from gpuswarm.core.errors import ConfigError
    from gpuswarm.exec.docker.plugin import apply_options

    for args, shown in (
        (["-v/:/h"], "--docker-arg: '-v/:/h' (--volume) is refused"),
        (["--token=abcdefgh12345678"], "--docker-arg: the arguments look like they carry"),
    ):
        with pytest.raises(ConfigError) as exc:
            apply_options(None, {"image": "i:1", "docker_args": args})
        assert str(exc.value).startswith(shown), str(exc.value)  # was "option: args: ..."


def test_gpus_in_args_is_refused_while_gpuswarm_gives_the_gpus() -> None:
    for args in (["--gpus", "all"], ["--gpus=all"], ["-m1g", "--gpus", "device=0"]):
        with pytest.raises(ValidationError, match="is refused: gpuswarm gives each container"):
            RunConfig.model_validate(config(args))  # gpu_flags: auto
        cfg = config(args)
        cfg["docker"] = {**cfg["docker"], "gpu_flags": "none"}  # type: ignore[dict-item]
        RunConfig.model_validate(cfg)  # the user's own GPUs


def test_an_image_that_docker_would_read_as_an_option_is_refused() -> None:
    for image in ("-v/:/host", "--privileged"):
        cfg = config([])
        cfg["docker"] = {"image": image}
        with pytest.raises(ValidationError, match="starts with '-': docker would read it as an"):
            RunConfig.model_validate(cfg)  # was: "not present ...: run `docker pull --privileged`"


def test_the_table_is_consistent() -> None:
    assert not BOOLEAN & VALUED
    assert set(SHORT.values()) <= BOOLEAN | VALUED


@pytest.mark.docker
@pytest.mark.slow
def test_the_table_is_the_docker_cli_s() -> None:
    """Every option ``docker run --help`` lists is known, and each is boolean or valued as the
    installed CLI parses it: a valued option takes the next word (so no image is left: "requires
    at least 1 argument", or the word is judged as its value); a boolean one leaves it as the
    image. Nothing reaches an engine but the look-up of an image that does not exist."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI")
    helptext = subprocess.run([docker, "run", "--help"], capture_output=True, text=True).stdout
    listed = set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", helptext, re.M))
    assert listed and listed <= BOOLEAN | VALUED, listed - (BOOLEAN | VALUED)
    word = "gpuswarm-no-such-image-zz"
    wrong = []
    for name in sorted((BOOLEAN | VALUED) - {"help"}):
        run = [docker, "run", "--pull", "never", f"--{name}", word]
        err = subprocess.run(run, capture_output=True, text=True, timeout=60).stderr
        assert "unknown flag" not in err, name
        took = any(
            s in err
            for s in ("requires at least 1 argument", f'invalid argument "{word}"', "requires API")
        )
        if took != (name in VALUED):
            wrong.append((name, err[:160]))
    for letter in SHORT:
        run = [docker, "run", "--pull", "never", f"-{letter}", word]
        err = subprocess.run(run, capture_output=True, text=True, timeout=60).stderr
        assert "unknown shorthand" not in err, letter
    assert wrong == []
