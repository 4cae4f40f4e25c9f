"""``repeats: k`` (issue 34): each task of an entry runs k independent times.

Repeat ``j`` of a task named ``N`` is the task ``N-r<j>`` (so its own id, workspace, attempts
and resume), with ``{repeat}`` = ``j`` among its placeholders; its spec names the task it
repeats (``repeat_of``: the id ``N`` would have) and ``j``, which the outputs group by
(:mod:`gpuswarm.outputs.passk`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from gpuswarm.config.instances import Instance

REPEAT = "repeat"  # the placeholder


def repeated(instances: Iterable[Instance], k: int | None) -> Iterator[Instance]:
    """Each instance ``k`` times (None: once, as it is)."""
    for inst in instances:
        if k is None:
            yield inst
            continue
        for j in range(1, k + 1):
            yield dataclasses.replace(
                inst,
                name=f"{inst.name}-r{j}",
                vars={**inst.vars, REPEAT: str(j)},
                label=f"{inst.label} repeat {j}",
            )


def repeat_fields(inst: Instance, id_for: Callable[[str], str]) -> dict[str, object]:
    """The spec fields of a repeat: the task it repeats (``id_for`` of its name) and which
    repeat it is."""
    j = int(inst.vars[REPEAT])
    return {"repeat_of": id_for(inst.name.removesuffix(f"-r{j}")), "repeat": j}
