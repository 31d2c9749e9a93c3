"""The chat plane's routes on the daemon's socket.

`POST /chat/{session}` `{"text": ..., "end": false}` (`requests.ChatTurn`, as the CLI sends it; a malformed one
is a 400 saying what to send) answers NDJSON, one event a line: `ack` at once (before any store or model work:
that is the seed's *ttfa*), then `slot`, `intent`, `token`...,
`done` — or `error` with a closed `code`. A full gate queue is refused before the ack with 503, a
`Retry-After` header and `{"error", "code": "Busy", "retry_after"}`. A client that disconnects cancels
its turn, which frees its slot. `POST /chat/{session}/end` flushes the session's pending extraction.
`GET /chat/{session}` returns its history and memories; `GET /chat` the gate and plane counters.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from aiohttp import web

from orchestrator.chat.pipeline import ChatPlane, Turn
from orchestrator.requests import ChatTurn

_SESSION = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _session(request: web.Request) -> str:
    s = request.match_info["session"]
    if not _SESSION.match(s):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"bad session name {s!r}: use 1-128 letters, digits, '.', '_', ':' or '-'"}),
            content_type="application/json",
        )
    return s


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode() + b"\n"


class ChatApi:
    def __init__(self, plane: ChatPlane) -> None:
        self.plane = plane

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/chat", self.stats),
            web.post("/chat/{session}", self.turn),
            web.post("/chat/{session}/end", self.end),
            web.get("/chat/{session}", self.session),
        ]

    async def turn(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic()
        session = _session(request)
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": 'the body is not JSON: send {"text": "..."}'}, status=400)
        asked = ChatTurn.from_json(data)  # a malformed one is a BadRequest: 400, saying what to send
        refused = self.plane.busy()
        if refused is not None:
            return web.json_response(
                {"error": str(refused), "code": str(refused.code), "retry_after": refused.retry_after},
                status=503,
                headers={"Retry-After": str(int(refused.retry_after))},
            )
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        await resp.write(_line({"event": "ack", "session": session, "ttfa_s": round(time.monotonic() - received, 6)}))
        turn, q = self.plane.submit(session, asked.text.strip(), end=asked.end)
        watch = asyncio.create_task(self._watch(request, turn, q), name=f"chat-client:{session}")
        try:
            async for ev in self.plane.events(q):
                await resp.write(_line(ev))
            if not watch.done():
                await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.plane.leave(turn, q)
            raise
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        return resp

    async def _watch(self, request: web.Request, turn: Turn, q: asyncio.Queue[Any]) -> None:
        """The client's connection closed: leave the turn (aiohttp does not cancel handlers by default)."""
        while True:
            transport = request.transport
            if transport is None or transport.is_closing():
                self.plane.leave(turn, q)
                return
            await asyncio.sleep(0.05)

    async def end(self, request: web.Request) -> web.Response:
        session = _session(request)
        self.plane.end(session)
        return web.json_response({"session": session, "ended": True})

    async def session(self, request: web.Request) -> web.Response:
        session = _session(request)
        store = self.plane.store
        return web.json_response(
            {
                "session": session,
                "messages": await store.history(session, 200),
                "memories": await store.memories(session),
            }
        )

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.plane.snapshot())
