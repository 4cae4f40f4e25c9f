"""The rows of a command list's tasks that nobody changed since this process created them
(issue 31): a 100,000-task run's warm stop writes its outputs without reading 95,000 untouched
descriptors. Which files are unchanged is :class:`gpuswarm.store.created.Created`'s (one stat
each); their row is the shared one (one created descriptor's, parsed once) with the task's id,
name, seq and state, the same row :func:`gpuswarm.outputs.results.row_for` makes of the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gpuswarm.core.models import Descriptor, RecordError, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import env_secret_values
from gpuswarm.outputs.rowtypes import Row, unattempted_row
from gpuswarm.outputs.taskrow import TaskRow
from gpuswarm.store.created import Created
from gpuswarm.store.names import seq_of, task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.spool import present_ids


class CreatedRows:
    """Rows of ``queue``'s created, unchanged descriptors; :meth:`of` is None when it has none."""

    def __init__(self, created: Created, shared: Row, secrets: set[str]) -> None:
        self._created = created
        self._shared = shared
        self._secrets = secrets  # the shared env's secret values
        self.used = False  # a row came from here: its secrets join the run's redaction

    @classmethod
    def of(cls, queue: DirQueue) -> CreatedRows | None:
        created = queue.created
        if created is None or not len(created) or created.shared is None:
            return None
        try:
            desc = Descriptor.parse(created.shared)
        except RecordError:
            return None
        if desc.attempt_count:  # never: it is a new descriptor's bytes
            return None
        return cls(created, unattempted_row(State.PENDING, desc), env_secret_values(desc.env))

    def secrets(self) -> set[str]:
        return self._secrets if self.used else set()

    @contextmanager
    def in_folder(self, queue: DirQueue, state: State) -> Iterator[Callable[[str], Row | None]]:
        """A reader of ``state``'s rows by file name (None: that file must be read)."""
        try:
            folder = os.open(queue.paths.state_dir(state.value), os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # a folder of a newer version, not there: every file is read
            yield lambda _: None
            return

        value = state.value

        def row(name: str) -> Row | None:
            task_name = self._created.name_if_unchanged(name, folder)
            return None if task_name is None else self._like(value, name, task_name)

        try:
            yield row
        finally:
            os.close(folder)

    def spooled(self, paths: RunPaths) -> list[Row] | None:
        """The rows of the spool's tasks that no queue folder holds yet (as
        :func:`~gpuswarm.store.spool.spooled_blobs` finds them, without reading the spool);
        None when not every line of it was remembered."""
        names = self._created.spool_names()
        if names is None:
            return None
        if not names or not paths.enqueue_spool.exists():
            return []
        present = present_ids(paths)
        pending = State.PENDING.value
        files = self._created.spooled_name
        return [
            self._like(pending, name, files(name) or "")
            for name in names
            if task_id_of(name) not in present
        ]

    def _like(self, state: str, name: str, task_name: str) -> Row:
        """The shared row as ``name``'s (a created descriptor's name: no lease part)."""
        self.used = True
        shared = self._shared
        values = shared.values
        return Row(
            values=TaskRow(
                task=task_id_of(name),
                name=task_name,
                state=state,
                reason=values.reason,
                last=values.last,
            ),
            metrics=shared.metrics,
            result=shared.result,
            inputs=shared.inputs,
            seq=seq_of(name),
            spend=shared.spend,
            repeat=shared.repeat,
        )
