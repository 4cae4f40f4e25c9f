"""What an agent's attempt spent: tokens, cost and model, read from its CLI's own usage output.

Each preset names the format its CLI reports usage in (``usage: {format: ...}``):

- ``claude-json``: Claude Code's final JSON line (``--output-format json`` or ``stream-json``):
  ``{"type": "result", "total_cost_usd": ..., "usage": {"input_tokens", "cache_creation_
  input_tokens", "cache_read_input_tokens", "output_tokens"}, "modelUsage": {MODEL: ...}}``;
- ``codex-jsonl``: Codex's ``exec --json`` events, each ``{"type": "turn.completed", "usage":
  {"input_tokens", "cached_input_tokens", "output_tokens"}}`` summed;
- ``gemini-json``: Gemini CLI's ``--output-format json`` document, ``stats.models.<MODEL>.tokens``
  (``prompt``, ``cached``, ``candidates``, ``thoughts``) per model;
- ``aider``: aider's ``Tokens: 1.9k sent, 400 cache hit, 30 received. Cost: $0.01 message,
  $0.02 session.`` lines and its ``Model: NAME ...`` line;
- ``regex`` (a ``custom`` preset): a regular expression per field (its first group, the last
  match in the log), e.g. ``tokens_in: 'in=(\\d+)'``;
- ``json`` (a ``custom`` preset): a dotted path per field into the last JSON object of the log
  that has the ``tokens_in`` (else ``cost_usd``) path, e.g. ``tokens_in: usage.input``.

``tokens_in`` counts every input token, ``tokens_cached`` the part of them read from a prompt
cache, ``tokens_out`` every output token (reasoning included). The log is the attempt's, read
through :func:`gpuswarm.core.taskfiles.read_tail` (its last :data:`SCAN_BYTES`, never through a
link, never blocking); a record that is there but does not parse is a ``problem`` (reported,
its cost unknown), never an exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from gpuswarm.agents.jsonlog import Garbled, last_object
from gpuswarm.core.taskfiles import read_tail

SCAN_BYTES = 1 << 20  # the end of the log that is read (the final record is there)
MAX_RECORDS = 10_000  # codex events / aider lines summed per log
Format = Literal["claude-json", "codex-jsonl", "gemini-json", "aider", "regex", "json"]
FIELDS = ("tokens_in", "tokens_cached", "tokens_out", "cost_usd", "model")
_BUILT_IN = ("claude-json", "codex-jsonl", "gemini-json", "aider")


class UsageSpec(BaseModel):
    """``usage:`` of a preset: how its CLI reports what it spent."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    format: Format
    tokens_in: str | None = None
    tokens_cached: str | None = None
    tokens_out: str | None = None
    cost_usd: str | None = None
    model: str | None = None

    @model_validator(mode="after")
    def _checked(self) -> UsageSpec:
        given = [f for f in FIELDS if getattr(self, f) is not None]
        if self.format in _BUILT_IN:
            if given:
                raise ValueError(
                    f"usage: format {self.format} reads its CLI's own fields; remove "
                    f"{', '.join(given)} (or use format: regex or json)"
                )
            return self
        if self.tokens_in is None and self.cost_usd is None:
            how = "'input=(\\d+)'" if self.format == "regex" else "usage.input_tokens"
            raise ValueError(
                f"usage: format {self.format} needs tokens_in or cost_usd (e.g. tokens_in: {how})"
            )
        if self.format == "regex":
            for name in given:
                try:
                    re.compile(getattr(self, name))
                except re.error as exc:
                    raise ValueError(f"usage.{name} is not a regular expression: {exc}") from None
        return self


@dataclass(frozen=True)
class ModelTokens:
    """One model's share of an attempt (a CLI may call a small model besides its main one)."""

    model: str | None
    tokens_in: int
    tokens_cached: int
    tokens_out: int


@dataclass(frozen=True)
class Usage:
    """What one attempt spent, as its CLI reported it (``cost_usd`` None: it reported none)."""

    tokens_in: int | None = None
    tokens_cached: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    model: str | None = None
    parts: tuple[ModelTokens, ...] = ()
    problem: str | None = None  # a usage record that is there but unreadable


# -- reading a log -------------------------------------------------------------------------------
def read_log_usage(log: Path, spec: UsageSpec) -> Usage | None:
    """The usage in the attempt's ``log`` (None: the CLI reported none, or there is no log)."""
    try:
        data = read_tail(log, SCAN_BYTES)[0]
    except OSError:
        return None
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    return parse_usage(text, spec)


