"""The decision rules' flags, shared by ``research init`` and ``research config`` (their
settings: docs/research.md, "Decisions"; their meaning: ``rules.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--noise-confirm", "noise_confirm", int, "re-runs of a gain within the noise (default 2)"),
    ("--baseline-repeats", "baseline_repeats", int, "first baseline runs (0: 2 per GPU model)"),
    ("--gain-per-line", "gain_per_line", str, "gain per added line (0.01%; units: 0.0001)"),
    ("--equal-within", "equal_within", str, "'equal' before a noise estimate (0.05%)"),
    ("--vram-share", "vram_share", float, "a keep raising peak memory by more than this (0.1)"),
    ("--vram-gain", "vram_gain", str, "...must gain at least this (0.5%; units: 0.005)"),
    (
        "--base-platform",
        "base_platform",
        str,
        "whose wins move BASE: majority (default), any, a model",
    ),
)


def rule_options(fn: F) -> F:
    for flag, dest, kind, text in reversed(_FLAGS):
        fn = click.option(flag, dest, type=kind, default=None, help=text)(fn)
    fn = click.option(
        "--simplify/--no-simplify",
        "simplify",
        default=None,
        help="keep a change that removes lines and measures equal (default on)",
    )(fn)
    return fn


def rule_changes(kw: dict[str, Any]) -> dict[str, Any]:
    """The rule settings given on the command line (popped from ``kw``)."""
    out = {}
    for dest in ("simplify", *(f[1] for f in _FLAGS)):
        value = kw.pop(dest, None)
        if value is not None:
            out[dest] = value
    return out
