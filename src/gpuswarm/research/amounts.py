"""The rule settings' amounts (``gain_per_line``, ``vram_gain``, ``equal_within``): a share of
BASE's metric (``"0.01%"``) or absolute metric units (``"0.0001"``).

A leaf of research: the settings' validator (:mod:`.experiment`) checks them here and the rules
(:mod:`.rules`) weigh them here, so that neither imports the other for it.
"""

from __future__ import annotations

import math

AMOUNT_FIELDS = ("gain_per_line", "vram_gain", "equal_within")


def parse_amount(field: str, text: str) -> tuple[float, bool]:
    """``"0.01%"`` -> (0.0001, relative); ``"0.0001"`` -> (0.0001, absolute)."""
    raw = str(text).strip()
    relative = raw.endswith("%")
    try:
        value = float(raw[:-1] if relative else raw)
    except ValueError:
        raise ValueError(
            f"{field} {text!r}: give a share of BASE's metric such as '0.01%', or metric "
            "units such as '0.0001'"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{field} {text!r}: must be 0 or more")
    return (value / 100.0 if relative else value), relative


def amount(text: str, reference: float) -> float:
    """The amount ``text`` stands for where BASE measures ``reference``."""
    value, relative = parse_amount("amount", text)
    return value * abs(reference) if relative else value
