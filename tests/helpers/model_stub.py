"""A scripted LLM on 127.0.0.1 for driving real agent CLIs without a network.

:class:`ModelStub` serves, in a thread of the test process:

- ``POST /v1/messages`` (Anthropic, as Claude Code calls it: streamed as server-sent events when
  the request says ``stream``, else one JSON message);
- ``POST /v1/chat/completions`` (OpenAI, as aider calls it through litellm: streamed as
  ``data:`` chunks ending in ``[DONE]``, or one JSON completion);
- ``POST /v1/responses`` (OpenAI's Responses API, as Codex calls it: server-sent events);
- ``POST /v1beta/models/<m>:streamGenerateContent`` (Gemini, as Gemini CLI calls it: ``data:``
  chunks) and ``:generateContent`` (its side requests: its model router and checks get JSON
  that fits the schema they ask for).

What it answers comes from one :class:`EditRule`: a file to change, a regex to find in it and
a function that gives the replacement, and the line to end with (the change's description).
It edits through each CLI's own mechanism: to Claude Code it answers with a ``Read`` tool call,
then an ``Edit`` tool call whose ``old_string`` is what the regex matched in the file the CLI
read back, then the description; to Codex with ``cat`` and then ``apply_patch`` through its shell
tool; to Gemini CLI with its ``read_file`` and ``replace`` tools; to aider with one
search/replace block of the file's matched line (aider applies it) and the description. When
the regex matches nothing it answers only with text (the agent then changes nothing). Every
request is kept in :attr:`requests`.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Json = dict[str, Any]
Stream = Callable[[Json], Iterator[bytes]]

# What every answer used, in each API's own usage fields (one conversation's total is the sum
# over its requests): Anthropic counts input tokens apart from the cache's (written, read),
# OpenAI's chat and Responses APIs count cached tokens inside the input, Gemini inside the prompt.
ANTHROPIC_USAGE: Json = {
    "input_tokens": 1200,
    "cache_creation_input_tokens": 300,
    "cache_read_input_tokens": 500,
    "output_tokens": 80,
}
CHAT_USAGE: Json = {
    "prompt_tokens": 1500,
    "completion_tokens": 90,
    "total_tokens": 1590,
    "prompt_tokens_details": {"cached_tokens": 400},
}
RESPONSES_USAGE: Json = {
    "input_tokens": 1500,
    "input_tokens_details": {"cached_tokens": 400},
    "output_tokens": 90,
    "output_tokens_details": {"reasoning_tokens": 20},
    "total_tokens": 1590,
}
GEMINI_USAGE: Json = {
    "promptTokenCount": 1500,
    "cachedContentTokenCount": 400,
    "candidatesTokenCount": 90,
    "thoughtsTokenCount": 20,
    "totalTokenCount": 1610,
}


@dataclass
class EditRule:
    file: str  # relative to the agent's working folder
    pattern: str  # a regex whose first match is replaced (one line)
    replace: Callable[[re.Match[str]], str]
    description: Callable[[re.Match[str]], str]


@dataclass
class ModelStub:
    rule: EditRule
    requests: list[Json] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ModelStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                body: Json = json.loads(self.rfile.read(size) or b"{}")
                stub.requests.append({"path": self.path, "body": body})
                stub.headers.append({k.lower(): v for k, v in self.headers.items()})
                routed = stub.route(self.path.split("?", 1)[0], body)
                if routed is None:
                    self._json(404, {"error": {"type": "not_found", "message": self.path}})
                    return
                message, stream = routed
                self._reply(body, message, stream)

            def do_GET(self) -> None:
                stub.requests.append({"path": self.path, "body": None})
                self._json(404, {"error": {"type": "not_found", "message": self.path}})

            def _reply(self, body: Json, message: Json, stream: Stream | None) -> None:
                if stream is None or not (body.get("stream") or stream is gemini_events):
                    self._json(200, message)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for chunk in stream(message):
                    self.wfile.write(chunk)
                self.wfile.flush()
                self.close_connection = True

            def _json(self, code: int, data: Json) -> None:
                raw = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def route(self, route: str, body: Json) -> tuple[Json, Stream | None] | None:
        """The answer to a POST and how to stream it (None: not streamed), or None: 404."""
        if route.endswith("/v1/messages"):
            return self.anthropic(body), anthropic_events
        if route.endswith("/chat/completions"):
            return self.openai(body), openai_chunks
        if route.endswith("/v1/responses"):
            return self.responses(body), responses_events
        model = route.rsplit("/", 1)[-1].split(":", 1)[0]  # Gemini: /v1beta/models/<m>:...
        if route.endswith(":streamGenerateContent"):
            return {**self.gemini(body), "modelVersion": model}, gemini_events
        if route.endswith(":generateContent"):
            return {**gemini_json(body), "modelVersion": model}, None
        if route.endswith(":countTokens"):
            return {"totalTokens": 10}, None
        return None

    # -- what to answer ---------------------------------------------------------------------
    def _find(self, text: str) -> re.Match[str] | None:
        return re.search(self.rule.pattern, text)

    def anthropic(self, body: Json) -> Json:
        """Read the file, then edit what matched in what was read, then describe it."""
        model = str(body.get("model", "stub"))
        tools = {t.get("name") for t in body.get("tools", [])}
        if "Edit" not in tools:  # a side request (a title, a summary): plain text
            return anthropic_message(model, [text_block("ok")])
        workdir = _workdir(body)
        path = f"{workdir}/{self.rule.file}"
        results = [b for b in _blocks(body.get("messages", [])) if b.get("type") == "tool_result"]
        if not results:
            return anthropic_message(model, [tool_use("Read", {"file_path": path})], "tool_use")
        seen = _text(results[-1].get("content"))
        if len(results) == 1:
            match = self._find(seen)
            if match is None:
                return anthropic_message(model, [text_block("Nothing to change.")])
            edit = {"file_path": path, "old_string": match.group(0)}
            edit["new_string"] = self.rule.replace(match)
            return anthropic_message(model, [tool_use("Edit", edit)], "tool_use")
        match = self._find(_text(results[0].get("content")))
        said = self.rule.description(match) if match is not None else "Done."
        return anthropic_message(model, [text_block(said)])

    def openai(self, body: Json) -> Json:
        """One search/replace block of the matched line (aider's diff format)."""
        text = "\n".join(_text(m.get("content")) for m in body.get("messages", []))
        match = self._find(text)
        if match is None:
            reply = "Nothing to change."
        else:
            reply = (
                f"{self.rule.description(match)}\n\n{self.rule.file}\n```python\n"
                f"<<<<<<< SEARCH\n{match.group(0)}\n=======\n{self.rule.replace(match)}\n"
                ">>>>>>> REPLACE\n```\n"
            )
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "stub"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                }
            ],
            "usage": dict(CHAT_USAGE),
        }

    def responses(self, body: Json) -> Json:
        """Codex (the Responses API): ``cat`` the file with its shell tool, then an
        ``apply_patch`` of the matched line through the same tool, then the description."""
        items = [i for i in body.get("input", []) if isinstance(i, dict)]
        outputs = [i for i in items if i.get("type") == "function_call_output"]
        path = self.rule.file
        if not outputs:
            return responses_message([function_call("exec_command", {"cmd": f"cat {path}"})])
        seen = _text(outputs[0].get("output"))
        match = self._find(seen)
        if match is None:
            return responses_message([output_message("Nothing to change.")])
        if len(outputs) == 1:
            patch = (
                f"apply_patch <<'PATCH'\n*** Begin Patch\n*** Update File: {path}\n@@\n"
                f"-{match.group(0)}\n+{self.rule.replace(match)}\n*** End Patch\nPATCH"
            )
            return responses_message([function_call("exec_command", {"cmd": patch})])
        return responses_message([output_message(self.rule.description(match))])

    def gemini(self, body: Json) -> Json:
        """Gemini CLI: its read_file, then its replace of what matched, then the description."""
        parts = [p for c in body.get("contents", []) for p in c.get("parts", [])]
        results = [p["functionResponse"] for p in parts if "functionResponse" in p]
        workdir = _gemini_workdir(body)
        path = f"{workdir}/{self.rule.file}"
        if not results:
            return gemini_reply(
                [{"functionCall": {"name": "read_file", "args": {"file_path": path}}}]
            )
        seen = json.dumps(results[0].get("response", {}))
        match = self._find(json.loads(seen).get("output", seen) if seen.startswith("{") else seen)
        if match is None:
            return gemini_reply([{"text": "Nothing to change."}])
        if len(results) == 1:
            args = {
                "file_path": path,
                "old_string": match.group(0),
                "new_string": self.rule.replace(match),
                "instruction": "apply the change",
            }
            return gemini_reply([{"functionCall": {"name": "replace", "args": args}}])
        return gemini_reply([{"text": self.rule.description(match)}])

    def main_requests(self) -> list[Json]:
        """The requests of the agent's own conversation (not a CLI's side requests)."""
        out = []
        for r in self.requests:
            body = r["body"] or {}
            if (
                ":streamGenerateContent" in r["path"]
                or "chat/completions" in r["path"]
                or "/responses" in r["path"]
                or any(t.get("name") == "Edit" for t in body.get("tools", []))
            ):
                out.append(body)
        return out


