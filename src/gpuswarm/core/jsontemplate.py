"""One JSON object encoded once with holes, then filled per row: the same text, a fraction of
the work.

A 100,000-line command list makes 100,000 descriptors that differ only in a few values (id,
name, command, seq). Encoding each whole dict costs the encoder's set-up and a walk of twenty
keys per task; a template encodes the shared object once, with a sentinel string where each
varying value goes, and a row is its constant pieces joined with the encodings of its own
values. JSON is compositional (no indent: a value's text does not depend on where it sits), so
the text is exactly what ``dumps`` gives the filled object; tests check that byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring, encode_basestring_ascii  # the C functions
from typing import Any

# A NUL cannot be in a command (the loader refuses it), and the text around it makes a clash with
# a real value of the shared object impossible in practice; the count is checked anyway.
_SENTINEL = "\x00gpuswarm-hole-{}\x00"


def hole(n: int) -> str:
    """The placeholder value of hole ``n``: put it where the ``n``-th varying value goes."""
    return _SENTINEL.format(n)


class TemplateError(ValueError):
    """The object's text does not hold each hole as expected (a value equal to a sentinel)."""


class JsonTemplate:
    """The text of ``obj`` (built with :func:`hole` values) split around its holes."""

    __slots__ = ("_dumps", "_lists", "_pieces", "_slots", "_string")

    def __init__(
        self,
        obj: Any,
        holes: Sequence[int],
        dumps: Callable[[Any], str],
        *,
        ensure_ascii: bool = True,
    ) -> None:
        """``holes``: how often each hole (numbered from 0) is in ``obj``; ``dumps``: the
        encoder whose text a filled row must equal (also used for each row's values);
        ``ensure_ascii``: that encoder's (a string value is encoded by json's own C function
        for it, without the encoder's set-up)."""
        text = dumps(obj)
        encoded = {dumps(hole(n)): n for n in range(len(holes))}
        pattern = re.compile("|".join(re.escape(e) for e in encoded))
        pieces: list[str] = []
        slots: list[int] = []
        start = 0
        for found in pattern.finditer(text):
            pieces.append(text[start : found.start()])
            slots.append(encoded[found.group()])
            start = found.end()
        pieces.append(text[start:])
        inner = [e[1:-1] for e in encoded]  # a hole inside a longer string: no hole at all
        counted = [slots.count(n) for n in range(len(holes))]
        if counted != list(holes) or any(i in p for p in pieces for i in inner):
            raise TemplateError(f"holes found {counted} times in the encoded object, not {holes}")
        self._set(pieces, slots, dumps, ensure_ascii)

    @classmethod
    def of_parts(
        cls,
        pieces: Sequence[str],
        slots: Sequence[int],
        dumps: Callable[[Any], str],
        *,
        ensure_ascii: bool = True,
    ) -> JsonTemplate:
        """The template whose :meth:`parts` are these (one kept in a file: store/spool.py)."""
        if len(pieces) != len(slots) + 1 or not all(type(p) is str for p in pieces):
            raise TemplateError(f"{len(pieces)} pieces for {len(slots)} holes")
        if not all(type(n) is int and n >= 0 for n in slots):
            raise TemplateError(f"hole numbers {list(slots)} are not all counts")
        out = cls.__new__(cls)
        out._set(pieces, slots, dumps, ensure_ascii)
        return out

    def _set(
        self,
        pieces: Sequence[str],
        slots: Sequence[int],
        dumps: Callable[[Any], str],
        ensure_ascii: bool,
    ) -> None:
        self._pieces = tuple(pieces)
        self._slots = tuple(slots)
        self._dumps = dumps
        self._string = encode_basestring_ascii if ensure_ascii else encode_basestring
        if self._string(hole(0)) != dumps(hole(0)):
            raise TemplateError("ensure_ascii does not match the encoder's")
        # a list of strings (an argv) joined here when the encoder writes lists compactly
        self._lists = (
            dumps([hole(0), hole(1)]) == f"[{self._string(hole(0))},{self._string(hole(1))}]"
        )

    def parts(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """``(pieces, holes)``: the text between the holes, and which hole each one is."""
        return self._pieces, self._slots

    @property
    def holes(self) -> int:
        """How many values a row gives (the highest hole number, plus one)."""
        return max(self._slots, default=-1) + 1

    def fill(self, values: Sequence[Any]) -> str:
        """The text of the object with hole ``n`` replaced by ``values[n]``."""
        dumps, string, pieces = self._dumps, self._string, self._pieces
        encoded = [
            string(v)
            if type(v) is str
            else str(v)
            if type(v) is int
            else f"[{','.join(map(string, v))}]"
            if type(v) is list and self._lists and all(type(x) is str for x in v)
            else dumps(v)
            for v in values
        ]
        out = [pieces[0]]
        for slot, piece in zip(self._slots, pieces[1:], strict=True):
            out.append(encoded[slot])
            out.append(piece)
        return "".join(out)
