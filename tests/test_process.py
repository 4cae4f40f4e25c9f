"""process.py with real processes: classification, timeouts, cancel, escapees, many at once."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuswarm.core.logs import detect_oom, log_tail
from gpuswarm.core.models import EndKind
from gpuswarm.exec.base import AttemptEnd, LaunchSpec
from gpuswarm.exec.local import process, tree
from gpuswarm.exec.local.process import Attempt
from gpuswarm.exec.local.tree import become_subreaper, kill_tree, sweep_orphans

PY = sys.executable
ESCAPE = str(Path(__file__).parent / "helpers" / "proc_escape.py")
IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs a subreaper")


@pytest.fixture(scope="session", autouse=True)
def subreaper() -> bool:
    return become_subreaper()


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Every test must leave no child (alive or zombie) and no registered attempt behind."""
    before = {c.pid for c in psutil.Process().children()}
    yield
    new = [c for c in psutil.Process().children() if c.pid not in before]
    for child in new:  # clean up before failing, so one failure does not cascade
        kill_tree([child.pid], 0)
    assert not new, f"left behind: {new}"
    assert not tree.REGISTRY.live


def make_spec(
    tmp_path: Path,
    argv: list[str],
    name: str = "a",
    *,
    timeout: float | None = None,
    grace: float = 10.0,
    token: str = "",
) -> LaunchSpec:
    log = tmp_path / name / "output.log"
    return LaunchSpec(argv, dict(os.environ), tmp_path, log, timeout, grace, token)


def run(tmp_path: Path, argv: list[str], name: str = "a", **kw: Any) -> AttemptEnd:
    return Attempt.launch(make_spec(tmp_path, argv, name, **kw)).wait()


def read_pid(path: Path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)
    return int(path.read_text())


def assert_gone(pid: int) -> None:
    """Dead and reaped: a zombie still counts as present."""
    assert not psutil.pid_exists(pid), f"pid {pid} survived ({psutil.Process(pid).status()})"


def cancel_later(attempt: Attempt, delay: float, *, hard: bool = False) -> threading.Thread:
    def go() -> None:
        time.sleep(delay)
        attempt.cancel(hard=hard)

    thread = threading.Thread(target=go)
    thread.start()
    return thread


# -- classification --------------------------------------------------------------------------------
def test_exit_zero_carries_token_and_logs(tmp_path: Path) -> None:
    code = "import os; print('hello', os.environ['GPUSWARM_ATTEMPT_TOKEN'])"
    end = run(tmp_path, [PY, "-c", code], token="tok-1")
    assert end.ok and end.kind is EndKind.EXITED
    assert (end.returncode, end.signal, end.reason, end.killed) == (0, None, "exit 0", 0)
    assert end.pid is not None and end.duration >= 0 and not end.oom
    assert "hello tok-1" in (tmp_path / "a" / "output.log").read_text()


def test_exit_three(tmp_path: Path) -> None:
    end = run(tmp_path, ["/bin/sh", "-c", "exit 3"])
    assert (end.kind, end.returncode, end.reason, end.ok) == (EndKind.EXITED, 3, "exit 3", False)


