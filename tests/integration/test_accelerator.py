"""A task's ``accelerator:`` through the real CLI: with several GPU models in one run
(``sim:2xA100,1xH100``), a task asking for a model runs only on that model's slots, the others
anywhere; a model none of the run's GPUs is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_driver import find_runs, run_cli

from gpuswarm.placement.devices import model_matches

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def _config(tmp_path: Path, tasks: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(f"name: models\nworkspace: ws\ngpus: sim:2xA100,1xH100\ntasks:\n{tasks}")
    return path


def _attempts(run: Path) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for path in (run / ".parallel" / "done").glob("*.json"):
        desc = json.loads(path.read_text())
        out[desc["task"]["name"]] = desc["attempts"]
    return out


def test_tasks_run_only_on_the_model_they_ask_for(tmp_path: Path) -> None:
    entries = "".join(
        f"  - {{name: h{i}, accelerator: H100, command: 'sleep 0.3'}}\n"  # the slots overlap
        for i in range(4)
    )
    entries += "".join(
        f"  - {{name: a{i}, accelerator: a100, command: 'sleep 0.3'}}\n" for i in range(4)
    )
    entries += "".join(f"  - {{name: x{i}, command: 'true'}}\n" for i in range(4))
    res = run_cli("run", "--plain", _config(tmp_path, entries), cwd=tmp_path)
    assert res.returncode == 0, res
    (run,) = find_runs(tmp_path / "ws")
    attempts = _attempts(run)
    assert len(attempts) == 12, attempts
    for name, tries in attempts.items():
        (only,) = tries
        if name.startswith("h"):
            assert only["accelerator"] == "H100", (name, only)
        elif name.startswith("a"):
            assert only["accelerator"] == "A100", (name, only)
    # the H100's one slot ran its four one after the other while the A100s ran theirs
    h100 = {a[0]["slot"] for n, a in attempts.items() if n.startswith("h")}
    assert len(h100) == 1, h100


def test_a_model_the_run_has_not_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path, "  - {name: v, accelerator: V100, command: 'true'}\n")
    res = run_cli("run", "--plain", config, cwd=tmp_path)
    assert res.returncode == 2, res
    assert "accelerator 'V100' is none of this run's GPUs (A100, H100)" in res.stderr, res
    assert not (tmp_path / "ws").exists() or not find_runs(tmp_path / "ws")


@pytest.mark.parametrize(
    ("name", "wanted", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "H100", True),
        ("NVIDIA H100 80GB HBM3", "h100 80gb", True),
        ("NVIDIA A100-SXM4-80GB", "A100", True),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb", True),
        ("NVIDIA A100-SXM4-80GB", "A10", False),
        ("NVIDIA H100 80GB HBM3", "80GB H100", False),
        ("XH100", "H100", False),
        ("A100", "A100", True),
    ],
)
def test_model_matches(name: str, wanted: str, expected: bool) -> None:
    assert model_matches(name, wanted) is expected
