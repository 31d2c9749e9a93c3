"""The landing queue in team mode: a job lands on the team's shared remote (`git.remote.land`), not on a branch of
this node's clone.

The lander's queue, its outcomes and what happens after each (`core.lifecycle.after_landing`) are the ones of
`jobs.landing.Lander`; only the attempt differs:
- one landing at a time per (remote, branch) across the team: the attempt holds the team's landing lock
  (`PgStore.landing_lock`, an advisory lock that dies with the node's connection);
- fetch the remote tip, merge in memory, run the landing check on the result, and push with
  `--force-with-lease` as the compare-and-swap; a lost race fetches and tries again;
- the push is fenced: right before it, the node must still hold the job (a node whose lease ended and was
  taken over never pushes), and each push's intent is journaled in the shared store, so a node that takes the
  job over can tell whether it reached the remote (`TeamNode`);
- the node's own clone is updated only with `[team] follow = true`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pygit2
import structlog

from orchestrator.core.job import Job
from orchestrator.core.lifecycle import Then
from orchestrator.git import commits, repos
from orchestrator.git import remote as rmt
from orchestrator.git.outcomes import LandResult
from orchestrator.jobs.landing import Lander
from orchestrator.jobs.recovery import StoreJournal
from orchestrator.store.postgres import PgStore
from orchestrator.team import clones
from orchestrator.team.facts import Fetches


class TeamLander(Lander):
    def __init__(self, *args: Any, fetches: Fetches, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fetches = fetches
        """Shared with the round's `TeamFacts`: one fetch at a time per clone."""

    @property
    def team_store(self) -> PgStore:
        store = self.board.store
        assert isinstance(store, PgStore)
        return store

    async def _attempt(self, job: Job, log: structlog.typing.FilteringBoundLogger) -> Then:
        # Landed as stored now, and only as sealed: a job taken over by another node, or moved on, lands nothing of
        # this attempt; one whose order was changed, or whose review no node approved, is failed and never lands.
        held = await self.team_store.team.landable(job.id)
        if held is None:
            await self.board.foreign({job.id})
            return Then.END
        return await super()._attempt(held, log)

    async def _publish(self, job: Job) -> None:
        worktree = str(self.pool.path_for(Path(job.repo), job.id)) if job.worktree else None
        await asyncio.to_thread(_own_result, Path(job.repo), worktree, job)
        await super()._publish(job)

    async def _git_land(self, job: Job) -> LandResult:
        assert job.result is not None
        remote = await asyncio.to_thread(clones.remote_of, job.repo, job.branch)
        store = self.team_store

        async def fence() -> bool:
            return await store.team.holds(job.id)

        team = self.cfg.team
        async with store.team.landing_lock(remote.key), self.fetches.lock(job.repo):
            return await rmt.land(
                Path(job.repo),
                remote,
                job.result,
                fence=fence,
                publisher=rmt.PUBLISHERS[team.publish](team.git_timeout),
                journal=StoreJournal(store, asyncio.get_running_loop()),
                follow=team.follow,
                checkout_journal=StoreJournal(store, asyncio.get_running_loop()),
                timeout=team.git_timeout,
                **self._landing(job),
            )


class NotItsResult(RuntimeError):
    """The result the shared store names for a job is no commit this node made of that job's files."""


def _own_result(repo: Path, worktree: str | None, job: Job) -> None:
    """NotItsResult unless the commit the shared store names as `job`'s result is that job's own (its trailer names
    it: only the daemon writes it, on the commit it makes of the job's files). A push carries the result's whole
    history onto the team's remote, so it is never a commit the store names otherwise (another of the clone's, a
    private branch's), whoever wrote that there."""
    assert job.result is not None
    where = commits.result_repo(repo, worktree)
    try:
        message = repos.open_repo(where).revparse_single(job.result).peel(pygit2.Commit).message
    except (KeyError, ValueError, pygit2.GitError, repos.RepoError):
        message = ""
    if commits.job_of(message) != job.id:
        raise NotItsResult(
            f"the result the team's store names for job {job.id} ({job.result[:12]}) is no commit this node made of "
            "its files: not pushed (the record was changed outside this node); retry the job"
        )
