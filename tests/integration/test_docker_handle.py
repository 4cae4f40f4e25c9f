"""The docker backend's handle and leftovers on a real engine, in process: the end of the
docker *client* is never the end of the task, a dead owner's containers are found and removed by
label, and secrets reach the container by name only."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from dockerkit import USR_MOUNT, containers, docker

from gpuswarm.core.models import EndKind
from gpuswarm.exec.base import BackendOptions, LaunchSpec
from gpuswarm.exec.docker.argv import name_pattern
from gpuswarm.exec.docker.backend import DockerBackend
from gpuswarm.exec.docker.settings import DockerConfig

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def backend_for(run: Path, image: str, owner: str = "") -> DockerBackend:
    """A backend of run ``run``; its owner id is unique like a supervisor's (close() removes
    every container of its owner: tests running side by side must not share one)."""
    owner = owner or f"test-{run.parent.name}"
    settings = DockerConfig.model_validate(
        {"image": image, "network": "none", "mounts": [USR_MOUNT]}
    )
    options = BackendOptions(
        settings=settings, run_dir=str(run), owner=owner, max_log_bytes=1 << 20
    )
    backend = DockerBackend(options)
    backend.open()
    return backend


def spec_for(run: Path, script: str, **env: str) -> LaunchSpec:
    ws = run / "tasks" / "t"
    ws.mkdir(parents=True, exist_ok=True)
    return LaunchSpec(
        argv=["sh", "-c", script],
        env={**os.environ, **env},
        cwd=ws,
        log_path=ws / "attempt-1" / "output.log",
        timeout=60,
        grace=2,
        token=f"{run.name}/t/1",
        binds=(ws,),
        own_env=frozenset(env),
        identity={"kind": "attempt", "task": "t", "attempt": "1", "slot": "h-gpu0"},
    )


def wait_running(run: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not [c for c in containers(run) if c.state == "running"]:
        assert time.monotonic() < deadline, "the container never ran"
        time.sleep(0.05)


def test_killing_the_docker_client_is_not_the_end_of_the_task(
    tmp_path: Path, docker_image: str
) -> None:
    run = tmp_path / "run"
    backend = backend_for(run, docker_image)
    try:
        handle = backend.launch(spec_for(run, "sleep 2; echo finished > done.txt"))
        wait_running(run)
        assert handle.pid is not None
        os.kill(handle.pid, signal.SIGKILL)  # the client only: the container runs on
        end = handle.wait()
        assert end.ok, end
        assert (run / "tasks/t/done.txt").read_text() == "finished\n"  # it ran to its end
        assert "docker client ended" in end.reason
        assert all(c.state != "running" for c in containers(run))  # ended; being removed
    finally:
        backend.close()
    assert containers(run) == []  # removed by close() at the latest


def test_a_dead_owners_containers_are_found_by_label_and_removed(
    tmp_path: Path, docker_image: str
) -> None:
    run = tmp_path / "run"
    labels = ["--label", f"gpuswarm.run={run}", "--label", "gpuswarm.owner=dead-owner"]
    common = ["run", "-d", "--init", "--network", "none", "-v", "/usr:/usr:ro", *labels]
    # one still running (ignoring TERM, with a setsid escapee), one that ended earlier
    docker(
        *common,
        "--label", "gpuswarm.kind=attempt", "--label", "gpuswarm.task=t1",
        docker_image, "sh", "-c", "trap '' TERM; setsid sleep 1000 & sleep 1000",
    )  # fmt: skip
    docker(*common, "--label", "gpuswarm.kind=attempt", "--label", "gpuswarm.task=t2",
           docker_image, "true")  # fmt: skip
    deadline = time.monotonic() + 30
    while len(containers(run)) < 2 or any(c.state == "created" for c in containers(run)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = sorted(c.name for c in containers(run))
    backend = backend_for(run, docker_image, owner="me")
    try:
        assert sorted(map(str, backend.leftovers(str(run)))) == before  # `gpuswarm check`
        assert backend.end_leftovers(owner="someone-else").ids == []
        found = backend.end_leftovers(owner="dead-owner", grace=1)
        assert sorted(map(str, found.ids)) == before
        assert found.tasks == frozenset({"t1"})  # the running attempt: never judged done
        assert found.killed == 1
        assert containers(run) == []
    finally:
        backend.close()


def test_secrets_reach_the_container_by_name_only(tmp_path: Path, docker_image: str) -> None:
    run = tmp_path / "run"
    secret = "ghp_" + "s3cr3t" * 6
    backend = backend_for(run, docker_image)
    try:
        handle = backend.launch(
            spec_for(run, 'printf %s "$API_TOKEN" > seen.txt; sleep 3', API_TOKEN=secret)
        )
        wait_running(run)
        assert handle.pid is not None
        cmdline = Path(f"/proc/{handle.pid}/cmdline").read_bytes().decode()
        assert "API_TOKEN" in cmdline and secret not in cmdline
        inspect = subprocess.run(
            ["docker", "inspect", "--format", "{{json .Args}}", containers(run)[0].id],
            capture_output=True,
            text=True,
            check=True,
        )
        assert secret not in inspect.stdout
        end = handle.wait()
        assert end.ok, end
        assert (run / "tasks/t/seen.txt").read_text() == secret
    finally:
        backend.close()


def test_a_hard_cancel_kills_the_container_at_once(tmp_path: Path, docker_image: str) -> None:
    run = tmp_path / "run"
    backend = backend_for(run, docker_image)
    try:
        handle = backend.launch(spec_for(run, "trap '' TERM; sleep 1000"))
        wait_running(run)
        handle.cancel(hard=True)
        end = handle.wait()
        assert end.kind is EndKind.CANCELLED and "SIGKILL" in end.reason, end
        assert all(c.state != "running" for c in containers(run))  # ended (being removed)
    finally:
        backend.close()
    assert containers(run) == []


def test_pids_are_the_host_pids_of_every_process_of_the_container(
    tmp_path: Path, docker_image: str
) -> None:
    """What the VRAM sampler attributes GPU processes by (issue 19): the container's processes,
    a child of its command included, by their host pids; none once it ended."""
    run = tmp_path / "run"
    backend = backend_for(run, docker_image)
    try:
        handle = backend.launch(spec_for(run, "sleep 1000 & echo $! > kid; wait"))
        wait_running(run)
        kid = run / "tasks/t/kid"
        deadline = time.monotonic() + 30
        while not kid.exists() or not kid.read_text().strip():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        pids = handle.pids()
        assert len(pids) >= 2 and all(p > 1 for p in pids)
        cmdlines = [Path(f"/proc/{p}/cmdline").read_bytes() for p in pids]
        assert any(c.startswith(b"sleep\0") for c in cmdlines), cmdlines  # the child, as seen
        handle.cancel(hard=True)  # from the host
        handle.wait()
        assert handle.pids() == []
    finally:
        backend.close()


def _named(pattern: str) -> list[tuple[str, str]]:
    """(name, state) of every container whose name starts with ``pattern`` (a regex)."""
    out = docker(
        "ps", "--all", "--filter", f"name=^/?{pattern}", "--format", "{{.Names}} {{.State}}"
    )
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    return [(n, s) for n, s in rows if re.match(pattern, n)]


@pytest.mark.parametrize("by", ["run", "owner"])
def test_orphans_are_found_by_their_names_whatever_their_labels_say(
    tmp_path: Path, docker_image: str, by: str
) -> None:
    """Issue 30: a container whose labels say another run and owner (``--label`` in docker.args,
    refused at load since; set here past validation) is still found by resume (``run``) and by a
    reclaim of its dead owner (``owner``), and removed before either requeues its task."""
    run = tmp_path / "run"
    dead = f"dead-{uuid.uuid4().hex}"  # unique like a supervisor's (host:pid:start)
    forged = ["--label", f"gpuswarm.run={tmp_path / 'elsewhere'}", "--label", "gpuswarm.owner=x"]
    first = backend_for(run, docker_image, owner=dead)
    assert first.settings is not None
    first.settings = first.settings.model_copy(update={"args": forged})
    mine = name_pattern(run_dir=str(run))
    handle = None
    try:
        handle = first.launch(spec_for(run, "trap '' TERM; sleep 1000"))
        deadline = time.monotonic() + 30
        while "running" not in {s for _, s in _named(mine)}:
            assert time.monotonic() < deadline, "the container never ran"
            time.sleep(0.05)
        assert containers(run) == []  # its labels do not name this run
        assert handle.pid is not None
        os.kill(handle.pid, signal.SIGKILL)  # the supervisor's client dies; the container runs on
        later = backend_for(run, docker_image, owner=f"later-{uuid.uuid4().hex}")
        try:
            before = [n for n, _ in _named(mine)]
            if by == "run":
                found = later.end_leftovers(run_dir=str(run), grace=0.5)
            else:
                found = later.end_leftovers(owner=dead, grace=0.5)
            assert [str(i) for i in found.ids] == before and len(before) == 1
            assert found.killed == 1 and found.tasks == frozenset({"t"}), found
            assert _named(mine) == []  # gone before anything could be requeued
        finally:
            later.close()
    finally:
        for name, _ in _named(mine):
            docker("rm", "--force", name, check=False)
        if handle is not None:  # reap the killed client: no zombie, no attempt left registered
            handle.wait()
        first.close()
