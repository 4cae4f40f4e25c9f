"""Task dependencies and groups at load time (issue 35): ``after:``, ``after_any:``,
``after_failed:`` references resolved to task ids, unknown ones and cycles refused (exit 2,
naming the field and the cycle), and the group of every glob or matrix entry.

A reference is a task id, a task name, or ``group:NAME`` (every task of that group); a task
with ``repeats: k`` named by its own name or id means each of its k repeats. In a glob or
matrix entry it is a template of the instance's own values, so one line makes each instance
depend on its own counterpart: ``after: "agent-{task_rel}"`` (the validator of a folder after
the agent of the same folder). The rendered text is matched against the ids first, then the
names, then the id its name would give (``agent/{task_rel}`` names -> ``agent-...`` ids).

The keys (a task's, or ``defaults:``): ``after``, ``after_any``, ``after_failed`` (one, or a
list) it waits for: their end done / in any state / a failure (none failed: it ends skipped).
An ``after`` prerequisite that does not succeed ends it ``dependency_failed``. Unknown
references, a task after itself and cycles are exit 2. ``group``: the group it is counted,
capped and acted on in (``status``/``cancel``/``retry``/``pause --group``); a glob or matrix
entry's default is its name before the first placeholder (else ``tasks-<index>``). Top level
``groups: {NAME: {max_parallel: N, priority: P}}``: at most N of its tasks run at once; P is its
tasks' default priority.

A group's name is shown and written everywhere (status, report.html, the dashboard, /metrics'
labels) and matched by name (``groups:``, ``group:NAME``, ``--group``), so it is never redacted:
a ``group:`` or ``groups:`` key that holds a secret (a secret variable's value, of this process
or of the task's env, or a token's shape) is exit 2; an entry's default group is made from its
name with the secrets taken out, as the tasks' names are.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from gpuswarm.config.depfields import GroupConfig
from gpuswarm.config.models import TaskEntry, TaskOptions, TaskSpec
from gpuswarm.config.yamlload import Locator, PathKey, format_path, quote
from gpuswarm.core.paths import slugify
from gpuswarm.core.placeholders import find_placeholders, render, unknown_placeholders
from gpuswarm.core.redact import Redactor, name_redactor

DEP_FIELDS = ("after", "after_any", "after_failed")
GROUP_PREFIX = "group:"


def check_ref_templates(
    opts: TaskOptions, var_names: set[str], loc: Locator, origin: Mapping[str, PathKey]
) -> None:
    """Refuse a ``{placeholder}`` in a reference that this entry's instances do not have."""
    for key in DEP_FIELDS:
        for n, ref in enumerate(getattr(opts, key)):
            bad = unknown_placeholders(ref, var_names)
            if bad:
                names = ", ".join("{" + k + "}" for k in sorted(var_names)) or "none"
                raise loc.error(
                    (*origin[key], n),
                    f"unknown placeholder {{{bad[0]}}} in {key}; a reference may use this "
                    f"entry's values ({names}); write {{{{ and }}}} for literal braces",
                )


class Refs(TypedDict):
    """A task's references by field (a TaskSpec's ``after``, ``after_any``, ``after_failed``)."""

    after: list[str]
    after_any: list[str]
    after_failed: list[str]


def rendered_refs(opts: TaskOptions, values: Mapping[str, str]) -> Refs:
    """The references of one instance, its values filled in (resolved later, to ids)."""

    def of(refs: list[str]) -> list[str]:
        return [render(r, dict(values)) if find_placeholders(r) else r for r in refs]

    return Refs(
        after=of(opts.after), after_any=of(opts.after_any), after_failed=of(opts.after_failed)
    )


def with_entry_group(
    opts: TaskOptions,
    entry: TaskEntry,
    index: int,
    loc: Locator,
    path: PathKey,
    groups: Collection[str] = (),
    names: Redactor | None = None,
) -> TaskOptions:
    """``opts`` with the entry's default group (:func:`entry_group`) when it names none; a
    group name (the entry's, or a ``groups:`` key, checked with the first entry) holding a
    secret (``names``: the entry's name redactor) is a ConfigError at its field."""
    if opts.group is None and entry.glob is None and entry.matrix is None and index:
        return opts
    names = names if names is not None else name_redactor(opts.env)
    where = [((*path, "group"), opts.group)] + [(("groups",), k) for k in groups if not index]
    for at, name in where:
        if name is not None and names.name(name) != name:
            raise loc.error(
                at,
                f"group {quote(names.name(name))} holds a secret (the value of a secret "
                "variable, or a token's shape): group names are shown and written everywhere; "
                "name the group without it",
            )
    group = entry_group(entry, index, names) if opts.group is None else None
    return opts if group is None else opts.model_copy(update={"group": group})


