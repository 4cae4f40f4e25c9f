"""YAML loading that remembers where every value came from.

:class:`LineLoader` is PyYAML's safe loader that records, for each mapping key and each sequence
item, the 1-based line it starts on, keyed by its path tuple (``("tasks", 2, "timeout") -> 14``).
It rejects duplicate keys in a mapping (plain YAML silently keeps the last one), nesting deeper
than :data:`MAX_DEPTH` levels, aliases that expand the document by more than
:data:`MAX_ALIAS_NODES` nodes (a "billion laughs" bomb) or into itself (``&a [*a]``), and values
holding a NUL byte or a lone surrogate (``"\\ud800"``), which no command, path or environment
can carry. A character YAML does not allow (a C0 control byte, DEL) is named with its line and
column. :func:`quote` shows a value in a message in at most a line.

:func:`load_yaml` lets libyaml scan and parse (PyYAML's C parser, several times faster on a big
config) under the same composer and checks; where libyaml finds a problem, the pure-Python
parser reads the text again, so messages (and verdicts) are PyYAML's own.

:class:`Locator` turns a path into ``file:line: field.path: message`` so every error about a
config names the file, the line and the field. A path without a recorded line falls back to the
line of its nearest recorded parent.
"""

from __future__ import annotations

import contextlib
import gc
import re
import reprlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from gpuswarm.core.errors import ConfigError

try:
    from yaml._yaml import CParser as _CParser  # libyaml, in PyYAML's wheels
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _CParser = None  # type: ignore[assignment,misc]

PathKey: TypeAlias = tuple[str | int, ...]
LineMap: TypeAlias = dict[PathKey, int]

_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
MAX_DEPTH = 64  # a config needs about 6 levels (tasks[i].matrix.key[j])
MAX_ALIAS_NODES = 1_000_000  # nodes aliases may add to a document (each merge of defaults adds)
MAX_MESSAGE = 2000  # characters of one error message
_NOT_TEXT = re.compile("[\0\ud800-\udfff]")
_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 60, 60, 2
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 4


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection while a config is read and validated (a decorator too).

    A big config's nodes, values and errors (100,000s) all live until the end: each collection
    scanned them again, about 40% of rejecting one with 20,000 problems. Refcounting frees what
    it can meanwhile; cycles (a refused recursive anchor) wait for the next collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def shorten(text: str, limit: int = 60) -> str:
    """``text`` as it is when short, else its start and its length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def quote(value: object) -> str:
    """A short ``repr`` of ``value`` for a message: long strings and big lists are cut."""
    if type(value) is str and len(value) <= _REPR.maxstring:  # most: as reprlib would say it
        shown = repr(value)
        if len(shown) <= _REPR.maxstring:
            return shown
    return _REPR.repr(value)


def format_path(path: PathKey) -> str:
    """``("tasks", 2, "timeout")`` -> ``tasks[2].timeout``; odd keys are quoted: ``env['A B']``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{quote(part)}]"
    return out


@dataclass(frozen=True)
class Locator:
    """Where a config came from (``source``, a display name) and the line of each path in it."""

    source: str
    lines: Mapping[PathKey, int] = field(default_factory=dict)

    def line(self, path: PathKey) -> int | None:
        """The line of ``path``, else of its nearest parent that has one."""
        for end in range(len(path), -1, -1):
            found = self.lines.get(path[:end])
            if found is not None:
                return found
        return None

    def where(self, path: PathKey) -> str:
        line = self.line(path)
        return f"{self.source}:{line}" if line is not None else self.source

    def message(self, path: PathKey, text: str, *, show_path: bool = True) -> str:
        shown = format_path(path) if show_path else ""
        out = f"{self.where(path)}: {shown}: {text}" if shown else f"{self.where(path)}: {text}"
        return out if len(out) <= MAX_MESSAGE else out[: MAX_MESSAGE - 3] + "..."

    def error(self, path: PathKey, text: str, *, show_path: bool = True) -> ConfigError:
        return ConfigError(self.message(path, text, show_path=show_path))


