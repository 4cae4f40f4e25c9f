"""Fixtures of the real-container tests (``@pytest.mark.docker``); helpers: ``dockerkit``.

A test marked ``docker`` is skipped when no Docker engine is reachable, and fails instead when
``GPUSWARM_REQUIRE_DOCKER=1`` (CI). After it, every gpuswarm container whose run folder is under
the test's ``tmp_path`` (or a folder added to ``docker_roots``) is removed, and one that was
still there fails the test: a container left behind is a leak, a bug of the backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dockerkit import build_test_image, remove_containers, require_docker, wait_no_containers


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
    """The offline test image's tag, built on first use (see ``dockerkit``)."""
    require_docker()
    return build_test_image()
