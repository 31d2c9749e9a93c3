"""The git facts of a round in team mode: a target branch's head is the shared remote's tip, not the clone's.

`heads` fetches each (repo, branch) it is asked for into the clone's own tracking ref (`git.remote.fetch`), at
most once every `REFRESH` seconds per branch, and at once after another node landed; in between, and while
this node lands onto that branch (the lander fetches itself), it reads the tip last fetched. The rest (`moved`,
`mergeable`) reads the clone's object store as on one machine: every fetched tip is in it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from pathlib import Path

from orchestrator import logging as olog
from orchestrator.config import Config
from orchestrator.git import remote as rmt
from orchestrator.jobs.facts import GitFacts
from orchestrator.team import clones

REFRESH = 5.0
"""Seconds a fetched tip is used before the remote is asked again. Another node's landing makes the next round
ask at once (`forget`, on its notification); this is for pushes from outside the team."""


class Fetches:
    """One fetch at a time per clone: a round's and a landing's fetches write the same tracking ref."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, repo: str) -> asyncio.Lock:
        return self._locks.setdefault(repo, asyncio.Lock())


class TeamFacts(GitFacts):
    def __init__(self, cfg: Config, fetches: Fetches) -> None:
        super().__init__(cfg)
        self.fetches = fetches
        self._at: dict[tuple[str, str], float] = {}
        self._tips: dict[tuple[str, str], str | None] = {}
        self._said: dict[tuple[str, str], str] = {}

    def forget(self) -> None:
        """Another node changed jobs (it may have landed): the next round asks the remote again."""
        self._at.clear()

    async def heads(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
        """Each (repo, branch)'s tip on the shared remote; None where it cannot be known. The repositories are
        asked at once (one clone's branches in turn, under its lock): a slow remote costs the round its own
        time, not the sum of every remote's."""
        wanted = list(dict.fromkeys(keys))
        tips = await asyncio.gather(*(self._tip(*key) for key in wanted))
        return dict(zip(wanted, tips, strict=True))

    async def _tip(self, repo: str, branch: str) -> str | None:
        key = (repo, branch)
        lock = self.fetches.lock(repo)
        fresh = time.monotonic() - self._at.get(key, -REFRESH) < REFRESH
        if key in self._tips and (fresh or lock.locked()):
            # The tip last fetched, or pushed by this node's own landing since (it moves the same ref).
            remote = await asyncio.to_thread(clones.remote_of, repo, branch)
            return await asyncio.to_thread(rmt.tracked, Path(repo), remote) or self._tips[key]
        async with lock:
            try:
                remote = await asyncio.to_thread(clones.remote_of, repo, branch)
                tip = await asyncio.to_thread(rmt.fetch, Path(repo), remote, timeout=self.cfg.team.git_timeout)
            except (clones.NotShared, rmt.RemoteError) as e:
                # The tip last fetched stands in until the remote answers again; said once per cause.
                if self._said.get(key) != str(e):
                    self._said[key] = str(e)
                    olog.get(repo=repo).warning(olog.Event.SCHEDULER_ERROR, error=str(e))
                tip = self._tips.get(key)
            else:
                self._said.pop(key, None)
        self._tips[key], self._at[key] = tip, time.monotonic()
        return tip
