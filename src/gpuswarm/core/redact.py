"""What gpuswarm writes or shows for a person: secrets redacted, terminal controls made inert.

Redaction works two ways, and every command, environment value, task name and log tail that
gpuswarm writes (run.json, events.jsonl, results.tsv, summary.json, report.html, ``status``,
the live view and the plain lines) goes through one of these functions:

- **by name**: an environment variable whose name looks secret (:func:`is_secret_name`:
  ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*API_KEY*``, ``*_KEY``, ``*CREDENTIAL*``,
  ``AUTH*``, ...) has its whole value replaced by ``***``, and that value is blanked wherever it
  appears in a text (:func:`redact_text`);
- **by shape** (:func:`redact_shapes`), whatever the name: the password of a URL
  (``https://user:***@host``), the value after a secret-looking option (``--api-key ***``,
  ``--token=***``, ``--password ***``), a secret-looking ``NAME=value`` assignment, a JSON,
  Python or YAML pair under a secret-looking key (``"api_key": "***"``, ``'token': '***'``,
  ``password: ***``), the credentials of an ``Authorization:`` / ``X-Api-Key:`` / ``Cookie:``
  header, and common token formats (OpenAI ``sk-...``, GitHub ``ghp_...``/``github_pat_...``,
  Slack ``xox.-...``, AWS ``AKIA...``, Hugging Face ``hf_...``, GitLab ``glpat-...``, Google
  ``AIza...``, JWTs).

:class:`Redactor` is the one redactor of a run: the secret values it is fed (the environment of
the process that writes or shows, every task's own env, the values in the files a run
provisions: :mod:`gpuswarm.core.secretvalues`) compiled into one pattern, once, then the shapes.
Every output of a run goes through one: run.json, events' names, results.tsv, summary.json,
report.html, ``status``, the live view and the dashboard.

The queue itself (``.parallel/``, mode 0700) keeps the real command and env: a resume must run
them. :func:`inert` shows text from a task (log lines, reasons) with control characters as
visible escapes (``\\x1b``), so that a task's output cannot drive the terminal of ``status``,
``watch`` or the live view.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpuswarm.core.inert import inert as inert  # redact's callers show text with it too

REDACTED = "***"
MIN_SECRET_LEN = 4
_PLAIN_VALUES = frozenset({"true", "false", "none", "null"})  # ENABLE_AUTH=true hides no secret
_SECRET_RE = re.compile(
    r"TOKEN(?!I[ZS]|S(?:_|$))"  # not TOKENIZERS_PARALLELISM, MAX_TOKENS
    r"|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL"
    r"|AUTH(?!OR(?!I[SZ]))"  # AUTH, AUTHORIZATION, OAUTH; not AUTHOR, AUTHORITY
    r"|COOKIE|SESSION_KEY|(?:^|_)KEY(?:_|$)|(?:^|_)PASS(?:_|$)",
    re.IGNORECASE,
)

# -- shapes ---------------------------------------------------------------------------------------
_NOT_WORD = r"(?<![A-Za-z0-9_\-])"
_TOKENS = re.compile(
    _NOT_WORD
    + r"(?:"
    + r"|".join(
        (
            r"sk-(?:proj-|ant-(?:api\d\d-)?|svcacct-|admin-|live-|test-)?[A-Za-z0-9_]{20,}[\w-]*",
            r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}",
            r"gh[pousr]_[A-Za-z0-9]{20,}",
            r"github_pat_[A-Za-z0-9_]{20,}",
            r"xox[abposr]-[A-Za-z0-9-]{10,}",
            r"(?:AKIA|ASIA)[A-Z0-9]{16}",
            r"hf_[A-Za-z0-9]{20,}",
            r"glpat-[A-Za-z0-9_-]{20,}",
            r"AIza[0-9A-Za-z_-]{35}",
            r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}",
        )
    )
    + r")"
)
# scheme://user:password@host -> scheme://user:***@host
_URL_CREDENTIALS = re.compile(
    r"((?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{0,31}://[^\s/:@'\"]*:)([^\s/@'\"]+)(@)"
)
# Authorization: Bearer X, X-Api-Key: X, Cookie: X (also the -H 'Authorization: ...' of curl)
_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|x-api-key|api-key|x-auth-token|x-access-token|"
    r"private-token|(?:set-)?cookie)(\s*[:=]\s*)((?:bearer|basic|token|bot|digest|negotiate)\s+)?"
    r"([^\s'\"]+)"
)
# --api-key X, --token=X, -password X (the option name decides: is_secret_name)
_OPTION = re.compile(
    r"(?<![\w-])(--?([A-Za-z][A-Za-z0-9_-]*))(=|[ \t]+)(\"[^\"]*\"|'[^']*'|(?!-)[^\s'\"]+)"
)
# curl -u user:X, --user=user:X
_USER_OPTION = re.compile(r"(?<![\w-])(-u|--user|--proxy-user)(=|[ \t]+)([^\s:'\"]*):([^\s'\"]+)")
# HF_TOKEN=X python ..., export DB_PASSWORD='X'
_ASSIGNMENT = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)(=)(\"[^\"]*\"|'[^']*'|[^\s'\"]+)")


# "token": "X", 'api_key': 'X' (JSON, a Python dict); the key decides (is_secret_name)
_QUOTED_PAIR = re.compile(
    r"""(["'])([A-Za-z_][A-Za-z0-9_.\-]{0,80})\1([ \t]*:[ \t]*)"""
    r"""("(?:[^"\\\n]|\\.)*"|'[^'\n]*'|[^\s,}\]'"]+)"""
)
# password: X as a YAML line (the rest of the line) or inline in a text (one word)
_YAML_LINE = re.compile(
    r"(?m)^([ \t]*(?:-[ \t]+)?)([A-Za-z_][A-Za-z0-9_.\-]{0,80})([ \t]*:[ \t]+)"
    r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s#'\"][^\n]*?)(?=[ \t]+#|[ \t]*$)"
)
_INLINE_PAIR = re.compile(
    r"(?<![\w.\-])([A-Za-z_][A-Za-z0-9_.\-]{0,80})([ \t]*:[ \t]+)(\"[^\"\n]*\"|'[^'\n]*'|[^\s'\"]+)"
)
_NUMBER = re.compile(r"[-+]?[0-9][0-9.eE+-]*")
_SCHEMES = frozenset({"bearer", "basic", "token", "bot", "digest", "negotiate"})


@functools.lru_cache(maxsize=8192)
def is_secret_name(name: str) -> bool:
    """True for variable names that usually hold secrets (``HF_TOKEN``, ``OPENAI_API_KEY``...).
    Cached: every task's env asks about the same few names."""
    return _SECRET_RE.search(name) is not None


def _option_name_secret(name: str) -> bool:
    return is_secret_name(name.replace("-", "_"))


def _hide_quoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[0] + REDACTED + value[0]
    return REDACTED


def _option(match: re.Match[str]) -> str:
    if not _option_name_secret(match.group(2)) or match.group(4).lower() in _PLAIN_VALUES:
        return match.group(0)
    return match.group(1) + match.group(3) + _hide_quoted(match.group(4))


def _assignment(match: re.Match[str]) -> str:
    if not is_secret_name(match.group(1)) or match.group(3).lower() in _PLAIN_VALUES:
        return match.group(0)
    return match.group(1) + "=" + _hide_quoted(match.group(3))


def _header(match: re.Match[str]) -> str:
    return match.group(1) + match.group(2) + (match.group(3) or "") + REDACTED


def _pair_value_hidden(key: str, value: str) -> bool:
    bare = value.strip("'\"")
    return (
        _option_name_secret(key)
        and bare.lower() not in _PLAIN_VALUES
        and bare != REDACTED
        and bare.split(" ", 1)[0].lower() not in _SCHEMES  # "Authorization: Bearer ***"
        and (value[:1] in "'\"" or _NUMBER.fullmatch(value) is None)  # "tokens_used": 12
    )


def _pair(key: int, value: int) -> Any:
    def sub(match: re.Match[str]) -> str:
        if not _pair_value_hidden(match.group(key), match.group(value)):
            return match.group(0)
        start, end = match.span(value)
        base = match.start()
        text = match.group(0)
        return text[: start - base] + _hide_quoted(match.group(value)) + text[end - base :]

    return sub


_quoted_pair, _yaml_line, _inline_pair = _pair(2, 4), _pair(2, 4), _pair(1, 3)


def redact_shapes(text: str) -> str:
    """``text`` with secrets that look like secrets replaced by ``***`` (see the module doc)."""
    if not text:
        return text
    text = _URL_CREDENTIALS.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    text = _HEADER.sub(_header, text)
    if ":" in text:
        text = _QUOTED_PAIR.sub(_quoted_pair, text)
        text = _YAML_LINE.sub(_yaml_line, text)
        text = _INLINE_PAIR.sub(_inline_pair, text)
    if "-" in text:
        text = _OPTION.sub(_option, text)
        text = _USER_OPTION.sub(
            lambda m: m.group(1) + m.group(2) + m.group(3) + ":" + REDACTED, text
        )
    if "=" in text:
        text = _ASSIGNMENT.sub(_assignment, text)
    return _TOKENS.sub(REDACTED, text)


def redact_argv(argv: list[str]) -> list[str]:
    """An argv list redacted element by element; ``["--token", "X"]`` hides ``X`` too."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        option = re.fullmatch(r"--?([A-Za-z][A-Za-z0-9_-]*)", arg)
        if option and _option_name_secret(option.group(1)):
            hide_next = True
        header = re.fullmatch(r"(?i)(?:proxy-)?authorization|x-api-key|api-key|cookie", arg)
        if header:
            hide_next = True
        if out and out[-1] in ("-u", "--user", "--proxy-user") and ":" in arg:
            arg = arg.split(":", 1)[0] + ":" + REDACTED
        out.append(redact_shapes(arg))
    return out


def redact_command(command: str | list[str]) -> str | list[str]:
    """A task's command (a shell string or an argv list) fit to be written or shown."""
    return redact_argv(command) if isinstance(command, list) else redact_shapes(command)


# -- environments and texts ----------------------------------------------------------------------
def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env``: secret-named values are ``***``, the others redacted by shape."""
    return {
        k: REDACTED if v and is_secret_name(k) else redact_shapes(v) if isinstance(v, str) else v
        for k, v in env.items()
    }


ALTERNATION_MAX = 64  # more values: one trie-shaped pattern (an alternation of 2,000 is 20x slower)


Trie = dict[str, "Trie"]  # a character -> the values' rest after it ("": a value ends here)


def _trie(values: Iterable[str]) -> str:
    """One regex of ``values`` as a trie (shared prefixes once; longer matches first)."""
    root: Trie = {}
    for value in values:
        node = root
        for ch in value:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: Trie) -> str:
        out = []
        while len(node) == 1 and "" not in node:  # a chain: no group
            ((ch, node),) = node.items()
            out.append(re.escape(ch))
        kids = sorted(k for k in node if k)
        if not kids:
            return "".join(out)
        alts = [re.escape(k) + build(node[k]) for k in kids]
        inner = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return "".join(out) + ("(?:" + inner + ")?" if "" in node else inner)

    return build(root)


@functools.lru_cache(maxsize=64)
def _secret_pattern(values: frozenset[str]) -> re.Pattern[str]:
    if len(values) > ALTERNATION_MAX:
        return re.compile(_trie(values))
    ordered = sorted(values, key=len, reverse=True)  # a secret containing another goes first
    return re.compile("|".join(re.escape(v) for v in ordered))


def usable_secret(value: str) -> bool:
    return len(value) >= MIN_SECRET_LEN and value.lower() not in _PLAIN_VALUES


def env_secret_values(env: Mapping[str, Any] | None) -> set[str]:
    """The values of ``env``'s secret-looking variables, as given and stripped (>= 4 chars;
    ``true``, ``false``, ``none``, ``null`` are no secrets)."""
    return {
        v
        for k, raw in (env or {}).items()
        if isinstance(raw, str) and is_secret_name(k)
        for v in (raw, raw.strip())
        if usable_secret(v)
    }


class Redactor:
    """Secret values blanked (one pattern, compiled once per set of values), then shapes.

    Build one per run (:func:`gpuswarm.core.secretvalues.run_redactor`) and use it for every
    output; :meth:`including` adds a task's own env (the same object when it adds nothing)."""

    __slots__ = ("_pattern", "values")

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.values = frozenset(v for v in values if usable_secret(v))
        self._pattern = _secret_pattern(self.values) if self.values else None

    @classmethod
    def of_env(cls, *envs: Mapping[str, Any] | None) -> Redactor:
        return cls(set().union(*(env_secret_values(e) for e in envs)))

    def including(self, *envs: Mapping[str, Any] | None, values: Iterable[str] = ()) -> Redactor:
        extra = set().union(*(env_secret_values(e) for e in envs), values)
        extra = {v for v in extra if usable_secret(v)} - self.values
        return Redactor(self.values | extra) if extra else self

    def text(self, text: str) -> str:
        """``text`` with every secret value replaced, then redacted by shape."""
        if not text:
            return text
        if self._pattern is not None:
            text = self._pattern.sub(REDACTED, text)
        return redact_shapes(text)

    def name(self, name: str) -> str:
        """A task name (shown and written everywhere: redacted like a command)."""
        return self.text(name)

    def command(self, command: str | list[str]) -> str | list[str]:
        if isinstance(command, list):
            return [self.text(a) for a in redact_argv(command)]
        return self.text(command)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """Secret-named values are ``***``, the others redacted by value and shape."""
        return {
            k: REDACTED if v and is_secret_name(k) else self.text(v) if isinstance(v, str) else v
            for k, v in env.items()
        }

    def tree(self, value: Any) -> Any:
        """A JSON-like value: ``env`` mappings by :meth:`env`, ``command`` values by
        :meth:`command`, every other string by :meth:`text` (keys too)."""
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for k, v in value.items():
                key = self.text(k) if isinstance(k, str) else k
                if k == "env" and isinstance(v, dict):
                    out[key] = self.env(v)
                elif k == "command" and isinstance(v, list | str) and _all_str(v):
                    out[key] = self.command(v)
                elif isinstance(v, str) and isinstance(k, str) and _pair_value_hidden(k, v):
                    out[key] = REDACTED  # {"api_key": "..."} in a result file, as in a text
                else:
                    out[key] = self.tree(v)
            return out
        if isinstance(value, list | tuple):
            return [self.tree(v) for v in value]
        return self.text(value) if isinstance(value, str) else value


