"""A protocol double for the OpenAI Responses API: a local HTTP server, as the codex CLI calls it.

`POST /v1/responses` (also without `/v1`) answers from a script: each request takes the next `ResponseReply`,
or a function of the request body (a `doubles.script.Conversations`) picks one. A reply is a function call
(`function_call`, e.g. codex's `exec_command` with a shell command: `exec_command`), an assistant message
(`output_message`), an error as the API sends one (`error_reply`: 429 with `retry-after`, 500, ...) or a slow
answer. A request with `"stream": true` (codex always streams) gets the answer as server-sent events, each
`event: <type>` with its JSON: `response.created`, `response.in_progress`, `response.output_item.added`, the
text's `response.output_text.delta`s or the call's `response.function_call_arguments.delta`, then
`response.output_item.done` and `response.completed` with the usage.

A script sees the request as a conversation of messages (`messages`, beside the Responses fields): each input
message keeps its role and text, a `function_call` item counts as an assistant message and its
`function_call_output` as a user message holding the output, so `Conversations` routes and steps codex's
requests as it does the chat APIs'. A model of the protocol, not of any model: the client talks to it as to the
real API (base URL `double.url + "/v1"`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from orchestrator.lab.doubles.http import picker, serve

__all__ = ["ResponseReply", "ResponsesDouble", "error_reply", "exec_command", "function_call", "output_message"]

_ids = itertools.count(1)


@dataclass(frozen=True)
class ResponseReply:
    """One scripted answer: a message's text, or a function call (`call`: name and arguments)."""

    status: int = 200
    text: str = ""
    call: tuple[str, dict[str, Any]] | None = None
    usage: tuple[int, int] = (100, 20)
    """(input tokens, output tokens)."""
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


def output_message(text: str, *, usage: tuple[int, int] = (100, 20)) -> ResponseReply:
    """An assistant message whose text is `text` (the turn ends with it)."""
    return ResponseReply(text=text, usage=usage)


def function_call(name: str, arguments: dict[str, Any], *, usage: tuple[int, int] = (100, 20)) -> ResponseReply:
    """A call of the client's tool `name` with `arguments` (sent as their JSON text, as the API does)."""
    return ResponseReply(call=(name, arguments), usage=usage)


def exec_command(cmd: str) -> ResponseReply:
    """codex's shell tool: run `cmd` in its working directory."""
    return function_call("exec_command", {"cmd": cmd})


_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_api_key", 429: "rate_limit_exceeded", 500: "server_error"}


def error_reply(status: int, message: str = "", *, retry_after: float | None = None) -> ResponseReply:
    """An error as the API sends it: `{"error": {"message", "type", "code"}}`."""
    kind = _ERROR_TYPES.get(status, "server_error")
    headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
    return ResponseReply(
        status=status,
        error={"message": message or kind.replace("_", " "), "type": kind, "param": None, "code": kind},
        headers=headers,
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        str(part.get("text", "")) for part in content or [] if isinstance(part, Mapping) and "text" in part
    )


def as_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's `input` as chat messages: a function call is the assistant's turn, its output the user's."""
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for item in items or []:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role", "user"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            out.append({"role": "assistant", "content": f"{item.get('name')}({item.get('arguments')})"})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "user", "content": output if isinstance(output, str) else json.dumps(output)})
    return out


Script = Iterable[ResponseReply] | Callable[[dict[str, Any]], ResponseReply]


class ResponsesDouble:
    """`async with ResponsesDouble(script) as double:` serves on 127.0.0.1; base URL `double.url + "/v1"`."""

    def __init__(self, script: Script) -> None:
        self._pick = picker(script, error_reply(500, "protocol double: its script is used up"))
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> ResponsesDouble:
        app = web.Application()
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/responses", self._responses)
        self._runner, self.url = await serve(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        reply = self._pick({**body, "messages": as_messages(body)})
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.error is not None:
            return web.json_response({"error": reply.error}, status=reply.status, headers=reply.headers)
        n = next(_ids)
        rid, model, created = f"resp_double_{n:06d}", body.get("model", "gpt-double"), int(time.time())
        item: dict[str, Any]
        if reply.call is not None:
            name, arguments = reply.call
            item = {"type": "function_call", "id": f"fc_double_{n:06d}", "call_id": f"call_double_{n:06d}",
                    "name": name, "arguments": json.dumps(arguments), "status": "completed"}  # fmt: skip
        else:
            part = {"type": "output_text", "text": reply.text, "annotations": []}
            item = {"type": "message", "id": f"msg_double_{n:06d}", "role": "assistant", "status": "completed",
                    "content": [part]}  # fmt: skip
        used_in, used_out = reply.usage
        usage = {
            "input_tokens": used_in, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": used_out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": used_in + used_out,
        }  # fmt: skip
        shell = {"id": rid, "object": "response", "created_at": created, "model": model, "output": []}
        done = {**shell, "status": "completed", "output": [item], "usage": usage}
        if not body.get("stream"):
            return web.json_response(done)
        response = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
        await response.prepare(request)
        seq = itertools.count()

        async def send(kind: str, **data: Any) -> None:
            event = {"type": kind, "sequence_number": next(seq), **data}
            await response.write(f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode())

        await send("response.created", response={**shell, "status": "in_progress"})
        await send("response.in_progress", response={**shell, "status": "in_progress"})
        started = {**item, "status": "in_progress"}
        if item["type"] == "function_call":
            await send("response.output_item.added", output_index=0, item={**started, "arguments": ""})
            await send("response.function_call_arguments.delta", output_index=0, item_id=item["id"],
                       delta=item["arguments"])  # fmt: skip
            await send("response.function_call_arguments.done", output_index=0, item_id=item["id"],
                       arguments=item["arguments"])  # fmt: skip
        else:
            await send("response.output_item.added", output_index=0, item={**started, "content": []})
            for i in range(0, len(reply.text), 40):
                await send("response.output_text.delta", output_index=0, content_index=0, item_id=item["id"],
                           delta=reply.text[i : i + 40])  # fmt: skip
        await send("response.output_item.done", output_index=0, item=item)
        await send("response.completed", response=done)
        await response.write_eof()
        return response
