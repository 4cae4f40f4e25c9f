"""How a failed preflight is told (issue 33): two lines, the check's own message and the log."""

from __future__ import annotations

from pathlib import Path

from gpuswarm.core.paths import RunPaths
from gpuswarm.supervise.preflight import Failure, failure_message, last_said


def _paths(tmp_path: Path) -> RunPaths:
    return RunPaths(tmp_path / "run_1")


def test_a_script_is_told_by_its_message_and_a_command_by_itself(tmp_path: Path) -> None:
    log = tmp_path / "run_1" / "preflight" / "gpu0.log"
    script = (
        "# agent x: installed?\nif ! command -v x; then\n  echo 'x is missing'\n  exit 127\nfi\n"
    )
    text = failure_message(
        _paths(tmp_path), [Failure("gpu0", script, "exit 127", "x is missing", log)]
    )
    first, second = text.split("\n")
    assert first == "preflight failed on gpu0: x is missing"
    assert second.startswith(f"log: {log} (no task was started;")
    timed_out = Failure("gpu0", script, "timeout after 600s", "waiting for login", log)
    first = failure_message(_paths(tmp_path), [timed_out]).split("\n")[0]
    assert first == "preflight failed on gpu0: waiting for login (timeout after 600s)"
    long = "python -c 'import torch; assert torch.cuda.is_available()'; " * 3
    failures = [Failure(s, long, "exit 1", "", log) for s in ("gpu1", "gpu0", "gpu2")]
    first = failure_message(_paths(tmp_path), failures).split("\n")[0]
    assert first.startswith("preflight failed on gpu0 (and on 2 other slots): `python -c")
    assert first.endswith(" ...` exit 1 (no output)") and len(first) < 140
    two = [Failure(s, "nvidia-smi", "exit 9", "NVML: no GPU", log) for s in ("gpu1", "gpu0")]
    first = failure_message(_paths(tmp_path), two).split("\n")[0]
    assert (
        first == "preflight failed on gpu0 (and on 1 other slot): `nvidia-smi` exit 9: NVML: no GPU"
    )


def test_the_message_is_the_last_line_printed_redacted_and_inert(tmp_path: Path) -> None:
    out = tmp_path / "output.log"
    out.write_text(
        "lots\nof\noutput\n\x1b[31mtoken sk-live-abcdef0123456789abcdef0123 is bad\x1b[0m\n\n  \n"
    )
    said = last_said(out, {"API_KEY": "sk-live-abcdef0123456789abcdef0123"})
    assert said.startswith("\\x1b[31mtoken ") and said.endswith("is bad\\x1b[0m")
    assert "sk-live-abcdef" not in said
    out.write_text("x" * 5000 + "\n")
    assert len(last_said(out, {})) == 300
    assert last_said(tmp_path / "absent.log", {}) == ""
