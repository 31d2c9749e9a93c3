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
from orchestrator.git import landing as git_landing
from orchestrator.git import remote as rmt
from orchestrator.git.landing import LandOutcome, LandResult
from orchestrator.jobs.landing import Lander
from orchestrator.jobs.recovery import StoreJournal
from orchestrator.team import clones
from orchestrator.team.facts import Fetches
from orchestrator.team.pgstore import PgStore

OUTCOMES: dict[rmt.RemoteOutcome, LandOutcome] = {
    rmt.RemoteOutcome.LANDED: LandOutcome.LANDED,
    rmt.RemoteOutcome.NOOP: LandOutcome.NOOP,
    rmt.RemoteOutcome.CONFLICT: LandOutcome.CONFLICT,
    rmt.RemoteOutcome.REWRITTEN: LandOutcome.REWRITTEN,
    rmt.RemoteOutcome.CHECK_FAILED: LandOutcome.CHECK_FAILED,
    rmt.RemoteOutcome.REFUSED: LandOutcome.FAULT,
    rmt.RemoteOutcome.NO_BRANCH: LandOutcome.FAULT,
    rmt.RemoteOutcome.KEPT_MOVING: LandOutcome.HEAD_MOVED,
    rmt.RemoteOutcome.UNREACHABLE: LandOutcome.UNREACHABLE,
    rmt.RemoteOutcome.FENCED: LandOutcome.HEAD_MOVED,  # the next attempt finds the job is not this node's: ends
}
"""How each way a landing onto the remote ends reads to the lander (the same outcomes as a local landing)."""


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
        remote = await asyncio.to_thread(clones.remote_of, job.repo, job.branch)
        repo_cfg = self.cfg.repo(job.repo)
        store = self.team_store
        check = None
        if repo_cfg.check:
            cmd, timeout = repo_cfg.check, repo_cfg.check_timeout
            from orchestrator.jobs.recovery import StoreOwner

            async def check(sha: str) -> git_landing.CheckResult:
                return await git_landing.run_check(
                    Path(job.repo), sha, cmd, timeout=timeout, log_path=self.paths.job_log(job.id),
                    scratch_root=self.paths.scratch, owner=StoreOwner(store, job.id), sandbox=self.sandbox,
                )  # fmt: skip

        async def fence() -> bool:
            return await store.holds(job.id)

        team = self.cfg.team
        async with store.landing_lock(remote.key), self.fetches.lock(job.repo):
            landed = await rmt.land(
                Path(job.repo),
                remote,
                job.result,
                job_id=job.id,
                message=self._message(job),
                base=job.base,
                mergeable=self._mergeable(job),
                style=repo_cfg.land_style,  # type: ignore[arg-type]  # config validates it is one of LAND_STYLES
                check=check,
                fence=fence,
                publisher=rmt.PUBLISHERS[team.publish](team.git_timeout),
                journal=StoreJournal(store, asyncio.get_running_loop()),
                follow=team.follow,
                checkout_journal=StoreJournal(store, asyncio.get_running_loop()),
                timeout=team.git_timeout,
            )
        message = landed.message + (f"; {landed.followed}" if landed.followed else "")
        return LandResult(
            OUTCOMES[landed.outcome],
            landed.sha,
            landed.old_head or "",
            landed.conflicts,
            (),
            message,
            landed.check_output,
        )
