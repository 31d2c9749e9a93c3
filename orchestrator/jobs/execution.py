"""Run one admitted job: its worktree, its runner, the live watch of what it touches, its result commit.

The scheduler owns the task; this module only carries the job from `running` to `landing` (or to an end).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
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
from orchestrator.git.workspace import Rebased, ResultRefused, Workspace, remove_tree
from orchestrator.git.worktrees import WorktreePool, branch_name
from orchestrator.jobs import escapes, joblog, quota
from orchestrator.jobs.board import Board
from orchestrator.jobs.door import Door, Doors
from orchestrator.jobs.limits import Limits
from orchestrator.jobs.recovery import CLEANUP_ERRORS, StoreOwner
from orchestrator.jobs.rerun import Rerun, hold, recheck, requeue, seen_already, unseen_of
from orchestrator.jobs.retire import retire_attempt
from orchestrator.llm import pricing
from orchestrator.paths import Paths, open_private, private_dir
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
        self.limits = Limits(board.store.limits)
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

    async def _rerun(self, job: Job, rerun: Rerun, ran: float, *, resumes: bool = False) -> Job:
        """The attempt stopped (its runner is done): back to the queue behind what it met, or conflicted; with
        `resumes` (an agent CLI that goes on with its session), waiting to go on in its kept worktree instead."""
        current = await self.board.store.jobs.get(job.id) or job
        if current.state is not JobState.RUNNING:
            raise _Moved(current)
        if resumes:
            return await hold(self.board, self.pool, self._policy(), current, rerun, ran)
        return await requeue(self.board, self.pool, self._policy(), current, rerun, ran)

    async def _moved_on(self, job: Job, worktree: Path, resume: str) -> tuple[Job, str]:
        """A job stopped on a real conflict goes on in its kept worktree from the head (`moved_from`): what moved is
        merged into its files (`Workspace.rebase`), each file where its edit conflicted left as landed with its own
        version beside it in its private dir, and its agent is told."""
        done = await asyncio.to_thread(Workspace.at(worktree).rebase, str(job.base), branch_name(job.id))
        yours = self.paths.job_private(job.id) / "yours"
        await asyncio.to_thread(_hand_back, yours, done.yours)
        note = _moved_note(done, yours)
        job = _still(await self.board.update(job.id, RUNNING, moved_from="", feedback=f"{resume}\n\n{note}"), job)
        olog.get().info(
            olog.Event.JOB_MOVED_ON, old=done.old, new=done.new, moved=len(done.moved), yours=sorted(done.yours)
        )
        return job, job.feedback

    async def _beside(self, job: Job) -> tuple[int, ...]:
        """The other active jobs of the job's repository and branch (their landings can move its base)."""
        active = await self.board.store.jobs.all(ACTIVE)
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
        return await self.board.store.jobs.get(job.id) or job

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
        """Carry an admitted job (already stored as running, with its base) to landing or an end state, in three
        steps: `_prepare` (its worktree, the watch, the run's context), `_attempt` (its runner, waiting out rate
        limits) and `_settle` (again behind what it met, or its result committed and its next state written).

        One exit stack undoes what `_prepare` set up whichever way the run ends; on an unexpected end it keeps the
        worktree. With `resume` (review feedback), the job goes on in the worktree it kept: its runner is told
        `resume`, and what it changes goes on top of its earlier result."""
        structlog.contextvars.bind_contextvars(job_id=job.id, repo=job.repo)
        if (me := asyncio.current_task()) is not None:
            self._tasks[job.id] = me
        try:
            if not resume and (said := await seen_already(self.board, job)) is not None:
                step = lifecycle.Step(JobState.UNCHANGED, RUNNING, JobEvent.FINISHED, Code.NO_CHANGES, said)
                olog.get().info(olog.Event.JOB_FINISHED, changes=0, landed=False, rechecked=False)
                return await self._end(job, step, finished_at=time.time(), exit_code=0, actual=frozenset())
            async with contextlib.AsyncExitStack() as undo:
                attempt = await self._prepare(job, resume, undo)
                job, outcome = await self._attempt(attempt)
                return await self._settle(attempt, job, outcome)
        except _Moved as moved:
            return moved.job  # someone else moved it on (it is no longer `running`): nothing more is written
        except asyncio.CancelledError:
            await self._cancelled(job)
            raise
        except Exception as e:
            code, reason = _failure(e)
            step = lifecycle.Step(JobState.FAILED, RUNNING, JobEvent.FAILED, code, reason)
            job = await self._end(job, step, finished_at=time.time(), data={"code": code})
            log = olog.get()
            log.error(olog.Event.JOB_FAILED, code=code, reason=job.reason, exc_info=code is Code.RUNNER_ERROR)
            return job
        finally:
            self._tasks.pop(job.id, None)
            structlog.contextvars.unbind_contextvars("job_id", "repo")

    # -- prepare ----------------------------------------------------------------------------------------

    async def _prepare(self, job: Job, resume: str, undo: contextlib.AsyncExitStack) -> Attempt:
        """The job's worktree (its own, or the one it kept), the watch of what it touches, the guard of its disk
        use and the context its runner gets; each registered on `undo`."""
        assert job.base is not None
        base: str = job.base
        repo = Path(job.repo)
        undo.push_async_exit(functools.partial(self._keep_on_error, repo, job.id))
        runner = get_runner(job.runner, self.runners)
        if resume:
            # Where the pool keeps the job's workspace: a path in the record is never taken on its word.
            worktree = self.pool.path_for(repo, job.id)
            if not job.worktree or not await asyncio.to_thread(worktree.is_dir):
                raise RuntimeError(f"its worktree {worktree} is gone; nothing to go on from")
            if job.moved_from:
                job, resume = await self._moved_on(job, worktree, resume)
        else:
            if await asyncio.to_thread(self.pool.path_for(repo, job.id).exists):
                # An earlier attempt's workspace, kept (its node lost the job, or stopped): this attempt starts
                # afresh, that one's work kept on its attempt branch.
                kept = await retire_attempt(self.pool, job)
                olog.get().info(olog.Event.ATTEMPT_KEPT, branch=kept, why="a fresh workspace for this attempt")
            worktree = await self.pool.acquire(repo, job.id, base)
            if self.on_acquired is not None:
                self.on_acquired(repo, base)
            job = _still(await self.board.update(job.id, RUNNING, worktree=str(worktree)), job)
        olog.get().info(
            olog.Event.JOB_STARTED, worktree=str(worktree), base=base, runner=job.runner,
            claim=sorted(job.claim.paths),
        )  # fmt: skip
        watcher = ChangeWatcher(
            worktree, base, functools.partial(self._report, job.id), limit=self.cfg.jobs.max_tracked_paths
        )
        undo.push_async_callback(_stop_watching, watcher)
        await watcher.start()
        guard = asyncio.create_task(self._guard(job.id, [worktree, self.paths.job_private(job.id)]))
        undo.callback(guard.cancel)
        door: Door | None = None
        if self.doors is not None and getattr(runner, "wants_door", False):
            door = await self.doors.open(job.id, self.paths.job_private(job.id))
            undo.push_async_callback(_close_door, door)
        ctx = self._context(job, worktree, resume, door)
        await asyncio.to_thread(joblog.attempt_header, ctx.log_path, job, resume)
        # Without a sandbox, the user's checkout is compared before and after (see `escapes`).
        sandbox = getattr(runner, "sandbox", None)
        watch_checkout = not (sandbox is not None and sandbox.active)
        before = await asyncio.to_thread(escapes.snapshot, repo) if watch_checkout else None
        return Attempt(job, repo, base, worktree, runner, ctx, watcher, guard, before, resume)

    def _context(self, job: Job, worktree: Path, resume: str, door: Door | None) -> RunContext:
        """What the job's runner gets: its worktree, log, limits, owner of its processes, feedback, its door."""
        return RunContext(
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

    async def _keep_on_error(self, repo: Path, job_id: int, *exc: Any) -> bool:
        """On an unexpected end (an error, a cancel, the job moved by someone else): its worktree is kept."""
        if exc[0] is not None:
            with olog.best_effort("keep the worktree", *CLEANUP_ERRORS):
                await asyncio.shield(self.pool.release(repo, job_id, keep=True))
        return False

    # -- run ----------------------------------------------------------------------------------------------

    async def _attempt(self, a: Attempt) -> tuple[Job, RunResult | Rerun]:
        """The runner's runs (`_runs`), or the `Rerun` the watch stopped it with."""
        a.began = time.monotonic()
        return await self._runs_or_rerun(a.job, a.runner, a.ctx)

    # -- settle -------------------------------------------------------------------------------------------

    async def _settle(self, a: Attempt, job: Job, outcome: RunResult | Rerun) -> Job:
        """Where the job goes from what its run ended with."""
        if isinstance(outcome, Rerun) or (outcome.code == Code.CONFLICT and not outcome.ok):
            # Stopped on a real conflict, or its change does not apply on this base (a replay): it runs again.
            return await self._again(a, job, outcome)
        result = await self._escaped(a, job, outcome)
        await asyncio.to_thread(joblog.exit_line, a.ctx.log_path, result.exit_code, result.summary)
        a.guard.cancel()
        await a.watcher.stop()
        sha, result = await self._commit(a, job, result) if result.ok else (None, result)
        if not result.ok:
            return await self._failed(a, job, result)
        return await self._finished(a, job, result, sha)

    async def _again(self, a: Attempt, job: Job, outcome: RunResult | Rerun) -> Job:
        """Its run was stopped or its change does not apply here: back to the queue behind what it met."""
        ran = time.monotonic() - a.began
        a.guard.cancel()
        said = f"stopped: {outcome.reason}" if isinstance(outcome, Rerun) else outcome.summary
        await asyncio.to_thread(joblog.exit_line, a.ctx.log_path, None, said)
        await a.watcher.stop()
        if not isinstance(outcome, Rerun):
            # Its change does not apply here: another base may take it, once the jobs beside it and the earlier-queued
            # ones it went ahead of have landed (or now, on the head that has the ones it has not seen).
            missed = await unseen_of(self.board, replace(job, base=a.base))
            behind = tuple(sorted({*await self._beside(job), *missed.waiting}))
            settles = bool(behind or missed.landed)
            return await self._rerun(job, Rerun(outcome.summary, behind, settles=settles), ran)
        # An agent CLI that resumes its session goes on from where it was stopped; any other runs again.
        return await self._rerun(job, outcome, ran, resumes=bool(getattr(a.runner, "resumes", False)))

    async def _escaped(self, a: Attempt, job: Job, result: RunResult) -> RunResult:
        """`result`, or a failure when the job wrote the user's checkout while it ran (no sandbox to stop it)."""
        if a.before is None or not result.ok:
            return result
        wrote = await self._written(a.repo, a.before)
        if not wrote:
            return result
        olog.get().warning(olog.Event.JOB_ESCAPED, paths=wrote[:50])
        return RunResult(
            False,
            result.exit_code,
            f"wrote outside its worktree: {', '.join(wrote[:10])}{' ...' if len(wrote) > 10 else ''} "
            f"changed in {a.repo} while it ran (no sandbox here to stop it; if you made those edits "
            f"yourself, `orchestrator retry {job.id}`)",
            code=Code.WROTE_OUTSIDE,
        )

    async def _commit(self, a: Attempt, job: Job, result: RunResult) -> tuple[str | None, RunResult]:
        """The job's result commit, built by the daemon from its files (None: it changed nothing); a refused result
        is a failure that says why."""
        # A revision's change goes on top of its earlier result (the branch moves forward, nothing kept aside). Into
        # its quarantine: the result reaches the repository when it lands (`Lander`), not before.
        try:
            sha = await asyncio.to_thread(
                commits.commit_worktree, a.worktree,
                message=job.revision_text(a.resume) if a.resume else job.commit_text, job_id=job.id, base=a.base,
                repo_path=a.repo, stack=bool(a.resume), prior=job.result if a.resume else None, author=job.author,
                max_total=self.cfg.jobs.max_result_bytes, publish=False,
            )  # fmt: skip
        except ResultRefused as refused:
            result = RunResult(False, result.exit_code, f"{refused}; nothing was committed", code=refused.code)
            await asyncio.to_thread(joblog.exit_line, a.ctx.log_path, result.exit_code, result.summary)
            return None, result
        return sha, result

    async def _failed(self, a: Attempt, job: Job, result: RunResult) -> Job:
        """Its run failed: its worktree is kept for a person, what it touched recorded."""
        actual = await asyncio.to_thread(actual_paths, a.worktree, a.base, limit=self.cfg.jobs.max_tracked_paths)
        await self.pool.release(a.repo, job.id, keep=True)
        step = lifecycle.after_run(
            RunEnd(job.id, False, result.exit_code, result.code, result.summary, worktree=str(a.worktree))
        )
        job = await self._end(
            job, step, finished_at=time.time(), exit_code=result.exit_code, actual=actual,
            data={"code": step.code, "exit_code": result.exit_code},
        )  # fmt: skip
        olog.get().warning(olog.Event.JOB_FAILED, code=step.code, reason=job.reason, exit_code=result.exit_code)
        return job

    async def _finished(self, a: Attempt, job: Job, result: RunResult, sha: str | None) -> Job:
        """Its run ended well: to landing (or review) with its result, or unchanged when it changed nothing."""
        actual = await asyncio.to_thread(actual_paths, a.worktree, a.base, limit=self.cfg.jobs.max_tracked_paths)
        step = lifecycle.after_run(
            RunEnd(
                job.id, True, 0, summary=result.summary, changed=sha is not None, review=job.land == "review",
                revised=bool(a.resume) and job.result is not None,  # a failed job's revision may have none yet
            )
        )  # fmt: skip
        sha = sha or (job.result if a.resume else None)
        if sha is None:
            await self.pool.release(a.repo, job.id, keep=False, delete_branch=True)
            missed = await unseen_of(self.board, replace(job, base=a.base))
            if lifecycle.on_unchanged(job.attempts, self._policy(), unseen=bool(missed)) is JobState.QUEUED:
                return _still(await recheck(self.board, job, missed, result.summary), job)
            job = await self._end(job, step, finished_at=time.time(), exit_code=0, actual=frozenset())
            olog.get().info(olog.Event.JOB_FINISHED, changes=0, landed=False)
            return job
        if job.claim.paths and (wide := claims.outside(actual, job.claim.paths)):
            olog.get().warning(olog.Event.JOB_OUTSIDE_CLAIM, paths=sorted(wide)[:50], claim=sorted(job.claim.paths))
            job = _still(
                await self.board.update(
                    job.id, RUNNING, event=JobEvent.OUTSIDE_CLAIM, data={"paths": sorted(wide)[:50]}
                ),
                job,
            )
        job = await self._end(job, step, result=sha, actual=actual, exit_code=0, data={"result": sha})
        event = olog.Event.JOB_READY if step.to is JobState.READY else olog.Event.JOB_FINISHED
        olog.get().info(event, result=sha, actual=sorted(actual)[:50], touched=len(actual))
        return job

    async def _cancelled(self, job: Job) -> None:
        """Its task was cancelled (a person, the daemon stopping, a limit): its stop written, whatever comes."""
        stop = self.stops.pop(job.id, INTERRUPTED)
        with contextlib.suppress(OSError):
            await asyncio.shield(asyncio.to_thread(joblog.exit_line, self.paths.job_log(job.id), None, stop.reason))
        await asyncio.shield(self._stop_write(job.id, stop))
        event = {JobState.CANCELLED: olog.Event.JOB_CANCELLED, JobState.FAILED: olog.Event.JOB_FAILED}.get(
            stop.state, olog.Event.DAEMON_CANCELLED
        )
        olog.get().warning(event, code=stop.code, reason=stop.reason)


@dataclass
class Attempt:
    """One run of a job in its worktree: what its steps share."""

    job: Job
    repo: Path
    base: str
    worktree: Path
    runner: Runner
    ctx: RunContext
    watcher: ChangeWatcher
    guard: asyncio.Task[None]
    before: escapes.CheckoutState | None
    """The user's checkout before the run, when no sandbox keeps the job out of it."""
    resume: str
    began: float = 0.0


async def _stop_watching(watcher: ChangeWatcher) -> None:
    """The watch ends with its run (a no-op when the run stopped it already)."""
    with olog.best_effort("stop the change watcher", TimeoutError, OSError):
        await asyncio.wait_for(watcher.stop(), 5)


async def _close_door(door: Door) -> None:
    """The job's door closes with its run, even when the run is being cancelled."""
    await asyncio.shield(door.close())


def _hand_back(where: Path, yours: dict[str, bytes]) -> None:
    """The job's own versions of the files its edit conflicted in, under `where` (made afresh, 0700)."""
    remove_tree(where)
    for rel, data in yours.items():
        dest = where / rel
        private_dir(dest.parent)
        fd = open_private(dest, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


def _moved_note(done: Rebased, yours: Path) -> str:
    """What a job's agent is told when it goes on from the new head: what moved, and where its edits conflicted."""
    if not done.moved:
        return "The branch did not move meanwhile (the job it waited for did not land): go on with your task."
    shown = ", ".join(done.moved[:20]) + (f" and {len(done.moved) - 20} more" if len(done.moved) > 20 else "")
    note = (
        f"While you were stopped, the branch moved from {done.old[:12]} to {done.new[:12]} in {len(done.moved)} "
        f"path{'s' if len(done.moved) != 1 else ''} ({shown}); that is merged into your working tree, which now "
        "starts from the new head."
    )
    if done.yours:
        files = ", ".join(sorted(done.yours))
        note += (
            f" Your edits to {files} conflicted with it: those files now hold the landed version, and yours are kept "
            f"read-only under {yours}/ (same paths). Make your change again on top of the landed version."
        )
    return note + " Go on with your task from there."
