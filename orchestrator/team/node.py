"""This daemon as one node of a team: its lease, what it hears from the other nodes, and what it takes over.

Every third of `[team] lease` the node renews its lease (one row: its hold on every job it has), reopens the
notification connection if PostgreSQL dropped it, takes over the jobs of nodes whose lease ended, and stops its
own runners of jobs another node cancelled. Taking a job over:
- queued, planning, planned or running: back to the team's queue for a fresh attempt (a running job's processes
  lived on the dead node's machine; that node ends them when it restarts, as one machine does);
- landing: if an intent of its push is journaled and the remote branch contains the pushed commit, it landed
  (recorded as landed, once); otherwise it is queued for a fresh attempt (its result commit lives in the dead
  node's clone).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchestrator import logging as olog
from orchestrator.core.job import Job
from orchestrator.core.models import Code, JobState
from orchestrator.git import landing
from orchestrator.git import remote as rmt
from orchestrator.jobs.board import Board
from orchestrator.jobs.execution import Stop
from orchestrator.jobs.scheduler import Scheduler
from orchestrator.store import StoreUnreachable
from orchestrator.store.postgres import PgStore
from orchestrator.team import clones
from orchestrator.team.facts import TeamFacts

ERRORS = (StoreUnreachable, rmt.RemoteError, clones.NotShared, OSError)


class TeamNode:
    def __init__(self, store: PgStore, board: Board, scheduler: Scheduler, git_timeout: float = 120.0) -> None:
        self.store = store
        self.board = board
        self.scheduler = scheduler
        self.git_timeout = git_timeout
        self.every = store.team.lease / 3
        self._task: asyncio.Task[None] | None = None
        self._heard: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.store.team.listen(self._foreign)
        olog.get().info(
            olog.Event.TEAM_JOINED, node=self.store.node, labels=list(self.store.team.labels),
            lease=self.store.team.lease,
            store=str(self.store.path),
        )  # fmt: skip
        self._task = asyncio.create_task(self._loop(), name="team-node")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._heard) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _foreign(self, ids: set[int]) -> None:
        """Another node changed jobs: waiters, watchers and the scheduler hear it (in a task this node owns)."""
        task = asyncio.create_task(self._heard_of(ids), name="team-heard")
        self._heard.add(task)
        task.add_done_callback(self._heard.discard)

    async def _heard_of(self, ids: set[int]) -> None:
        if self.store.team.remote_moved and isinstance(self.scheduler.facts, TeamFacts):
            self.store.team.remote_moved = False
            self.scheduler.facts.forget()
        try:
            await self.board.foreign(ids)
        except ERRORS as e:  # the next notification, or the next beat, reads it again
            olog.get().warning(olog.Event.TEAM_STORE_LOST, error=f"{type(e).__name__}: {e}")

    async def _loop(self) -> None:
        while True:
            try:
                await self.beat()
            except ERRORS as e:
                olog.get().warning(olog.Event.TEAM_STORE_LOST, error=f"{type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 - a bad beat must not end the node's lease renewals
                olog.get().error(olog.Event.SCHEDULER_ERROR, error=f"{type(e).__name__}: {e}", exc_info=True)
            await asyncio.sleep(self.every)

    async def beat(self) -> None:
        """One renewal: the lease, the notification connection, lapsed jobs taken over, cancels from elsewhere."""
        await self.store.team.renew()
        await self.store.team.relisten()
        for job in await self.store.team.lapsed():
            await self.take_over(job)
        await self._cancelled_elsewhere()

    async def take_over(self, job: Job) -> bool:
        landed = await self._landed(job) if job.state is JobState.LANDING else None
        done = await self.board.take_over(job, landed=landed)
        if done is not None:
            olog.get(job_id=job.id, repo=job.repo).warning(
                olog.Event.TEAM_TAKEOVER, node=job.node, was=str(job.state), now=str(done.state), landed=landed
            )
        return done is not None

    async def _landed(self, job: Job) -> str | None:
        """The commit a dead node's push of this job put on the remote, if its journal says it tried and the remote
        branch holds it."""
        intents = await self.store.journal.remote(job.id)
        if not intents:
            return None
        remote = await asyncio.to_thread(clones.remote_of, job.repo, job.branch)
        tip = await asyncio.to_thread(rmt.fetch, Path(job.repo), remote, timeout=self.git_timeout)  # once for all
        for intent in reversed(intents):
            if tip is not None and await asyncio.to_thread(landing.contains, Path(job.repo), tip, intent.new):
                return intent.new
        return None

    async def _cancelled_elsewhere(self) -> None:
        running = list(self.scheduler.running)
        if not running:
            return
        for job in await self.store.jobs.many(running):
            if job.state is JobState.CANCELLED and job.id in self.scheduler.running:
                olog.get(job_id=job.id, repo=job.repo).info(olog.Event.TEAM_CANCELLED_ELSEWHERE, state=str(job.state))
                # Its state is written already; the stop's own write (expecting `running`) backs off.
                await self.scheduler.stop_job(job.id, Stop(JobState.CANCELLED, job.reason, Code.CANCELLED))
