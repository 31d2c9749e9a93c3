"""Run a protocol double in a thread of its own, so a test can drive the real daemon synchronously meanwhile."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, TypeVar

from orchestrator.lab.doubles.anthropic import AnthropicDouble, Script
from orchestrator.lab.doubles.openai import OpenAIDouble
from orchestrator.lab.doubles.openai import Script as ChatScript
from orchestrator.lab.doubles.responses import ResponsesDouble
from orchestrator.lab.doubles.responses import Script as ResponsesScript

D = TypeVar("D", bound="AbstractAsyncContextManager[Any]")


@contextmanager
def anthropic_double(script: Script) -> Iterator[AnthropicDouble]:
    """An `AnthropicDouble` serving on 127.0.0.1 from a background event loop for the `with` block."""
    with served(AnthropicDouble(script)) as double:
        yield double


@contextmanager
def openai_double(script: ChatScript, models: tuple[str, ...] = ("gpt-double",)) -> Iterator[OpenAIDouble]:
    """An `OpenAIDouble` (chat completions) serving on 127.0.0.1 for the `with` block."""
    with served(OpenAIDouble(script, models=models)) as double:
        yield double


@contextmanager
def responses_double(script: ResponsesScript) -> Iterator[ResponsesDouble]:
    """A `ResponsesDouble` (the Responses API, as codex calls it) serving on 127.0.0.1 for the `with` block."""
    with served(ResponsesDouble(script)) as double:
        yield double


@contextmanager
def served(double: D) -> Iterator[D]:
    """Any protocol double, entered on a background event loop of its own for the `with` block."""
    loop = asyncio.new_event_loop()
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
