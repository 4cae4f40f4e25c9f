"""Files a task controls (issue 12 items 1-4): readers that never block, never follow a planted
symlink and never read without a limit; completion files that cannot crash the committer; the
log pump that holds the cap while the task writes; records read back from disk."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuswarm.core.logs import LogPump, cap_log, detect_oom, log_tail
from gpuswarm.core.metrics import ResultFileError, load_result_file, parse_metrics, read_completion
from gpuswarm.core.records import descriptor_problem, parse_descriptor
from gpuswarm.core.taskfiles import UnsafeFile, read_limited, read_tail
from gpuswarm.store.ledger import bad_event_lines, read_events, tail_events


def _in_thread(fn: object, timeout: float = 10.0) -> None:
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it does not return."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "it blocked"
    if errors:
        raise errors[0]


def test_fifo_as_completion_file_or_log_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "result.json"
    os.mkfifo(fifo)

    def completion() -> None:
        with pytest.raises(ResultFileError, match="FIFO"):
            read_completion(tmp_path, "result.json")

    _in_thread(completion)
    _in_thread(lambda: (log_tail(fifo), detect_oom(fifo), parse_metrics(fifo, {"x": "x=(1)"})))
    _in_thread(lambda: cap_log(fifo, 10))
    assert read_tail(fifo, 100) == (b"", False)


def test_symlinks_a_task_plants_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"o" * 4000)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "output.log").symlink_to(outside)
    assert cap_log(ws / "output.log", 100) == 0  # the outside file is not truncated
    assert outside.stat().st_size == 4000
    assert log_tail(ws / "output.log") == ""
    with pytest.raises(UnsafeFile, match="symlink"):
        read_limited(ws / "output.log", 10_000)


@pytest.mark.parametrize(
    ("rel", "target"),
    [
        ("r.yaml", "secret"),  # a symlink to a file outside the workspace
        ("r.json", "/dev/zero"),
        ("r.json", "/etc/os-release"),
        ("../secret", None),  # a placeholder value that climbs out
        ("/etc/os-release", None),  # one that makes the path absolute
        ("a\0b", None),  # one that holds a NUL byte
    ],
)
def test_completion_file_must_stay_inside_the_workspace(
    tmp_path: Path, rel: str, target: str | None
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("token: SECRET\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    if target is not None:
        (ws / rel).symlink_to(secret if target == "secret" else target)
    with pytest.raises(ResultFileError) as info:
        read_completion(ws, rel)
    assert "SECRET" not in str(info.value)
    assert "outside the task workspace" in str(info.value) or "NUL" in str(info.value)


def test_a_symlink_inside_the_workspace_is_fine(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text('{"ok": true}')
    (tmp_path / "r.json").symlink_to("real.json")
    assert read_completion(tmp_path, "r.json") == {"ok": True}


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("r.yaml", "&a [*a]\n", "contains itself"),
        ("r.yaml", "&a {k: *a}\n", "contains itself"),
        ("r.json", "[" * 20000 + "]" * 20000, "nested"),
        ("r.yaml", "[" * 20000 + "]" * 20000, "nested"),
        ("r.json", '{"a": "\\ud800"}', "does not parse"),
        ("r.yaml", "a: \x00\n", "does not parse"),
        ("r.json", "\xff\xfe", "does not parse"),
    ],
)
def test_poison_completion_files_are_failures_with_a_reason(
    tmp_path: Path, name: str, text: str, why: str
) -> None:
    (tmp_path / name).write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        data = load_result_file(tmp_path / name)
    except ResultFileError as exc:
        assert why in str(exc), exc
    else:  # a lone surrogate may parse: then it is plain data
        assert why == "does not parse" and data is not None


def test_billion_laughs_in_a_completion_file_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (tmp_path / "r.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(ResultFileError, match="more than"):
        load_result_file(tmp_path / "r.yaml")


def test_huge_completion_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_bytes(b"[" + b"1," * (3 << 20) + b"1]")
    with pytest.raises(ResultFileError, match="larger than"):
        load_result_file(tmp_path / "r.json")


def _pump_into(tmp_path: Path, limit: int, chunks: list[bytes]) -> tuple[Path, int]:
    """Write ``chunks`` through a pump into a log capped at ``limit``; the largest size seen."""
    log = tmp_path / "output.log"
    pump = LogPump()
    pump.start()
    sink = pump.add(os.open(log, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), limit)
    peak = 0
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            view = view[os.write(sink.write_fd, view) :]
        peak = max(peak, log.stat().st_size)
    pump.finish(sink)
    pump.stop()
    return log, max(peak, log.stat().st_size)


def test_pump_holds_the_cap_while_the_task_writes(tmp_path: Path) -> None:
    chunk = b"x" * 65535 + b"\n"
    log, peak = _pump_into(tmp_path, 1 << 20, [b"HEAD\n"] + [chunk] * 320 + [b"the end\n"])
    assert peak <= 1 << 20, peak  # 20 MiB written, never more than the cap on disk
    data = log.read_bytes()
    assert data.startswith(b"HEAD\n") and data.endswith(b"the end\n")
    assert b"bytes of output dropped here" in data


def test_pump_keeps_everything_under_the_cap(tmp_path: Path) -> None:
    log, _ = _pump_into(tmp_path, 1 << 20, [b"line %d\n" % i for i in range(1000)])
    assert log.read_bytes() == b"".join(b"line %d\n" % i for i in range(1000))


def test_pump_with_a_cap_smaller_than_its_marker(tmp_path: Path) -> None:
    _, peak = _pump_into(tmp_path, 64, [b"y" * 1000] * 5)
    assert peak <= 200, peak


def test_descriptor_problems_name_the_field() -> None:
    good = {"id": "t", "task": {"name": "t"}, "attempts": [{"n": 1, "duration": 1.5}]}
    assert descriptor_problem(good) is None
    assert descriptor_problem([1]) == "a JSON list, not a descriptor object"
    assert descriptor_problem({**good, "attempts": "x"}) == "attempts is str, not list"
    bad = {**good, "attempts": [{"duration": "slow"}]}
    assert descriptor_problem(bad) == "attempts[0].duration is str, not int or float"
    assert descriptor_problem({**good, "task": {"env": []}}) == "task.env is list, not dict"
    assert parse_descriptor(b"") == (None, "empty file")


def test_journal_readers_skip_lines_that_are_no_events(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"ev": "a"}\n[1]\n"x"\nnull\n{"ev": "b", "seconds": "x"}\n{"ev": "c"}\n')
    assert [e["ev"] for e in read_events(path)] == ["a", "c"]
    assert [e["ev"] for e in tail_events(path)] == ["a", "c"]
    assert [n for n, _ in bad_event_lines(path)] == [2, 3, 4, 5]


def test_durations_are_bounded_but_a_month_is_fine() -> None:
    from gpuswarm.config.values import parse_duration

    assert parse_duration("30d") == 30 * 86400
    assert parse_duration("365d") == 365 * 86400
    for absurd in ("366d", "400d", 1e300, "9999999h"):
        with pytest.raises(ValueError, match="longer than 365 days"):
            parse_duration(absurd)


def test_a_workspace_replaced_by_a_symlink_does_not_move_the_boundary(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "r.json").write_text('{"secret": "SECRET"}')
    ws = tmp_path / "tasks" / "t"
    ws.parent.mkdir()
    ws.symlink_to(elsewhere)  # the task did: rm -rf $WS; ln -s elsewhere $WS
    with pytest.raises(ResultFileError, match="outside the task workspace"):
        read_completion(ws, "r.json")


def test_a_source_file_is_compared_without_following_anything(tmp_path: Path) -> None:
    """Issue 28.2: the completion file is compared with the one the task's source folder
    ships; on the source side no symlink is followed (the folder on the way or the file), a
    FIFO never blocks, and sizes are compared before any byte is read."""
    from gpuswarm.core.taskfiles import open_beneath, same_bytes

    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    (src / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (src / "sub" / "r.yaml").write_text("passed: true\n")
    (elsewhere / "r.yaml").write_text("passed: true\n")
    mine = tmp_path / "mine.yaml"
    mine.write_text("passed: true\n")

    def same(rel: str) -> bool:
        a = os.open(mine, os.O_RDONLY)
        try:
            b = open_beneath(src, rel)
            try:
                return same_bytes(a, b, 1 << 20)
            finally:
                os.close(b)
        finally:
            os.close(a)

    assert same("sub/r.yaml")
    (src / "sub" / "r.yaml").write_text("passed: false\n")
    assert not same("sub/r.yaml")  # same size, other bytes
    (src / "linked").symlink_to(elsewhere)
    (src / "link.yaml").symlink_to(elsewhere / "r.yaml")
    for rel in ("linked/r.yaml", "link.yaml", "../elsewhere/r.yaml", "/etc/passwd", "a\0b"):
        with pytest.raises(UnsafeFile):
            same(rel)
    os.mkfifo(src / "fifo.yaml")

    def fifo() -> None:
        with pytest.raises(UnsafeFile):
            same("fifo.yaml")

    _in_thread(fifo)
    with pytest.raises(FileNotFoundError):
        same("missing.yaml")
    big = os.open(tmp_path / "big", os.O_RDWR | os.O_CREAT)
    os.ftruncate(big, 2 << 20)
    assert not same_bytes(big, big, 1 << 20)  # over the limit: never read, never "the same"
    os.close(big)


def test_a_copied_completion_file_reads_the_same_for_every_task(tmp_path: Path) -> None:
    """The copy's reason names the file by its path in the workspace, not each task's source
    folder, so summary.json groups 63 copies as one reason (was one group per task)."""
    from gpuswarm.exec.plan import check_written

    reasons = []
    for task in ("a", "b"):
        source, workspace = tmp_path / "tasks" / task, tmp_path / "ws" / task
        for folder in (source / "sub", workspace / "sub"):
            folder.mkdir(parents=True)
            (folder / "report.yaml").write_text("passed: true\n")
        with pytest.raises(ResultFileError) as caught:
            check_written(workspace / "sub" / "report.yaml", "sub/report.yaml", [source])
        reasons.append(str(caught.value))
    assert reasons[0] == reasons[1] and "sub/report.yaml" in reasons[0], reasons
    assert "byte-identical" in reasons[0] and str(tmp_path) not in reasons[0]
