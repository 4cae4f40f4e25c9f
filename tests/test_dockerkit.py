"""The real-container test kit itself: skip or fail without an engine, the image, leak checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dockerkit import (
    REQUIRE_ENV,
    containers,
    containers_under,
    docker,
    remove_containers,
    wait_no_containers,
)
from pytest import FixtureRequest

pytestmark = pytest.mark.slow  # pytest and docker processes: part of CI, not of the fast suite

HELPERS = Path(__file__).parent / "helpers"

INNER = """
import pytest

@pytest.mark.docker
def test_needs_an_engine():
    pass
"""

LEAKY = """
import subprocess
import pytest

@pytest.mark.docker
def test_leaves_a_container(tmp_path, docker_image):
    subprocess.run(
        ["docker", "run", "-d", "--network", "none", "-v", "/usr:/usr:ro",
         "--label", f"gpuswarm.run={tmp_path}/run_1", "--label",
         "gpuswarm.owner=leaky", docker_image, "/usr/bin/sleep", "30"],
        check=True, capture_output=True,
    )
"""


def _inner_pytest(
    tmp_path: Path, env: dict[str, str], text: str = INNER
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(text)
    argv = [sys.executable, "-m", "pytest", "-p", "dockerkit", "-p", "no:cacheprovider"]
    argv += ["-q", "-rse", "-o", "markers=docker: real containers", "test_inner.py"]
    return subprocess.run(
        argv,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(HELPERS), "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(("required", "outcome"), [("", "1 skipped"), ("1", "1 error")])
def test_a_docker_test_without_an_engine_is_skipped_unless_required(
    tmp_path: Path, required: str, outcome: str
) -> None:
    nowhere = f"unix://{tmp_path}/no-such-docker.sock"  # docker info fails fast
    res = _inner_pytest(tmp_path, {"DOCKER_HOST": nowhere, REQUIRE_ENV: required})
    assert outcome in res.stdout, res.stdout + res.stderr
    if required:
        assert REQUIRE_ENV in res.stdout, res.stdout


@pytest.mark.docker
def test_the_image_runs_sh_and_python_on_the_hosts_usr(docker_image: str) -> None:
    out = docker(
        "run", "--rm", "--init", "--network", "none", "--user", "65534:65534",
        "-v", "/usr:/usr:ro", docker_image,
        "sh", "-c", "id -u; test -d /tmp && test -w /tmp && python3 -c 'print(6 * 7)'",
    )  # fmt: skip
    assert out.stdout.split() == ["65534", "42"], out


@pytest.mark.docker
def test_containers_are_found_by_run_label_and_a_leak_is_reported(
    tmp_path: Path, docker_image: str, request: FixtureRequest
) -> None:
    run = tmp_path / "ws" / "run_x"
    started = docker(
        "run", "-d", "--init", "--network", "none", "-v", "/usr:/usr:ro",
        "--name", f"gpuswarm-kit-{tmp_path.name}",
        "--label", f"gpuswarm.run={run}", "--label", "gpuswarm.owner=o1",
        "--label", "gpuswarm.task=t1", "--label", "gpuswarm.kind=attempt",
        docker_image, "sleep", "30",
    )  # fmt: skip
    cid = started.stdout.strip()
    try:
        (found,) = containers(run=run)
        assert found.id == cid and found.state == "running"
        assert found.labels == {"run": str(run), "owner": "o1", "task": "t1", "kind": "attempt"}
        assert containers(run=run, owner="o1") == [found]
        assert containers(run=run, owner="o2") == []
        assert containers_under([tmp_path]) == [found]
        assert (
            containers_under([tmp_path / "ws" / "run"]) == []
        )  # a prefix of a name is not "under"
        assert wait_no_containers([tmp_path], timeout=0.2) == [found]
    finally:
        remove_containers(containers(run=run))
    assert containers(run=run) == []


@pytest.mark.docker
def test_a_container_a_test_leaves_fails_it_and_is_removed(tmp_path: Path) -> None:
    res = _inner_pytest(tmp_path, {}, LEAKY)
    assert "1 passed, 1 error" in res.stdout, res.stdout + res.stderr
    assert "containers left behind" in res.stdout, res.stdout
    mine = [c for c in containers(owner="leaky") if c.labels["run"].startswith(str(tmp_path))]
    assert mine == []
