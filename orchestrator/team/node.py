"""This daemon as one node of a team: its lease, what it hears from the other nodes, and what it takes over.

The lease is renewed from a thread of its own (`team.lease`): a busy event loop never lets it lapse. Every third
of `[team] lease` the node reopens the notification connection if PostgreSQL dropped it, stops at once its own
runners of jobs it no longer holds (taken over while it could not renew, or cancelled from another node), and,
once its own renewals have gone through for a whole lease, takes over the jobs of nodes whose lease ended:
- queued, planning, planned or running: back to the team's queue for a fresh attempt (a running job's processes
  lived on that node's machine; it stops them as soon as it hears, or ends them when it restarts);
- landing: if an intent of its push is journaled and the remote branch contains the pushed commit, it landed
  (recorded as landed, once); otherwise it is queued for a fresh attempt (its result commit lives in the other
  node's clone). Should the other node's push land after all, the fresh attempt finds it there and lands
  nothing again (`git.landing`: a remote head holding the job's commit already).
A job changes holder with its epoch: whatever an attempt that lost its job still tries to write (its end, its
push) is refused by the store (`store.postgres`), so a job is worked on at most one node at a time.
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
from orchestrator.team.lease import LeaseKeeper

ERRORS = (StoreUnreachable, rmt.RemoteError, clones.NotShared, OSError)


class TeamNode:
    def __init__(
        self,
        store: PgStore,
        board: Board,
        scheduler: Scheduler,
        git_timeout: float = 120.0,
        keeper: LeaseKeeper | None = None,
    ) -> None:
        self.store = store
        self.board = board
        self.scheduler = scheduler
        self.git_timeout = git_timeout
        self.every = store.team.lease / 3
        self.keeper = keeper or LeaseKeeper(store.url, store.node, store.team.lease)
        self._task: asyncio.Task[None] | None = None
        self._heard: set[asyncio.Task[None]] = set()
        self._stopping: set[int] = set()
        """Jobs whose runner is being stopped here (a beat and a notification may both find one lost)."""

    async def start(self) -> None:
        await asyncio.to_thread(self.keeper.start)
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
        await asyncio.to_thread(self.keeper.stop)

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
            # A job this node runs that another node changed (or, after a reconnection, any: what changed is
            # unknown) may be lost to it: stopped at once, not at the next beat.
            if not ids or ids & set(self.scheduler.running):
                await self._stop_lost()
            await self.board.foreign(ids)
        except ERRORS as e:  # the next notification, or the next beat, reads it again
            olog.get().warning(olog.Event.TEAM_STORE_LOST, error=f"{type(e).__name__}: {e}")

    async def _loop(self) -> None:
        while True:
            try:
                await self.beat()
            except ERRORS as e:
                olog.get().warning(olog.Event.TEAM_STORE_LOST, error=f"{type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 - a bad beat must not end the node's beats
                olog.get().error(olog.Event.SCHEDULER_ERROR, error=f"{type(e).__name__}: {e}", exc_info=True)
            await asyncio.sleep(self.every)

    async def beat(self) -> None:
        """One beat: the notification connection, this node's lost jobs stopped, lapsed jobs taken over."""
        await self.store.team.relisten()
        await self._stop_lost()
        if self.keeper.steady_for() < self.store.team.lease:
            return  # this node was cut off itself not long ago: others may not have renewed yet either
        for job in await self.store.team.lapsed():
            await self.take_over(job)  # each announced by the board

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

    async def _stop_lost(self) -> None:
        """Stop at once the runner of every job this node runs that it no longer holds at its epoch (taken over
        while it could not renew) or that another node cancelled. Nothing of the stopped attempt is written (the
        epoch fences its writes); its workspace is kept, and a later claim of the job here rebuilds it, the
        attempt's work kept on its branch (`jobs.retire`)."""
        running = [i for i in self.scheduler.running if i not in self._stopping]
        for job_id, job in (await self.store.team.lost(running)).items():
            if job_id not in self.scheduler.running or job_id in self._stopping:
                continue
            log = olog.get(job_id=job_id, repo=job.repo)
            if job.state is JobState.CANCELLED:
                log.info(olog.Event.TEAM_CANCELLED_ELSEWHERE, state=str(job.state))
                stop = Stop(JobState.CANCELLED, job.reason, Code.CANCELLED)
            else:
                log.warning(olog.Event.TEAM_TAKEOVER, node=job.node, now=str(job.state), lost=True)
                stop = Stop(JobState.INTERRUPTED, f"this node lost the job (now {job.state}, held by "
                            f"{job.node or 'nobody'}); its runner was stopped here", Code.INTERRUPTED)  # fmt: skip
            self._stopping.add(job_id)
            try:
                await self.scheduler.stop_job(job_id, stop)
            finally:
                self._stopping.discard(job_id)
