"""Run a protocol double in a thread of its own, so a test can drive the real daemon synchronously meanwhile."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator.doubles.anthropic import AnthropicDouble, Script


@contextmanager
def anthropic_double(script: Script) -> Iterator[AnthropicDouble]:
    """An `AnthropicDouble` serving on 127.0.0.1 from a background event loop for the `with` block."""
    loop = asyncio.new_event_loop()
    double = AnthropicDouble(script)
    ready = threading.Event()
    stop: asyncio.Event | None = None

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        async with double:
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the double did not start"
    try:
        yield double
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
