"""The local planner: local evidence (`evidence.local_plan`) with each repository's mined change history,
kept in the store and extended incrementally from the last head it was mined to."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchestrator import logging as olog
from orchestrator.core.job import Job
from orchestrator.plan.base import Plan
from orchestrator.plan.evidence import local_plan
from orchestrator.plan.history import KEEP, Change, History, mine
from orchestrator.store import Store


class Histories:
    """One `History` per repository: loaded from the store once, then extended to each new head."""

    def __init__(self, store: Store | None, keep: int = KEEP) -> None:
        self.store = store
        self.keep = keep
        self._mem: dict[str, History] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def counts(self, repo: str) -> dict[str, int]:
        """How often each file changed in the repo's mined history (empty before the first plan)."""
        history = self._mem.get(repo)
        return dict(history.count) if history is not None else {}

    async def at(self, repo: str, head: str) -> History:
        """The repo's history up to `head` (mined now where the cache stops short of it)."""
        async with self._locks.setdefault(repo, asyncio.Lock()):
            history = self._mem.get(repo)
            if history is None and self.store is not None:
                cached = await self.store.plan_history(repo)
                if cached is not None:
                    history = History((Change.from_json(row) for row in cached[1]), tip=cached[0])
            if history is not None and history.tip == head:
                self._mem[repo] = history
                return history
            since = history.tip if history is not None else None
            new, incremental = await asyncio.to_thread(mine, Path(repo), head, since, self.keep)
            if history is None or not incremental:
                history = History(new, tip=head)
            else:
                for c in new:
                    history.add(c)
                history.tip = head
                if len(history.changes) > self.keep * 2:
                    history = History(history.changes[-self.keep :], tip=head)
            self._mem[repo] = history
            if self.store is not None:
                await self.store.save_plan_history(repo, head, [c.to_json() for c in history.changes])
            olog.get(repo=repo).debug(
                olog.Event.PLAN_HISTORY, head=head, mined=len(new), incremental=incremental, kept=len(history.changes)
            )
            return history


class LocalPlanner:
    """Local evidence only: no network, always there."""

    name = "local"

    def __init__(self, histories: Histories) -> None:
        self.histories = histories

    async def plan(self, job: Job, base: str) -> Plan:
        try:
            history: History | None = await self.histories.at(job.repo, base)
        except Exception as e:  # noqa: BLE001 - co-change evidence is optional: plan without it
            olog.get(job_id=job.id, repo=job.repo).warning(
                olog.Event.PLAN_NOTE, code="Failed", reason=f"history not mined: {type(e).__name__}: {e}"
            )
            history = None
        return await asyncio.to_thread(local_plan, Path(job.repo), base, job.text, history)
