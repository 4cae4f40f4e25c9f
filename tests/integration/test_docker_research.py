"""A research round with ``--backend docker``: every variant (and the baseline) runs in a
container of the image, and the round's results are those of the local backend.

Real containers (``dockerkit``'s offline image, the host's ``/usr`` read-only: the variant runs
``python3 train.py`` with Debian's interpreter); marked ``docker`` (``tests/conftest.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliResult
from dockerkit import ContainerWatcher
from integration_support import TRAIN_PY, edit_constant, git, make_research_repo, research_results

pytestmark = [pytest.mark.slow, pytest.mark.docker]

Cli = Callable[..., CliResult]


def val_bpb(lr: float = 0.04, depth: int = 8) -> str:
    """TRAIN_PY's metric as printed (integration_support's defaults: LR 0.04, DEPTH 8)."""
    return f"{0.9 + (lr - 0.05) ** 2 * 100 + abs(depth - 6) * 0.01:.6f}"


def test_a_research_round_runs_every_variant_in_a_container(
    tmp_path: Path, gpuswarm: Cli, run_reaper: None, docker_image: str
) -> None:
    # a second of "training": long enough for the watcher to see each container
    repo = make_research_repo(tmp_path / "repo", TRAIN_PY.replace("SLEEP = 0.2", "SLEEP = 1.0"))
    tag = "dock"
    res = gpuswarm(
        "research", "init", "-C", repo, "--tag", tag, "--edit", "train.py",
        "--protect", "prepare.py", "--command", "python3 train.py", "--gpus", "sim:2",
        "--timeout", "20s", "--linger", "2s", "--json", "--baseline-repeats", "1",
        "--backend", "docker", "--image", docker_image,
        "--mount", "/usr:/usr:ro", "--network", "none",
    )  # fmt: skip
    assert res.returncode == 0, str(res)
    with ContainerWatcher([tmp_path]) as watcher:
        edit_constant(repo, "LR", "0.05")
        res = gpuswarm("research", "try", "-C", repo, "-m", "increase LR to 0.05", "--json")
        assert res.returncode == 0, str(res)
        tried = json.loads(res.stdout)
        res = gpuswarm("research", "wait", "-C", repo, "--json", timeout=60)
        assert res.returncode == 0, str(res)
    waited = json.loads(res.stdout)
    assert waited["timed_out"] is False, waited
    assert {v["id"] for v in waited["finished"]} == {"v0001", tried["id"]}, waited

    rows = research_results(repo, tag)
    assert len(rows) == 3, rows
    assert rows[1][1] == val_bpb() and rows[1][3:] == ["keep", "baseline"], rows
    (variant,) = [r for r in rows[1:] if "increase LR to 0.05" in r[4]]
    assert variant[1] == val_bpb(lr=0.05) and variant[3] == "keep", rows
    assert git(repo, "rev-parse", f"autoresearch/{tag}").startswith(variant[0])

    # both attempts were containers of this experiment's queue run
    attempts = [c for c in watcher.seen.values() if c.labels.get("kind") == "attempt"]
    assert len({c.labels["task"] for c in attempts}) == 2, list(watcher.seen.values())
    assert all(Path(c.labels["run"]).is_relative_to(repo) for c in attempts), attempts
    assert gpuswarm("research", "stop", "-C", repo).returncode == 0