# -- Anthropic ------------------------------------------------------------------------------------
def text_block(text: str) -> Json:
    return {"type": "text", "text": text}


def tool_use(name: str, data: Json) -> Json:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": name, "input": data}


def anthropic_message(model: str, content: list[Json], stop: str = "end_turn") -> Json:
    return {
        "id": f"msg_{uuid.uuid4().hex[:20]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": dict(ANTHROPIC_USAGE),
    }


def _sse(event: str, data: Json) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def anthropic_events(message: Json) -> Iterator[bytes]:
    """The server-sent events of ``message``, as the Messages API streams them."""
    start = {**message, "content": [], "stop_reason": None}
    yield _sse("message_start", {"type": "message_start", "message": start})
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            first: Json = {"type": "text", "text": ""}
            delta: Json = {"type": "text_delta", "text": block["text"]}
        else:
            first = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield _sse(
            "content_block_start",
            {"type": "content_block_start", "index": i, "content_block": first},
        )
        yield _sse(
            "content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}
        )
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": i})
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": message["usage"]["output_tokens"]}
    yield _sse("message_delta", {"type": "message_delta", "delta": stop, "usage": usage})
    yield _sse("message_stop", {"type": "message_stop"})


# -- OpenAI ---------------------------------------------------------------------------------------
def openai_chunks(message: Json) -> Iterator[bytes]:
    text = message["choices"][0]["message"]["content"]
    base = {k: message[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    for delta, finish in (({"role": "assistant", "content": text}, None), ({}, "stop")):
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    # the usage chunk a client asks for with stream_options.include_usage (litellm does)
    yield f"data: {json.dumps({**base, 'choices': [], 'usage': message['usage']})}\n\n".encode()
    yield b"data: [DONE]\n\n"


# -- OpenAI Responses (Codex) ---------------------------------------------------------------------
def function_call(name: str, arguments: Json) -> Json:
    call = uuid.uuid4().hex[:12]
    return {
        "type": "function_call",
        "id": f"fc_{call}",
        "call_id": f"call_{call}",
        "name": name,
        "arguments": json.dumps(arguments),
    }


def output_message(text: str) -> Json:
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex[:12]}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def responses_message(output: list[Json]) -> Json:
    usage = dict(RESPONSES_USAGE)
    return {"id": f"resp_{uuid.uuid4().hex[:12]}", "object": "response", "status": "completed",
            "output": output, "usage": usage}  # fmt: skip


def responses_events(message: Json) -> Iterator[bytes]:
    created = {**message, "status": "in_progress", "output": []}
    yield _sse("response.created", {"type": "response.created", "response": created})
    for i, item in enumerate(message["output"]):
        added = {"type": "response.output_item.added", "output_index": i, "item": item}
        yield _sse("response.output_item.added", added)
        if item["type"] == "message":
            delta = {"type": "response.output_text.delta", "output_index": i, "content_index": 0,
                     "item_id": item["id"], "delta": item["content"][0]["text"]}  # fmt: skip
            yield _sse("response.output_text.delta", delta)
        done = {"type": "response.output_item.done", "output_index": i, "item": item}
        yield _sse("response.output_item.done", done)
    yield _sse("response.completed", {"type": "response.completed", "response": message})


# -- Gemini ---------------------------------------------------------------------------------------
def gemini_reply(parts: list[Json]) -> Json:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": dict(GEMINI_USAGE),
        "modelVersion": "stub",
    }


