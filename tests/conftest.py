"""Fixtures shared by every test folder: the real-container kit's (``tests/helpers/dockerkit.py``),
and a private state folder per test (the index of runs, never the real home).

A test marked ``docker`` is skipped when no Docker engine is reachable (failed instead under
``GPUSWARM_REQUIRE_DOCKER=1``, as in CI) and fails when it leaves a container behind; it asks
for ``docker_image`` (the offline test image) and ``docker_roots`` (folders watched for leaks).
"""

import pytest
from dockerkit import (  # noqa: F401  (a hook and fixtures, found by name)
    _docker_leak_check,
    docker_image,
    docker_roots,
    pytest_runtest_setup,
)


@pytest.fixture(autouse=True)
def _private_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test (and every CLI it starts: they inherit the environment) keeps the index of
    runs (``store/runindex.py``) in a folder of its own, never in the real home."""
    monkeypatch.setenv("GPUSWARM_STATE_DIR", str(tmp_path_factory.mktemp("state")))
