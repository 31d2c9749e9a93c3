"""The landing queue: one landing at a time per target branch; a conflict never lands.

A finished job waits for the jobs it must land after (an overlap was seen while both ran), then takes its
branch's lock, merges onto the current head in memory, runs the repo's landing check if one is set, and
moves the branch by compare-and-swap. Conflicts re-queue the job on the new head (bounded attempts), or
leave it for a person. A user's uncommitted change in the way makes the landing wait and say why.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import structlog

from orchestrator import logging as olog
from orchestrator.config import Config
from orchestrator.core import claims
from orchestrator.core.job import Job
from orchestrator.core.models import Code, JobState
from orchestrator.git import commits
from orchestrator.git import landing as git_landing
from orchestrator.git.worktrees import WorktreePool
from orchestrator.jobs.board import Board
from orchestrator.jobs.recovery import CLEANUP_ERRORS, StoreJournal, StoreOwner
from orchestrator.jobs.retire import fresh_attempt, retire_attempt
from orchestrator.paths import Paths
from orchestrator.runners.sandbox import Sandbox

USER_DIRTY_RETRY = (1.0, 30.0)  # first and longest wait before trying again when the user's changes are in the way


class Lander:
    def __init__(
        self, board: Board, cfg: Config, paths: Paths, pool: WorktreePool, sandbox: Sandbox | None = None
    ) -> None:
        self.board = board
        self.sandbox = sandbox
        """Where landing checks run (the job's code, merged): confined like the jobs themselves."""
        self.cfg = cfg
        self.paths = paths
        self.pool = pool
        self.inflight: set[tuple[str, str]] = set()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._side: set[asyncio.Task[None]] = set()
        self._attempting: set[int] = set()
        self._waiting: dict[int, str | None] = {}
        """Job id → the reason its landing waits on a person (None: not waiting), to log each wait once."""

    def submit(self, job: Job) -> None:
        if job.id in self.tasks and not self.tasks[job.id].done():
            return
        task = asyncio.create_task(self._land(job.id), name=f"land-{job.id}")
        self.tasks[job.id] = task
        task.add_done_callback(functools.partial(self._forget, job.id))

    def landing_now(self, job_id: int) -> bool:
        """True while this job's merge and branch move are under way (it holds its branch's lock)."""
        return job_id in self._attempting

    def _forget(self, job_id: int, _task: asyncio.Task[None]) -> None:
        self.tasks.pop(job_id, None)
        self._waiting.pop(job_id, None)

    def _beside(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` as a task this lander owns (awaited by `drain`), off the landing lock."""
        task = asyncio.create_task(work, name=name)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _recycle(self, repo: Path, job_id: int, landed: str) -> None:
        """Give a landed job's worktree back and top the warm pool up at the new head."""
        bound = {"job_id": job_id, "repo": str(repo)}
        with olog.best_effort("recycle the landed job's worktree", *CLEANUP_ERRORS, **bound):
            await self.pool.release(repo, job_id, keep=False, delete_branch=True)
        await self._top_up(repo, landed)

    def top_up(self, repo: Path, at: str) -> None:
        """Refill a repo's warm pool beside a job that took its last worktree. Without this the pool stays
        empty from a repo's first jobs (fresh checkouts) until its first landing, and the jobs admitted
        then all wait for fresh checkouts made one after another under the repo's worktree lock."""
        if not self.pool.pooled(repo):
            self._beside(self._top_up(repo, at), f"top-up-{repo.name}")

    async def _top_up(self, repo: Path, at: str) -> None:
        with olog.best_effort("top the worktree pool up", *CLEANUP_ERRORS, repo=str(repo)):
            await self.pool.fill(repo, at)

    async def drain(self, timeout: float) -> list[int]:
        """Let landings in flight finish within `timeout`; cancel the rest and return their ids."""
        tasks = list(self.tasks.values())
        cut: list[int] = []
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            cut = sorted(int(t.get_name().split("-")[1]) for t in pending)
        side = list(self._side)
        if side:
            # Recycling is only tidying: what is not done in time, `WorktreePool.recover` redoes on start.
            _, late = await asyncio.wait(side, timeout=max(timeout, 1.0))
            for t in late:
                t.cancel()
            await asyncio.gather(*side, return_exceptions=True)
        return cut

    def _mergeable(self, job: Job) -> Callable[[str], bool]:
        patterns = (*self.cfg.jobs.mergeable, *self.cfg.repo(job.repo).mergeable)
        return lambda path: claims.matches(path, patterns)

    async def _land(self, job_id: int) -> None:
        job = await self.board.store.get(job_id)
        if job is None or job.state is not JobState.LANDING:
            return
        structlog.contextvars.bind_contextvars(job_id=job.id, repo=job.repo)
        log = olog.get()
        if job.land_after:
            reason = f"waits for jobs {_ids(job.land_after)} to land first (overlap seen)"
            await self.board.update(job.id, reason=reason, code=Code.LAND_AFTER)
            log.info(olog.Event.LANDING_WAITING, code=Code.LAND_AFTER, reason=reason, blocking=sorted(job.land_after))
            # Settled when it landed or ended, or went back to the queue (a conflict re-queued it): its
            # old result will never land, and its next attempt starts from whatever lands meanwhile.
            await self.board.wait_ended(job.land_after, timeout=None, settled=lambda st: not st.active)
            log.info(olog.Event.LANDING_WAIT_ENDED, code=Code.LAND_AFTER)
        key = (job.repo, job.branch)
        lock = self._locks.setdefault(key, asyncio.Lock())
        delay = USER_DIRTY_RETRY[0]
        self._waiting[job.id] = None
        while True:
            async with lock:
                self.inflight.add(key)
                self._attempting.add(job.id)
                await self.board.announce()
                try:
                    outcome = await self._attempt(job, log)
                except Exception as e:
                    log.error(
                        olog.Event.JOB_FAILED, code=Code.LANDING_FAILED, reason=f"landing failed: {e}", exc_info=True
                    )
                    await self._fail(
                        job,
                        "failed",
                        Code.LANDING_FAILED,
                        f"landing failed: {type(e).__name__}: {e}; its result {job.result} is kept "
                        f"on branch orchestrator/{job.id}",
                    )
                    outcome = "done"
                finally:
                    self.inflight.discard(key)
                    self._attempting.discard(job.id)
                    await self.board.announce()
            if outcome != "wait":
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, USER_DIRTY_RETRY[1])

    async def _fail(self, job: Job, event: str, code: Code, reason: str) -> None:
        """The job did not land and will not by itself; its branch and worktree stay for a person."""
        await self.board.update(
            job.id,
            state=JobState.FAILED,
            finished_at=time.time(),
            event=event,
            data={"code": code},
            reason=reason,
            code=code,
        )

    async def _attempt(self, job: Job, log: structlog.typing.FilteringBoundLogger) -> str:
        assert job.result is not None
        repo = Path(job.repo)
        log.info(olog.Event.LANDING_STARTED, result=job.result, branch=job.branch)
        check = self.cfg.repo(job.repo).check
        style = self.cfg.repo(job.repo).land_style
        # Subjects come from the ticket's first line; a squash is the job's one commit, trailer kept.
        if style == "squash":
            message = commits.job_message(job.commit_text, job.id)
        else:
            message = f"Merge orchestrator job {job.id}: {job.subject}"
        if check:
            result = await git_landing.land_checked(
                repo,
                job.branch,
                job.result,
                job_id=job.id,
                message=message,
                command=check,
                timeout=self.cfg.repo(job.repo).check_timeout,
                log_path=self.paths.job_log(job.id),
                scratch_root=self.paths.scratch,
                mergeable=self._mergeable(job),
                style=style,
                owner=StoreOwner(self.board.store, job.id),
                journal=StoreJournal(self.board.store, asyncio.get_running_loop()),
                sandbox=self.sandbox,
            )
        else:
            result = await asyncio.to_thread(
                git_landing.land,
                repo,
                job.branch,
                job.result,
                job_id=job.id,
                message=message,
                mergeable=self._mergeable(job),
                style=style,
                journal=StoreJournal(self.board.store, asyncio.get_running_loop()),
            )
        outcome = result.outcome
        if outcome is not git_landing.LandOutcome.USER_DIRTY and self._waiting.get(job.id):
            self._waiting[job.id] = None
            log.info(olog.Event.LANDING_WAIT_ENDED, code=Code.USER_DIRTY, outcome=str(outcome))
        if outcome in (git_landing.LandOutcome.LANDED, git_landing.LandOutcome.NOOP):
            landed = result.sha or job.result
            await self.board.update(
                job.id,
                state=JobState.LANDED,
                landed_sha=landed,
                finished_at=time.time(),
                event="landed",
                reason=result.message or f"landed on {job.branch} at {landed[:12]}",
                code=Code.LANDED,
                data={"sha": landed},
            )
            event = olog.Event.LANDING_LANDED if outcome is git_landing.LandOutcome.LANDED else olog.Event.LANDING_NOOP
            log.info(event, sha=landed, branch=job.branch)
            # Nothing slow under the landing lock: the worktree goes back and the pool refills beside it.
            self._beside(self._recycle(repo, job.id, landed), f"recycle-{job.id}")
            return "done"
        if outcome is git_landing.LandOutcome.USER_DIRTY:
            reason = (
                f"waits: your uncommitted changes to {', '.join(result.user_paths)} in {job.repo} are in the "
                f"way of this landing; commit or stash them and it lands"
            )
            # Logged when the wait starts (or its paths change), not on every retry; `_land` logs its end.
            if self._waiting.get(job.id) != reason:
                self._waiting[job.id] = reason
                await self.board.update(
                    job.id,
                    reason=reason,
                    code=Code.USER_DIRTY,
                    event="landing_waits",
                    data={"user_paths": list(result.user_paths), "code": Code.USER_DIRTY},
                )
                log.warning(
                    olog.Event.LANDING_WAITING,
                    code=Code.USER_DIRTY,
                    user_paths=list(result.user_paths),
                    reason=reason,
                )
            return "wait"
        if outcome is git_landing.LandOutcome.HEAD_MOVED:
            return "wait"
        if outcome is git_landing.LandOutcome.CHECK_FAILED:
            await self._fail(
                job,
                "check_failed",
                Code.CHECK_FAILED,
                f"the landing check `{self.cfg.repo(job.repo).check}` failed on the merged "
                f"result; not landed; worktree kept (see `orchestrator logs {job.id}`)",
            )
            log.warning(olog.Event.LANDING_CHECK_FAILED, code=Code.CHECK_FAILED, output=result.check_output[-2000:])
            return "done"
        # A conflict never lands: re-queue on the new head, or leave it for a person.
        conflicts = list(result.conflicts)
        log.warning(olog.Event.LANDING_CONFLICT, code=Code.CONFLICT, conflicts=conflicts, attempt=job.attempts + 1)
        if self.cfg.jobs.retry_on_conflict and job.attempts + 1 < self.cfg.jobs.max_attempts:
            kept = await retire_attempt(self.pool, job)
            await self.board.update(
                job.id,
                **fresh_attempt(job),
                event="requeued",
                code=Code.CONFLICT,
                data={"conflicts": conflicts, "kept": kept, "code": Code.CONFLICT},
                reason=(
                    f"conflict in {', '.join(conflicts)} with {job.branch}; re-queued on the new head "
                    f"(attempt {job.attempts + 2} of {self.cfg.jobs.max_attempts}); previous result kept as {kept}"
                ),
            )
            log.info(olog.Event.JOB_REQUEUED, code=Code.CONFLICT, attempt=job.attempts + 2, kept=kept)
        else:
            await self.pool.release(repo, job.id, keep=True)
            await self.board.update(
                job.id,
                state=JobState.CONFLICTED,
                finished_at=time.time(),
                event="conflicted",
                code=Code.CONFLICT,
                data={"conflicts": conflicts, "code": Code.CONFLICT},
                reason=(
                    f"conflict in {', '.join(conflicts)} with {job.branch}; not landed; its branch "
                    f"orchestrator/{job.id} and worktree are kept for a person"
                ),
            )
        return "done"


def _ids(ids: tuple[int, ...]) -> str:
    return ", ".join(str(i) for i in sorted(ids))
