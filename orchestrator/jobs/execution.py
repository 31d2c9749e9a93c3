"""Run one admitted job: its worktree, its runner, the live watch of what it touches, its result commit.

The scheduler owns the task; this module only carries the job from `running` to `landing` (or to an end).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from orchestrator import logging as olog
from orchestrator.config import Config
from orchestrator.core import claims, lifecycle
from orchestrator.core.job import Job
from orchestrator.core.lifecycle import RunEnd
from orchestrator.core.models import ACTIVE, Code, JobEvent, JobState
from orchestrator.git import commits
from orchestrator.git.changes import ChangeWatcher, actual_paths
from orchestrator.git.workspace import ResultRefused
from orchestrator.git.worktrees import WorktreePool
from orchestrator.jobs import escapes, joblog, quota
from orchestrator.jobs.board import Board
from orchestrator.jobs.door import Door, Doors
from orchestrator.jobs.limits import Limits
from orchestrator.jobs.recovery import CLEANUP_ERRORS, StoreOwner
from orchestrator.jobs.rerun import Rerun, requeue
from orchestrator.llm import pricing
from orchestrator.paths import Paths
from orchestrator.runners import Runner, ratelimit
from orchestrator.runners import get as get_runner
from orchestrator.runners.base import RunContext, RunResult
from orchestrator.store import StoreFull

OnChange = Callable[[int, frozenset[str]], Awaitable[None]]
HeldBy = Callable[[int, str], Awaitable[str | None]]
OnAcquired = Callable[[Path, str], None]
"""Told (repo, base) after each job takes its worktree: the warm pool's owner tops it up beside the job."""


RATE_LIMIT_OVER = (
    "The model API's rate limit that stopped your last run is over: go on with the task from where it stopped."
)
"""What a runner is told when it runs again after a rate limit."""
ESCAPE_RECHECK = 0.5
"""Seconds before a checkout that looked written by a job is looked at again (a landing may be under way)."""


@dataclass
class Stop:
    """Why a job's task was cancelled: a person cancelled it, the daemon is stopping, or the daemon stopped it (a
    limit passed, its state could not be stored: failed)."""

    state: JobState
    reason: str
    code: Code = Code.INTERRUPTED

    @property
    def event(self) -> JobEvent:
        """What its job's history records: cancelled, failed, or interrupted (the daemon stopping)."""
        events = {JobState.CANCELLED: JobEvent.CANCELLED, JobState.FAILED: JobEvent.FAILED}
        return events.get(self.state, JobEvent.INTERRUPTED)


INTERRUPTED = Stop(
    JobState.INTERRUPTED,
    "the daemon stopped while this job ran; it keeps its place: `orchestrator retry` runs it again",
)
RUNNING = frozenset({JobState.RUNNING})


class _Moved(Exception):
    """The job left `running` under its task (a guarded write found it elsewhere)."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.id} is {job.state}")
        self.job = job


def _still(written: Job | None, job: Job) -> Job:
    """The job as a guarded write left it; `_Moved` when the write found it no longer running."""
    if written is None:
        raise _Moved(job)
    return written


def _failure(e: Exception) -> tuple[Code, str]:
    """A job's code and reason for an error its run did not expect: a full disk says so, and what to do."""
    if isinstance(e, StoreFull):
        return Code.NO_SPACE, str(e)
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return Code.NO_SPACE, f"a disk is full ({e}): free space there, then `orchestrator revise` or `retry` it"
    return Code.RUNNER_ERROR, f"{type(e).__name__}: {e}"