def gemini_events(message: Json) -> Iterator[bytes]:
    yield f"data: {json.dumps(message)}\r\n\r\n".encode()


def _from_schema(schema: Json) -> object:
    kind = str(schema.get("type", "object")).lower()
    if "enum" in schema:
        return "user" if "user" in schema["enum"] else schema["enum"][0]
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _from_schema(v) for k, v in props.items()}
    if kind in ("number", "integer"):
        return schema.get("minimum", 10)
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    return "ok"


def gemini_json(body: Json) -> Json:
    """A side request (its router, its next-speaker check): JSON that fits the schema asked."""
    config = body.get("generationConfig", {})
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    text = json.dumps(_from_schema(schema)) if schema else "ok"
    return gemini_reply([{"text": text}])


def _gemini_workdir(body: Json) -> str:
    texts = [str(p.get("text", "")) for c in body.get("contents", []) for p in c.get("parts", [])]
    system = body.get("systemInstruction", {})
    texts += (
        [str(p.get("text", "")) for p in system.get("parts", [])]
        if isinstance(system, dict)
        else []
    )
    for text in texts:
        found = re.search(r"Workspace Directories:\**\s*\n\s*-\s*(/\S+)", text)
        if found:
            return found.group(1)
    raise AssertionError("no workspace directory in the request")


# -- reading requests -----------------------------------------------------------------------------
def _blocks(messages: list[Json]) -> Iterator[Json]:
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            yield from (b for b in content if isinstance(b, dict))


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            _text(b.get("text", b.get("content"))) for b in content if isinstance(b, dict)
        )
    return ""


_WORKDIR = re.compile(r"(?:Primary working directory|Working directory):\s*(\S+)")


def _workdir(body: Json) -> str:
    """The folder Claude Code works in: its system prompt says so."""
    system = body.get("system")
    text = _text(system) if not isinstance(system, str) else system
    text += "\n".join(_text(m.get("content")) for m in body.get("messages", []))
    found = _WORKDIR.search(text)
    assert found, "no working directory in the request"
    return found.group(1)


def request_text(body: Json) -> str:
    """Everything a request says (system and messages), to look for the prompt in it."""
    system = body.get("system")
    parts = [_text(system) if not isinstance(system, str) else system]
    parts += [_text(m.get("content")) for m in body.get("messages", [])]
    parts += [_text(i.get("content")) for i in body.get("input", []) if isinstance(i, dict)]
    parts += [_text(c.get("parts")) for c in body.get("contents", []) if isinstance(c, dict)]
    return "\n".join(parts)