def entry_group(entry: TaskEntry, index: int, names: Redactor | None = None) -> str | None:
    """A glob or matrix entry is a group by default, named after the entry: its name's text
    before the first placeholder (``agent/{task_rel}`` -> ``agent``), else ``tasks-<index>``;
    secrets in it (``names``) are taken out first."""
    if entry.glob is None and entry.matrix is None:
        return None
    text = entry.name or ""
    head = text.split("{", 1)[0]
    name = slugify(names.name(head) if names is not None else head).strip("._-")
    return name or f"tasks-{index}"


def group_priority(spec: TaskSpec, groups: Mapping[str, GroupConfig], own: bool) -> TaskSpec:
    """A task of a group with a ``priority:`` gets it, unless the task sets its own."""
    if spec.group is None or own:
        return spec
    cfg = groups.get(spec.group)
    if cfg is None or cfg.priority is None:
        return spec
    return spec.model_copy(update={"priority": cfg.priority})


@dataclass
class _Names:
    ids: set[str]
    by_name: dict[str, str]
    groups: dict[str, list[str]]
    known: Collection[str] = field(default_factory=frozenset)
    repeats: dict[str, list[str]] = field(default_factory=dict)  # issue 34: N -> N-r1..N-rk

    def resolve(self, ref: str) -> list[str] | None:
        if ref.startswith(GROUP_PREFIX):
            return self.groups.get(ref[len(GROUP_PREFIX) :])
        for found in (ref if ref in self.ids else None, self.by_name.get(ref)):
            if found is not None:
                return [found]
        slug = slugify(ref).lstrip("._-")
        if slug in self.ids:
            return [slug]
        if (ref if ref in self.repeats else slug) in self.repeats:  # every repeat of it
            return self.repeats[ref if ref in self.repeats else slug]
        if ref in self.known:
            return [ref]
        return [slug] if slug in self.known else None


def resolve(
    specs: list[TaskSpec],
    where: Mapping[str, PathKey],
    loc: Locator,
    *,
    known: Collection[str] = frozenset(),
) -> list[TaskSpec]:
    """Every reference of ``specs`` made a task id (of ``specs``, or of ``known``: the tasks a
    run already has, for ``gpuswarm add``); an unknown reference, a task after itself and a
    cycle are refused, located at the entry (``where``: task id -> its entry's path)."""
    if not any(s.after or s.after_any or s.after_failed for s in specs):
        return specs
    groups: dict[str, list[str]] = {}
    for s in specs:
        if s.group is not None:
            groups.setdefault(s.group, []).append(s.id)
    repeats: dict[str, list[str]] = {}
    for s in specs:
        if s.repeat_of is not None:
            repeats.setdefault(s.repeat_of, []).append(s.id)
    names = _Names({s.id for s in specs}, {s.name: s.id for s in specs}, groups, known, repeats)
    out: list[TaskSpec] = []
    for spec in specs:
        update: dict[str, list[str]] = {}
        for key in DEP_FIELDS:
            ids: list[str] = []
            for ref in getattr(spec, key):
                found = names.resolve(ref)
                if found is None:
                    raise loc.error(
                        (*where[spec.id], key),
                        f"task {quote(spec.id)}: {key} names {quote(ref)}, which is no task "
                        "id, task name or group:NAME of this run; fix the reference",
                    )
                ids += [t for t in found if t != spec.id or not ref.startswith(GROUP_PREFIX)]
            if spec.id in ids:
                raise loc.error(
                    (*where[spec.id], key),
                    f"task {quote(spec.id)} is {key} itself; remove it from {key}",
                )
            update[key] = list(dict.fromkeys(ids))
        out.append(spec.model_copy(update=update) if update else spec)
    cycle = find_cycle({s.id: [*s.after, *s.after_any, *s.after_failed] for s in out})
    if cycle is not None:
        path = where[cycle[0]]
        raise loc.error(
            path,
            f"the dependencies form a cycle: {' -> '.join(cycle)} (at {format_path(path)}); "
            "nothing in it could ever start: remove one of its after: references",
        )
    return out


def find_cycle(edges: Mapping[str, list[str]]) -> list[str] | None:
    """One cycle of the graph task -> prerequisites (``[a, b, a]``: a after b after a), or
    None. Iterative (a chain of 100,000 tasks is no recursion)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for start in edges:
        if state.get(start):
            continue
        path: list[str] = []
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(edges.get(start, ())))]
        state[start] = 1
        path.append(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            seen = state.get(child)
            if seen == 1:
                return [*path[path.index(child) :], child]
            if seen is None and child in edges:
                state[child] = 1
                path.append(child)
                stack.append((child, iter(edges[child])))
    return None
