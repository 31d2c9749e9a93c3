"""A protocol double for the Claude API: a local HTTP server speaking the real Messages API.

`POST /v1/messages` answers from a script: each request takes the next `Reply` (or a function of the
request body picks one). A reply is a real Messages API body (`text_message`, `tool_use_message`), a real
error (`error_reply`: 429 with `retry-after`, 529 `overloaded_error`, 500 `api_error`), a malformed body
(`raw`), a slow answer (`delay`, for timeouts) or a reset connection (`reset`). The double records every
request body and the most requests it had in flight at once, so tests can check prompts and bounds.

A request with `"stream": true` (as Claude Code sends every call) gets the same scripted reply as
server-sent events, exactly as the API streams it: `message_start`, per block `content_block_start`,
deltas (`text_delta`, `input_json_delta`) and `content_block_stop`, then `message_delta` with the stop
reason and usage, and `message_stop`; an error reply stays a plain HTTP error, as the API sends one before
a stream starts. `/v1/messages/count_tokens` and the `/api/hello` reachability probe are answered too.

It is a model of the protocol, not of Claude: production code talks to it exactly as to the real API
(`ANTHROPIC_BASE_URL` = `double.url`). `orchestrator.lab.doubles.script` scripts a whole agent conversation
(which tool calls the "model" makes, turn by turn) on top of it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from orchestrator.lab.doubles.http import picker, serve

__all__ = ["AnthropicDouble", "Reply", "error_reply", "text_message", "tool_use_message"]

_ids = itertools.count(1)


@dataclass(frozen=True)
class Reply:
    """One scripted answer."""

    status: int = 200
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    """Seconds to wait before answering (a slow model, or a client timeout)."""
    raw: bytes | None = None
    """Sent as the body instead of `body` (malformed output)."""
    reset: bool = False
    """Close the connection without answering."""


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _message(content: list[dict[str, Any]], stop_reason: str, model: str, usage: tuple[int, int]) -> dict[str, Any]:
    return {
        "id": f"msg_double_{next(_ids):06d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": _usage(*usage),
    }


def text_message(text: str, *, model: str = "claude-double", usage: tuple[int, int] = (100, 20)) -> Reply:
    """A final assistant answer (`stop_reason: end_turn`)."""
    return Reply(body=_message([{"type": "text", "text": text}], "end_turn", model, usage))


def tool_use_message(
    name: str,
    tool_input: dict[str, Any],
    *,
    text: str = "",
    more: Iterable[tuple[str, dict[str, Any]]] = (),
    model: str = "claude-double",
    usage: tuple[int, int] = (100, 20),
) -> Reply:
    """An answer that calls tool `name` with `tool_input` (and any `more` calls), `stop_reason: tool_use`."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for n, (tool, args) in enumerate(((name, tool_input), *more)):
        content.append({"type": "tool_use", "id": f"toolu_double_{next(_ids):06d}_{n}", "name": tool, "input": args})
    return Reply(body=_message(content, "tool_use", model, usage))


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def error_reply(status: int, message: str = "", *, retry_after: float | None = None) -> Reply:
    """An error exactly as the API sends it: `{"type": "error", "error": {"type", "message"}}`."""
    kind = _ERROR_TYPES.get(status, "api_error")
    headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
    return Reply(
        status=status,
        body={"type": "error", "error": {"type": kind, "message": message or kind.replace("_", " ")}},
        headers=headers,
    )


Script = Iterable[Reply] | Callable[[dict[str, Any]], Reply]


class AnthropicDouble:
    """`async with AnthropicDouble(script) as double:` serves on 127.0.0.1 at `double.url`."""

    def __init__(self, script: Script, port: int = 0) -> None:
        self._pick = picker(script, error_reply(500, "protocol double: its script is used up"))
        self.port = port
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        """Each request's headers (`x-api-key`, `anthropic-beta`, ...), in the order of `requests`."""
        self.in_flight = 0
        self.peak_in_flight = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> AnthropicDouble:
        app = web.Application()
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_route("*", "/api/hello", self._hello)
        self._runner, self.url = await serve(app, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            reply = self._pick(body)
            if reply.delay:
                await asyncio.sleep(reply.delay)
            if reply.reset:
                assert request.transport is not None
                request.transport.abort()
                return web.Response(status=500)  # never reaches the client: the connection is gone
            if reply.raw is not None:
                return web.Response(
                    status=reply.status, body=reply.raw, headers=reply.headers, content_type="application/json"
                )
            payload = dict(reply.body or {})
            if reply.status == 200 and "model" in payload and body.get("model"):
                payload["model"] = body["model"]
            if body.get("stream") and reply.status == 200:
                return await self._stream(request, payload)
            return web.Response(
                status=reply.status,
                text=json.dumps(payload),
                headers={"request-id": _request_id(), **reply.headers},
                content_type="application/json",
            )
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, message: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"content-type": "text/event-stream", "cache-control": "no-cache", "request-id": _request_id()}
        )
        await response.prepare(request)
        for event in stream_events(message):
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        await response.write_eof()
        return response

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"input_tokens": max(1, len(json.dumps(body)) // 4)})

    async def _hello(self, request: web.Request) -> web.Response:
        return web.Response(status=200)


def _request_id() -> str:
    return f"req_double_{next(_ids):06d}"


def stream_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A complete message as the API's stream of events: what a streaming client puts back together."""
    usage = dict(message.get("usage") or _usage(0, 0))
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": 1}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    for index, block in enumerate(message.get("content") or []):
        if block.get("type") == "tool_use":
            opened = {**block, "input": {}}
            pieces = _chunks(json.dumps(block["input"]))
            deltas = [{"type": "input_json_delta", "partial_json": part} for part in pieces]
        elif block.get("type") == "text":
            opened = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": part} for part in _chunks(block.get("text", ""))]
        else:
            opened, deltas = block, []
        events.append({"type": "content_block_start", "index": index, "content_block": opened})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")},
            "usage": {"output_tokens": usage.get("output_tokens", 0)},
        }
    )
    events.append({"type": "message_stop"})
    return events


def _chunks(text: str, size: int = 40) -> list[str]:
    """A text cut into the small pieces a stream delivers (at least one piece, so a block is never empty)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]
