"""One real Slurm cluster (tests/helpers/slurm_cluster.py) per test session (per xdist worker):
``slurm_cluster``. Every test here is marked ``slurm``; without root or Slurm it is skipped,
failed instead under ``CI=true`` or ``GPUSWARM_REQUIRE_SLURM=1``."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

import pytest
from slurm_cluster import SlurmCluster, require_slurm


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/slurm/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.xdist_group("slurm"))  # one worker, one cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    require_slurm()
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster, both nodes up; every job the test left is cancelled after it."""
    for node in ("gsn1", "gsn2"):
        if slurm_cluster.node_states().get(node, "").endswith("*") or node in slurm_cluster.dead:
            slurm_cluster.revive(node)
    slurm_cluster.wait_idle(60)
    yield slurm_cluster
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        subprocess.run(
            ["scancel", "--full", "-u", "root"],
            env=slurm_cluster.client_env(),
            capture_output=True,
            timeout=30,
            check=False,
        )
