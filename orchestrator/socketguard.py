"""The API socket's guard: every connection sends a request's headers in time, and only so many are served at once.

aiohttp restarts its keep-alive timer on every byte it receives, so a client that trickles a byte a second
(slowloris) would hold a connection, and a few hundred of them the daemon's memory, for ever. Here each
connection has `header_timeout` seconds from opening, and again from each answer, to get a request as far as
its handler (which means its headers arrived); past that it is closed. A request being handled (a `wait`, an
event stream, a chat turn) is never cut by it. Past `max_connections`, a new connection is closed at once.

Built on the public pieces only: aiohttp's low-level `Server` (the runner's protocol factory), asyncio's
`create_unix_server` and `Protocol`, and a middleware that says when a request reached its handler.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from orchestrator import logging as olog

REPORT_EVERY = 60.0
"""Seconds between two log lines about connections the guard closed (an attack must not flood the log)."""


class Guard:
    def __init__(self, header_timeout: float, max_connections: int) -> None:
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self._conns: dict[Any, _Conn] = {}
        self.closed = {"slow": 0, "full": 0}
        """Connections closed, by why: their headers were too slow, or too many were open."""
        self._reported = 0.0

    def factory(self, runner: web.AppRunner) -> Any:
        server = runner.server
        assert server is not None, "the runner is set up first"
        return lambda: _Conn(self, server())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        conn = self._conns.get(request.transport)
        if conn is not None:
            conn.busy += 1
            conn.disarm()
        try:
            return await handler(request)
        finally:
            if conn is not None:
                conn.busy -= 1
                if not conn.busy:
                    conn.arm()

    def _closed(self, why: str) -> None:
        self.closed[why] += 1
        now = time.monotonic()
        if now - self._reported >= REPORT_EVERY:
            self._reported = now
            olog.get().warning(
                olog.Event.API_CONNECTIONS_CLOSED,
                slow=self.closed["slow"],
                full=self.closed["full"],
                header_timeout=self.header_timeout,
                max_connections=self.max_connections,
            )


class _Conn(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, a deadline for its next request outside."""

    def __init__(self, guard: Guard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None
        self.busy = 0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if len(self.guard._conns) >= self.guard.max_connections:
            self.guard._closed("full")
            transport.close()
            return
        self.guard._conns[transport] = self
        self.arm()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self.guard._conns.pop(self.transport, None) is self:
            self.inner.connection_lost(exc)

    def arm(self) -> None:
        self.disarm()
        self._timer = asyncio.get_running_loop().call_later(self.guard.header_timeout, self._expire)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.busy or self.transport is None:
            return
        self.guard._closed("slow")
        self.transport.close()


async def serve(runner: web.AppRunner, path: Path, guard: Guard) -> asyncio.AbstractServer:
    """The runner's app on the UNIX socket `path`, each connection guarded."""
    return await asyncio.get_running_loop().create_unix_server(guard.factory(runner), path=str(path))
