"""The docker backend's declaration (config/backends.py): its settings (``docker:``), the options
it adds to ``run`` and ``research init`` and what it is (a HOME per slot, attempts inside an
image). Loading it loads no backend: :mod:`.backend` is imported only when a run uses it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuswarm.config.backends import BackendPlugin, Option
from gpuswarm.config.errors import flag_error
from gpuswarm.core.errors import ConfigError
from gpuswarm.exec.docker.settings import DockerConfig

RUN, INIT = "run", "research init"
_BOTH = frozenset({RUN, INIT})


def mount_flag(text: str) -> dict[str, Any]:
    """``--mount SRC:DEST[:ro]`` as a mounts: entry."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]) or parts[2:] not in ([], ["ro"], ["rw"]):
        raise ConfigError(f"--mount {text!r}: write SRC:DEST or SRC:DEST:ro, e.g. /data:/data:ro")
    return {"src": parts[0], "dest": parts[1], "read_only": parts[2:] == ["ro"]}


def apply_options(block: BaseModel | None, values: Mapping[str, Any]) -> BaseModel:
    """The docker flags over the config's ``docker:`` block (``--docker-arg``, ``--mount`` and
    ``--pass-env`` add to its lists); a ConfigError naming the flag."""
    base = block.model_dump() if block is not None else {}
    if values.get("image") is not None:
        base["image"] = values["image"]
    if "image" not in base:
        raise ConfigError("--backend docker: give the image with --image IMG")
    base["args"] = [*base.get("args", []), *values.get("docker_args", ())]
    base["mounts"] = [*base.get("mounts", []), *(mount_flag(m) for m in values.get("mounts", ()))]
    base["pass_env"] = [*base.get("pass_env", []), *values.get("pass_env", ())]
    if values.get("network") is not None:
        base["network"] = values["network"]
    try:
        return DockerConfig.model_validate(base)
    except ValidationError as exc:
        text = str(flag_error(exc)).replace("--args:", "--docker-arg:")
        for said, flag in (
            ("option: args: ", "--docker-arg: "),
            ("option: args ", "--docker-arg: the arguments "),
        ):
            text = text.replace(said, flag)  # a refusal of the whole list names the flag too
        raise ConfigError(text.replace("--mounts:", "--mount:")) from None


def _refuse(backend: str) -> str:
    return (
        f"--backend {backend}: --image, --docker-arg, --mount, --network and --pass-env "
        "are docker's; add --backend docker (or drop them)"
    )


def _pass_env(block: BaseModel, names: list[str]) -> BaseModel:
    assert isinstance(block, DockerConfig)
    merged = list(block.pass_env)
    merged += [n for n in names if n not in merged]
    return block.model_copy(update={"pass_env": merged})


PLUGIN = BackendPlugin(
    name="docker",
    factory="gpuswarm.exec.docker.backend:DockerBackend",
    settings=DockerConfig,
    needs_block=(
        "backend: docker needs a docker: block with the image, e.g. docker: {image: myimage:tag}"
    ),
    options=(
        Option(
            ("--image",),
            "docker: the image every attempt runs in (implies --backend docker)",
            frozenset({RUN}),
        ),
        Option(
            ("--image",),
            "docker: the image every variant runs in (implies --backend docker)",
            frozenset({INIT}),
        ),
        Option(("--docker-arg", "docker_args"), "docker: an extra run argument", _BOTH, True),
        Option(("--mount", "mounts"), "docker: SRC:DEST[:ro] (SRC must exist)", _BOTH, True),
        Option(("--network",), "docker: the containers' --network (e.g. none)", _BOTH),
        Option(("--pass-env", "pass_env"), "docker: a host variable, by name", _BOTH, True),
    ),
    apply_options=apply_options,
    refuse_options=_refuse,
    isolates_home=True,  # a container always gets a HOME: the caches persist over attempts
    runs_on_host=False,  # an agent's program is the image's, found on its PATH
    pass_env=_pass_env,
)
