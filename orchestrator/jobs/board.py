"""The job board: every job state change goes through here, so it is stored first, then announced.

Storing before acting is what lets a killed daemon restart where it was; announcing wakes the scheduler
(event-driven, no polling) and anyone waiting on a job (`orchestrator wait`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from orchestrator.core.job import Job
from orchestrator.store import Store


class Board:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._changed = asyncio.Condition()
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, wake: Callable[[], None]) -> None:
        """Call `wake` (cheap, synchronous) after every change: the scheduler, the service status line."""
        self._listeners.append(wake)

    async def update(
        self, job_id: int, *, event: str | None = None, data: dict[str, Any] | None = None, **fields: Any
    ) -> Job:
        job = await self.store.update(job_id, event=event, data=data, **fields)
        await self.announce()
        return job

    async def announce(self) -> None:
        for wake in self._listeners:
            wake()
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[[], Any], timeout: float | None) -> bool:
        """Wait until `await predicate()` is truthy or the timeout passes; True if it came true."""

        async def _loop() -> None:
            async with self._changed:
                while not await predicate():
                    await self._changed.wait()

        try:
            await asyncio.wait_for(_loop(), timeout)
        except TimeoutError:
            return False
        return True
