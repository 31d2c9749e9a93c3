"""What every model API double shares: a script of replies, and a local aiohttp server on a free port."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from aiohttp import web

R = TypeVar("R")


def picker(script: Iterable[R] | Callable[[dict[str, Any]], R], used_up: R) -> Callable[[dict[str, Any]], R]:
    """The reply to each request: `script(body)` when it is a function, else its replies in turn, then `used_up`."""
    if callable(script):
        return script
    replies = iter(list(script))
    return lambda _body: next(replies, used_up)


async def serve(app: web.Application, port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `app` on 127.0.0.1 at `port` (0: a free one); the runner (to clean up) and the base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server = site._server
    assert server is not None and server.sockets  # type: ignore[attr-defined]
    return runner, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"  # type: ignore[attr-defined]
