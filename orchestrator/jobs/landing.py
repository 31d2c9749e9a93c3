"""The landing queue: one landing at a time per target branch; a conflict never lands.

A finished job waits for the jobs it must land after (an overlap was seen while both ran), then takes its
branch's lock and lands (`git.landing.land`: merge onto the current head in memory, the repo's landing check,
the compare-and-swap, the checkouts; all or nothing). What happens next is `core.lifecycle.after_landing`:
conflicts re-queue the job on the new head (bounded attempts) or leave it for a person; a rewritten branch
plans it again; a user's uncommitted change in the way, or a full disk, makes the landing wait and say why;
a fault fails it with nothing moved. Whatever goes wrong, its state says what is on the branch.
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
from orchestrator import testhook
from orchestrator.config import Config
from orchestrator.core import claims, lifecycle
from orchestrator.core.job import Job, fresh_attempt
from orchestrator.core.lifecycle import Landed, Then
from orchestrator.core.models import Code, JobEvent, JobState
from orchestrator.git import commits, repos
from orchestrator.git import landing as git_landing
from orchestrator.git.worktrees import WorktreePool, branch_name
from orchestrator.jobs.board import Board
from orchestrator.jobs.landing_check import ShellCheck
from orchestrator.jobs.recovery import CLEANUP_ERRORS, StoreJournal, StoreOwner
from orchestrator.jobs.retire import retire_attempt
from orchestrator.paths import Paths
from orchestrator.proc.sandbox import Sandbox

LANDING = frozenset({JobState.LANDING})
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

    def withdraw(self, job_id: int) -> None:
        """Take a job out of its branch's landing queue (a cancel); never while it lands (`landing_now`)."""
        assert not self.landing_now(job_id)
        task = self.tasks.get(job_id)
        if task is not None:
            task.cancel()

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
        # Recycling is only tidying: what is not done in time, `WorktreePool.recover` redoes on start.
        self.pool.stop_tidying()
        side = list(self._side)
        if side:
            _, late = await asyncio.wait(side, timeout=max(timeout, 1.0))
            for t in late:
                t.cancel()
            await asyncio.gather(*side, return_exceptions=True)
        return cut

    def _mergeable(self, job: Job) -> Callable[[str], bool]:
        patterns = self.cfg.mergeable(job.repo)
        return lambda path: claims.matches(path, patterns)

    async def _land(self, job_id: int) -> None:
        job = await self.board.store.jobs.get(job_id)
        if job is None or job.state is not JobState.LANDING:
            return
        structlog.contextvars.bind_contextvars(job_id=job.id, repo=job.repo)
        log = olog.get()
        if job.land_after:
            reason = f"waits for jobs {_ids(job.land_after)} to land first (overlap seen)"
            if await self.board.update(job.id, LANDING, reason=reason, code=Code.LAND_AFTER) is None:
                return  # cancelled meanwhile
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
                    then = await self._attempt(job, log)
                finally:
                    self.inflight.discard(key)
                    self._attempting.discard(job.id)
                    await self.board.announce()
            if then is Then.END:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, USER_DIRTY_RETRY[1])

    async def _attempt(self, job: Job, log: structlog.typing.FilteringBoundLogger) -> Then:
        """One landing attempt under the branch's lock, and its outcome written: what the lander does next."""
        assert job.result is not None
        current = await self.board.store.jobs.get(job.id)
        if current is None or current.state is not JobState.LANDING:
            return Then.END  # moved on while it waited for its turn: nothing of it lands
        await testhook.reach("landing.attempt", job.id)
        log.info(olog.Event.LANDING_STARTED, result=job.result, branch=job.branch)
        head = await asyncio.to_thread(repos.branch_head, Path(job.repo), job.branch)
        try:
            await self._publish(job)
            result = await self._git_land(job)
        except Exception as e:
            # Whatever failed, the job's state says what is on the branch: landed if its move went through.
            log.error(olog.Event.JOB_FAILED, code=Code.LANDING_FAILED, reason=f"landing failed: {e}", exc_info=True)
            landed = await asyncio.to_thread(landed_by, Path(job.repo), job.branch, job.id, head)
            reason = f"landing failed: {type(e).__name__}: {e}"
            if landed is not None:
                await self._landed(job, landed, f"landed on {job.branch} at {landed[:12]}; then {reason}", log)
            else:
                why = f"{reason}; not landed, {job.branch} not moved"
                await self._fail(job, JobEvent.FAILED, Code.LANDING_FAILED, why)
            return Then.END
        outcome = Landed(str(result.outcome))
        if outcome is not Landed.USER_DIRTY and self._waiting.get(job.id):
            self._waiting[job.id] = None
            log.info(olog.Event.LANDING_WAIT_ENDED, code=Code.USER_DIRTY, outcome=str(outcome))
        then, to = lifecycle.after_landing(outcome, job.attempts, self.policy)
        if to is JobState.LANDED:
            await self._landed(job, result.sha or job.result, result.message, log, noop=outcome is Landed.NOOP)
        elif to is JobState.QUEUED:
            await self._requeue(job, outcome, result, log)
        elif to is JobState.CONFLICTED:
            await self._conflicted(job, result, log)
        elif to is JobState.FAILED:
            await self._failed(job, outcome, result, log)
        elif then is Then.WAIT:
            await self._waits(job, outcome, result, log)
        return then

    @property
    def policy(self) -> lifecycle.LandingPolicy:
        return lifecycle.LandingPolicy(self.cfg.jobs.retry_on_conflict, self.cfg.jobs.max_attempts)

    def _message(self, job: Job) -> str:
        """The landing commit's message: a squash is the job's one commit (trailer kept), else a merge commit
        named for the ticket's first line."""
        if self.cfg.land_style(job.repo) == "squash":
            return commits.job_message(job.commit_text, job.id)
        return f"Merge orchestrator job {job.id}: {job.subject}"

    def _check(self, job: Job) -> ShellCheck | None:
        """The repo's landing check for this job's landing, if it has one."""
        repo_cfg = self.cfg.repo(job.repo)
        if not repo_cfg.check:
            return None
        return ShellCheck(
            repo_cfg.check,
            repo_cfg.check_timeout,
            log_path=self.paths.job_log(job.id),
            scratch_root=self.paths.scratch,
            owner=StoreOwner(self.board.store, job.id),
            sandbox=self.sandbox,
        )

    def _landing(self, job: Job) -> git_landing.Landing:
        """The job's side of its landing, the same wherever it lands."""
        return git_landing.Landing(
            job_id=job.id,
            message=self._message(job),
            base=job.base,
            check=self._check(job),
            mergeable=self._mergeable(job),
            style=self.cfg.land_style(job.repo),  # type: ignore[typeddict-item]  # config validates it is one of LAND_STYLES
        )

    async def _git_land(self, job: Job) -> git_landing.LandResult:
        assert job.result is not None
        journal = StoreJournal(self.board.store, asyncio.get_running_loop())
        return await git_landing.land(Path(job.repo), job.branch, job.result, journal=journal, **self._landing(job))

    async def _publish(self, job: Job) -> None:
        """The job's result into its repository (its objects from the workspace's quarantine, and its branch): what
        lands must be there; what never lands (a rejected review) never gets there."""
        assert job.result is not None
        # The job's workspace is where the pool keeps it, never where the record says.
        worktree = str(self.pool.path_for(Path(job.repo), job.id)) if job.worktree else None
        await asyncio.to_thread(commits.publish_result, worktree, Path(job.repo), job.result, branch_name(job.id))

    async def _landed(
        self, job: Job, sha: str, reason: str, log: structlog.typing.FilteringBoundLogger, *, noop: bool = False
    ) -> None:
        done = await self.board.settle(
            job.id,
            LANDING,
            JobState.LANDED,
            JobEvent.LANDED,
            landed_sha=sha,
            finished_at=time.time(),
            reason=reason or f"landed on {job.branch} at {sha[:12]}",
            code=Code.LANDED,
            data={"sha": sha},
        )
        if done is None:  # it holds the branch lock: nothing else moves a landing job now
            log.error(olog.Event.SCHEDULER_ERROR, error=f"job {job.id} landed at {sha} but was no longer landing")
        log.info(olog.Event.LANDING_NOOP if noop else olog.Event.LANDING_LANDED, sha=sha, branch=job.branch)
        # Nothing slow under the landing lock: the worktree goes back and the pool refills beside it.
        self._beside(self._recycle(Path(job.repo), job.id, sha), f"recycle-{job.id}")

    async def _waits(
        self, job: Job, outcome: Landed, result: git_landing.LandResult, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        """The landing waits on a person (their change in the way, a full disk); said once per reason."""
        if outcome is Landed.HEAD_MOVED:
            return
        waits = {Landed.NO_SPACE: Code.NO_SPACE, Landed.UNREACHABLE: Code.REMOTE_UNREACHABLE}
        code = waits.get(outcome, Code.USER_DIRTY)
        if result.user_paths:
            reason = (
                f"waits: your uncommitted changes to {', '.join(result.user_paths)} in {job.repo} are in the "
                f"way of this landing; commit or stash them and it lands"
            )
        else:
            reason = f"waits: {result.message}"
        # Logged when the wait starts (or its reason changes), not on every retry; the next attempt logs its end.
        if self._waiting.get(job.id) == reason:
            return
        self._waiting[job.id] = reason
        await self.board.update(
            job.id,
            LANDING,
            reason=reason,
            code=code,
            event=JobEvent.LANDING_WAITS,
            data={"user_paths": list(result.user_paths), "code": code},
        )
        log.warning(olog.Event.LANDING_WAITING, code=code, user_paths=list(result.user_paths), reason=reason)

    async def _failed(
        self, job: Job, outcome: Landed, result: git_landing.LandResult, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        if outcome is Landed.CHECK_FAILED:
            await self._fail(
                job,
                JobEvent.CHECK_FAILED,
                Code.CHECK_FAILED,
                f"the landing check `{self.cfg.repo(job.repo).check}` failed on the merged "
                f"result; not landed; worktree kept (see `orchestrator logs {job.id}`)",
            )
            log.warning(olog.Event.LANDING_CHECK_FAILED, code=Code.CHECK_FAILED, output=result.check_output[-2000:])
            return
        reason = f"landing failed: {result.message}; its result {job.result} is kept on branch {branch_name(job.id)}"
        log.error(olog.Event.JOB_FAILED, code=Code.LANDING_FAILED, reason=reason)
        await self._fail(job, JobEvent.FAILED, Code.LANDING_FAILED, reason)

    async def _fail(self, job: Job, event: JobEvent, code: Code, reason: str) -> None:
        """The job did not land and will not by itself; its branch and worktree stay for a person."""
        await self.board.settle(
            job.id,
            LANDING,
            JobState.FAILED,
            event,
            finished_at=time.time(),
            data={"code": code},
            reason=reason,
            code=code,
        )

    async def _requeue(
        self, job: Job, outcome: Landed, result: git_landing.LandResult, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        """Back to the queue, planned again on the new head; this attempt kept on a branch of its own."""
        kept = await retire_attempt(self.pool, job)
        data: dict[str, Any]
        if outcome is Landed.REWRITTEN:
            code, data = Code.REWRITTEN, {"head": result.sha, "base": job.base, "kept": kept, "code": Code.REWRITTEN}
            reason = f"{result.message}; previous result kept as {kept}"
            log.warning(olog.Event.LANDING_REWRITTEN, code=code, head=result.sha, base=job.base, kept=kept)
        else:
            conflicts = list(result.conflicts)
            log.warning(olog.Event.LANDING_CONFLICT, code=Code.CONFLICT, conflicts=conflicts, attempt=job.attempts + 1)
            code, data = Code.CONFLICT, {"conflicts": conflicts, "kept": kept, "code": Code.CONFLICT}
            reason = (
                f"conflict in {', '.join(conflicts)} with {job.branch}; re-queued on the new head "
                f"(attempt {job.attempts + 2} of {self.cfg.jobs.max_attempts}); previous result kept as {kept}"
            )
        await self.board.settle(
            job.id,
            LANDING,
            JobState.QUEUED,
            JobEvent.REQUEUED,
            **fresh_attempt(job),
            code=code,
            data=data,
            reason=reason,
        )
        log.info(olog.Event.JOB_REQUEUED, code=code, attempt=job.attempts + 2, kept=kept)

    async def _conflicted(
        self, job: Job, result: git_landing.LandResult, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        conflicts = list(result.conflicts)
        log.warning(olog.Event.LANDING_CONFLICT, code=Code.CONFLICT, conflicts=conflicts, attempt=job.attempts + 1)
        await self.pool.release(Path(job.repo), job.id, keep=True)
        await self.board.settle(
            job.id,
            LANDING,
            JobState.CONFLICTED,
            JobEvent.CONFLICTED,
            finished_at=time.time(),
            code=Code.CONFLICT,
            data={"conflicts": conflicts, "code": Code.CONFLICT},
            reason=(
                f"conflict in {', '.join(conflicts)} with {job.branch}; not landed; its branch "
                f"{branch_name(job.id)} and worktree are kept for a person"
            ),
        )


def landed_by(repo_path: Path, branch: str, job_id: int, before: str) -> str | None:
    """The head a landing of `job_id` moved `branch` to since it was at `before` (its reflog says), if it did and
    did not undo it; None when the branch does not hold that landing."""
    repo = repos.open_repo(repo_path)
    ref = repo.lookup_reference(branch if branch.startswith("refs/") else f"refs/heads/{branch}")
    if str(ref.target) == before:
        return None
    for entry in ref.log():  # newest first
        if entry.message == f"orchestrator: undo land job {job_id}":
            return None
        if entry.message == f"orchestrator: land job {job_id}":
            return str(entry.oid_new)
        if str(entry.oid_old) == before:
            break
    return None


def _ids(ids: tuple[int, ...]) -> str:
    return ", ".join(str(i) for i in sorted(ids))
