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

import structlog

from orchestrator.core.job import Job
from orchestrator.core.lifecycle import Then
from orchestrator.git import remote as rmt
from orchestrator.git import repos
from orchestrator.git.outcomes import LandOutcome, LandResult
from orchestrator.git.worktrees import branch_name
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
        if not await self.team_store.holds(job.id):
            return Then.END  # taken over by another node, or moved on: nothing of this attempt lands
        return await super()._attempt(job, log)

    async def _git_land(self, job: Job) -> LandResult:
        assert job.result is not None
        if (why := await asyncio.to_thread(_not_own_result, Path(job.repo), job)) is not None:
            return LandResult(LandOutcome.FAULT, None, "", (), (), why)
        remote = await asyncio.to_thread(clones.remote_of, job.repo, job.branch)
        store = self.team_store

        async def fence() -> bool:
            return await store.holds(job.id)

        team = self.cfg.team
        async with store.landing_lock(remote.key), self.fetches.lock(job.repo):
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


def _not_own_result(repo: Path, job: Job) -> str | None:
    """Why the result the shared store names for `job` is not this node's to push (None: it is). A push carries the
    result's whole history onto the team's remote, so it must be the commit this node made of the job's files, on
    the job's branch in this clone: never a commit the store names otherwise (another commit of the clone, a
    private branch's), whoever wrote that there."""
    branch = branch_name(job.id)
    try:
        head = repos.branch_head(repo, branch)
    except repos.RepoError:
        head = None
    if head == job.result:
        return None
    return (
        f"the result the team's store names for job {job.id} ({str(job.result)[:12]}) is not the head of its branch "
        f"{branch} in this clone ({head[:12] if head else 'no such branch'}): not pushed (the record was changed "
        "outside this node); retry the job"
    )
