"""``backend: ray``'s settings: the config's ``ray:`` block (issue 16; docs/cluster.md).

The ray backend's own model, registered with its options by :mod:`.plugin`; the core config
model knows nothing of it. Imports only config and core: ``ray`` itself is never loaded here.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuswarm.config.values import Duration, NonEmpty
from gpuswarm.config.yamlload import quote

_STRICT = ConfigDict(extra="forbid", strict=True)

_RAY_ADDRESS = re.compile(r"auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}")


class RayConfig(BaseModel):
    """``backend: ray``: one slot actor per GPU on every node of a Ray cluster (docs/cluster.md)."""

    model_config = _STRICT

    address: NonEmpty = "auto"  # auto | HOST:PORT | ray://HOST:PORT (Ray Client)
    namespace: NonEmpty = "gpuswarm"  # the Ray namespace the run's slot actors are named in
    shared_path: NonEmpty | None = None  # a folder every node sees at this path (large artifacts)
    ship: Literal["auto", "always", "never"] = "auto"  # the task's folder to nodes without it
    max_ship_mb: float = Field(default=256.0, gt=0)  # a shipped folder (packed) at most
    max_result_mb: float = Field(default=16.0, gt=0)  # what an attempt's folder sends home at most
    setup: NonEmpty | None = None  # run once per node before its first attempt (uv sync, data)
    setup_timeout: Duration = 3600.0
    # the head not answering this long: the run stops, its in-flight attempts lost and queued
    # again (below Ray's gcs_rpc_server_reconnect_timeout_s, 60 s, after which Ray ends drivers)
    head_timeout: Duration = 30.0

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if not _RAY_ADDRESS.fullmatch(value):
            raise ValueError(
                f"address {quote(value)} is not auto, HOST:PORT or ray://HOST:PORT "
                "(the head's address, as `ray start --head` prints it)"
            )
        return value
