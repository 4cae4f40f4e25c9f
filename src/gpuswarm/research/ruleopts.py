"""The decision rules' flags, shared by ``research init`` and ``research config`` (their
settings: docs/research.md, "Decisions"; their meaning: ``rules.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

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


class RuleSettings(TypedDict, total=False):
    """The decision rules' settings given (``configure.RULES``; their types: the flags')."""

    simplify: bool
    noise_confirm: int
    baseline_repeats: int
    gain_per_line: str
    equal_within: str
    vram_share: float
    vram_gain: str
    base_platform: str


RS = TypeVar("RS", bound=RuleSettings)


def rules_into(kw: dict[str, Any], out: RS) -> RS:
    """The rule settings given on the command line (popped from ``kw``), in the flags' order,
    into ``out`` (a RuleSettings, or the settings they are the first part of)."""
    given = {dest: kw.pop(dest, None) for dest in ("simplify", *(f[1] for f in _FLAGS))}
    if given["simplify"] is not None:
        out["simplify"] = given["simplify"]
    if given["noise_confirm"] is not None:
        out["noise_confirm"] = given["noise_confirm"]
    if given["baseline_repeats"] is not None:
        out["baseline_repeats"] = given["baseline_repeats"]
    if given["gain_per_line"] is not None:
        out["gain_per_line"] = given["gain_per_line"]
    if given["equal_within"] is not None:
        out["equal_within"] = given["equal_within"]
    if given["vram_share"] is not None:
        out["vram_share"] = given["vram_share"]
    if given["vram_gain"] is not None:
        out["vram_gain"] = given["vram_gain"]
    if given["base_platform"] is not None:
        out["base_platform"] = given["base_platform"]
    return out
