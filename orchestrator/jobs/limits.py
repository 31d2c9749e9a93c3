"""Rate limits the runners met: by runner name, until when each lasts. A fact of the scheduler's next snapshot.

When a job's model API says it is rate- or usage-limited, that job waits (still running, its worktree and
paths kept, its slot free for a job that can run meanwhile) and its runner is marked limited until then: jobs of
that runner that have not started yet wait too (admission's `RateLimited`, with the time they start), instead of
each hitting the limit and failing or retrying on its own. When a limit runs out the scheduler is woken, so they
start by themselves. Each limit is stored before it is acted on (`Limits.set_rate_limit`), and a restarted daemon
reads back those still in force (`load`): its jobs of a limited runner wait until the limit's end, as before.
A limit read from output a job could have printed itself (a forgeable sign: aider's and codex's lines sit
among what their agent prints) rests that job only, until another job of the same runner meets one too while
the first still stands: a job cannot hold back its runner's other jobs on its own words.
What stands and what has ended is decided by `runners.ratelimit.extends`, `standing` and `corroborated` (pure).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from orchestrator.runners import ratelimit


class LimitStore(Protocol):
    async def rate_limits(self) -> dict[str, float]: ...

    async def set_rate_limit(self, runner: str, until: float) -> None: ...


class Limits:
    def __init__(self, store: LimitStore | None = None) -> None:
        self.store = store
        self._until: dict[str, float] = {}
        self._sightings: dict[str, dict[int, float]] = {}
        """Forgeable limits not yet corroborated: runner → job → the time the limit its output named ends."""
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.on_over: Callable[[], None] | None = None
        """Called when a limit runs out (the scheduler's wake)."""

    async def load(self) -> dict[str, float]:
        """The stored limits still in force (a restart's), known again with a timer each; returns them."""
        if self.store is None:
            return {}
        known = ratelimit.standing(await self.store.rate_limits(), time.time())
        for runner, until in known.items():
            self._arm(runner, until)
        return known

    async def hit(self, runner: str, until: float, *, job: int = 0, forgeable: bool = False) -> bool:
        """`runner`'s model API is limited until `until` (a UNIX time): stored, then known; a later end already
        known stands. A `forgeable` limit, seen by `job`, counts only once corroborated by another job's. Returns
        whether the runner's other jobs are held back now."""
        if forgeable:
            now = time.time()
            seen = ratelimit.standing(self._sightings.get(runner, {}), now)
            self._sightings[runner] = {**seen, job: max(until, seen.get(job, 0.0))}
            if not ratelimit.corroborated(seen, job, now):
                return runner in self.active(now)
        if not ratelimit.extends(self._until, runner, until):
            return True
        if self.store is not None:
            await self.store.set_rate_limit(runner, until)
        self._arm(runner, until)
        return True

    def active(self, now: float | None = None) -> dict[str, float]:
        """The runners still limited at `now` (default: the time now), each with the time it ends."""
        self._until = ratelimit.standing(self._until, time.time() if now is None else now)
        return dict(self._until)

    def _arm(self, runner: str, until: float) -> None:
        if not ratelimit.extends(self._until, runner, until):
            return
        self._until[runner] = until
        old = self._timers.pop(runner, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[runner] = loop.call_later(max(0.0, until - time.time()) + 0.05, self._over, runner)

    def _over(self, runner: str) -> None:
        self._timers.pop(runner, None)
        if self.on_over is not None:
            self.on_over()
