"""The docker backend with real containers (issue 15): what a task sees, owns and leaves behind.

The real CLI in subprocesses, a real engine and the offline test image (``dockerkit``: an empty
rootfs run with the host's ``/usr`` read-only and no network). Marked ``docker``: skipped without
an engine, failed then under ``GPUSWARM_REQUIRE_DOCKER=1`` (CI); after each test no container of
its runs may be left (``docker_roots`` in ``tests/conftest.py``). Timeouts, SIGKILL and resume:
``test_docker_recovery.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, cli_argv, cli_env, find_runs
from dockerkit import IMAGE, USR_CLI_ARGS, USR_MOUNT, ContainerWatcher
from integration_support import read_results, task_states

pytestmark = [pytest.mark.slow, pytest.mark.docker]

Cli = Callable[..., CliResult]
Popen = Callable[..., CliProcess]
NOBODY = 65534
HOST_MNT_NS = str(Path("/proc/self/ns/mnt").readlink())

# What a task records in its workspace (run on the host's /usr inside the container):
# env.bin (env -0), parallel.txt (what of the run's .parallel/ it can see), ns.txt (its mount
# namespace), container.txt (its hostname: the container's id), homes.txt (the slots' homes it
# can see), times.txt (start end), and its id appended to $HOME/tasks.log (the slot's HOME).
PROBE = (
    "s=$(date +%s.%N); "
    "env -0 > {workspace}/env.bin; "
    "if [ -e {run_dir}/.parallel ]; then ls -A {run_dir}/.parallel | wc -l; else echo absent; fi"
    " > {workspace}/parallel.txt; "
    "readlink /proc/self/ns/mnt > {workspace}/ns.txt; "
    "cat /etc/hostname > {workspace}/container.txt; "
    "ls -A {run_dir}/homes > {workspace}/homes.txt 2>/dev/null; "
    "id -u > {workspace}/uid.txt; "
    'if [ -d "$HOME" ]; then echo yes; else echo no; fi > {workspace}/home_ok.txt; '
    'echo {task_id} >> "$HOME/tasks.log"; '
    "echo hello from $GPUSWARM_SLOT_ID; "
    "sleep 0.4; "
    'echo "$s $(date +%s.%N)" > {workspace}/times.txt'
)


def docker_block(image: str, *extra_mounts: dict[str, Any]) -> dict[str, Any]:
    return {"image": image, "network": "none", "mounts": [USR_MOUNT, *extra_mounts]}


def write_config(folder: Path, config: dict[str, Any], name: str = "config.yaml") -> Path:
    path = folder / name
    path.write_text(json.dumps(config, indent=1) + "\n")  # JSON is YAML
    return path


def read_env(path: Path) -> dict[str, str]:
    out = {}
    for item in path.read_bytes().split(b"\0"):
        if item:
            key, _, value = item.decode().partition("=")
            out[key] = value
    return out


def overlaps(spans: list[tuple[float, float, str]]) -> list[tuple[Any, Any]]:
    spans = sorted(spans)
    return [(a, b) for a, b in itertools.pairwise(spans) if b[0] < a[1]]


# -- 1. eight tasks on sim:4: each sees its slot only, no GPU shared at once ----------------------
def test_eight_tasks_on_four_sim_gpus_see_only_their_slot(
    tmp_path: Path, gpuswarm_popen: Popen, docker_image: str
) -> None:
    ids = [f"t{i}" for i in range(8)]
    config = write_config(
        tmp_path,
        {
            "name": "dock",
            "workspace": "ws",
            "gpus": "sim:4",
            "backend": "docker",
            "docker": docker_block(docker_image),
            "tasks": [{"name": i, "shell": True, "command": PROBE} for i in ids],
        },
    )
    with ContainerWatcher([tmp_path]) as watcher:
        res = gpuswarm_popen("run", "--plain", "--no-report", config).wait(90)
    assert res.returncode == 0, str(res)
    (run_dir,) = find_runs(tmp_path / "ws")
    assert task_states(run_dir) == dict.fromkeys(ids, "done")

    user = pwd.getpwuid(os.getuid()).pw_name
    by_gpu: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    slot_of: dict[str, str] = {}
    namespaces, hosts = set(), set()
    for task in ids:
        ws = run_dir / "tasks" / task
        env = read_env(ws / "env.bin")
        slot, host_gpu = env["GPUSWARM_SLOT_ID"], env["GPUSWARM_HOST_GPU_ID"]
        slot_of[task] = slot
        # renumbered inside: the container's one GPU is 0; the host's id stays in GPUSWARM_*
        assert env["CUDA_VISIBLE_DEVICES"] == "0", (task, env)
        assert env.get("HIP_VISIBLE_DEVICES", "0") == "0", (task, env)
        assert env.get("GPU_DEVICE_ORDINAL", "0") == "0", (task, env)
        assert host_gpu in {"0", "1", "2", "3"}, (task, env)
        assert env["GPUSWARM_GPU_IDS"] == host_gpu, (task, env)
        assert slot.endswith(f"-gpu{host_gpu}"), (task, slot, host_gpu)
        assert env["HOME"] == str(run_dir / "homes" / slot), (task, env["HOME"])
        home_ok = (ws / "home_ok.txt").read_text().strip()
        assert home_ok == "yes", f"{task}: the slot's HOME {env['HOME']} is not there inside"
        assert env["USER"] == user and env["LOGNAME"] == user, (task, env)
        # the queue is not visible inside; the task ran in a container of its own
        assert (ws / "parallel.txt").read_text().split() in (["absent"], ["0"]), task
        namespaces.add((ws / "ns.txt").read_text().strip())
        hosts.add((ws / "container.txt").read_text().strip())
        assert set((ws / "homes.txt").read_text().split()) <= {slot}, task  # not the others'
        assert (ws / "uid.txt").read_text().strip() == str(os.getuid())
        start, end = map(float, (ws / "times.txt").read_text().split())
        by_gpu[host_gpu].append((start, end, task))
        # the container's output is the attempt's output.log
        log = (ws / "attempt-1" / "output.log").read_text()
        assert f"hello from {slot}" in log, (task, log)
    assert HOST_MNT_NS not in namespaces
    assert len(hosts) == len(ids), hosts  # one container per attempt
    assert sorted(by_gpu) == ["0", "1", "2", "3"], by_gpu
    for gpu, spans in by_gpu.items():
        assert not overlaps(spans), (gpu, overlaps(spans))
    # the slot's HOME is mounted read-write and persists across its attempts
    for slot in set(slot_of.values()):
        ran = (run_dir / "homes" / slot / "tasks.log").read_text().split()
        assert sorted(ran) == sorted(t for t, s in slot_of.items() if s == slot), slot

    # the containers as docker saw them: labelled, named, one running per slot at any moment
    seen = list(watcher.seen.values())
    assert seen, f"no container seen while the run ran ({watcher.errors})"
    for c in seen:
        assert c.name.startswith("gpuswarm-"), c
        assert c.labels["run"] == str(run_dir), c
        assert c.labels["kind"] == "attempt", c
        assert c.labels["task"] in ids and c.labels["attempt"] == "1", c
        assert c.labels["slot"] == slot_of[c.labels["task"]], c
        assert c.labels.get("owner"), c
    for snapshot in watcher.snapshots:
        slots = [c.labels["slot"] for c in snapshot]
        assert len(slots) == len(set(slots)), snapshot


# -- 2. files belong to the invoking user -------------------------------------------------------
@pytest.fixture
def nobody_dir(docker_roots: list[Path]) -> Iterator[Path]:
    """A folder owned by uid 65534 (pytest's tmp_path lives under a 0700 folder), watched for
    leftover containers."""
    path = Path(tempfile.mkdtemp(prefix="gpuswarm-docker-nobody-"))
    os.chown(path, NOBODY, NOBODY)
    docker_roots.append(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run gpuswarm as another user",
)
SOCKET = Path("/var/run/docker.sock")


def run_as_nobody(folder: Path, config: Path, *, docker_group: bool) -> CliResult:
    """``gpuswarm run config`` as uid 65534 in ``folder`` (its HOME), in the group of the docker
    socket (root:docker 0660) or in no group at all."""
    if not SOCKET.exists() or "DOCKER_HOST" in os.environ:
        pytest.skip("needs the engine on the default socket (its group lets uid 65534 in)")
    groups = [f"--groups={SOCKET.stat().st_gid}"] if docker_group else ["--clear-groups"]
    setpriv = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        *groups,
        # read/search bypass only, to reach the interpreter; writes obey the modes
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
        "--",
    ]
    os.chown(config, NOBODY, NOBODY)
    argv = cli_argv(
        "run", "-q", "--no-report", config, prefix=[*setpriv, sys.executable, "-m", "gpuswarm"]
    )
    proc = subprocess.run(
        argv,
        cwd=folder,
        env=cli_env({"HOME": str(folder)}),
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        check=False,
    )
    return CliResult(argv[len(setpriv) + 3 :], proc.returncode, proc.stdout, proc.stderr, 0.0)


def nobody_config(folder: Path, image: str, task: str) -> Path:
    return write_config(
        folder,
        {
            "name": "own",
            "workspace": "ws",
            "gpus": "sim:1",
            "backend": "docker",
            "docker": docker_block(image),
            "tasks": [{"name": "w", "shell": True, "command": task}],
        },
    )


@NEEDS_ROOT
def test_files_a_task_writes_belong_to_the_invoking_user(
    nobody_dir: Path, docker_image: str
) -> None:
    task = (
        "id -u > {workspace}/uid.txt; mkdir {workspace}/sub; echo x > {workspace}/sub/f.txt; "
        'echo h > "$HOME/in-home.txt"'
    )
    config = nobody_config(nobody_dir, docker_image, task)
    res = run_as_nobody(nobody_dir, config, docker_group=True)
    (run_dir,) = find_runs(nobody_dir / "ws")
    log = run_dir / "tasks" / "w" / "attempt-1" / "output.log"
    assert res.returncode == 0, f"{res}\n--- output.log\n{log.read_text() if log.exists() else ''}"
    assert run_dir.stat().st_uid == NOBODY  # it really ran as the unprivileged user
    ws = run_dir / "tasks" / "w"
    assert (ws / "uid.txt").read_text().strip() == str(NOBODY)
    (home,) = (run_dir / "homes").iterdir()
    for path in (ws / "uid.txt", ws / "sub", ws / "sub" / "f.txt", home / "in-home.txt"):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY), (path, st.st_uid, st.st_gid)


@NEEDS_ROOT
def test_a_user_the_socket_refuses_gets_exit_2_and_the_fix(
    nobody_dir: Path, docker_image: str
) -> None:
    config = nobody_config(nobody_dir, docker_image, "true")
    res = run_as_nobody(nobody_dir, config, docker_group=False)
    assert res.returncode == 2, str(res)
    assert "docker group" in res.stderr and "permission denied" in res.stderr, str(res)
    assert not (nobody_dir / "ws").exists(), list((nobody_dir / "ws").rglob("*"))


# -- 3. command lists: --backend docker --image ----------------------------------------------------
def test_a_command_list_runs_in_containers_from_the_cli_flags(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    """Each line runs with /bin/sh -c inside the image by default, as on the local backend
    (issue 28: no --shell flag; its > and && are the shell's, not readlink's arguments)."""
    cmds = tmp_path / "cmds.txt"
    cmds.write_text(
        "readlink /proc/self/ns/mnt > {workspace}/ns.txt && echo $CUDA_VISIBLE_DEVICES\n" * 3
    )
    res = gpuswarm(
        "run",
        "--gpus",
        "sim:2",
        "--no-report",
        "--workspace",
        "ws",
        "--backend",
        "docker",
        "--image",
        docker_image,
        *USR_CLI_ARGS,
        cmds,
    )
    assert res.returncode == 0, str(res)
    (run_dir,) = find_runs(tmp_path / "ws")
    ids = ["cmd-00001", "cmd-00002", "cmd-00003"]
    assert task_states(run_dir) == dict.fromkeys(ids, "done")
    for task in ids:
        ns = (run_dir / "tasks" / task / "ns.txt").read_text().strip()
        assert ns and ns != HOST_MNT_NS, task
        log = (run_dir / "tasks" / task / "attempt-1" / "output.log").read_text()
        assert log.split() == ["0"], (task, log)


def test_a_plain_line_keeps_the_shell_in_a_container(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    """Issue 31: a line that needs no shell runs as its argv on the local backend only; in a
    container (whose PATH is not this one) it stays a /bin/sh line."""
    (tmp_path / "cmds.txt").write_text("ls /proc/self\n")
    res = gpuswarm(
        *("run", "--gpus", "sim:1", "--no-report", "--workspace", "ws", "--backend", "docker"),
        *("--image", docker_image, *USR_CLI_ARGS, tmp_path / "cmds.txt"),
    )
    assert res.returncode == 0, str(res)
    (run_dir,) = find_runs(tmp_path / "ws")
    (done,) = (run_dir / ".parallel" / "done").glob("*.json")
    task = json.loads(done.read_text())["task"]
    assert (task["shell"], task["command"]) == (True, "ls /proc/self")


def test_the_queue_is_masked_where_a_mount_shows_it_under_another_path(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    """Issue 30: with ``mounts: [{src: <a folder above the run>, dest: /host}]`` the queue was
    masked at its host path only: at /host/.../.parallel a task saw the other task pending and
    could write into pending/."""
    peek = (
        "q=$(echo /host/ws/peek/run_*/.parallel); "
        'ls -A "$q/pending" | wc -l > {workspace}/seen.txt; '
        "ls -A $(echo /host/ws/peek/run_*/homes) | wc -l > {workspace}/homes.txt; "
        'touch "$q/pending/planted.json" 2>/dev/null; true'
    )
    config = write_config(
        tmp_path,
        {
            "name": "peek",
            "workspace": "ws",
            "gpus": "sim:1",
            "backend": "docker",
            "docker": docker_block(docker_image, {"src": str(tmp_path), "dest": "/host"}),
            "tasks": [{"name": f"t{i}", "shell": True, "command": peek} for i in (1, 2)],
        },
    )
    res = gpuswarm("run", "--no-report", config)
    assert res.returncode == 0, str(res)
    (run_dir,) = find_runs(tmp_path / "ws")
    assert task_states(run_dir) == {"t1": "done", "t2": "done"}
    # t1 ran while t2 was pending: an empty mask is all it saw
    assert (run_dir / "tasks" / "t1" / "seen.txt").read_text().split() == ["0"]
    assert (run_dir / "tasks" / "t1" / "homes.txt").read_text().split() == ["0"]
    assert list((run_dir / ".parallel").rglob("planted.json")) == []


# -- 4. preflight runs inside the slot's container -------------------------------------------------
def test_preflight_runs_inside_the_slots_container(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    mount = {"src": str(probe), "dest": str(probe), "read_only": False}
    config = write_config(
        tmp_path,
        {
            "name": "pre",
            "workspace": "ws",
            "gpus": "sim:1",
            "backend": "docker",
            "docker": docker_block(docker_image, mount),
            "preflight": [
                "test -f /.dockerenv",
                f"readlink /proc/self/ns/mnt > {probe}/preflight.ns",
            ],
            "tasks": [{"name": "t", "command": ["true"]}],
        },
    )
    res = gpuswarm("run", "-q", "--no-report", config)
    assert res.returncode == 0, str(res)
    (run_dir,) = find_runs(tmp_path / "ws")
    assert task_states(run_dir) == {"t": "done"}
    ns = (probe / "preflight.ns").read_text().strip()
    assert ns and ns != HOST_MNT_NS  # not the host's mount namespace: in a container


# -- 5. what docker lacks is caught before any claim -----------------------------------------------
def _assert_nothing_created(ws: Path) -> None:
    made = sorted(p.relative_to(ws) for p in ws.glob("*/*")) if ws.exists() else []
    assert made == [], f"a run folder was made: {made}"


def test_an_image_that_is_not_present_exits_2_before_any_claim(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    absent = f"{IMAGE.split(':')[0]}:absent-{os.getpid()}"
    config = write_config(
        tmp_path,
        {
            "name": "noimg",
            "workspace": "ws",
            "gpus": "sim:2",
            "backend": "docker",
            "docker": docker_block(absent),
            "tasks": [{"name": "t", "command": ["true"]}],
        },
    )
    res = gpuswarm("run", "--no-report", config)
    assert res.returncode == 2, str(res)
    assert absent in res.stderr, str(res)
    _assert_nothing_created(tmp_path / "ws")


def test_an_engine_that_cannot_be_reached_exits_2_before_any_claim(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    config = write_config(
        tmp_path,
        {
            "name": "nodaemon",
            "workspace": "ws",
            "gpus": "sim:1",
            "backend": "docker",
            "docker": docker_block(docker_image),
            "tasks": [{"name": "t", "command": ["true"]}],
        },
    )
    nowhere = f"unix://{tmp_path}/no-such-docker.sock"
    res = gpuswarm("run", "--no-report", config, env={"DOCKER_HOST": nowhere})
    assert res.returncode == 2, str(res)
    said = res.stderr.lower()
    assert "docker" in said and any(w in said for w in ("daemon", "engine", "reach", "connect")), (
        str(res)
    )
    _assert_nothing_created(tmp_path / "ws")


def test_a_mount_whose_source_is_missing_exits_2_before_any_claim(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    missing = tmp_path / "no-such-data"
    config = write_config(
        tmp_path,
        {
            "name": "nomount",
            "workspace": "ws",
            "gpus": "sim:1",
            "backend": "docker",
            "docker": docker_block(docker_image, {"src": str(missing), "dest": "/data"}),
            "tasks": [{"name": "t", "command": ["true"]}],
        },
    )
    res = gpuswarm("run", "--no-report", config)
    assert res.returncode == 2, str(res)
    assert str(missing) in res.stderr, str(res)
    assert not missing.exists()  # docker's -v would have made it, as root
    _assert_nothing_created(tmp_path / "ws")


def test_a_run_argument_docker_refuses_fails_the_attempt_with_dockers_reason(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    cmds = tmp_path / "cmds.txt"
    cmds.write_text("true\n")
    res = gpuswarm(
        "run", "--gpus", "sim:1", "--no-report", "--workspace", "ws", "--image", docker_image,
        *USR_CLI_ARGS, "--docker-arg=--memory=gpuswarm-no-such-size", cmds,
    )  # fmt: skip
    assert res.returncode == 1, str(res)
    (run_dir,) = find_runs(tmp_path / "ws")
    reason = read_results(run_dir)["cmd-00001"]["reason"]
    # docker's own failure, told apart from the task's exit, with docker's words (its first
    # line: 'invalid argument "..." for "-m, --memory" flag', not the usage hint after it)
    assert "docker could not start" in reason and "gpuswarm-no-such-size" in reason, reason


@pytest.mark.parametrize(
    "arg", ["-v/:/host", "--mount=type=bind,source=/,destination=/host", "-u0", "-dt", "--nope"]
)
def test_a_refused_docker_arg_is_exit_2_before_anything_is_created(
    tmp_path: Path, gpuswarm: Cli, docker_image: str, arg: str
) -> None:
    cmds = tmp_path / "cmds.txt"
    cmds.write_text("true\n")
    res = gpuswarm(
        "run", "--gpus", "sim:1", "--no-report", "--workspace", "ws", "--image", docker_image,
        *USR_CLI_ARGS, f"--docker-arg={arg}", cmds,
    )  # fmt: skip
    assert res.returncode == 2, str(res)
    assert repr(arg) in res.stderr and "Traceback" not in res.stderr, str(res)
    _assert_nothing_created(tmp_path / "ws")


def test_an_image_without_the_shell_says_so(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    cmds = tmp_path / "cmds.txt"
    cmds.write_text("echo hi\n")
    # no /usr mount: the bare test image has no /bin/sh (nor python3)
    res = gpuswarm(
        "run", "--gpus", "sim:1", "--no-report", "--workspace", "ws", "--image", docker_image,
        "--network", "none", "--shell", cmds,
    )  # fmt: skip
    assert res.returncode == 1, str(res)
    (run_dir,) = find_runs(tmp_path / "ws")
    reason = read_results(run_dir)["cmd-00001"]["reason"]
    # the program that is missing is the shell, in the image; not the user's "echo"
    assert "command not found" in reason and "/bin/sh" in reason, reason


# -- 6. several GPUs per task: renumbered 0..k-1 inside; after_all in a container ----------------
def test_two_gpus_per_task_are_renumbered_and_after_all_runs_in_a_container(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    mount = {"src": str(probe), "dest": str(probe), "read_only": False}
    config = write_config(
        tmp_path,
        {
            "name": "two",
            "workspace": "ws",
            "gpus": "sim:4",
            "gpus_per_task": 2,
            "backend": "docker",
            "docker": docker_block(docker_image, mount),
            "after_all": (
                f"readlink /proc/self/ns/mnt > {probe}/after_all.ns && "
                f'touch "$HOME/written" && echo "$HOME" > {probe}/after_all.home && '
                f"cat $GPUSWARM_SUMMARY > /dev/null && ls $GPUSWARM_RUN_DIR/.parallel | wc -l "
                f"> {probe}/after_all.queue"
            ),
            "tasks": [
                {"name": n, "shell": True, "command": "env -0 > {workspace}/env.bin"}
                for n in ("a", "b")
            ],
        },
    )
    res = gpuswarm("run", "-q", "--no-report", config)
    assert res.returncode == 0, str(res)
    (run_dir,) = find_runs(tmp_path / "ws")
    host_ids = set()
    for task in ("a", "b"):
        env = read_env(run_dir / "tasks" / task / "env.bin")
        for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"):
            assert env.get(var, "0,1") == "0,1", (task, var, env)
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1", env
        host_ids.add(env["GPUSWARM_GPU_IDS"])
    assert sorted(host_ids) in (["0,1", "2,3"], ["2,3"], ["0,1"]), host_ids
    ns = (probe / "after_all.ns").read_text().strip()
    assert ns and ns != HOST_MNT_NS  # after_all ran in a container too
    home = Path((probe / "after_all.home").read_text().strip())
    assert home == run_dir / "homes" / "after_all" and (home / "written").is_file()  # its own
    assert (probe / "after_all.queue").read_text().strip() == "0"  # sees the run, not its queue
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["after_all"]["ok"] is True, summary["after_all"]