def _line_of(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


class _Lines(Composer, SafeConstructor, Resolver):
    """What both loaders add to PyYAML's composer: :attr:`lines`, the limits, duplicate keys.

    The event source (the parser) is the subclass's: libyaml's where PyYAML has it."""

    def _init_lines(self, source: str) -> None:
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self.source = source
        self.lines: LineMap = {}
        self._walked: set[int] = set()
        self._depth = 0
        self._aliased = False  # the document has an anchor: only then can it expand

    def load_with_lines(self) -> Any:
        """Load the single document of the stream (None when it is empty), recording lines."""
        node = self.get_single_node()
        if node is None:
            return None
        self.lines[()] = _line_of(node)
        if self._aliased:
            self._check_expansion(node)
        self._walk(node, ())
        return self.construct_document(node)

    def compose_document(self) -> yaml.Node | None:
        """PyYAML's, remembering whether the document has anchors (aliases need one)."""
        self.get_event()  # type: ignore[attr-defined]  # the document's start
        node = self.compose_node(None, None)  # type: ignore[arg-type]
        self.get_event()  # type: ignore[attr-defined]  # its end
        self._aliased = bool(self.anchors)
        self.anchors = {}
        return node

    def _nested(self) -> None:
        """PyYAML composes recursively: refuse a nesting that would exhaust the stack."""
        self._depth += 1
        if self._depth > MAX_DEPTH:
            line = int(self.peek_event().start_mark.line) + 1  # type: ignore[attr-defined]
            raise ConfigError(
                f"{self.source}:{line}: the YAML is nested more than {MAX_DEPTH} levels deep; "
                "a gpuswarm config needs a few levels (tasks: - matrix: key: [values]): "
                "flatten it"
            )

    def compose_sequence_node(self, anchor: Any) -> yaml.SequenceNode:
        self._nested()
        try:
            return super().compose_sequence_node(anchor)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
        self._nested()
        try:
            return super().compose_mapping_node(anchor)
        finally:
            self._depth -= 1

    def _check_expansion(self, root: yaml.Node) -> None:
        """Refuse aliases that expand into themselves, too deep, or by too many nodes."""
        size: dict[int, int] = {}
        depth: dict[int, int] = {}
        on_path: set[int] = set()
        stack: list[tuple[yaml.Node, bool]] = [(root, False)]
        while stack:
            node, finished = stack.pop()
            key = id(node)
            kids = _children(node)
            if finished:
                on_path.discard(key)
                size[key] = 1 + sum(size[id(k)] for k in kids)
                depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
                self._check_size(node, size[key], depth[key], len(size))
                continue
            if key in size:
                continue
            on_path.add(key)
            stack.append((node, True))
            for kid in kids:
                if id(kid) in on_path:
                    raise ConfigError(
                        f"{self.source}:{_line_of(kid)}: an alias refers to the anchor it is "
                        "inside (a recursive structure, e.g. &a [*a]); a config cannot be "
                        "infinite: write the value out"
                    )
                if id(kid) not in size:
                    stack.append((kid, False))

    def _check_size(self, node: yaml.Node, size: int, depth: int, distinct: int) -> None:
        if size - distinct > MAX_ALIAS_NODES:
            raise ConfigError(
                f"{self.source}:{_line_of(node)}: aliases expand this value to over "
                f"{MAX_ALIAS_NODES:,} values (a YAML bomb?); write the values out, or use "
                "fewer nested aliases"
            )
        if depth > MAX_DEPTH:
            raise ConfigError(
                f"{self.source}:{_line_of(node)}: aliases nest this value more than "
                f"{MAX_DEPTH} levels deep; write it out flat"
            )

    def _check_text(self, node: yaml.ScalarNode, path: PathKey) -> None:
        found = _NOT_TEXT.search(node.value)
        if found is None:
            return
        where = format_path(path) or "a key"
        if found.group() == "\0":
            problem = "holds a NUL byte (\\0), which no command, path or environment can carry"
            fix = "remove it"
        else:
            code = f"\\u{ord(found.group()):04x}"
            problem = f"holds {code}, a lone UTF-16 surrogate, which is not text"
            fix = "remove that escape or write the character itself"
        raise ConfigError(f"{self.source}:{_line_of(node)}: {where}: the value {problem}; {fix}")

    def _walk(self, node: yaml.Node, path: PathKey) -> None:
        # Aliased nodes are walked once (their first path); this also stops recursive anchors.
        if self._aliased:
            if id(node) in self._walked:
                return
            self._walked.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if _NOT_TEXT.search(node.value):
                self._check_text(node, path)
        elif isinstance(node, yaml.MappingNode):
            self._walk_mapping(node, path)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.lines.setdefault((*path, index), _line_of(item))
                self._walk(item, (*path, index))

    def _walk_mapping(self, node: yaml.MappingNode, path: PathKey) -> None:
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                self._walk(value_node, path)  # a merged mapping's values: checked for NULs
                continue
            self._check_text(key_node, path)
            # a plain string key is its text (construct_object would build it twice)
            key = key_node.value if key_node.tag == _STR_TAG else self.construct_object(key_node)
            line = _line_of(key_node)
            if key in first_line:
                self._duplicate(path, key, line, first_line[key])
            first_line[key] = line
            if isinstance(key, str | int) and not isinstance(key, bool):
                child: PathKey = (*path, key)
                self.lines[child] = line
                self._walk(value_node, child)

    def _duplicate(self, path: PathKey, key: Any, line: int, first: int) -> None:
        where = format_path(path) or "the top level"
        raise ConfigError(
            f"{self.source}:{line}: duplicate key {quote(key)} in {where} (first at line {first}); "
            "YAML would silently keep only the last one: remove or rename one of them"
        )


class LineLoader(_Lines, Reader, Scanner, Parser):
    """PyYAML's own (pure Python) loader with :class:`_Lines`: the reference for messages."""

    def __init__(self, stream: str, source: str = "<string>") -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        self._init_lines(source)


if _CParser is not None:

    class _FastLineLoader(_Lines, _CParser):
        """libyaml scans and parses (about 5x faster: a 1 MB config in a fraction of a
        second); the composer above it is PyYAML's, so lines and limits are the same."""

        def __init__(self, stream: str, source: str = "<string>") -> None:
            _CParser.__init__(self, stream)
            self._init_lines(source)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _hint(problem: str) -> str:
    if "\\t" in problem or "\t" in problem:
        return "indent with spaces, not tabs"
    if "mapping values are not allowed" in problem:
        return "quote values that contain ': ' and check the indentation"
    if "another document" in problem:
        return "keep one document per file (remove the '---' line)"
    return "check the indentation and quoting near that line"


def _yaml_error(exc: yaml.YAMLError, source: str) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    problem = str(getattr(exc, "problem", None) or exc)
    if mark is None:
        return ConfigError(f"{source}: invalid YAML: {problem}; {_hint(problem)}")
    detail = f"{problem} (column {mark.column + 1})"
    if context:
        at = f" at line {context_mark.line + 1}" if context_mark is not None else ""
        detail = f"{context}{at}: {detail}"
    return ConfigError(f"{source}:{mark.line + 1}: invalid YAML: {detail}; {_hint(problem)}")


def _reader_error(exc: yaml.reader.ReaderError, text: str, source: str) -> ConfigError:
    """A character YAML does not allow (a C0 control byte, DEL, U+FFFE), located."""
    char = chr(exc.character) if isinstance(exc.character, int) else ""
    index = text.find(char) if char else -1
    if index < 0:
        return ConfigError(f"{source}: invalid YAML: {exc.reason}; remove the character")
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    shown = f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    return ConfigError(
        f"{source}:{line}: invalid YAML: the control character {shown} (column {column}) is not "
        f"allowed in a YAML file; remove it, or write it as an escape in double quotes "
        f'("{shown}")'
    )


def _load(loader_class: type[_Lines], text: str, source: str) -> tuple[Any, LineMap]:
    loader = loader_class(text, source)  # type: ignore[call-arg]
    try:
        return loader.load_with_lines(), loader.lines
    finally:
        loader.dispose()  # type: ignore[attr-defined]


def load_yaml(text: str, source: str) -> tuple[Any, LineMap]:
    """Parse ``text`` (one YAML document) into plain data plus its :data:`LineMap`.

    libyaml parses when it can; where it finds a problem, PyYAML's own parser reads the text
    again: its messages (and its verdict) are the reference. Any YAML error becomes a
    :class:`ConfigError` naming ``source`` and the line.
    """
    try:
        if _CParser is not None:
            try:
                return _load(_FastLineLoader, text, source)
            except (yaml.MarkedYAMLError, UnicodeError):
                pass  # PyYAML's parser says what is wrong, and where
        return _load(LineLoader, text, source)
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, source) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, source) from None
