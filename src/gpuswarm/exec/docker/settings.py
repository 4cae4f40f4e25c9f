"""``backend: docker``'s settings: the config's ``docker:`` block (see docs/docker.md).

The docker backend's own model, registered with its options by :mod:`.plugin`; the core
config model knows nothing of it. ``args`` are read as ``docker run`` reads them
(:mod:`.runargs`). Imports only config and core: loading it never loads the backend.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuswarm.config.values import EnvName, NonEmpty
from gpuswarm.config.yamlload import quote
from gpuswarm.core.redact import redact_tree
from gpuswarm.exec.docker import runargs

_STRICT = ConfigDict(extra="forbid", strict=True)


class MountEntry(BaseModel):
    """A host folder or file at ``dest`` inside every container (``backend: docker``)."""

    model_config = _STRICT

    src: NonEmpty  # a host path (relative: to the config's folder); it must exist
    dest: NonEmpty  # an absolute path inside the container
    read_only: bool = False

    @model_validator(mode="after")
    def _absolute_dest(self) -> MountEntry:
        if not self.dest.startswith("/") or "\0" in self.dest or ":" in self.dest:
            raise ValueError(
                f"dest {quote(self.dest)} must be an absolute path inside the container without "
                "':', e.g. /data"
            )
        if ":" in self.src or "\0" in self.src:
            raise ValueError(f"src {quote(self.src)} must be a path without ':'")
        return self


GpuFlags = Literal["auto", "nvidia", "amd", "cdi", "none"]
_SHM_SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$")


class DockerConfig(BaseModel):
    """``backend: docker``: each attempt in a container of ``image`` (see docs/docker.md)."""

    model_config = _STRICT

    image: NonEmpty  # present on the docker host: never pulled
    args: list[str] = Field(default_factory=list)  # extra ``docker run`` arguments
    mounts: list[MountEntry] = Field(default_factory=list)
    gpu_flags: GpuFlags = "auto"
    network: NonEmpty | None = None  # docker's --network (None: docker's default)
    shm_size: NonEmpty | None = None  # docker's --shm-size, e.g. 16g
    pass_env: list[EnvName] = Field(default_factory=list)  # host variables passed by name

    @model_validator(mode="after")
    def _checked(self) -> DockerConfig:
        if self.shm_size is not None and not _SHM_SIZE.match(self.shm_size):
            raise ValueError(f"shm_size {quote(self.shm_size)} is not a size; write e.g. 16g")
        if self.image.startswith("-"):  # docker run would read it as an option, the command
            raise ValueError(  # as the image (the presence check only failed by chance)
                f"image {quote(self.image)} starts with '-': docker would read it as an option; "
                "give the image's name (e.g. my/train:1)"
            )
        if redact_tree(self.args) != self.args or redact_tree(self.image) != self.image:
            raise ValueError(
                "args look like they carry a secret (a token, a password in a URL); pass "
                "secrets by name with pass_env, never on a command line"
            )
        why = runargs.refusal(self.args)  # read as docker reads them: any spelling
        if why is not None:
            raise ValueError(why)
        gpus = [o for o in runargs.parse(self.args) if o.name == "gpus"]
        if gpus and self.gpu_flags != "none":  # docker adds it to gpuswarm's: every GPU shown
            raise ValueError(
                f"args: {quote(gpus[0].written)} is refused: gpuswarm gives each container its "
                f"slot's GPUs (gpu_flags: {self.gpu_flags}), and a second --gpus would show it "
                "the other slots' GPUs too; set gpu_flags: none to give your own"
            )
        return self
