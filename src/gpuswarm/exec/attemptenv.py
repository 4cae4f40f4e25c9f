"""An attempt's environment: its slot's, the task's, its GPUs' and its identity, made per task
from a part made once per slot.

Everything but four variables (the task's id, name, workspace, attempt number) and ``PWD`` is
the same for every attempt on a slot, yet is ~50 variables to copy, filter (a direct line runs
with the variables ``/bin/sh`` would pass on) and compare with the supervisor's (``own_env``).
:func:`attempt_env` keeps that part per slot, keyed by the slot with its devices, its GPUs,
the run, the owner and the folder, and valid while the slot's and the supervisor's environments
compare equal to the ones it was made from (one C-level dict comparison: a changed environment
is never missed); it fills in the rest. The result is the long way's (:func:`env_long`) in
content and order, ``own_env`` too: a test compares both over generated environments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gpuswarm.config.direct import shell_env, shell_pwd
from gpuswarm.placement.gpus import Slot, isolation_env

# the variables of one attempt that its slot's others do not share, in the order they are set
PER_TASK = ("GPUSWARM_TASK_ID", "GPUSWARM_TASK_NAME", "GPUSWARM_TASK_WORKSPACE", "GPUSWARM_ATTEMPT")
_MAX = 64  # kept parts (a slot each, a few per slot where tasks take different GPUs)


@dataclasses.dataclass(frozen=True)
class Identity:
    """What an attempt's environment says of it and of its run."""

    run_dir: str
    task_id: str
    name: str
    workspace: str
    attempt: str
    owner: str
    task_dir: str | None  # the task's ``task_dir`` var, when it has one


@dataclasses.dataclass(frozen=True)
class EnvOf:
    """What an attempt's environment is made of."""

    base: Mapping[str, str]  # the slot's (the supervisor's with the slot's HOME over it)
    task_env: Mapping[str, str]  # the task's own variables, rendered
    slot: Slot
    gpu_ids: tuple[int, ...]
    ident: Identity
    shell_cwd: str | None  # the attempt's folder when it runs a direct line (sh's env)
    inherited: Mapping[str, str]  # the supervisor's: what ``own_env`` is told apart from


def env_long(of: EnvOf) -> tuple[dict[str, str], frozenset[str]]:
    """The environment made from scratch, and the names in it set or changed over
    ``of.inherited``."""
    ident, slot = of.ident, of.slot
    env = dict(of.base)
    env.update(of.task_env)
    env.update(isolation_env(slot, of.gpu_ids))
    env.update(
        GPUSWARM_RUN_DIR=ident.run_dir,
        GPUSWARM_TASK_ID=ident.task_id,
        GPUSWARM_TASK_NAME=ident.name,
        GPUSWARM_TASK_WORKSPACE=ident.workspace,
        GPUSWARM_ATTEMPT=ident.attempt,
        GPUSWARM_OWNER=ident.owner,
        GPUSWARM_SLOT_ID=slot.label,  # unique in the run: <host>-gpu3, <host>-gpu3.1
    )
    if ident.task_dir is not None:
        env["GPUSWARM_TASK_DIR"] = ident.task_dir
    if of.shell_cwd is not None:  # run direct: the env /bin/sh passes on
        env = shell_env(env, of.shell_cwd)
    return env, frozenset(k for k, _ in env.items() - of.inherited.items())  # set or changed


@dataclasses.dataclass(frozen=True)
class _Part:
    base: dict[str, str]  # copies, compared with the caller's on each use
    inherited: dict[str, str]
    env: dict[str, str]  # the slot's part, each per-task variable at its place
    own: frozenset[str]  # names of ``env`` set or changed, the per-task ones left out


_parts: dict[tuple[object, ...], _Part] = {}


def attempt_env(of: EnvOf) -> tuple[dict[str, str], frozenset[str]]:
    """:func:`env_long`'s result, from the slot's kept part where it can be."""
    ident, base, inherited = of.ident, of.base, of.inherited
    if of.task_env or ident.task_dir is not None:  # the task's own variables: the long way
        return env_long(of)
    key = (of.slot, of.slot.devices, of.gpu_ids, ident.run_dir, ident.owner, of.shell_cwd)
    part = _parts.get(key)
    if part is None or part.base != base or part.inherited != inherited:
        part = _part(of)
        if len(_parts) >= _MAX:
            _parts.clear()
        _parts[key] = part
    env = part.env.copy()
    own = set(part.own)
    values = (ident.task_id, ident.name, ident.workspace, ident.attempt)
    for name, value in zip(PER_TASK, values, strict=True):
        env[name] = value
        if inherited.get(name) != value:
            own.add(name)
    if of.shell_cwd is not None:
        pwd = env["PWD"] = shell_pwd(base.get("PWD"), of.shell_cwd)
        if inherited.get("PWD") != pwd:
            own.add("PWD")
    return env, frozenset(own)


def _part(of: EnvOf) -> _Part:
    """The long way's environment with the per-task variables (and a direct line's PWD) left
    blank at their places, and its own names without them."""
    blank = dataclasses.replace(of.ident, task_id="", name="", workspace="", attempt="")
    env, own = env_long(dataclasses.replace(of, ident=blank))
    leave = {*PER_TASK, "PWD"} if of.shell_cwd is not None else set(PER_TASK)
    return _Part(dict(of.base), dict(of.inherited), env, own - leave)
