"""Proposers: where an autonomous loop's variants come from.

- ``mutate`` (built in, offline): perturbs numeric settings of the editable files (see
  mutate.py for the forms), one or two at a time, never repeating a variant already tried.
- ``agent`` (agent.py): runs a configured command (an LLM coding agent's CLI) in a scratch
  export of BASE with a prompt file; its edits of the editable files become the variant.
"""

from __future__ import annotations

import contextlib
import random
import threading
from dataclasses import dataclass, field
from typing import Protocol

from gpuswarm.core.errors import ResearchError
from gpuswarm.research import gitops, mutate, numeric
from gpuswarm.research.entries import VariantMeta
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths
from gpuswarm.research.journal import ExperimentState
from gpuswarm.research.payloads import Knob


@dataclass(frozen=True)
class Proposal:
    files: dict[str, bytes | None]  # full new contents of changed editable files ...
    description: str
    base: str  # ... made from this BASE
    meta: VariantMeta = field(default_factory=VariantMeta)


class Proposer(Protocol):
    name: str

    def propose(self, state: ExperimentState) -> Proposal | None:
        """A change to BASE's editable files, or None when this proposer has nothing (now)."""


def _base_files(paths: ExpPaths, cfg: ExperimentConfig, base: str) -> dict[str, str]:
    out = {}
    for rel in cfg.edit:
        data = gitops.blob(paths.repo, base, rel)
        if data is not None:
            out[rel] = data.decode("utf-8", errors="surrogateescape")
    return out


class MutateProposer:
    name = "mutate"

    def __init__(
        self,
        paths: ExpPaths,
        cfg: ExperimentConfig,
        seed: int | None = None,
        *,
        include: tuple[str, ...] = (),
        exclude: tuple[str, ...] = (),
    ) -> None:
        self.paths = paths
        self.cfg = cfg
        self.include, self.exclude = include, exclude
        self.rng = random.Random(seed)
        self._lock = threading.Lock()
        self._offered: set[str] = set()  # digests proposed, maybe not journaled yet
        self._digests: dict[str, str] = {}

    def _digest_of(self, commit: str) -> str:
        """The mutate digest of a commit's editable files (cached: commits never change)."""
        if commit not in self._digests:
            self._digests[commit] = mutate.digest(_base_files(self.paths, self.cfg, commit))
        return self._digests[commit]

    def selection(self, base: str, files: dict[str, str]) -> mutate.Selection:
        """What may be mutated at ``base``: --mutate / --mutate-exclude, minus the names the
        command overrides at run time (a config file after the script, ``--name=value``)."""
        tracked = dict(files)
        for word in self.cfg.command.split():
            rel = word[2:] if word.startswith("./") else word
            if rel.endswith(".py") and rel not in tracked:
                with contextlib.suppress(ResearchError):
                    data = gitops.blob(self.paths.repo, base, rel)
                    if data is not None:
                        tracked[rel] = data.decode("utf-8", errors="surrogateescape")
        names, configs = numeric.command_overrides(self.cfg.command, tracked)
        return mutate.Selection(
            include=self.include,
            exclude=self.exclude,
            overridden=frozenset(names),
            config_files=frozenset(configs),
        )

    def check(self, state: ExperimentState) -> list[str]:
        """The settings mutate would change at BASE; a ResearchError (exit 2) saying why when
        there is none, or when a --mutate name matches nothing."""
        files = _base_files(self.paths, self.cfg, state.base)
        select = self.selection(state.base, files)
        pool = mutate.candidates(files, select)
        found = [c.name for c, _ in pool]
        for pattern in self.include:
            if not any(select.matches((pattern,), c) for c, _ in pool):
                every = [c.name for p in sorted(files) for c in numeric.constants(p, files[p])]
                raise ResearchError(
                    f"--mutate {pattern}: no numeric setting of that name in "
                    f"{', '.join(self.cfg.edit)} (found: {', '.join(every[:30]) or 'none'})"
                )
        if not found:
            skipped = "; ".join(f"{n}: {why}" for n, why in list(select.skipped.items())[:12])
            raise ResearchError(
                f"mutate has nothing to propose: no numeric setting it may change in "
                f"{', '.join(self.cfg.edit)} at BASE {gitops.short(state.base)} (it looks for "
                "`name = <number>` at module level, `2**19`, tuples of numbers, @dataclass "
                "field and add_argument defaults)"
                + (f"; skipped {skipped}" if skipped else "")
                + ". Name settings with --mutate NAME, edit other files (--edit at init), or "
                "use --proposer agent"
            )
        return found

    def survey(self, state: ExperimentState) -> list[Knob]:
        """Every numeric setting of BASE's editable files, and whether mutate may change it
        (``knob``) or why not (``why``): ``research mutate --list``."""
        files = _base_files(self.paths, self.cfg, state.base)
        select = self.selection(state.base, files)
        kept = {(c.path, c.name): options for c, options in mutate.candidates(files, select)}
        rows: list[Knob] = []
        for path in sorted(files):
            for c in numeric.constants(path, files[path]):
                options = kept.get((c.path, c.name))
                why = None if options else select.skipped.get(c.name, "no value to move to")
                if not options and self.include and not select.matches(self.include, c):
                    why = "not named by --mutate"
                rows.append(
                    {
                        "file": c.path,
                        "line": c.line,
                        "name": c.name,
                        "value": c.literal,
                        "knob": bool(options),
                        "why": why,
                        "tries": options or [],
                    }
                )
        return rows

    def propose(self, state: ExperimentState) -> Proposal | None:
        files = _base_files(self.paths, self.cfg, state.base)
        select = self.selection(state.base, files)
        tried = {str(v.meta["digest"]) for v in state.variants.values() if "digest" in v.meta}
        # every variant's code, however it was made (by hand, a re-base): never propose a twin
        tried.update(self._digest_of(v.commit) for v in state.variants.values())
        tried.add(mutate.digest(files))
        with self._lock:  # proposals may be made in parallel: never the same one twice
            m = mutate.propose(files, self.rng, tried | self._offered, select=select)
            if m is None:
                return None
            after = {**files, **m.files}
            self._offered.add(mutate.digest(after))
        return Proposal(
            files={p: t.encode("utf-8", errors="surrogateescape") for p, t in m.files.items()},
            description=m.description,
            base=state.base,
            meta={"digest": mutate.digest(after), "changes": [list(c) for c in m.changes]},
        )