class Executor:
    def __init__(
        self,
        board: Board,
        cfg: Config,
        paths: Paths,
        pool: WorktreePool,
        runners: dict[str, Runner],
        on_change: OnChange,
        on_acquired: OnAcquired | None = None,
        held: HeldBy | None = None,
        doors: Doors | None = None,
    ) -> None:
        self.held = held
        self.doors = doors
        """Opens a job's door for its agent CLI's MCP server (runners that `wants_door`)."""
        """(job id, path) → why the job should not write that path now (the overlap watch answers)."""
        self.limits = Limits(board.store)
        """Rate limits the runners met (a fact of the scheduler's snapshots)."""
        self.board = board
        self.cfg = cfg
        self.paths = paths
        self.pool = pool
        self.runners = runners
        self.on_change = on_change
        self.on_acquired = on_acquired
        self.stops: dict[int, Stop] = {}
        self._runs_of: dict[int, asyncio.Task[tuple[Job, RunResult]]] = {}
        """Each running job's runner (its runs after rate limits too): what `interrupt` stops."""
        self._reruns: dict[int, Rerun] = {}
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        """Each running job's task (the one `run` runs in), for `halt`."""

    def interrupt(self, job_id: int, rerun: Rerun) -> bool:
        """Stop a running job's runner (its processes end; its workspace stays) and run it again (`jobs.rerun`).
        False when its runner is not running any more: it finished, and its landing settles what it met."""
        task = self._runs_of.get(job_id)
        if task is None or task.done():
            return False
        self._reruns[job_id] = rerun
        task.cancel()
        return True

    async def _runs_or_rerun(self, job: Job, runner: Runner, ctx: RunContext) -> tuple[Job, RunResult | Rerun]:
        """`_runs`, or the `Rerun` that `interrupt` stopped it with (a cancel of the job's own task goes on up)."""
        task = asyncio.ensure_future(self._runs(job, runner, ctx))
        self._runs_of[job.id] = task
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            rerun = self._reruns.get(job.id)
            if rerun is None or not task.cancelled() or (me is not None and me.cancelling()):
                raise
            return job, rerun
        finally:
            del self._runs_of[job.id]
            self._reruns.pop(job.id, None)

    def _policy(self) -> lifecycle.LandingPolicy:
        return lifecycle.LandingPolicy(self.cfg.jobs.retry_on_conflict, self.cfg.jobs.max_attempts)

    async def _rerun(self, job: Job, rerun: Rerun, ran: float) -> Job:
        """The attempt stopped (its runner is done): back to the queue behind what it met, or conflicted."""
        current = await self.board.store.get(job.id) or job
        if current.state is not JobState.RUNNING:
            raise _Moved(current)
        return await requeue(self.board, self.pool, self._policy(), current, rerun, ran)

    async def _beside(self, job: Job) -> tuple[int, ...]:
        """The other active jobs of the job's repository and branch (their landings can move its base)."""
        active = await self.board.store.jobs(ACTIVE)
        return tuple(sorted(j.id for j in active if (j.repo, j.branch) == (job.repo, job.branch) and j.id != job.id))

    def halt(self, job_id: int, stop: Stop) -> bool:
        """End a running job's task with `stop` (its cancel arm writes it), from anywhere on the loop without waiting
        for it; False when it has no task running here."""
        task = self._tasks.get(job_id)
        if task is None or task.done():
            return False
        self.stops.setdefault(job_id, stop)
        task.cancel()
        return True

    async def _report(self, job_id: int, paths: frozenset[str]) -> None:
        """The watch's new set for a running job; a job whose paths cannot be stored (a full disk) is stopped: it
        could not be kept apart from the others, and it may be what filled the disk."""
        try:
            await self.on_change(job_id, paths)
        except StoreFull as e:
            reason = f"{e}; it was stopped: what it touches could not be stored"
            self.halt(job_id, Stop(JobState.FAILED, reason, Code.NO_SPACE))

    async def _guard(self, job_id: int, paths: list[Path]) -> None:
        """Stop the job once its disk use or its disk's free room is over a limit (`jobs.quota`)."""
        j = self.cfg.jobs
        if not (j.max_bytes or j.min_free_bytes):
            return
        try:
            over = await quota.guard(paths, j.max_bytes, j.min_free_bytes)
        except Exception:  # noqa: BLE001 - the measure broke, not the job: it runs on unmeasured, and the log says why
            olog.get(job_id=job_id).exception(olog.Event.STEP_FAILED, step="measure the job's disk use")
            return
        olog.get(job_id=job_id).warning(olog.Event.JOB_OVER_QUOTA, code=over.code, reason=over.reason)
        self.halt(job_id, Stop(JobState.FAILED, over.reason, over.code))

    async def _written(self, repo: Path, before: escapes.CheckoutState) -> list[str]:
        """Paths of the user's checkout the job wrote while it ran (see `escapes`). A first finding is looked at
        again after `ESCAPE_RECHECK` seconds: a landing caught half way through its checkout update has
        finished by then and explains its files."""
        after = await asyncio.to_thread(escapes.snapshot, repo)
        if not await asyncio.to_thread(escapes.written, repo, before, after):
            return []
        await asyncio.sleep(ESCAPE_RECHECK)
        after = await asyncio.to_thread(escapes.snapshot, repo)
        return await asyncio.to_thread(escapes.written, repo, before, after)

    async def _end(self, job: Job, step: lifecycle.Step, **fields: Any) -> Job:
        """Write `step` (from `running`), which ends the round (and any revision's feedback with it); the job as
        stored, whoever moved it last. On a full disk it waits for room (`Board.settle`)."""
        done = await self.board.settle(
            job.id, step.expect, step.to, step.event, code=step.code, reason=step.reason, feedback="", **fields
        )
        if done is not None:
            return done
        return await self.board.store.get(job.id) or job

    async def _stop_write(self, job_id: int, stop: Stop) -> Job | None:
        return await self.board.settle(
            job_id,
            RUNNING,
            stop.state,
            stop.event,
            finished_at=time.time(),
            reason=stop.reason,
            code=stop.code,
            data={"code": stop.code},
        )

    async def stopped(self, job_id: int) -> Job | None:
        """A job's task was cancelled before it ran its runner: write its stop's state if it was moved to
        `running` already (None, nothing written, if it was not)."""
        return await self._stop_write(job_id, self.stops.pop(job_id, INTERRUPTED))

    async def _runs(self, job: Job, runner: Runner, ctx: RunContext) -> tuple[Job, RunResult]:
        """The runner's run, and its runs again after each rate limit its model API reports (bounded): meanwhile the
        job waits, still running (its worktree and paths kept), and jobs of its runner not started yet wait too
        (`limits`). Each run after a wait goes on from the last one, in the same worktree."""
        log = olog.get()
        usage = job.usage if ctx.resume else None
        code, waits, j = job.code, 0, self.cfg.jobs
        while True:
            result = await runner.run(ctx)
            if result.usage is not None:
                usage = pricing.added(usage, result.usage)
                job = _still(await self.board.update(job.id, RUNNING, usage=usage), job)
            if result.code != Code.RATE_LIMITED:
                return job, result
            if waits >= j.rate_limit_waits:
                return job, replace(result, summary=f"{result.summary}; still limited after {waits} waits")
            seconds = ratelimit.wait(result.retry_after, waits, j.rate_limit_wait, j.rate_limit_max_wait)
            until = time.time() + seconds
            held = await self.limits.hit(job.runner, until, job=job.id, forgeable=result.limit_forgeable)
            waits += 1
            reason = (
                f"{result.summary}; waits until {time.strftime('%H:%M:%S', time.localtime(until))} ({seconds:g}s, "
                f"wait {waits} of {j.rate_limit_waits}), then goes on by itself"
            )
            if not held:
                reason += f" (its output alone holds back no other {job.runner} job, until another one meets a limit)"
            job = _still(
                await self.board.update(
                    job.id,
                    RUNNING,
                    code=Code.RATE_LIMITED,
                    reason=reason,
                    event=JobEvent.RATE_LIMITED,
                    data={"code": Code.RATE_LIMITED, "until": until, "seconds": seconds, "wait": waits, "held": held},
                ),
                job,
            )
            log.warning(olog.Event.JOB_RATE_LIMITED, code=Code.RATE_LIMITED, reason=reason, seconds=seconds)
            await asyncio.to_thread(joblog.exit_line, ctx.log_path, result.exit_code, reason)
            await asyncio.sleep(seconds)
            job = _still(await self.board.update(job.id, RUNNING, code=code, reason="goes on after a rate limit"), job)
            resume = f"{ctx.resume}\n\n{RATE_LIMIT_OVER}" if ctx.resume else RATE_LIMIT_OVER
            ctx = replace(ctx, job=job, resume=resume, session=False)
            await asyncio.to_thread(joblog.attempt_header, ctx.log_path, job, RATE_LIMIT_OVER)

    async def run(self, job: Job, *, resume: str = "") -> Job:
        """Carry an admitted job (already stored as running, with its base) to landing or an end state.

        With `resume` (review feedback), the job goes on in the worktree it kept: its runner is told `resume`,
        and what it changes goes on top of its earlier result."""
        structlog.contextvars.bind_contextvars(job_id=job.id, repo=job.repo)
        log = olog.get()
        assert job.base is not None
        base: str = job.base
        repo = Path(job.repo)
        watcher: ChangeWatcher | None = None
        guard: asyncio.Task[None] | None = None
        door: Door | None = None
        if (me := asyncio.current_task()) is not None:
            self._tasks[job.id] = me
        try:
            runner = get_runner(job.runner, self.runners)
            if resume:
                # Where the pool keeps the job's workspace: a path in the record is never taken on its word.
                worktree = self.pool.path_for(repo, job.id)
                if not job.worktree or not await asyncio.to_thread(worktree.is_dir):
                    raise RuntimeError(f"its worktree {worktree} is gone; nothing to go on from")
            else:
                worktree = await self.pool.acquire(repo, job.id, base)
                if self.on_acquired is not None:
                    self.on_acquired(repo, base)
                job = _still(await self.board.update(job.id, RUNNING, worktree=str(worktree)), job)
            log.info(
                olog.Event.JOB_STARTED,
                worktree=str(worktree),
                base=base,
                runner=job.runner,
                claim=sorted(job.claim.paths),
            )
            watcher = ChangeWatcher(
                worktree, base, functools.partial(self._report, job.id), limit=self.cfg.jobs.max_tracked_paths
            )
            await watcher.start()
            guard = asyncio.create_task(self._guard(job.id, [worktree, self.paths.job_private(job.id)]))
            if self.doors is not None and getattr(runner, "wants_door", False):
                door = await self.doors.open(job.id, self.paths.job_private(job.id))
            ctx = RunContext(
                job=job,
                worktree=worktree,
                log_path=self.paths.job_log(job.id),
                timeout=self.cfg.jobs.timeout,
                owner=StoreOwner(self.board.store, job.id),
                private_dir=self.paths.job_private(job.id),
                terminal=self.paths.job_terminal(job.id),
                log_cap=self.cfg.jobs.log_max_bytes,
                grace=self.cfg.jobs.kill_grace,
                held=functools.partial(self.held, job.id) if self.held is not None else None,
                env={"ORCHESTRATOR_FEEDBACK": resume} if resume else {},
                resume=resume,
                door=door.address if door is not None else None,
            )
            await asyncio.to_thread(joblog.attempt_header, ctx.log_path, job, resume)
            # Without a sandbox, the user's checkout is compared before and after (see `escapes`).
            sandbox = getattr(runner, "sandbox", None)
            watch_checkout = not (sandbox is not None and sandbox.active)
            before = await asyncio.to_thread(escapes.snapshot, repo) if watch_checkout else None
            began = time.monotonic()
            job, outcome = await self._runs_or_rerun(job, runner, ctx)
            if isinstance(outcome, Rerun) or (outcome.code == Code.CONFLICT and not outcome.ok):
                # Stopped on a real conflict, or its change does not apply on this base (a replay): it runs again.
                ran = time.monotonic() - began
                guard.cancel()
                said = f"stopped: {outcome.reason}" if isinstance(outcome, Rerun) else outcome.summary
                await asyncio.to_thread(joblog.exit_line, ctx.log_path, None, said)
                await watcher.stop()
                watcher = None
                if not isinstance(outcome, Rerun):
                    behind = await self._beside(job)
                    outcome = Rerun(outcome.summary, behind, settles=bool(behind))
                return await self._rerun(job, outcome, ran)
            result = outcome
            if before is not None and result.ok:
                wrote = await self._written(repo, before)
                if wrote:
                    log.warning(olog.Event.JOB_ESCAPED, paths=wrote[:50])
                    result = RunResult(
                        False,
                        result.exit_code,
                        f"wrote outside its worktree: {', '.join(wrote[:10])}{' ...' if len(wrote) > 10 else ''} "
                        f"changed in {repo} while it ran (no sandbox here to stop it; if you made those edits "
                        f"yourself, `orchestrator retry {job.id}`)",
                        code=Code.WROTE_OUTSIDE,
                    )
            await asyncio.to_thread(joblog.exit_line, ctx.log_path, result.exit_code, result.summary)
            guard.cancel()
            await watcher.stop()
            watcher = None
            sha: str | None = None
            if result.ok:
                # A revision's change goes on top of its earlier result (the branch moves forward, nothing kept aside).
                try:
                    # Into its quarantine: the result reaches the repository when it lands (`Lander`), not before.
                    sha = await asyncio.to_thread(
                        commits.commit_worktree,
                        worktree,
                        message=job.revision_text(resume) if resume else job.commit_text,
                        job_id=job.id,
                        base=base,
                        repo_path=repo,
                        stack=bool(resume),
                        prior=job.result if resume else None,
                        max_total=self.cfg.jobs.max_result_bytes,
                        publish=False,
                        author=job.author,
                    )
                except ResultRefused as refused:
                    result = RunResult(False, result.exit_code, f"{refused}; nothing was committed", code=refused.code)
                    await asyncio.to_thread(joblog.exit_line, ctx.log_path, result.exit_code, result.summary)
            if not result.ok:
                actual = await asyncio.to_thread(actual_paths, worktree, base, limit=self.cfg.jobs.max_tracked_paths)
                await self.pool.release(repo, job.id, keep=True)
                step = lifecycle.after_run(
                    RunEnd(job.id, False, result.exit_code, result.code, result.summary, worktree=str(worktree))
                )
                job = await self._end(
                    job,
                    step,
                    finished_at=time.time(),
                    exit_code=result.exit_code,
                    actual=actual,
                    data={"code": step.code, "exit_code": result.exit_code},
                )
                log.warning(olog.Event.JOB_FAILED, code=step.code, reason=job.reason, exit_code=result.exit_code)
                return job
            actual = await asyncio.to_thread(actual_paths, worktree, base, limit=self.cfg.jobs.max_tracked_paths)
            step = lifecycle.after_run(
                RunEnd(
                    job.id,
                    True,
                    0,
                    summary=result.summary,
                    changed=sha is not None,
                    review=job.land == "review",
                    revised=bool(resume) and job.result is not None,  # a failed job's revision may have none yet
                )
            )
            sha = sha or (job.result if resume else None)
            if sha is None:
                await self.pool.release(repo, job.id, keep=False, delete_branch=True)
                job = await self._end(job, step, finished_at=time.time(), exit_code=0, actual=frozenset())
                log.info(olog.Event.JOB_FINISHED, changes=0, landed=False)
                return job
            if job.claim.paths and (wide := claims.outside(actual, job.claim.paths)):
                log.warning(olog.Event.JOB_OUTSIDE_CLAIM, paths=sorted(wide)[:50], claim=sorted(job.claim.paths))
                job = _still(
                    await self.board.update(
                        job.id, RUNNING, event=JobEvent.OUTSIDE_CLAIM, data={"paths": sorted(wide)[:50]}
                    ),
                    job,
                )
            job = await self._end(job, step, result=sha, actual=actual, exit_code=0, data={"result": sha})
            event = olog.Event.JOB_READY if step.to is JobState.READY else olog.Event.JOB_FINISHED
            log.info(event, result=sha, actual=sorted(actual)[:50], touched=len(actual))
            return job
        except _Moved as moved:
            # Someone else moved it on (it is no longer `running`): its worktree is kept, nothing more is written.
            with olog.best_effort("keep the worktree", *CLEANUP_ERRORS):
                await self.pool.release(repo, job.id, keep=True)
            if watcher is not None:
                with olog.best_effort("stop the change watcher", TimeoutError, OSError):
                    await asyncio.wait_for(watcher.stop(), 5)
            return moved.job
        except asyncio.CancelledError:
            stop = self.stops.pop(job.id, INTERRUPTED)
            with contextlib.suppress(OSError):
                await asyncio.shield(asyncio.to_thread(joblog.exit_line, self.paths.job_log(job.id), None, stop.reason))
            if watcher is not None:
                with olog.best_effort("stop the change watcher", TimeoutError, OSError):
                    await asyncio.wait_for(watcher.stop(), 5)
            with olog.best_effort("keep the worktree", *CLEANUP_ERRORS):
                await asyncio.shield(self.pool.release(repo, job.id, keep=True))
            await asyncio.shield(self._stop_write(job.id, stop))
            event = {JobState.CANCELLED: olog.Event.JOB_CANCELLED, JobState.FAILED: olog.Event.JOB_FAILED}.get(
                stop.state, olog.Event.DAEMON_CANCELLED
            )
            log.warning(event, code=stop.code, reason=stop.reason)
            raise
        except Exception as e:
            if watcher is not None:
                with olog.best_effort("stop the change watcher", TimeoutError, OSError):
                    await asyncio.wait_for(watcher.stop(), 5)
            with olog.best_effort("keep the worktree", *CLEANUP_ERRORS):
                await self.pool.release(repo, job.id, keep=True)
            code, reason = _failure(e)
            step = lifecycle.Step(JobState.FAILED, RUNNING, JobEvent.FAILED, code, reason)
            job = await self._end(job, step, finished_at=time.time(), data={"code": code})
            log.error(olog.Event.JOB_FAILED, code=code, reason=job.reason, exc_info=code is Code.RUNNER_ERROR)
            return job
        finally:
            if guard is not None:
                guard.cancel()
            if door is not None:
                await asyncio.shield(door.close())
            self._tasks.pop(job.id, None)
            structlog.contextvars.unbind_contextvars("job_id", "repo")
