"""Counted words in messages: ``1 task``, ``2 tasks``, ``1 attempt``."""

from __future__ import annotations


def counted(n: int, word: str, plural: str | None = None) -> str:
    """``n`` and ``word``, plural unless ``n`` is 1 (``plural``: an irregular plural)."""
    return f"{n} {word if n == 1 else plural or word + 's'}"
