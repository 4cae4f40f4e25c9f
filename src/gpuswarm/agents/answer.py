"""The agent's final answer inside a CLI's structured output (research's description of a run).

A CLI that prints JSON (its preset's ``usage`` format says which) wraps its answer: Claude
Code's ``result``, Codex's last ``agent_message``, Gemini CLI's ``response``. An output that
holds none, or a garbled one, gives None: the caller falls back to the plain text.
"""

from __future__ import annotations

import json

from gpuswarm.agents.jsonlog import Garbled, last_object


def answer_text(fmt: str, text: str) -> str | None:
    """The agent's final answer in output of a structured ``fmt`` (Claude Code's ``result``,
    Codex's last ``agent_message``, Gemini CLI's ``response``); None: ``fmt`` is text, or the
    output holds no answer."""
    try:
        if fmt == "claude-json":
            obj = last_object(text, '"result"', lambda o: o.get("type") == "result")
            value = obj.get("result") if obj else None
        elif fmt == "gemini-json":
            obj = last_object(text, '"response"', lambda o: "response" in o)
            value = obj.get("response") if obj else None
        elif fmt == "codex-jsonl":
            value = _codex_answer(text)
        else:
            return None
    except Garbled:
        return None
    return value if isinstance(value, str) else None


def _codex_answer(text: str) -> str | None:
    answer = None
    for line in text.splitlines():
        if line.startswith("{") and '"agent_message"' in line:
            try:
                event = json.loads(line)
            except (ValueError, RecursionError):
                continue
            item = event.get("item") if isinstance(event, dict) else None
            if isinstance(item, dict) and item.get("type") == "agent_message":
                answer = item.get("text") if isinstance(item.get("text"), str) else answer
    return answer
