"""``halt:`` / ``--halt``: when a run stops early, with GNU parallel's ``--halt`` meanings.

``WHEN,WHY=VALUE``: WHEN is ``soon`` (claim no new task; running ones finish) or ``now`` (running
ones are stopped too and go back to the queue, like a Ctrl-C); WHY is ``fail`` (tasks that ended
failed: a task with attempts left is not failed yet), ``success`` (tasks that ended done) or
``done`` (either); VALUE is a count (``3``) or a percentage of the run's tasks (``10%``; skipped
and cancelled tasks are out of it). ``never`` turns it off. GNU parallel's old numeric forms are
accepted too: 0 (never), 1 (soon,fail=1), 2 (now,fail=1), -1 (soon,success=1), -2
(now,success=1), and 1-99% (soon,fail=N%).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

HALT_HELP = "e.g. now,fail=1 | soon,fail=3 | soon,fail=10% | now,success=1 | never"
_FORM = re.compile(r"^(soon|now),(fail|success|done)=(\d+(?:\.\d+)?)(%?)$")
_LEGACY = {"1": "soon,fail=1", "2": "now,fail=1", "-1": "soon,success=1", "-2": "now,success=1"}


@dataclass(frozen=True)
class HaltRule:
    when: str  # soon | now
    why: str  # fail | success | done
    value: float  # a count, or a percentage when ``percent``
    percent: bool = False

    @property
    def text(self) -> str:
        value = f"{self.value:g}%" if self.percent else str(int(self.value))
        return f"{self.when},{self.why}={value}"

    def threshold(self, total: int) -> int:
        """How many matching tasks halt a run of ``total`` tasks (at least 1)."""
        if not self.percent:
            return int(self.value)
        return max(1, math.ceil(self.value / 100 * total - 1e-9))

    def what(self, count: int) -> str:
        """``3 tasks failed`` / ``1 task done`` / ``4 tasks ended``."""
        verb = {"fail": "failed", "success": "done", "done": "ended"}[self.why]
        return f"{count} task{'s' if count != 1 else ''} {verb}"


def parse_halt(text: str) -> HaltRule | None:
    """A halt spec -> its rule (None for ``never``); ValueError saying what is accepted."""
    spec = "".join(str(text).split()).lower()
    if spec in ("never", "0"):
        return None
    spec = _LEGACY.get(spec, spec)
    if re.fullmatch(r"\d+(\.\d+)?%", spec):
        spec = f"soon,fail={spec}"
    found = _FORM.match(spec)
    if found is None:
        raise ValueError(
            f"{str(text)!r} is no halt spec; write WHEN,WHY=VALUE with WHEN soon or now, WHY "
            f"fail, success or done and VALUE a count or a percentage ({HALT_HELP})"
        )
    when, why, number, pct = found.groups()
    value = float(number)
    if pct:
        if not 0 < value <= 100:
            raise ValueError(f"{text!r}: a percentage is above 0 and at most 100% ({HALT_HELP})")
    elif value != int(value) or value < 1:
        raise ValueError(f"{text!r}: a count is a whole number of at least 1 ({HALT_HELP})")
    return HaltRule(when, why, value, bool(pct))


def canonical_halt(value: object) -> str | None:
    """A config's ``halt:`` value checked and written back in its one form (``never``: None)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"halt is a text like now,fail=1 ({HALT_HELP})")
    rule = parse_halt(str(value))
    return None if rule is None else rule.text
