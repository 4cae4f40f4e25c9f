"""Text from a task (log lines, reasons) made inert for a terminal or a page: control characters
shown as visible escapes, so no escape sequence or bidirectional override takes effect."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def inert(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with control characters (all but tab, and newline with ``keep_newlines``)
    written as visible escapes: ESC becomes ``\\x1b``, so no escape sequence reaches a terminal.
    Bidirectional overrides (``\\u202e``) are escaped too."""
    if keep_newlines:
        return "\n".join(_CONTROL.sub(_visible, line) for line in text.split("\n"))
    return _CONTROL.sub(_visible, text)
