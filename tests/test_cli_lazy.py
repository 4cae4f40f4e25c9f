"""The CLI loads each command's module when the command is asked for: ``--version`` and
``--help`` of the group import no engine and no config models, ``status`` no engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SNIPPET = """
import json, sys
from gpuswarm.cli import cli
try:
    cli({argv!r}, prog_name="gpuswarm")
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("gpuswarm", "pydantic")))))
"""


def _loaded(argv: list[str]) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", SNIPPET.format(argv=argv)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_version_loads_nothing_of_the_commands() -> None:
    loaded = _loaded(["--version"])
    assert "gpuswarm.app.engine" not in loaded and "gpuswarm.config.models" not in loaded
    assert "pydantic" not in loaded


def test_a_read_only_command_does_not_load_the_engine() -> None:
    loaded = _loaded(["status", "--help"])
    assert "gpuswarm.cli.runs" in loaded
    assert "gpuswarm.app.engine" not in loaded and "gpuswarm.supervise.supervisor" not in loaded


def test_run_loads_what_it_needs() -> None:
    loaded = _loaded(["run", "--help"])
    assert "gpuswarm.cli.supervise" in loaded and "gpuswarm.app.engine" in loaded


def test_status_of_a_run_loads_neither_pydantic_nor_yaml(tmp_path: Path) -> None:
    """``status RUN`` on a real run: the config models, pydantic and yaml stay unloaded (issue
    33: they were most of its start-up, pulled in by ``--gpus``'s size parser and ``clean``'s
    duration parser)."""
    from gpuswarm.store.runs import NewRun, create_run

    run = create_run(NewRun(name="lazy", workspace=tmp_path, info={"name": "lazy"}, tasks=[]))
    snippet = SNIPPET.replace('("gpuswarm", "pydantic")', '("gpuswarm", "pydantic", "yaml")')
    out = subprocess.run(
        [sys.executable, "-c", snippet.format(argv=["status", str(run.root)])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "gpuswarm.outputs.status" in loaded  # it did show the run
    assert not {m for m in loaded if m.startswith(("pydantic", "yaml", "gpuswarm.config"))}