def test_self_kill_with_sigsegv_is_signaled(tmp_path: Path) -> None:
    end = run(tmp_path, [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert (end.kind, end.signal, end.returncode) == (EndKind.SIGNALED, "SIGSEGV", None)
    assert end.reason == "killed by SIGSEGV"


def test_missing_command(tmp_path: Path) -> None:
    attempt = Attempt.launch(make_spec(tmp_path, ["no-such-command-xyz", "--flag"]))
    assert attempt.done and attempt.pid is None
    end = attempt.wait()
    assert (end.kind, end.reason) == (EndKind.NOT_FOUND, "command not found: no-such-command-xyz")
    assert "command not found" in (tmp_path / "a" / "output.log").read_text()


def test_missing_command_in_shell(tmp_path: Path) -> None:
    end = run(tmp_path, ["/bin/sh", "-c", "no-such-command-xyz --flag"])
    assert (end.kind, end.returncode) == (EndKind.NOT_FOUND, 127)
    assert end.reason == "command not found: no-such-command-xyz"


def test_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    end = run(tmp_path, [str(script)])
    assert end.kind is EndKind.NOT_EXECUTABLE and str(script) in end.reason
    end = run(tmp_path, ["/bin/sh", "-c", "./script.sh"], name="b")
    assert (end.kind, end.returncode) == (EndKind.NOT_EXECUTABLE, 126)
    assert "./script.sh" in end.reason


def test_missing_cwd_is_spawn_error(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, ["true"])
    spec = LaunchSpec(spec.argv, spec.env, tmp_path / "nope", spec.log_path)
    end = Attempt.launch(spec).wait()
    assert end.kind is EndKind.SPAWN_ERROR and "nope" in end.reason
    assert "working directory" in spec.log_path.read_text()


def test_oom_is_read_from_the_log(tmp_path: Path) -> None:
    code = (
        "import sys; print('step 1'); "
        "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', "
        "file=sys.stderr); sys.exit(1)"
    )
    end = run(tmp_path, [PY, "-c", code])
    assert end.oom and end.kind is EndKind.EXITED and end.returncode == 1
    assert end.reason == "CUDA out of memory (exit 1)"


@pytest.mark.parametrize(
    ("text", "oom"),
    [
        ("RuntimeError: CUDA error: out of memory\n", True),
        ("hipErrorOutOfMemory\n", True),
        ("RuntimeError: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate\n", True),
        ("GPU 0: out of memory while loading\n", True),
        ("MemoryError: out of memory\n", False),
        ("the relationship ran out of memory\n", False),
        ("all good\n", False),
    ],
)
def test_detect_oom(tmp_path: Path, text: str, oom: bool) -> None:
    log = tmp_path / "log"
    log.write_text("x" * 100_000 + "\n" + text)
    assert detect_oom(log) is oom


def test_end_kind_is_a_json_string() -> None:
    assert json.dumps({"k": EndKind.TIMEOUT}) == '{"k": "timeout"}'
    assert EndKind("not-found") is EndKind.NOT_FOUND


# -- log tail --------------------------------------------------------------------------------------
def test_log_tail_collapses_progress_lines(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"first\n 10%|#\r 50%|###\r100%|#####\nbad \xff byte\r\nlast\n")
    assert log_tail(log) == "first\n100%|#####\nbad \ufffd byte\nlast"
    assert log_tail(log, max_lines=1) == "last"
    assert log_tail(tmp_path / "missing") == ""


def test_log_tail_drops_a_partial_first_line(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("a" * 50 + "\nline two\nline three\n")
    assert log_tail(log, max_bytes=25) == "line two\nline three"


# -- timeouts and escapees -------------------------------------------------------------------------
def test_timeout_when_sigterm_is_ignored(tmp_path: Path) -> None:
    end = run(tmp_path, [PY, "-c", IGNORE_TERM], timeout=2.0, grace=0.3)
    assert (end.kind, end.returncode) == (EndKind.TIMEOUT, None)
    assert end.reason.startswith("timeout after 2s (")
    assert end.signal in ("SIGKILL", "SIGTERM")  # SIGTERM only if python was slower than 2 s
    assert end.pid is not None
    assert_gone(end.pid)


def test_timeout_stopped_by_sigterm(tmp_path: Path) -> None:
    end = run(tmp_path, ["sleep", "30"], timeout=0.3, grace=5.0)
    assert (end.kind, end.signal) == (EndKind.TIMEOUT, "SIGTERM")
    assert end.reason == "timeout after 0.3s (stopped by SIGTERM)"
    assert end.duration < 5.0


@linux_only
@pytest.mark.parametrize("mode", ["setsid", "daemon", "noenv"])
def test_escapee_dies_after_exit_zero(tmp_path: Path, mode: str) -> None:
    pidfile = tmp_path / "escapee.pid"
    end = run(tmp_path, [PY, ESCAPE, str(pidfile), mode, "exit"], grace=0.5)
    assert end.ok, end.reason
    assert end.killed >= 1
    assert_gone(read_pid(pidfile))


@linux_only
@pytest.mark.parametrize("mode", ["setsid", "keep"])
def test_escapee_dies_on_timeout(tmp_path: Path, mode: str) -> None:
    pidfile = tmp_path / "escapee.pid"
    end = run(tmp_path, [PY, ESCAPE, str(pidfile), mode, "hang"], timeout=3.0, grace=0.3)
    assert end.kind is EndKind.TIMEOUT
    assert end.killed >= 1
    assert_gone(read_pid(pidfile))
    assert end.pid is not None
    assert_gone(end.pid)


@linux_only
@pytest.mark.parametrize("mode", ["daemon", "noenv"])
def test_cleanup_spares_escapees_of_other_live_attempts(tmp_path: Path, mode: str) -> None:
    pidfile = tmp_path / "escapee.pid"
    other = Attempt.launch(make_spec(tmp_path, [PY, ESCAPE, str(pidfile), mode, "hang"], "b"))
    pid = read_pid(pidfile)
    assert run(tmp_path, ["true"]).ok  # ends while `other` is live: must not touch its escapee
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    other.cancel(hard=True)
    assert other.wait().kind is EndKind.CANCELLED
    assert_gone(pid)


@linux_only
@pytest.mark.parametrize("mode", ["setsid", "daemon"])
def test_escapee_found_when_a_thread_launched_it(tmp_path: Path, mode: str) -> None:
    """As the supervisor's loop does: launch from a thread, look without blocking. The orphan
    is re-parented to the main thread, whose children are what the attempt's check reads."""
    pidfile = tmp_path / "escapee.pid"
    result: dict[str, Any] = {}

    def loop() -> None:
        attempt = Attempt.launch(make_spec(tmp_path, [PY, ESCAPE, str(pidfile), mode, "exit"]))
        deadline = time.monotonic() + 30
        while attempt.end_if_clean() is None and not attempt._reaped:  # main still running
            assert time.monotonic() < deadline
            time.sleep(0.01)
        result["clean"] = attempt.end_if_clean()  # the main exited: something of it is left
        result["end"] = attempt.wait()

    thread = threading.Thread(target=loop)
    thread.start()
    thread.join(60)
    assert result["clean"] is None  # not mistaken for a clean exit
    end = result["end"]
    assert end.ok and end.killed >= 1, end
    assert_gone(read_pid(pidfile))


def test_background_job_of_a_shell_dies_after_exit_zero(tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    end = run(tmp_path, ["/bin/sh", "-c", f"sleep 300 & echo $! > {pidfile}"], grace=0.5)
    assert end.ok and end.killed == 1
    assert_gone(read_pid(pidfile))


# -- cancel ----------------------------------------------------------------------------------------
def test_cancel_soft(tmp_path: Path) -> None:
    attempt = Attempt.launch(make_spec(tmp_path, ["sleep", "60"], grace=5.0))
    thread = cancel_later(attempt, 0.3)
    end = attempt.wait()
    thread.join()
    assert (end.kind, end.signal) == (EndKind.CANCELLED, "SIGTERM")
    assert end.reason == "cancelled (stopped by SIGTERM)" and end.duration < 5.0
    attempt.cancel()  # after the end: a no-op
    assert attempt.done and attempt.wait() is end


def test_cancel_soft_escalates_after_grace(tmp_path: Path) -> None:
    attempt = Attempt.launch(make_spec(tmp_path, [PY, "-c", IGNORE_TERM], grace=0.3))
    thread = cancel_later(attempt, 1.5)
    end = attempt.wait()
    thread.join()
    assert end.kind is EndKind.CANCELLED and end.signal in ("SIGKILL", "SIGTERM")


@pytest.mark.parametrize("soft_first", [False, True])
def test_cancel_hard(tmp_path: Path, soft_first: bool) -> None:
    attempt = Attempt.launch(make_spec(tmp_path, [PY, "-c", IGNORE_TERM], grace=60.0))
    if soft_first:
        cancel_later(attempt, 0.5).join()
    thread = cancel_later(attempt, 1.0, hard=True)
    end = attempt.wait()
    thread.join()
    assert (end.kind, end.reason) == (EndKind.CANCELLED, "cancelled (SIGKILL sent)")
    assert end.duration < 30.0


def test_cancel_before_wait(tmp_path: Path) -> None:
    attempt = Attempt.launch(make_spec(tmp_path, ["sleep", "60"]))
    attempt.cancel(hard=True)
    end = attempt.wait()
    assert (end.kind, end.signal) == (EndKind.CANCELLED, "SIGKILL")


# -- cost and scale --------------------------------------------------------------------------------
def test_wait_returns_soon_after_exit(tmp_path: Path) -> None:
    for i in range(5):
        end = run(tmp_path, ["true"], name=f"t{i}")
        assert end.ok and end.duration < 2.0


@pytest.mark.skipif(not process._USE_PIDFD, reason="needs pidfd")
def test_waiting_does_not_poll(tmp_path: Path) -> None:
    attempts = [Attempt.launch(make_spec(tmp_path, ["sleep", "2"], name=f"s{i}")) for i in range(8)]
    before = resource.getrusage(resource.RUSAGE_SELF)
    with ThreadPoolExecutor(8) as pool:
        ends = list(pool.map(Attempt.wait, attempts))
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert all(e.ok for e in ends)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.5, cpu
    assert after.ru_nvcsw - before.ru_nvcsw < 200  # measured ~50; a 50 ms polling loop needs ~370


def test_many_concurrent_attempts(tmp_path: Path) -> None:
    def worker(slot: int) -> list[tuple[int, AttemptEnd]]:
        out = []
        for i in range(20):
            k = (slot + i) % 5
            argv = ["no-such-command-xyz"] if k == 4 else ["/bin/sh", "-c", f"exit {k}"]
            out.append((k, run(tmp_path, argv, name=f"{slot}-{i}")))
        return out

    with ThreadPoolExecutor(16) as pool:
        results = [r for rs in pool.map(worker, range(16)) for r in rs]
    assert len(results) == 320
    for k, end in results:
        if k == 4:
            assert end.kind is EndKind.NOT_FOUND
        else:
            assert (end.kind, end.returncode, end.killed) == (EndKind.EXITED, k, 0)
    zombies = [c for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    assert not zombies


def test_without_pidfd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "_USE_PIDFD", False)
    assert run(tmp_path, ["/bin/sh", "-c", "exit 3"]).returncode == 3
    end = run(tmp_path, ["sleep", "30"], name="b", timeout=0.3, grace=5.0)
    assert (end.kind, end.signal) == (EndKind.TIMEOUT, "SIGTERM")
    attempt = Attempt.launch(make_spec(tmp_path, ["sleep", "60"], name="c"))
    thread = cancel_later(attempt, 0.2, hard=True)
    assert attempt.wait().kind is EndKind.CANCELLED
    thread.join()


# -- helpers for the supervisor --------------------------------------------------------------------
def test_become_subreaper_is_idempotent() -> None:
    assert become_subreaper() is become_subreaper()


def test_kill_tree(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    script = f"sleep 300 & echo $! >> {pidfile}; sleep 300 & echo $! >> {pidfile}; wait"
    popen = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 30
    while len(pidfile.read_text().split() if pidfile.exists() else []) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert kill_tree([popen.pid], grace=0.5) == 3
    popen.wait()
    for pid in [popen.pid, *map(int, pidfile.read_text().split())]:
        assert_gone(pid)
    assert kill_tree([popen.pid], grace=0.5) == 0  # already gone: no error


@linux_only
def test_sweep_orphans_by_token_prefix(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    env = {**os.environ, tree.TOKEN_VAR: "sweep-123"}
    argv = [PY, ESCAPE, str(pidfile), "daemon", "exit"]
    subprocess.run(argv, env=env, check=True, start_new_session=True, capture_output=True)
    pid = read_pid(pidfile)
    assert sweep_orphans("other-") == 0
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    assert sweep_orphans("sweep-", grace=0.5) == 1
    assert_gone(pid)


def test_signal_names_are_reported_for_unknown_signals(tmp_path: Path) -> None:
    end = run(tmp_path, [PY, "-c", f"import os; os.kill(os.getpid(), {int(signal.SIGUSR1)})"])
    assert end.signal == "SIGUSR1" and end.kind is EndKind.SIGNALED
