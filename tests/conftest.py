"""Fixtures shared by every test folder: the real-container kit's (``tests/helpers/dockerkit.py``).

A test marked ``docker`` is skipped when no Docker engine is reachable (failed instead under
``GPUSWARM_REQUIRE_DOCKER=1``, as in CI) and fails when it leaves a container behind; it asks
for ``docker_image`` (the offline test image) and ``docker_roots`` (folders watched for leaks).
"""

from dockerkit import (  # noqa: F401  (a hook and fixtures, found by name)
    _docker_leak_check,
    docker_image,
    docker_roots,
    pytest_runtest_setup,
)
