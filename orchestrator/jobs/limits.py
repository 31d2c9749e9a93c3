"""Rate limits the runners met: by runner name, until when each lasts. A fact of the scheduler's next snapshot.

When a job's model API says it is rate- or usage-limited, that job waits (still running, its worktree and
paths kept) and its runner is marked limited until then: jobs of that runner that have not started yet wait
too (admission's `RateLimited`, with the time they start), instead of each hitting the limit and failing or
retrying on its own. When a limit runs out the scheduler is woken, so they start by themselves. Kept in
memory: after a restart a job meets the limit once more, and waits again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Limits:
    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.on_over: Callable[[], None] | None = None
        """Called when a limit runs out (the scheduler's wake)."""

    def hit(self, runner: str, until: float) -> None:
        """`runner`'s model API is limited until `until` (a UNIX time); a later end already known stands."""
        if until <= self._until.get(runner, 0.0):
            return
        self._until[runner] = until
        old = self._timers.pop(runner, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[runner] = loop.call_later(max(0.0, until - time.time()) + 0.05, self._over, runner)

    def active(self, now: float | None = None) -> dict[str, float]:
        """The runners still limited at `now` (default: the time now), each with the time it ends."""
        at = time.time() if now is None else now
        for runner in [r for r, t in self._until.items() if t <= at]:
            del self._until[runner]
        return dict(self._until)

    def _over(self, runner: str) -> None:
        self._timers.pop(runner, None)
        if self.on_over is not None:
            self.on_over()
