"""The local planner: local evidence (`evidence.local_plan`) with each repository's mined change history
(kept in the store and extended incrementally from the last head it was mined to) and its record (the
planner replayed on its past changes, `plan.record`: refitted as the history grows)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator import logging as olog
from orchestrator.core.job import Job
from orchestrator.plan import record
from orchestrator.plan.accuracy import Settled
from orchestrator.plan.base import Plan
from orchestrator.plan.evidence import local_plan
from orchestrator.plan.history import KEEP, Change, History, mine
from orchestrator.plan.score import Calibration
from orchestrator.store import Store

REFIT = record.REBUILD
"""New changes in a repository's history after which its record is replayed and fitted again."""


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
                cached = await self.store.plans.history(repo)
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
                await self.store.plans.save_history(repo, head, [c.to_json() for c in history.changes])
            olog.get(repo=repo).debug(
                olog.Event.PLAN_HISTORY, head=head, mined=len(new), incremental=incremental, kept=len(history.changes)
            )
            return history


class Records:
    """One calibration per repository, fitted on its record: built off the event loop (a thread), kept in the store
    (a restarted daemon does not replay it again), built again once `refit` new changes arrived, and kept current
    between by the daemon's own outcomes (`observe`: the pairs it ran side by side)."""

    def __init__(self, ignore: tuple[str, ...] = (), refit: int = REFIT, store: Store | None = None) -> None:
        self.ignore = ignore
        self.refit = refit
        self.store = store
        self._fitted: dict[str, tuple[str, Calibration | None]] = {}
        """repo → (the newest change fitted on, the record's calibration)."""
        self._outcomes: dict[str, list[Settled]] = {}
        self._current: dict[str, tuple[int, Calibration | None]] = {}
        """repo → (outcomes refit on, the calibration refit on them)."""
        self._locks: dict[str, asyncio.Lock] = {}

    def observe(self, by_repo: Mapping[str, Sequence[Settled]]) -> None:
        """The pairs the daemon ran side by side that have settled, per repository (every one so far)."""
        self._outcomes = {repo: list(got) for repo, got in by_repo.items()}

    async def at(self, repo: str, history: History) -> Calibration | None:
        """The repository's calibration (None: its record is too short to tell)."""
        async with self._locks.setdefault(repo, asyncio.Lock()):
            newest = history.changes[-1].sha if history.changes else ""
            hit = self._fitted.get(repo) or await self._stored(repo)
            if hit is None or (hit[0] != newest and _since(history, hit[0]) >= self.refit):
                hit = newest, await self._build(repo, history)
                self._current.pop(repo, None)
            self._fitted[repo] = hit
        calibration, outcomes = hit[1], self._outcomes.get(repo, [])
        if calibration is None or not outcomes:
            return calibration
        done = self._current.get(repo)
        if done is None or done[0] != len(outcomes):
            done = len(outcomes), record.refit(calibration, outcomes)
            self._current[repo] = done
            olog.get(repo=repo).info(
                olog.Event.PLAN_RECORD,
                outcomes=len(outcomes),
                calibration=done[1].to_json() if done[1] is not None else None,
                reason="risk refitted on the pairs the daemon ran side by side",
            )
        return done[1]

    async def _build(self, repo: str, history: History) -> Calibration | None:
        changes = list(history.changes)
        calibration = await asyncio.to_thread(record.build, Path(repo), changes, self.ignore, history.tip)
        olog.get(repo=repo).info(
            olog.Event.PLAN_RECORD,
            replayed=min(len(changes), record.REPLAY),
            calibration=calibration.to_json() if calibration is not None else None,
            reason=(
                "record too short: risk unknown"
                if calibration is None
                else calibration.unknown or "risk estimated from the replayed changes"
            ),
        )
        if self.store is not None:
            newest = changes[-1].sha if changes else ""
            await self.store.plans.save_record(repo, newest, calibration.dump() if calibration is not None else None)
        return calibration

    async def _stored(self, repo: str) -> tuple[str, Calibration | None] | None:
        """The record the store keeps for `repo` (None: none, or one this version cannot read: it is built again)."""
        if self.store is None:
            return None
        row = await self.store.plans.record(repo)
        if row is None:
            return None
        newest, data = row
        try:
            return newest, Calibration.load(data) if data is not None else None
        except (KeyError, ValueError, TypeError, IndexError) as e:
            olog.get(repo=repo).warning(olog.Event.PLAN_NOTE, code="Failed", reason=f"stored record unreadable: {e}")
            return None


def _since(history: History, sha: str) -> int:
    """How many of the history's changes come after `sha` (all of them when it is not there)."""
    for n, c in enumerate(reversed(history.changes)):
        if c.sha == sha:
            return n
    return len(history.changes)


class LocalPlanner:
    """Local evidence only: no network, always there."""

    name = "local"

    def __init__(self, histories: Histories, records: Records | None = None) -> None:
        self.histories = histories
        self.records = records if records is not None else Records()

    def observe(self, by_repo: Mapping[str, Sequence[Settled]]) -> None:
        """The pairs the daemon ran side by side that have settled (`Records.observe`)."""
        self.records.observe(by_repo)

    async def plan(self, job: Job, base: str) -> Plan:
        log = olog.get(job_id=job.id, repo=job.repo)
        calibration: Calibration | None = None
        try:
            history: History | None = await self.histories.at(job.repo, base)
        except Exception as e:  # noqa: BLE001 - co-change evidence is optional: plan without it
            log.warning(olog.Event.PLAN_NOTE, code="Failed", reason=f"history not mined: {type(e).__name__}: {e}")
            history = None
        if history is not None:
            try:
                calibration = await self.records.at(job.repo, history)
            except Exception as e:  # noqa: BLE001 - without a record the risk is unknown: the job runs alone
                log.warning(olog.Event.PLAN_NOTE, code="Failed", reason=f"record not replayed: {type(e).__name__}: {e}")
        ignore = self.records.ignore
        return await asyncio.to_thread(local_plan, Path(job.repo), base, job.text, history, ignore, calibration)
