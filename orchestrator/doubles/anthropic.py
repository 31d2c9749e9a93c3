"""A protocol double for the Claude API: a local HTTP server speaking the real Messages API.

`POST /v1/messages` answers from a script: each request takes the next `Reply` (or a function of the
request body picks one). A reply is a real Messages API body (`text_message`, `tool_use_message`), a real
error (`error_reply`: 429 with `retry-after`, 529 `overloaded_error`, 500 `api_error`), a malformed body
(`raw`), a slow answer (`delay`, for timeouts) or a reset connection (`reset`). The double records every
request body and the most requests it had in flight at once, so tests can check prompts and bounds.

It is a model of the protocol, not of Claude: production code talks to it exactly as to the real API
(`ANTHROPIC_BASE_URL` = `double.url`). Non-streaming calls only.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

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

    def __init__(self, script: Script) -> None:
        self._pick: Callable[[dict[str, Any]], Reply]
        if callable(script):
            self._pick = script
        else:
            replies = iter(list(script))

            def pick(_: dict[str, Any]) -> Reply:
                try:
                    return next(replies)
                except StopIteration:
                    return error_reply(500, "protocol double: its script is used up")

            self._pick = pick
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> AnthropicDouble:
        app = web.Application()
        app.router.add_post("/v1/messages", self._messages)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if body.get("stream"):
                return web.json_response(
                    {"type": "error", "error": {"type": "invalid_request_error", "message": "double: no streaming"}},
                    status=400,
                )
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
            return web.Response(
                status=reply.status,
                text=json.dumps(payload),
                headers={"request-id": f"req_double_{next(_ids):06d}", **reply.headers},
                content_type="application/json",
            )
        finally:
            self.in_flight -= 1
