"""resume keeps the run's config snapshot; a changed config needs an explicit flag."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuswarm", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


CONFIG = """
name: change
gpus: sim:2
workspace: ws
tasks:
  - name: a
    command: "true"
  - name: b
    command: {b}
"""


def test_changed_config_needs_the_flag_then_applies(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.format(b='"false"'))
    assert cli("run", "-q", cfg).returncode == 1
    (run,) = (tmp_path / "ws" / "change").glob("run_*")
    cfg.write_text(CONFIG.format(b='"true"') + '  - name: c\n    command: "true"\n')
    refused = cli("resume", "-q", "--config", cfg, run)
    assert refused.returncode == 2
    assert "--allow-config-change" in refused.stderr
    assert json.loads((run / "summary.json").read_text())["counts"]["failed"] == 1  # untouched
    applied = cli("resume", "-q", "--json", "--config", cfg, "--allow-config-change", run)
    assert applied.returncode == 0, applied.stderr
    summary = json.loads(applied.stdout)
    assert summary["counts"] == {"pending": 0, "running": 0, "done": 3, "failed": 0}
    assert cli("check", run).returncode == 0
    same = cli("resume", "-q", "--config", cfg, run)  # now the snapshot matches: no flag needed
    assert same.returncode == 0