SHAPES = Redactor()  # no values: shapes only

LINE_MAX = 1 << 16  # a line longer than this is redacted in pieces of this size


class LineRedactor:
    """Bytes of a log, redacted line by line as they come (a secret cut in two by a read is
    still found): :meth:`feed` gives back the whole lines so far, :meth:`flush` the rest.
    Bytes that are not UTF-8 pass through as they are (surrogateescape)."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self.partial = b""

    def _clean(self, data: bytes) -> bytes:
        text = data.decode("utf-8", errors="surrogateescape")
        return self.redactor.text(text).encode("utf-8", errors="surrogateescape")

    def feed(self, data: bytes) -> bytes:
        data = self.partial + data
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if end == 0 and len(data) > LINE_MAX:
            end = len(data)
        self.partial = data[end:]
        return self._clean(data[:end]) if end else b""

    def flush(self) -> bytes:
        data, self.partial = self.partial, b""
        return self._clean(data) if data else b""


def name_redactor(env: Mapping[str, Any] | None = None) -> Redactor:
    """The redactor of task names as they are made (at load: every output copies a name):
    this process's secret variables, the tasks' own ``env``, and shapes. Make one per batch
    of tasks that share ``env``: it compiles its pattern once."""
    return Redactor.of_env(os.environ, env)


def redact_text(text: str, env: Mapping[str, str]) -> str:
    """``text`` with every secret variable's value (>= 4 chars) replaced, then by shape.

    Values are matched as given and stripped of surrounding whitespace; ``true``, ``false``,
    ``none`` and ``null`` are left alone so that flags do not blank out ordinary words.
    """
    return Redactor.of_env(env).text(text)


def redact_tree(value: Any) -> Any:
    """A JSON-like config dump fit for run.json: ``env`` mappings by :func:`redact_env`,
    ``command`` values by :func:`redact_command`, every other string by shape."""
    return SHAPES.tree(value)


def _all_str(value: str | list[Any]) -> bool:
    return isinstance(value, str) or all(isinstance(v, str) for v in value)
