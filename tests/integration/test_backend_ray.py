"""``backend: ray`` on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``, 3 nodes x 2
fake GPUs, one cluster for the whole module): tasks spread over every node, each seeing one GPU;
a node that joins mid-run gets work; a node removed mid-task has its task requeued (``lost``)
and done once; a SIGKILLed driver's run resumes and its task ends once; a research round runs
across nodes; no actor of a run remains at its end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, find_runs, read_events, wait_for, wait_for_run
from integration_support import make_research_repo, research_ledger, research_results
from raykit import LocalRayCluster, require_ray

# one cluster per module: under xdist, `--dist loadgroup` keeps these tests on one worker
pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.timeout(180),
    pytest.mark.xdist_group("ray"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    require_ray()
    made = LocalRayCluster(tmp_path_factory.mktemp("ray"), nodes=3)
    try:
        yield made
    finally:
        made.shutdown()


def _commands(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _probe(seconds: float) -> str:
    """A task that records where it ran, what it saw, its pid and its child's (a sleep it
    waits for: Ray kills only an actor's direct children, the guard the rest)."""
    return (
        f"sh -c 'sleep {seconds} & "
        'echo "$GPUSWARM_TASK_ID $GPUSWARM_SLOT_ID cuda=$CUDA_VISIBLE_DEVICES $$ $!" '
        '>> "$GPUSWARM_RUN_DIR/../seen.txt"; wait\''
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone too
    except OSError:
        return False


def _seen(workspace: Path) -> list[list[str]]:
    rows = []
    for run in find_runs(workspace):
        path = run.parent / "seen.txt"
        if path.exists():
            rows = [line.split() for line in path.read_text().splitlines() if line]
    return rows


def _summary(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return data


def _ray_args(cluster: LocalRayCluster) -> list[str]:
    return ["--backend", "ray", "--ray-address", cluster.address, "--plain", "--no-report"]


def test_tasks_spread_over_every_node_each_sees_one_gpu(
    cluster: LocalRayCluster, tmp_path: Path, gpuswarm: Callable[..., CliResult]
) -> None:
    ws = tmp_path / "ws"
    cmds = _commands(tmp_path / "cmds.txt", [_probe(1.5) for _ in range(6)])
    result = gpuswarm("run", *_ray_args(cluster), "--workspace", ws, cmds, timeout=120)
    assert result.returncode == 0, result
    seen = _seen(ws)
    assert len(seen) == 6
    slots = {row[1] for row in seen}
    assert len(slots) == 6  # six slots at once: one per GPU of the cluster
    nodes = {label.split("-")[-2] for label in slots}
    assert nodes == {n[:6] for n in cluster.node_ids()}  # every node ran a task
    for _, label, cuda, *_ in seen:
        gpu = label.rsplit("-gpu", 1)[1]
        assert cuda == f"cuda={gpu}"  # one GPU each: the one Ray gave its slot
    run = find_runs(ws)[0]
    assert _summary(run)["counts"]["done"] == 6
    log = (run / "tasks" / "cmd-00001" / "attempt-1" / "output.log").read_text()
    assert log == ""  # its output went to seen.txt; the log exists (pulled home)
    assert cluster.wait_no_actors() == []


def test_tasks_per_gpu_shares_a_node_s_gpus_and_gpus_filters_nodes(
    cluster: LocalRayCluster, tmp_path: Path, gpuswarm: Callable[..., CliResult]
) -> None:
    head = next(n for n in cluster.node_ids() if n not in {w.node_id for w in cluster.workers})
    ws = tmp_path / "ws"
    config = tmp_path / "run.yaml"
    config.write_text(
        "backend: ray\n"
        f"ray: {{address: '{cluster.address}'}}\n"
        f"gpus: 'node:{head[:8]}'\n"
        "tasks_per_gpu: 2\n"
        f"workspace: {ws}\n"
        "tasks:\n"
        + "".join(f"  - {{name: t{i}, command: {json.dumps(_probe(2))}}}\n" for i in range(4))
    )
    result = gpuswarm("run", "--plain", "--no-report", config, timeout=120)
    assert result.returncode == 0, result
    seen = _seen(ws)
    slots = sorted(row[1] for row in seen)
    assert len(set(slots)) == 4  # 2 GPUs x 2 slots each, all four at once
    assert {label.split("-")[-2] for label in slots} == {head[:6]}  # on that node only
    assert sum(label.endswith(".1") for label in slots) == 2  # the second slot of each GPU
    assert cluster.wait_no_actors() == []


def test_staged_attempts_send_their_outputs_home_under_the_limit(
    cluster: LocalRayCluster, tmp_path: Path, gpuswarm: Callable[..., CliResult]
) -> None:
    """``ship: always`` (as on a node without the run folder): the attempt runs in a node-local
    stage, its cwd shipped; its completion file and outputs come home with the outcome, and
    outputs over ``max_result_mb`` fail the attempt with a clear line in its log."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "data.txt").write_text("input\n")
    ws = tmp_path / "ws"
    small = (
        'sh -c \'cat data.txt > "$GPUSWARM_TASK_WORKSPACE/copy.txt"; '
        'echo \\{\\"ok\\": 1\\} > "$GPUSWARM_TASK_WORKSPACE/result.json"; pwd\''
    )
    big = "sh -c 'head -c 4096 /dev/zero > \"$GPUSWARM_TASK_WORKSPACE/big.bin\"'"
    config = tmp_path / "cfg" / "run.yaml"
    config.write_text(
        "backend: ray\n"
        f"ray: {{address: '{cluster.address}', ship: always, max_result_mb: 0.001}}\n"
        f"workspace: {ws}\n"
        "tasks:\n"
        f"  - {{name: small, command: {json.dumps(small)}, done_when: result.json}}\n"
        f"  - {{name: big, command: {json.dumps(big)}}}\n"
    )
    result = gpuswarm("run", "--plain", "--no-report", config, timeout=120)
    assert result.returncode == 1, result  # the big one failed
    run = find_runs(ws)[0]
    task = run / "tasks" / "small"
    assert (task / "copy.txt").read_text() == "input\n"  # its shipped cwd, its output home
    assert json.loads((task / "result.json").read_text()) == {"ok": 1}
    where = (task / "attempt-1" / "output.log").read_text().strip()
    assert where != str(tmp_path / "cfg") and "gpuswarm-ray" in where  # ran in a stage
    log = (run / "tasks" / "big" / "attempt-1" / "output.log").read_text()
    assert "over ray.max_result_mb" in log and "ray.shared_path" in log
    assert not (run / "tasks" / "big" / "big.bin").exists()
    assert _summary(run)["counts"] == {**_summary(run)["counts"], "done": 1, "failed": 1}
    assert cluster.wait_no_actors() == []


def test_a_node_without_the_run_folder_gets_the_slot_home_and_keeps_it(
    cluster: LocalRayCluster, tmp_path: Path, gpuswarm: Callable[..., CliResult]
) -> None:
    """``home.isolate`` with ``ship: always``: the slot's private HOME, provisioned on the
    driver, is shipped once to the node, which keeps it for the slot's next attempts (as a
    local slot's HOME is kept), and drops it at the run's end."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "tool.cfg").write_text("token-free setting\n")
    ws = tmp_path / "ws"
    step = (
        'sh -c \'cat "$HOME/.config/tool.cfg" > "$GPUSWARM_TASK_WORKSPACE/cfg.txt"; '
        'echo x >> "$HOME/count"; wc -l < "$HOME/count" > "$GPUSWARM_TASK_WORKSPACE/n.txt"; '
        'echo "$HOME" > "$GPUSWARM_TASK_WORKSPACE/home.txt"\''
    )
    config = tmp_path / "cfg" / "run.yaml"
    config.write_text(
        "backend: ray\n"
        f"ray: {{address: '{cluster.address}', ship: always}}\n"
        "gpus: 1\n"  # one slot: both tasks run on it, one after the other
        "home: {isolate: true, provision: [{src: tool.cfg, dest: .config/tool.cfg}]}\n"
        f"workspace: {ws}\n"
        "tasks:\n"
        f"  - {{name: first, command: {json.dumps(step)}}}\n"
        f"  - {{name: second, command: {json.dumps(step)}}}\n"
    )
    result = gpuswarm("run", "--plain", "--no-report", config, timeout=120)
    assert result.returncode == 0, result
    run = find_runs(ws)[0]
    counts = {}
    for task in ("first", "second"):
        folder = run / "tasks" / task
        assert (folder / "cfg.txt").read_text() == "token-free setting\n"  # provisioned
        home = (folder / "home.txt").read_text().strip()
        assert "gpuswarm-ray" in home and not home.startswith(str(run))  # the node's copy
        counts[task] = int((folder / "n.txt").read_text())
    assert sorted(counts.values()) == [1, 2]  # the second attempt found the first's file
    slot_home = next((run / "homes").iterdir())
    assert not (slot_home / "count").exists()  # the driver's copy is not written by the node
    scratch = Path(os.environ["GPUSWARM_RAY_SCRATCH"]) / "gpuswarm-ray"
    assert list(scratch.glob(f"{run.name}-*/homes")) == []  # dropped at the run's end
    assert cluster.wait_no_actors() == []


def _events(run: Path, ev: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run) if e.get("ev") == ev]


def test_node_joining_gets_work_and_node_lost_mid_task_is_requeued_done_once(
    cluster: LocalRayCluster, tmp_path: Path, gpuswarm_popen: Callable[..., CliProcess]
) -> None:
    ws = tmp_path / "ws"
    cmds = _commands(tmp_path / "cmds.txt", [_probe(6) for _ in range(14)])
    proc = gpuswarm_popen("run", *_ray_args(cluster), "--json", "--workspace", ws, cmds)
    run = wait_for_run(ws, timeout=60)
    wait_for(lambda: len(_events(run, "started")) >= 6, timeout=60)
    node = cluster.add_node()  # joins mid-run: its slots get the pending tasks
    prefix = node.node_id[:6]
    # both of its slots running (a second start after the look made the lost set one larger)
    wait_for(
        lambda: (
            len({e["slot"] for e in _events(run, "started") if prefix in str(e.get("slot"))}) == 2
        ),
        timeout=60,
    )
    joined = [e for e in _events(run, "slots") if e.get("change") == "joined"]
    assert joined and joined[0]["node"] == node.node_id
    on_node = {e["task"] for e in _events(run, "started") if prefix in str(e.get("slot"))}
    cluster.remove_node(node)  # mid-task: its attempts are lost and run again elsewhere
    result = proc.wait(timeout=120)
    assert result.returncode == 0, result
    # issue 33: stdout is the one JSON document, whatever Ray says about the node's death; Ray's
    # own messages go to the run's ray.log, and the terminal gets one gpuswarm line per change
    assert json.loads(result.stdout)["counts"]["done"] == 14, result
    assert "(raylet)" not in result.output, result
    about = [line for line in result.stderr.splitlines() if node.node_id[:6] in line]
    assert len([line for line in about if "left the cluster" in line]) == 1, result
    assert len([line for line in about if "joined: 2 slots" in line]) == 1, result
    assert "(raylet)" in (run / "ray.log").read_text()  # what Ray said: kept, in the run
    assert (run / "ray.log").stat().st_mode & 0o077 == 0
    # what ran on the removed node ended with its slot actors (their guards): the shells and
    # the sleeps under them, which Ray itself leaves running
    pids = [int(p) for row in _seen(ws) if prefix in row[1] for p in row[3:]]
    assert pids
    wait_for(lambda: not any(_alive(p) for p in pids), timeout=20, what=f"{pids} gone")
    left = [e for e in _events(run, "slots") if e.get("change") == "left"]
    assert left and left[0]["node"] == node.node_id
    requeued = {e["task"] for e in _events(run, "requeued") if e.get("reason") == "lost"}
    assert requeued == on_node
    done = [e["task"] for e in _events(run, "finished") if e.get("state") == "done"]
    assert sorted(done) == sorted(set(done)) and len(done) == 14  # each task done once
    assert _summary(run)["counts"]["done"] == 14
    for task in on_node:
        desc = json.loads(next((run / ".parallel" / "done").glob(f"*_{task}.json")).read_text())
        kinds = [a["kind"] for a in desc["attempts"]]
        assert kinds == ["lost", "exited"], desc["attempts"]
    assert cluster.wait_no_actors() == []


def test_sigkilled_driver_resumes_and_each_task_ends_once(
    cluster: LocalRayCluster,
    tmp_path: Path,
    gpuswarm: Callable[..., CliResult],
    gpuswarm_popen: Callable[..., CliProcess],
) -> None:
    """The slot actors outlive the driver: resume reattaches, collects the outcome of the
    attempt that ended meanwhile (3 s) and waits for the one still running (11 s); no task is
    run twice, and the output written while no driver was there comes home."""
    ws = tmp_path / "ws"
    lines = [
        f"sh -c 'echo begin; sleep {seconds}; echo end >> {tmp_path}/ends-{seconds}.txt; echo bye'"
        for seconds in (3, 11)
    ]
    cmds = _commands(tmp_path / "cmds.txt", lines)
    proc = gpuswarm_popen("run", *_ray_args(cluster), "--workspace", ws, cmds)
    run = wait_for_run(ws, timeout=60)
    wait_for(lambda: len(_events(run, "started")) >= 2, timeout=60)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    result = gpuswarm("resume", run, "--plain", "--no-report", timeout=120)
    assert result.returncode == 0, result
    for seconds in (3, 11):  # ran to its end once, never twice
        assert (tmp_path / f"ends-{seconds}.txt").read_text().splitlines() == ["end"]
    assert _summary(run)["counts"]["done"] == 2
    adopted = [e for e in _events(run, "slots") if e.get("change") == "adopted"]
    assert sorted(e["task"] for e in adopted) == ["cmd-00001", "cmd-00002"]
    for task in ("cmd-00001", "cmd-00002"):
        log = (run / "tasks" / task / "attempt-1" / "output.log").read_text()
        assert log.splitlines()[-1] == "bye"  # written after the driver died, home too
        assert log.count("begin") == 1  # a reattached driver goes on where the dead one was
    assert cluster.wait_no_actors() == []


def test_research_round_across_nodes(
    cluster: LocalRayCluster, tmp_path: Path, gpuswarm: Callable[..., CliResult]
) -> None:
    """Variants shipped to the nodes that run them (``--ray-ship always``: as on nodes without
    the run folder), the per-node setup once per node, one ledger on the driver, results
    recording host and accelerator."""
    repo = make_research_repo(tmp_path / "repo")
    setups = tmp_path / "setups.txt"
    init = gpuswarm(
        "research", "init", "-C", repo, "--tag", "c1", "--edit", "train.py",
        "--protect", "prepare.py", "--command", f"{sys.executable} train.py",
        "--backend", "ray", "--ray-address", cluster.address, "--ray-ship", "always",
        "--ray-setup", f"echo $$ >> {setups}", "--timeout", "30s", "--linger", "1s",
        timeout=120,
    )  # fmt: skip
    assert init.returncode == 0, init
    loop = gpuswarm(
        "research", "loop", "-C", repo, "--proposer", "mutate", "--mode", "rounds",
        "--max-experiments", "5", "--seed", "2", timeout=170,
    )  # fmt: skip
    try:
        assert loop.returncode == 0, loop
    finally:
        gpuswarm("research", "stop", "-C", repo, timeout=60)
    finished = [e for e in research_ledger(repo, "c1") if e.get("ev") == "finished"]
    assert len(finished) >= 5
    assert any(e.get("ok") for e in finished), finished  # (mutate may make one crash)
    nodes = {str(e["slot"]).split("-")[-2] for e in finished}
    assert len(nodes) >= 2  # the round ran on several nodes
    assert {e.get("accelerator") for e in finished} == {"GPU"}  # Ray's fake GPUs
    assert all(e.get("host") for e in finished)
    rows = research_results(repo, "c1")
    assert len(rows) == 1 + len(finished)
    # setup ran once per node that got slots (3 nodes), however many runners started
    assert len(setups.read_text().splitlines()) == len(cluster.node_ids())
    assert cluster.wait_no_actors() == []


def test_a_chain_runs_in_order_and_a_failed_prerequisite_ends_its_dependent(
    cluster: LocalRayCluster, tmp_path: Path, gpuswarm: Callable[..., CliResult]
) -> None:
    """Issue 35 on the Ray driver: a -> b -> c run in order (each needs its prerequisite's
    file: one started early fails), ``d`` after a failed task ends dependency_failed."""
    marks = tmp_path / "marks"
    marks.mkdir()
    tasks = [
        {"name": "a", "command": f"sleep 0.3; touch {marks}/a", "shell": True},
        {"name": "b", "command": f"test -e {marks}/a && touch {marks}/b", "shell": True,
         "after": "a"},
        {"name": "c", "command": f"test -e {marks}/b", "shell": True, "after": "b"},
        {"name": "bad", "command": "exit 3", "shell": True},
        {"name": "d", "command": "true", "after": "bad"},
    ]  # fmt: skip
    config = tmp_path / "chain.yaml"
    config.write_text(json.dumps({"name": "chain", "workspace": "ws", "tasks": tasks}))
    result = gpuswarm("run", *_ray_args(cluster), config, timeout=120)
    assert result.returncode == 1, result  # bad failed
    run = find_runs(tmp_path / "ws")[0]
    states = {}
    for state in ("done", "failed", "dependency_failed", "pending", "blocked"):
        for path in (run / ".parallel" / state).glob("*.json"):
            states[json.loads(path.read_text())["id"]] = state
    assert states == {
        "a": "done",
        "b": "done",
        "c": "done",
        "bad": "failed",
        "d": "dependency_failed",
    }
    assert cluster.wait_no_actors() == []
