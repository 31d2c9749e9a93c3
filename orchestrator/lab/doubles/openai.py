"""A protocol double for the OpenAI chat-completions API: a local HTTP server, as aider (litellm) calls it.

`POST /v1/chat/completions` (also without `/v1`) answers from a script: each request takes the next
`Reply`, or a function of the request body (a `doubles.script.Conversations`) picks one. A reply is an
assistant message (`chat_message`: its text, e.g. aider's SEARCH/REPLACE edit blocks), an error as the API
sends one (`error_reply`: 429 with `retry-after`, 500, ...) or a slow answer. A request with
`"stream": true` gets the answer as server-sent `chat.completion.chunk` events ending with `data: [DONE]`,
with usage in the last chunk when the request asks for it (`stream_options.include_usage`).
`GET /v1/models` lists the model the test names.

A model of the protocol, not of any model: the client talks to it as to the real API (base URL
`double.url + "/v1"`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from orchestrator.lab.doubles.http import picker, serve

__all__ = ["ChatReply", "OpenAIDouble", "chat_message", "error_reply"]

_ids = itertools.count(1)


@dataclass(frozen=True)
class ChatReply:
    """One scripted answer."""

    status: int = 200
    content: str = ""
    usage: tuple[int, int] = (100, 20)
    """(prompt tokens, completion tokens)."""
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


def chat_message(content: str, *, usage: tuple[int, int] = (100, 20)) -> ChatReply:
    """An assistant answer (`finish_reason: stop`) whose text is `content`."""
    return ChatReply(content=content, usage=usage)


_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_api_key", 429: "rate_limit_exceeded", 500: "server_error"}


def error_reply(status: int, message: str = "", *, retry_after: float | None = None) -> ChatReply:
    """An error as the API sends it: `{"error": {"message", "type", "code"}}`."""
    kind = _ERROR_TYPES.get(status, "server_error")
    headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
    return ChatReply(
        status=status,
        error={"message": message or kind.replace("_", " "), "type": kind, "param": None, "code": kind},
        headers=headers,
    )


Script = Iterable[ChatReply] | Callable[[dict[str, Any]], ChatReply]


class OpenAIDouble:
    """`async with OpenAIDouble(script) as double:` serves on 127.0.0.1; base URL `double.url + "/v1"`."""

    def __init__(self, script: Script, *, models: Iterable[str] = ("gpt-double",)) -> None:
        self._pick = picker(script, error_reply(500, "protocol double: its script is used up"))
        self.models = tuple(models)
        self.requests: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> OpenAIDouble:
        app = web.Application()
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/chat/completions", self._completions)
            app.router.add_get(f"{prefix}/models", self._models)
        self._runner, self.url = await serve(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "double"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        reply = self._pick(body)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.error is not None:
            return web.json_response({"error": reply.error}, status=reply.status, headers=reply.headers)
        ident, model, created = f"chatcmpl-double-{next(_ids):06d}", body.get("model", self.models[0]), int(time.time())
        prompt, completion = reply.usage
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if not body.get("stream"):
            message = {"role": "assistant", "content": reply.content}
            choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
            completion_body = {"id": ident, "object": "chat.completion", "created": created, "model": model}
            return web.json_response({**completion_body, "choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
        await response.prepare(request)

        def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> bytes:
            event = {
                "id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra,
            }  # fmt: skip
            return f"data: {json.dumps(event)}\n\n".encode()

        await response.write(chunk({"role": "assistant", "content": ""}, None))
        text = reply.content
        for i in range(0, len(text), 40):
            await response.write(chunk({"content": text[i : i + 40]}, None))
        await response.write(chunk({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):  # the API's last chunk: no choices, the usage
            final = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model}
            await response.write(f"data: {json.dumps({**final, 'choices': [], 'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
