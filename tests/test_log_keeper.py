"""The log keeper (issue 28.6): what a task prints after its supervisor died reaches its log.

In-process: a LogPump whose thread is never started stands for a supervisor that reads nothing
any more; "dying" is closing its socket to the keeper without a goodbye and its pipe ends.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from gpuswarm.core.logs import LogPump, LogSink
from gpuswarm.exec.local.keeper import RUN_VAR, LogKeeper
from gpuswarm.exec.local.tree import candidates, sweep_orphans


def _open_log(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)


def _die(keeper: LogKeeper, sink: LogSink) -> None:
    """What a SIGKILL does to the supervisor's side: every fd of it closed, no goodbye."""
    sock = keeper._sock
    assert sock is not None
    sock.close()
    for fd in (sink.read_fd, sink.write_fd, sink.log_fd):
        os.close(fd)


def _holding(pid: int, log: Path) -> None:
    """Wait until the keeper has taken the log (it is up, its SIGTERM handler set)."""
    deadline = time.monotonic() + 20
    while str(log) not in {f.path for f in psutil.Process(pid).open_files()}:
        assert time.monotonic() < deadline, "the keeper never took the log"
        time.sleep(0.01)


def _exited(keeper: LogKeeper) -> None:
    proc = keeper._proc
    assert proc is not None
    assert proc.wait(10) == 0  # our child: reaped here


@pytest.mark.timeout(60)
def test_a_dead_supervisors_keeper_moves_the_pipe_into_the_log(tmp_path: Path) -> None:
    keeper = LogKeeper(str(tmp_path), "me:1:1")
    pump = LogPump(keeper)  # never started: nobody in this process reads the pipe
    log = tmp_path / "output.log"
    sink = pump.add(_open_log(log), 1 << 20)
    pid = keeper.pid
    assert pid is not None and psutil.Process(pid).environ()[RUN_VAR] == str(tmp_path)
    assert not [p for p, _ in candidates(None).alive if p == pid]  # never an escapee
    assert sweep_orphans() == 0 and psutil.Process(pid).is_running()
    writer = os.dup(sink.write_fd)  # the task's stdout: it outlives the supervisor
    os.write(writer, b"before\n")
    _die(keeper, sink)
    os.write(writer, b"speedup: 1.5\n")  # printed while no supervisor reads
    assert psutil.Process(pid).is_running()  # a writer still holds the pipe: it keeps pumping
    os.close(writer)  # the task exits
    _exited(keeper)
    assert log.read_text() == "before\nspeedup: 1.5\n"


@pytest.mark.timeout(60)
def test_the_keeper_holds_the_cap_and_stops_on_sigterm(tmp_path: Path) -> None:
    keeper = LogKeeper(str(tmp_path), "me:1:1")
    pump = LogPump(keeper)
    log = tmp_path / "output.log"
    sink = pump.add(_open_log(log), 4096)
    writer = os.dup(sink.write_fd)
    _die(keeper, sink)
    os.write(writer, b"x" * 20000 + b"\nlast line\n")
    pid = keeper.pid
    assert pid is not None
    _holding(pid, log)
    psutil.Process(pid).send_signal(signal.SIGTERM)  # a reclaimer: move what is there, stop
    _exited(keeper)
    text = log.read_text()
    assert len(text) <= 4096 and "bytes of output dropped" in text and "last line" in text
    os.close(writer)


@pytest.mark.timeout(60)
def test_a_goodbye_ends_the_keeper_without_pumping(tmp_path: Path) -> None:
    keeper = LogKeeper(str(tmp_path), "me:1:1")
    pump = LogPump(keeper)
    pump.start()
    log = tmp_path / "output.log"
    sink = pump.add(_open_log(log), 1 << 20)
    os.write(sink.write_fd, b"hello\n")
    pump.finish(sink)  # the supervisor's pump wrote it; the keeper let it go
    pump.stop()
    proc = keeper._proc
    keeper.close()
    assert proc is not None and proc.returncode is not None  # ended and reaped
    assert not psutil.pid_exists(proc.pid)
    assert log.read_text() == "hello\n"


@pytest.mark.timeout(60)
def test_a_goodbye_during_the_keepers_start_up_waits_for_no_interpreter(tmp_path: Path) -> None:
    """issue 31: the end of a short run no longer waits for the keeper to finish starting up
    (it is killed once the goodbye is queued); what the supervisor's pump wrote stays, and no
    process is left."""
    keeper = LogKeeper(str(tmp_path), "me:1:1")
    pump = LogPump(keeper)
    pump.start()
    log = tmp_path / "output.log"
    sink = pump.add(_open_log(log), 1 << 20)  # starts the keeper: it is importing now
    os.write(sink.write_fd, b"short\n")
    os.close(sink.write_fd)
    pump.finish(sink)
    pump.stop()
    proc = keeper._proc
    assert proc is not None and proc.poll() is None  # still starting
    keeper.close()
    assert proc.returncode == -signal.SIGKILL  # not waited for: the goodbye was queued
    assert not psutil.pid_exists(proc.pid)
    assert log.read_text() == "short\n"


@pytest.mark.timeout(60)
def test_a_keeper_without_a_goodbye_gets_its_time(tmp_path: Path) -> None:
    """A socket that broke (no goodbye could be queued) leaves the keeper to pump: close()
    waits for it rather than killing it."""
    keeper = LogKeeper(str(tmp_path), "me:1:1")
    pump = LogPump(keeper)
    log = tmp_path / "output.log"
    sink = pump.add(_open_log(log), 1 << 20)
    proc = keeper._proc
    assert proc is not None
    _holding(proc.pid, log)
    os.write(sink.write_fd, b"kept\n")
    for fd in (sink.write_fd,):
        os.close(fd)
    sock = keeper._sock
    assert sock is not None
    sock.close()  # the socket breaks: the next send fails, no goodbye
    keeper.close()
    assert proc.returncode == 0  # it pumped and exited by itself
    assert log.read_text() == "kept\n"
