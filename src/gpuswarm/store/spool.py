"""A streamed enqueue: a big new run's first tasks start while the rest is still written.

:func:`gpuswarm.store.runs.create_run` (``stream_after=K``) stages the first K descriptors in
pending/ and every other task in ``.parallel/enqueue.spool``, syncs once and renames the run
into place. Two layouts, told apart by the first line: ``gpuswarm-spool 1``, one line per task
(``<name>\\t<descriptor JSON>``); ``gpuswarm-spool 2``, a command list's (one template,
:class:`~gpuswarm.store.staging.Templated`): its template's pieces once, then lines of up to
:data:`ROWS_PER_LINE` rows ``[id, name, command, seq]``, each descriptor the template filled with
its row (the same bytes: a tenth of the spool to write and sync). From then on every task is
durable, the spool holding those not yet in pending/. A supervisor of the run (``run``,
``resume``, ``work``; one at a time, by a ``flock`` on the spool) moves them into pending/ in
chunks (:class:`Streamer`, a thread): each descriptor as a temp file renamed into place, so a
claim never meets a half-written one, and handed to the supervisor's own claim heap. Once every one
is there it syncs the run, journals ``enqueued`` and removes the spool (then the supervisor may
end: it never ends while the spool is there).

A crash anywhere leaves the spool: the next supervisor writes each of its tasks whose id no
queue folder holds (listed twice, so a task moving between folders meanwhile is seen), so no
task is lost or written twice. Readers count the spool's tasks as pending
(:func:`spooled_ids`): the run's size is known from its creation on.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from gpuswarm.core import faults
from gpuswarm.core.errors import QueueError
from gpuswarm.core.events import Ev
from gpuswarm.core.fsutil import COMPACT, fsync_dir, sync_tree
from gpuswarm.core.jsontemplate import JsonTemplate
from gpuswarm.core.paths import STATES, RunPaths
from gpuswarm.store.created import Created
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.names import corrupt_task_id, descriptor_name, task_id_of
from gpuswarm.store.staging import Templated, filled

HEADER = b"gpuswarm-spool 1\n"
HEADER_ROWS = b"gpuswarm-spool 2\n"  # a template and its rows (write_rows_spool)
ROWS_PER_LINE = 4096
CHUNK = 256  # descriptors per chunk: handed to the claim heap together
RETRY_LOCK_SECONDS = 1.0  # another live supervisor streams: look again this often


def write_spool(paths: RunPaths, entries: Iterable[tuple[str, bytes]]) -> int:
    """Write ``(descriptor name, descriptor bytes)`` lines into a staged run's spool (no fsync:
    the run is synced once before it is made visible); how many."""
    count = 0
    with open(paths.enqueue_spool, "wb", buffering=1 << 20) as fh:
        fh.write(HEADER)
        for name, blob in entries:
            fh.write(name.encode() + b"\t" + blob.rstrip(b"\n") + b"\n")
            count += 1
    return count


def write_rows_spool(
    paths: RunPaths, tasks: Templated, start: int, created: Created | None = None
) -> int:
    """Write the tasks of ``tasks`` from seq ``start`` on into a staged run's spool in the
    second layout (no fsync, as :func:`write_spool`); how many. ``created`` remembers them."""
    rows = tasks.rows
    if start >= len(rows):
        return 0
    pieces, holes = tasks.template.parts()
    head = {"priority": tasks.priority, "pieces": pieces, "holes": holes}
    with open(paths.enqueue_spool, "wb", buffering=1 << 20) as fh:
        fh.write(HEADER_ROWS)
        fh.write(COMPACT.encode(head).encode() + b"\n")
        for first in range(start, len(rows), ROWS_PER_LINE):
            chunk = rows[first : first + ROWS_PER_LINE]
            line = [[*row, seq] for seq, row in enumerate(chunk, first)]
            fh.write(COMPACT.encode(line).encode() + b"\n")
    if created is not None:
        one = filled(tasks.template, rows[start], start)
        priority, rest = tasks.priority, rows[start:]
        names = [descriptor_name(priority, seq, row[0]) for seq, row in enumerate(rest, start)]
        created.spooled_rows(start, names, [row[1] for row in rest], one)
    return len(rows) - start


def _entries(fh: Iterable[bytes], blobs: bool = True) -> Iterator[tuple[str, bytes]]:
    """``(descriptor name, bytes)`` of each spooled task (``blobs`` False: b"" for the bytes of
    the second layout's, which are never built)."""
    lines = iter(fh)
    first = next(lines, b"")
    if first == HEADER_ROWS:
        yield from _row_entries(fh, lines, blobs)
        return
    for line in itertools.chain((first,), lines):
        if line == HEADER or not line.endswith(b"\n"):
            continue  # the header; a line a crash cut short was never synced: never visible
        name, _, blob = line.partition(b"\t")
        yield name.decode(), blob


def _row_entries(
    fh: Iterable[bytes], lines: Iterator[bytes], blobs: bool
) -> Iterator[tuple[str, bytes]]:
    where = getattr(fh, "name", "the spool")
    try:
        head = json.loads(next(lines))
        template = JsonTemplate.of_parts(head["pieces"], head["holes"], COMPACT.encode)
        priority = int(head["priority"])
        for line in lines:
            if not line.endswith(b"\n"):
                continue  # cut short by a crash: never synced, never visible
            for task_id, name, command, seq in json.loads(line):
                blob = filled(template, (task_id, name, command), seq) if blobs else b""
                yield descriptor_name(priority, seq, task_id), blob
    except (StopIteration, ValueError, KeyError, TypeError) as exc:
        raise QueueError(
            f"{where}: a streamed enqueue's spool is damaged ({type(exc).__name__}: {exc}); "
            "its tasks not yet in pending/ cannot be read: re-add them (gpuswarm add)"
        ) from None


def spooled_ids(paths: RunPaths) -> list[str]:
    """The ids of the spool's tasks that no queue folder holds yet (counted as pending)."""
    try:
        fh = open(paths.enqueue_spool, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return []
    with fh:
        ids = [task_id_of(name) for name, _ in _entries(fh, blobs=False)]
    if not ids:
        return []
    known = present_ids(paths)
    return [i for i in ids if i not in known]


def spooled_blobs(paths: RunPaths) -> Iterator[tuple[str, bytes]]:
    """``(name, descriptor bytes)`` of the spool's tasks that no queue folder holds yet."""
    try:
        fh = open(paths.enqueue_spool, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return
    with fh:
        known = present_ids(paths)
        for name, blob in _entries(fh):
            if task_id_of(name) not in known:
                yield name, blob


def present_ids(paths: RunPaths) -> set[str]:
    """Every task id a queue folder holds (corrupt/ too), listed twice: a task that moved
    between two folders during one listing is seen by the other."""
    ids: set[str] = set()
    for _ in range(2):
        for state in STATES:
            try:
                names = os.listdir(paths.state_dir(state))
            except FileNotFoundError:
                continue
            ids.update(task_id_of(n) for n in names if not n.startswith("."))
        try:
            names = os.listdir(paths.corrupt)
        except FileNotFoundError:
            names = []
        ids.update(i for n in names if (i := corrupt_task_id(n)) is not None)
    return ids


class Streamer:
    """The thread that moves a run's spooled tasks into pending/ (one per supervisor)."""

    def __init__(
        self,
        paths: RunPaths,
        push: Callable[[str], None],
        ledger: Ledger,
        on_error: Callable[[BaseException], None] | None = None,
        created: Created | None = None,
    ) -> None:
        self.paths = paths
        self._created = created  # the run this process created: what it writes is remembered
        self._on_error = on_error
        self._push = push
        self._ledger = ledger
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuswarm-enqueue", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> Streamer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop between two descriptors (the spool keeps the rest) and wait for the thread."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if (
                    stream(self.paths, self._push, self._ledger, self._stop, self._created)
                    is not None
                ):
                    return
                self._stop.wait(RETRY_LOCK_SECONDS)  # another supervisor streams: it may die
        except Exception as exc:  # the spool keeps the rest: the next supervisor writes them
            self.error = exc
            if self._on_error is not None:
                self._on_error(exc)


@contextmanager
def streamed(
    paths: RunPaths,
    push: Callable[[str], None],
    ledger: Ledger,
    stop_run: Callable[[], None],
    created: Created | None = None,
) -> Iterator[None]:
    """While the block runs (a supervisor's loop), the run's spool is moved into pending/ and
    each name handed to ``push`` (its claim heap); stopped when the block ends first (a stop:
    the spool keeps the rest, for the next supervisor). A failure to write calls ``stop_run``
    (resume goes on with the spool)."""
    if not paths.enqueue_spool.exists():
        yield
        return
    streamer = Streamer(paths, push, ledger, on_error=lambda _: stop_run(), created=created)
    streamer.start()
    try:
        yield
    finally:
        streamer.stop()


def stream(
    paths: RunPaths,
    push: Callable[[str], None],
    ledger: Ledger,
    stop: threading.Event | None = None,
    created: Created | None = None,
) -> int | None:
    """Move the spool's tasks into pending/ (``push`` each name once it is there); how many it
    wrote, 0 when there is no spool, None when another live process streams this run (or a
    stop came first: the spool stays)."""
    try:
        fd = os.open(paths.enqueue_spool, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    with os.fdopen(fd, "rb") as fh:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        if os.fstat(fd).st_nlink == 0:
            return 0  # its holder finished and removed it between our open and our lock
        written = _write_all(paths, _entries(fh), push, stop, created)
        if written is None:
            return None
        sync_tree(paths.root)  # every descriptor is on disk before the spool goes
        ledger.emit(Ev.ENQUEUED, tasks=written)
        paths.enqueue_spool.unlink()
        fsync_dir(paths.parallel)
        if created is not None:
            created.spool_gone()
    return written


def _write_all(
    paths: RunPaths,
    entries: Iterator[tuple[str, bytes]],
    push: Callable[[str], None],
    stop: threading.Event | None,
    created: Created | None,
) -> int | None:
    known = present_ids(paths)
    folder = os.open(paths.state_dir("pending"), os.O_RDONLY | os.O_DIRECTORY)
    written = 0
    try:
        batch: list[str] = []
        for name, blob in entries:
            if task_id_of(name) in known:
                continue
            if stop is not None and stop.is_set():
                return None
            _write_one(folder, name, blob, created)
            batch.append(name)
            written += 1
            if len(batch) >= CHUNK:
                _hand(batch, push)
                faults.point("spool.chunk", done=written)
        _hand(batch, push)
    finally:
        os.close(folder)
    return written


def _hand(batch: list[str], push: Callable[[str], None]) -> None:
    for name in batch:
        push(name)
    batch.clear()


def _write_one(folder: int, name: str, blob: bytes, created: Created | None = None) -> None:
    """Temp file, then rename into pending/: a claim (any supervisor's scan) sees it whole.
    ``created`` remembers the file as written (before the rename: a claim may move it at once)."""
    tmp = f".tmp-{name}.{os.getpid()}.{threading.get_native_id()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(tmp, flags, 0o644, dir_fd=folder)
    try:
        os.write(fd, blob)
        if created is not None:
            created.moved_in(name, fd)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