def parse_usage(text: str, spec: UsageSpec) -> Usage | None:
    """The usage ``text`` (a CLI's output) reports in ``spec``'s format; None when it has none."""
    reader = _READERS[spec.format]
    try:
        return reader(text, spec)
    except Garbled as exc:
        return Usage(problem=f"garbled usage record ({spec.format}): {exc}")


def _count(obj: object, key: str, where: str, *, required: bool = False) -> int:
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None and not required:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Garbled(f"{where}{key} is {_shown(value)}, not a token count")
    return value


def _money(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e7:
        raise Garbled(f"{where} is {_shown(value)}, not an amount in USD")
    return float(value)


def _shown(value: object) -> str:
    return "missing" if value is None else repr(value)[:40]


def _claude(text: str, spec: UsageSpec) -> Usage | None:
    def want(obj: Mapping[str, object]) -> bool:
        return obj.get("type") == "result" and ("usage" in obj or "total_cost_usd" in obj)

    obj = last_object(text, '"result"', want)
    if obj is None:
        return None
    usage = obj.get("usage") or {}
    if not isinstance(usage, dict):
        raise Garbled(f"usage is {_shown(usage)}, not an object")
    where = "usage."
    fresh = _count(usage, "input_tokens", where, required=True)
    written = _count(usage, "cache_creation_input_tokens", where)
    read = _count(usage, "cache_read_input_tokens", where)
    out = _count(usage, "output_tokens", where, required=True)
    cost = _money(obj.get("total_cost_usd"), "total_cost_usd")
    parts = _claude_models(obj.get("modelUsage"))
    model = max(parts, key=lambda p: p.tokens_in + p.tokens_out).model if parts else None
    return Usage(fresh + written + read, read, out, cost, model, parts)


def _claude_models(models: object) -> tuple[ModelTokens, ...]:
    if not isinstance(models, dict):
        return ()
    out = []
    for name, m in list(models.items())[:32]:
        where = f"modelUsage.{name}."
        read = _count(m, "cacheReadInputTokens", where)
        inp = _count(m, "inputTokens", where) + _count(m, "cacheCreationInputTokens", where) + read
        out.append(ModelTokens(str(name)[:200], inp, read, _count(m, "outputTokens", where)))
    return tuple(out)


def _codex(text: str, spec: UsageSpec) -> Usage | None:
    total = [0, 0, 0]
    seen = 0
    for line in text.splitlines():
        if not line.startswith("{") or '"turn.completed"' not in line:
            continue
        seen += 1
        if seen > MAX_RECORDS:
            break
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            raise Garbled(f"{line[:60]!r}... is not JSON") from None
        if not isinstance(event, dict) or event.get("type") != "turn.completed":
            continue
        usage = event.get("usage")
        if not isinstance(usage, dict):
            raise Garbled(f"turn.completed's usage is {_shown(usage)}, not an object")
        total[0] += _count(usage, "input_tokens", "usage.", required=True)
        total[1] += _count(usage, "cached_input_tokens", "usage.")
        total[2] += _count(usage, "output_tokens", "usage.", required=True)
    if not seen:
        return None
    tin, cached, out = total
    return Usage(tin, cached, out, None, None, (ModelTokens(None, tin, cached, out),))


def _gemini(text: str, spec: UsageSpec) -> Usage | None:
    def want(obj: Mapping[str, object]) -> bool:
        return isinstance(obj.get("stats"), dict)

    obj = last_object(text, '"stats"', want)
    if obj is None:
        return None
    stats = obj["stats"]  # an object: want() chose it for that
    models = stats.get("models") if isinstance(stats, dict) else None
    if not isinstance(models, dict):
        raise Garbled(f"stats.models is {_shown(models)}, not an object")
    parts = []
    for name, m in list(models.items())[:32]:
        tokens = m.get("tokens") if isinstance(m, dict) else None
        where = f"stats.models.{name}.tokens."
        if not isinstance(tokens, dict):
            raise Garbled(f"{where[:-1]} is {_shown(tokens)}, not an object")
        out = _count(tokens, "candidates", where, required=True) + _count(tokens, "thoughts", where)
        prompt = _count(tokens, "prompt", where, required=True)
        parts.append(ModelTokens(str(name)[:200], prompt, _count(tokens, "cached", where), out))
    return _summed(parts, None)


def _summed(parts: list[ModelTokens], cost: float | None) -> Usage:
    model = max(parts, key=lambda p: p.tokens_in + p.tokens_out).model if parts else None
    return Usage(
        sum(p.tokens_in for p in parts),
        sum(p.tokens_cached for p in parts),
        sum(p.tokens_out for p in parts),
        cost,
        model,
        tuple(parts),
    )


_AIDER_TOKENS = re.compile(r"(?m)^Tokens: ([^\n]*?)(?: received\.)")
_AIDER_PART = re.compile(r"^\s*([0-9][0-9.]*)([kKmM]?) (sent|cache write|cache hit|received)$")
_AIDER_COST = re.compile(r"Cost: \$([0-9.]+) message, \$([0-9.]+) session\.")
_AIDER_MODEL = re.compile(r"(?m)^Model: (\S+)")


def _aider_count(number: str, unit: str) -> int:
    try:
        value = float(number)
    except ValueError:
        raise Garbled(f"{number!r} is not a token count") from None
    return round(value * {"": 1, "k": 1e3, "m": 1e6}[unit.lower()])


def _aider(text: str, spec: UsageSpec) -> Usage | None:
    sent = hit = received = 0
    lines = _AIDER_TOKENS.findall(text)[:MAX_RECORDS]
    if not lines:
        return None
    for line in lines:
        for piece in (line + " received").split(","):
            found = _AIDER_PART.match(piece)
            if found is None:
                raise Garbled(f"'Tokens: {line[:50]}' does not read as aider's token counts")
            count = _aider_count(found.group(1), found.group(2))
            kind = found.group(3)
            if kind in ("sent", "cache write"):
                sent += count if kind == "sent" else 0
            elif kind == "cache hit":
                hit += count
            else:
                received += count
    costs = _AIDER_COST.findall(text)
    cost = _money(float(costs[-1][1]), "Cost") if costs else None
    models = _AIDER_MODEL.findall(text)
    model = models[-1] if models else spec.model
    return Usage(sent, hit, received, cost, model, (ModelTokens(model, sent, hit, received),))


def _regex(text: str, spec: UsageSpec) -> Usage | None:
    found: dict[str, str] = {}
    for name in FIELDS:
        pattern = getattr(spec, name)
        if pattern is None:
            continue
        last = None
        for last in re.finditer(pattern, text, re.MULTILINE):  # noqa: B007 - the last one
            pass
        if last is not None:
            found[name] = (last.group(1) if last.groups() else last.group(0)).strip()
    if not found.keys() - {"model"}:
        return None
    return _of_fields({k: v.replace(",", "") if k != "model" else v for k, v in found.items()})


def _of_fields(values: Mapping[str, object]) -> Usage:
    counts = {}
    for name in ("tokens_in", "tokens_cached", "tokens_out"):
        value = values.get(name)
        if isinstance(value, str) and re.fullmatch(r"\d{1,18}", value):
            value = int(value)
        counts[name] = None if value is None else _count({name: value}, name, "", required=True)
    cost = values.get("cost_usd")
    if isinstance(cost, str):
        shown = cost[:40]
        try:
            cost = float(cost.lstrip("$"))
        except ValueError:
            raise Garbled(f"cost_usd is {shown!r}, not an amount in USD") from None
    model = values.get("model")
    model = str(model)[:200] if model is not None else None
    tin, tcached, tout = counts["tokens_in"], counts["tokens_cached"], counts["tokens_out"]
    parts = (ModelTokens(model, tin or 0, tcached or 0, tout or 0),) if tin is not None else ()
    return Usage(tin, tcached, tout, _money(cost, "cost_usd"), model, parts)


def _dotted(obj: object, path: str) -> object:
    for key in path.split("."):
        if isinstance(obj, list) and key.isdigit():
            obj = obj[int(key)] if int(key) < len(obj) else None
        elif isinstance(obj, dict):
            obj = obj.get(key)
        else:
            return None
    return obj


def _json_path(text: str, spec: UsageSpec) -> Usage | None:
    key = spec.tokens_in or spec.cost_usd
    assert key is not None
    marker = '"' + key.split(".")[0] + '"'
    obj = last_object(text, marker, lambda o: _dotted(o, key) is not None)
    if obj is None:
        return None
    values = {n: _dotted(obj, getattr(spec, n)) for n in FIELDS if getattr(spec, n) is not None}
    return _of_fields(values)


_READERS: dict[str, Callable[[str, UsageSpec], Usage | None]] = {
    "claude-json": _claude,
    "codex-jsonl": _codex,
    "gemini-json": _gemini,
    "aider": _aider,
    "regex": _regex,
    "json": _json_path,
}
