"""Tokens and cost per attempt (issue 34): each preset's usage format read from what its real CLI
printed (tests/data/agent_usage: captured against the model stub), the price table, garbled and
hostile records, and the attempt record's fields."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuswarm.agents.answer import answer_text
from gpuswarm.agents.preset import AgentUse, shipped_preset
from gpuswarm.agents.pricing import (
    AgentUsage,
    Price,
    attempt_usage,
    cost_of,
    model_key,
    price_of,
    usage_fields,
)
from gpuswarm.agents.spend import event_fields
from gpuswarm.agents.usage import (
    ModelTokens,
    Usage,
    UsageSpec,
    parse_usage,
    read_log_usage,
)
from gpuswarm.core.models import AttemptRecord
from gpuswarm.core.models.kinds import RecordError

DATA = Path(__file__).parent / "data" / "agent_usage"


def captured(name: str) -> str:
    return (DATA / f"{name}.out").read_text()


def spec(fmt: str, **fields: str) -> UsageSpec:
    return UsageSpec.model_validate({"format": fmt, **fields})


# -- the real CLIs' formats -------------------------------------------------------------------
def test_claude_code_final_json() -> None:
    # three requests of the stub, each 1200 fresh + 300 cache-written + 500 cache-read in, 80 out
    u = parse_usage(captured("claude-code"), spec("claude-json"))
    assert u is not None and u.problem is None
    assert (u.tokens_in, u.tokens_cached, u.tokens_out) == (3 * 2000, 3 * 500, 3 * 80)
    assert u.cost_usd == 0.030375  # Claude Code's own total_cost_usd
    assert u.model == "claude-opus-4-8[1m]"  # modelUsage's key
    assert answer_text("claude-json", captured("claude-code")) == "lowered DEPTH"


def test_codex_turn_completed_events() -> None:
    u = parse_usage(captured("codex"), spec("codex-jsonl"))
    assert u is not None
    assert (u.tokens_in, u.tokens_cached, u.tokens_out) == (3 * 1500, 3 * 400, 3 * 90)
    assert u.cost_usd is None and u.model is None  # Codex reports neither
    assert answer_text("codex-jsonl", captured("codex")) == "lowered DEPTH"


def test_gemini_stats_per_model() -> None:
    u = parse_usage(captured("gemini"), spec("gemini-json"))
    assert u is not None
    # its router's one request and the main model's three; output = candidates + thoughts
    assert (u.tokens_in, u.tokens_cached, u.tokens_out) == (4 * 1500, 4 * 400, 4 * 110)
    assert [p.model for p in u.parts] == ["gemini-3.5-flash-lite", "gemini-3.8-flash"]
    assert u.model == "gemini-3.8-flash"
    assert answer_text("gemini-json", captured("gemini")) == "lowered DEPTH"


def test_aider_tokens_line_and_cost() -> None:
    u = parse_usage(captured("aider"), spec("aider"))
    assert u is not None
    assert (u.tokens_in, u.tokens_cached, u.tokens_out) == (1900, 0, 30)  # "1.9k sent, 30 ..."
    assert u.model == "openai/stub-coder" and u.cost_usd is None  # no price known to aider
    priced = (
        "Model: claude-sonnet-4-5 with diff edit format\n"
        "Tokens: 12k sent, 1.2k cache hit, 350 received. Cost: $0.04 message, $0.04 session.\n"
        "Tokens: 2.5k sent, 3.1k cache write, 1.2k cache hit, 120 received.\n"
        "Cost: $0.02 message, $0.06 session.\n"
    )
    u = parse_usage(priced, spec("aider"))
    assert u is not None
    assert (u.tokens_in, u.tokens_cached, u.tokens_out) == (14500, 2400, 470)
    assert u.cost_usd == 0.06  # the session's total, not a message's
    assert u.model == "claude-sonnet-4-5"


def test_no_usage_record_is_none() -> None:
    for fmt in ("claude-json", "codex-jsonl", "gemini-json", "aider"):
        assert parse_usage("just text\n{not json\n", spec(fmt)) is None


# -- garbled and hostile records --------------------------------------------------------------
@pytest.mark.parametrize(
    ("fmt", "text", "says"),
    [
        ("claude-json", '{"type":"result","usage":{"input_tokens":"lots","output_tokens":1}}\n',
         "usage.input_tokens is 'lots'"),
        ("claude-json", '{"type":"result","total_cost_usd":0.1,"usage":{"input_tok\n',
         "is not JSON"),
        ("claude-json", '{"type":"result","usage":{"input_tokens":-5,"output_tokens":1}}\n',
         "not a token count"),
        ("claude-json", '{"type":"result","total_cost_usd":"free","usage":{"input_tokens":1,'
         '"output_tokens":1}}\n', "total_cost_usd is 'free'"),
        ("codex-jsonl", '{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":\n',
         "is not JSON"),
        ("codex-jsonl", '{"type":"turn.completed","usage":[1,2]}\n', "not an object"),
        ("gemini-json", '{"response":"x","stats":{"models":{"m":{"tokens":{"prompt":true,'
         '"candidates":1}}}}}\n', "prompt is True"),
        ("aider", "Tokens: lots sent, 3 received.\n", "does not read as aider's"),
    ],
)  # fmt: skip
def test_garbled_usage_is_a_problem_never_an_exception(fmt: str, text: str, says: str) -> None:
    u = parse_usage(text, spec(fmt))
    assert u is not None and u.problem is not None and says in u.problem, u
    assert u.tokens_in is None and u.cost_usd is None
    fields = attempt_usage(u, AgentUsage(spec=spec(fmt)))
    assert fields["cost_usd"] is None and fields["usage_problem"] == u.problem  # unknown, never 0


def test_a_deep_or_huge_record_is_bounded(tmp_path: Path) -> None:
    deep = '{"type":"result","usage":' + "[" * 100_000 + "]" * 100_000 + "}\n"
    u = parse_usage(deep, spec("claude-json"))
    assert u is not None and u.problem is not None  # RecursionError caught: garbled
    log = tmp_path / "output.log"
    line = captured("claude-code")
    log.write_text("x" * (3 << 20) + "\n" + line)  # only the log's last MiB is read
    got = read_log_usage(log, spec("claude-json"))
    assert got is not None and got.cost_usd == 0.030375


def test_the_log_is_never_followed_or_blocked_on(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere.log"
    real.write_text(captured("claude-code"))
    link = tmp_path / "output.log"
    link.symlink_to(real)
    assert read_log_usage(link, spec("claude-json")) is None  # a link is not followed
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    assert read_log_usage(fifo, spec("claude-json")) is None  # no writer: no hang
    assert read_log_usage(tmp_path / "missing.log", spec("claude-json")) is None


# -- custom presets: a regex or a JSON path ---------------------------------------------------
def test_custom_regex_usage() -> None:
    s = spec("regex", tokens_in=r"in=([\d,]+)", tokens_out=r"out=(\d+)", cost_usd=r"cost \$(\S+)",
             model=r"model=(\S+)")  # fmt: skip
    u = parse_usage("model=m1 in=10 out=2\nmodel=m2 in=1,200 out=30 cost $0.25\n", s)
    assert u is not None
    assert (u.tokens_in, u.tokens_out, u.cost_usd, u.model) == (1200, 30, 0.25, "m2")  # last wins
    assert parse_usage("nothing here\n", s) is None


def test_custom_json_path_usage() -> None:
    s = spec("json", tokens_in="stats.in", tokens_out="stats.out", model="meta.model")
    text = 'log\n{"stats": {"in": 5}}\n{"stats": {"in": 700, "out": 40}, "meta": {"model": "x"}}\n'
    u = parse_usage(text, s)
    assert u is not None and (u.tokens_in, u.tokens_out, u.model) == (700, 40, "x")
    bad = parse_usage('{"stats": {"in": "many"}}\n', s)
    assert bad is not None and bad.problem is not None and "tokens_in is 'many'" in bad.problem


def test_usage_spec_checks() -> None:
    with pytest.raises(ValueError, match="needs tokens_in or cost_usd"):
        spec("regex")
    with pytest.raises(ValueError, match="not a regular expression"):
        spec("regex", tokens_in="(")
    with pytest.raises(ValueError, match="reads its CLI's own fields"):
        spec("claude-json", tokens_in="x")
    custom = AgentUse.model_validate(
        {"program": "x", "args": ["-p"], "usage": {"format": "regex", "tokens_in": "in=(\\d+)"}}
    ).resolved()
    assert custom.usage is not None and custom.usage.format == "regex"
    with pytest.raises(ValueError, match="needs tokens_in or cost_usd"):  # where it is written
        AgentUse.model_validate({"program": "x", "args": ["-p"], "usage": {"format": "regex"}})


def test_shipped_presets_name_their_format() -> None:
    formats = {n: (shipped_preset(n).usage or spec("aider")).format for n in ("claude-code",
               "codex", "gemini", "aider")}  # fmt: skip
    assert formats == {"claude-code": "claude-json", "codex": "codex-jsonl",
                       "gemini": "gemini-json", "aider": "aider"}  # fmt: skip


# -- pricing -----------------------------------------------------------------------------------
def test_model_names_are_normalised_for_the_price_table() -> None:
    assert model_key("openai/gpt-5-2025-08-07") == "gpt-5"
    assert model_key("claude-sonnet-4-5-20250929") == "claude-sonnet-4-5"
    assert model_key("claude-opus-4-5[1m]") == "claude-opus-4-5"
    assert price_of("claude-opus-4-8[1m]") is None  # a model not listed is not a neighbour's


def test_cost_from_the_table_by_token_kind() -> None:
    u = parse_usage(captured("codex"), spec("codex-jsonl"))
    assert u is not None
    fields = attempt_usage(u, AgentUsage(spec=spec("codex-jsonl"), model="gpt-5"))
    # gpt-5: $1.25 / M fresh input, $0.125 / M cached, $10 / M output
    expected = ((4500 - 1200) * 1.25 + 1200 * 0.125 + 270 * 10.0) / 1e6
    assert fields["cost_usd"] == pytest.approx(expected) and fields["model"] == "gpt-5"
    assert fields["tokens_in"] == 4500 and fields["usage_problem"] is None


def test_unknown_model_costs_unknown_never_zero() -> None:
    u = parse_usage(captured("gemini"), spec("gemini-json"))
    assert u is not None
    fields = attempt_usage(u, AgentUsage(spec=spec("gemini-json")))
    assert fields["cost_usd"] is None and fields["tokens_in"] == 6000
    assert "no price for model gemini-3.5-flash-lite" in str(fields["usage_problem"])
    assert "pricing:" in str(fields["usage_problem"])
    codex = parse_usage(captured("codex"), spec("codex-jsonl"))
    assert codex is not None
    cost, why = cost_of(codex)  # no model named at all
    assert cost is None and why is not None and "unnamed model" in why


def test_config_pricing_overrides_and_adds() -> None:
    u = parse_usage(captured("gemini"), spec("gemini-json"))
    assert u is not None
    prices = {
        "gemini-3.5-flash-lite": Price(input=0.1, cached=0.01, output=0.4),
        "gemini-3.8-flash": Price(input=1.0, output=4.0),  # cached: as input
    }
    cost, why = cost_of(u, prices)
    lite = (1100 * 0.1 + 400 * 0.01 + 110 * 0.4) / 1e6
    main = (3300 * 1.0 + 1200 * 1.0 + 330 * 4.0) / 1e6
    assert why is None and cost == pytest.approx(lite + main)
    claude = Usage(
        10, 0, 10, None, "claude-sonnet-4-5", (ModelTokens("claude-sonnet-4-5", 10, 0, 10),)
    )
    assert cost_of(claude, {"claude-sonnet-4-5": Price(input=0, output=0)}) == (0.0, None)
    assert cost_of(claude)[0] == pytest.approx((10 * 3.0 + 10 * 15.0) / 1e6)


# -- the attempt record ------------------------------------------------------------------------
def test_attempt_record_carries_the_fields(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text("gpuswarm agent: claude-code in /w\n" + captured("claude-code") + "ok\n")
    fields = usage_fields(log, AgentUsage(spec=spec("claude-json")))
    rec = AttemptRecord.launched(
        n=1, slot="s", gpus=[0], started=1.0, ended=2.0, duration=1.0, kind="exited",
        returncode=0, signal=None, reason="exit 0", oom=False, killed=0,
    ).but(**fields)  # fmt: skip
    data = rec.to_json()
    assert {k: data[k] for k in ("tokens_in", "tokens_cached", "tokens_out", "cost_usd", "model")} \
        == {"tokens_in": 6000, "tokens_cached": 1500, "tokens_out": 240, "cost_usd": 0.030375,
            "model": "claude-opus-4-8[1m]"}  # fmt: skip
    back = AttemptRecord.from_json(json.loads(json.dumps(data)))
    assert back.to_json() == data and back.extra == {}
    assert event_fields(back) == {"tokens": 6240, "cost_usd": 0.030375}
    with pytest.raises(RecordError, match="tokens_in"):
        AttemptRecord.from_json({**data, "tokens_in": "6000"})
    plain = AttemptRecord.launched(
        n=1, slot="s", gpus=[0], started=1.0, ended=2.0, duration=1.0, kind="exited",
        returncode=0, signal=None, reason="exit 0", oom=False, killed=0,
    )  # fmt: skip
    assert "tokens_in" not in plain.to_json() and event_fields(plain) == {}


def test_unknown_cost_in_the_event() -> None:
    rec = AttemptRecord(n=1, tokens_in=10, tokens_out=5, model="x", usage_problem="cost unknown")
    assert event_fields(rec) == {"tokens": 15, "cost_usd": None, "cost_unknown": True}
