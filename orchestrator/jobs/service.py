"""The job verbs: what the API, the hook's intake and the spool ask of the job plane (enqueue, cancel, land,
reject, retry, clean, pause, wait, ...). Each verb reads the job, decides (`core.lifecycle`), and writes with
the expectation it read: when the daemon moved the job meanwhile, the write finds it elsewhere and the verb
says so (or, for a cancel, reads and decides again) — it never overwrites what happened in between.

Verbs on one job are taken one at a time (a per-job lock): two retries, or a clean beside a retry, do not
interleave their git work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from orchestrator import logging as olog
from orchestrator import requests as rq
from orchestrator import runners as runners_mod
from orchestrator import testhook
from orchestrator.config import Config
from orchestrator.core import claims, prose
from orchestrator.core.job import Job, fresh_attempt
from orchestrator.core.lifecycle import Cancel, Revise, on_cancel, on_revise
from orchestrator.core.models import CANCELLABLE, ENDED, OPEN, RETRYABLE, Code, JobEvent, JobState
from orchestrator.git import repos
from orchestrator.git.worktrees import WorktreePool
from orchestrator.jobs import retire, review
from orchestrator.jobs.board import Board
from orchestrator.jobs.editing import Change, EditError, Editing
from orchestrator.jobs.execution import Stop
from orchestrator.jobs.landing import Lander
from orchestrator.jobs.planning import Planning
from orchestrator.jobs.privatedirs import PrivateDirs
from orchestrator.jobs.recovery import CLEANUP_ERRORS
from orchestrator.jobs.retire import AttemptKept, retire_attempt
from orchestrator.jobs.scheduler import Scheduler
from orchestrator.paths import Paths
from orchestrator.plan import declared
from orchestrator.plan.base import Planner
from orchestrator.proc import jobpath
from orchestrator.runners import Runner
from orchestrator.store import NotShared, Write
from orchestrator.validate import BadRequest

MAX_FEEDBACK = 32_000
"""Characters of review feedback (`revise`): it reaches a CLI as one argument and in its environment."""
CANCEL_TRIES = 8
"""Reads a cancel makes at most: each one finds the job further along (started, landed, ended)."""


class JobError(Exception):
    """A request about a job cannot be done; the message says why and what to do."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


class Jobs:
    def __init__(
        self,
        board: Board,
        cfg: Config,
        paths: Paths,
        pool: WorktreePool,
        runners: dict[str, Runner],
        scheduler: Scheduler,
        planning: Planning,
        lander: Lander,
        private_dirs: PrivateDirs,
    ) -> None:
        self.board = board
        self.store = board.store
        self.cfg = cfg
        self.paths = paths
        self.pool = pool
        self.runners = runners
        self.scheduler = scheduler
        self.planning = planning
        self.lander = lander
        self.private_dirs = private_dirs
        self.editing = Editing(board, planning, scheduler.wake)
        self._locks: dict[int, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, job_id: int) -> AsyncIterator[None]:
        lock = self._locks.setdefault(job_id, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and self._locks.get(job_id) is lock:
                del self._locks[job_id]

    # -- reading --------------------------------------------------------------------------------------

    async def get(self, job_id: int) -> Job:
        job = await self.store.jobs.get(job_id)
        if job is None:
            raise JobError(f"no job {job_id}: `orchestrator status` lists the jobs", status=404)
        return self.scheduler.live(job)

    async def wait(self, ids: Iterable[int], timeout: float | None) -> list[Job]:
        """Until every one of these jobs has ended (or `timeout`); the jobs as they are then, in order."""
        ids = list(dict.fromkeys(ids))
        known = {j.id for j in await self.store.jobs.many(ids)}
        missing = [i for i in ids if i not in known]
        if missing:
            raise JobError(f"no job {missing[0]}: `orchestrator status` lists the jobs", status=404)
        await self.board.wait_ended(ids, timeout)
        found = {j.id: j for j in await self.store.jobs.many(ids)}
        return [self.scheduler.live(found[i]) for i in ids if i in found]

    async def diff(self, job_id: int, against_head: bool) -> dict[str, Any]:
        try:
            return await review.diff_async(await self.get(job_id), against_head)
        except review.ReviewError as e:
            raise JobError(str(e)) from None

    # -- enqueue --------------------------------------------------------------------------------------

    async def submit(self, request: rq.Enqueue, ticket: tuple[str, str | None] | None = None) -> Job:
        """Queue one job (the API, the hook's tickets and the spool share it): what the request cannot check on
        its own (its repository and branch, its runner, the jobs it runs after) is checked here.

        `ticket` is (idempotency key, ticket id), stored with the job in one transaction.
        """
        repo, branch, _ = await resolve(request.repo, request.branch)
        claim = declared.claim(request.paths)
        runner = request.runner or await self._runner_for(request.command, list(request.argv) or None)
        if runner not in self.runners:
            raise BadRequest(f"unknown runner {runner!r}: use one of {', '.join(sorted(self.runners))}")
        land = request.land or self.cfg.land_mode(str(repo))
        if land not in rq.LAND_MODES:
            raise BadRequest(f"--land {land!r}: use auto (land when finished) or review (wait for `orchestrator land`)")
        priority = request.priority or 0
        after = list(request.after)
        known = {j.id for j in await self.store.jobs.many(after)}
        for dep in after:
            if dep not in known:
                raise BadRequest(f"--after {dep}: no such job (`orchestrator status` lists the jobs)")
        before = request.before
        place: float | None = None
        room: list[Write] = []
        if before is not None:
            try:
                spot, room = await self.editing.place_for_new(before)
            except EditError as e:
                raise BadRequest(str(e)) from None
            place, priority = spot.place, spot.priority
        try:
            await self.editing.make_room(room)
        except EditError as e:
            raise JobError(str(e)) from None
        try:
            job = await self.board.add(
                repo=str(repo),
                branch=branch,
                text=request.command,
                runner=runner,
                priority=priority,
                after=after,
                declared=sorted(claim.paths),
                claim=claim,
                argv=request.argv or None,
                land=land,
                ticket=ticket,
                labels=request.labels,
                place=place,
                author=request.author,
            )
        except NotShared as e:  # team mode: a clone with no shared remote
            raise BadRequest(str(e)) from None
        olog.get(job_id=job.id, repo=job.repo).info(
            olog.Event.JOB_ENQUEUED,
            branch=branch,
            runner=runner,
            declared=sorted(claim.paths),
            priority=priority,
            after=after,
        )
        return job

    async def _runner_for(self, text: str, argv: list[str] | None) -> str:
        """The runner of a job queued with none named: `default_runner`; but a text in words for a `shell` default
        goes to the configured agent when a job can run it, and is refused otherwise, saying what to type."""
        runner = self.cfg.jobs.default_runner
        if runner != "shell" or argv:
            return runner
        path = jobpath.job_path(os.environ.get("PATH", ""))
        reading = await asyncio.to_thread(prose.read, text, lambda word: shutil.which(word, path=path) is not None)
        if reading.missing:
            raise BadRequest(
                f"this reads as a shell command, but {reading.why} ({path}): run, it would fail (exit 127). Install "
                f"it where a job finds it, or name it by its path (say `.venv/bin/{reading.word}`); a task in words "
                "goes to an agent (`--runner NAME`, `orchestrator runners` lists them)"
            )
        if not reading.prose:
            return runner
        agent = self.cfg.jobs.agent
        why = await runners_mod.unready(self.runners, agent) if agent else None
        if agent and why is None:
            return agent
        raise BadRequest(await self._prose_refusal(reading, agent, why))

    async def _prose_refusal(self, reading: prose.Reading, agent: str, why: str | None) -> str:
        """What to do with a text in words that no agent takes: the agents a job can run here, and the settings."""
        agents = [n for n in sorted(self.runners) if n not in ("shell", "replay")]
        ready = [n for n in agents if await runners_mod.unready(self.runners, n) is None]
        head = f"this reads as a task in words, not a shell command ({reading.why})"
        if agent:
            head += f", and the default agent {agent} cannot run here: {why}"
        if ready:
            how = (f"give it to an agent: `orchestrator enqueue --runner {ready[0]} ...`"
                   + (f" (ready here: {', '.join(ready)})" if len(ready) > 1 else "")
                   + f"; `[jobs] agent = \"{ready[0]}\"` in the config sends such texts there by default")  # fmt: skip
        else:
            how = (f"no agent can run a job here ({', '.join(agents) or 'none configured'}): `orchestrator runners` "
                   "says what each lacks")  # fmt: skip
        return f"{head}: {how}; `--runner shell` runs it as a shell script anyway"

    # -- editing the queue ----------------------------------------------------------------------------

    async def edit(self, job_id: int, request: rq.Edit) -> Job:
        """Change a waiting job's `text`, `paths` (its declared ones) or `priority` (see `jobs.editing`)."""
        paths = None if request.paths is None else tuple(sorted(declared.claim(request.paths).paths))
        change = Change(request.text, paths, request.priority)
        async with self._one_at_a_time(job_id):
            try:
                return await self.editing.edit(job_id, change)
            except EditError as e:
                raise JobError(str(e)) from None

    async def move(self, job_id: int, before: int) -> Job:
        """Put a waiting job just before another waiting one in the queue."""
        async with self._one_at_a_time(job_id):
            try:
                return await self.editing.move(job_id, before)
            except EditError as e:
                raise JobError(str(e)) from None

    async def switch(self, a: int, b: int) -> list[Job]:
        """Two waiting jobs take each other's place in the queue."""
        if a == b:
            raise BadRequest(f"job {a} cannot switch with itself: name two jobs")
        async with self._one_at_a_time(min(a, b)), self._one_at_a_time(max(a, b)):
            try:
                return await self.editing.switch(a, b)
            except EditError as e:
                raise JobError(str(e)) from None

    # -- steering -------------------------------------------------------------------------------------

    async def cancel(
        self,
        job_id: int,
        *,
        reason: str = "cancelled by request",
        event: JobEvent = JobEvent.CANCELLED,
        data: dict[str, Any] | None = None,
        only: frozenset[JobState] = CANCELLABLE,
    ) -> Job:
        """Cancel a job wherever it is; `only`: refuse (JobError) once it is outside these states."""
        async with self._one_at_a_time(job_id):
            stopped = False
            for _ in range(CANCEL_TRIES):
                job = await self.get(job_id)
                if stopped and job.state is JobState.CANCELLED:
                    return job  # its task wrote it
                if job.state in CANCELLABLE and job.state not in only:
                    raise JobError(f"job {job_id} is {job.state} now; not cancelled")
                await testhook.reach("cancel", job_id)
                # Team mode: another node's landing may be pushing right now, which this node cannot see.
                landing_now = self.lander.landing_now(job_id) or (
                    job.state is JobState.LANDING and not self.store.team.mine(job)
                )
                how = on_cancel(job.state, task=job_id in self.scheduler.running, landing_now=landing_now)
                if how is Cancel.ENDED:
                    raise JobError(f"job {job_id} already ended ({job.state}); nothing to cancel")
                if how is Cancel.LANDING_NOW:
                    raise JobError(f"job {job_id} is landing right now; wait for it (`orchestrator wait {job_id}`)")
                if how is Cancel.STOP_RUN:
                    stopped = await self.scheduler.stop_job(job_id, Stop(JobState.CANCELLED, reason, Code.CANCELLED))
                    continue  # read again: its task wrote `cancelled`, or it never started and is still planned
                if how is Cancel.STOP_PLAN:
                    await self.planning.cancel(job_id)
                elif how is Cancel.STOP_LANDING:
                    self.lander.withdraw(job_id)
                done = await self.board.transition(
                    job_id,
                    {job.state},
                    JobState.CANCELLED,
                    event,
                    finished_at=time.time(),
                    reason=reason,
                    code=Code.CANCELLED,
                    data={"code": Code.CANCELLED, **(data or {})},
                )
                if done is None:
                    continue  # it moved on meanwhile: decide again on where it is now
                if how in (Cancel.RELEASE, Cancel.STOP_LANDING):
                    with olog.best_effort("keep the cancelled job's worktree", *CLEANUP_ERRORS, job_id=job_id):
                        await self.pool.release(Path(job.repo), job_id, keep=True)
                olog.get(job_id=job_id, repo=job.repo).warning(
                    olog.Event.JOB_CANCELLED, code=Code.CANCELLED, reason=reason
                )
                return done
        raise JobError(f"job {job_id} kept moving while it was being cancelled; try again")

    async def land(self, job_id: int) -> Job:
        """Review mode: land a ready job (hand it to its branch's landing queue)."""
        async with self._one_at_a_time(job_id):
            try:
                return await review.land(self.board, self.lander, await self.get(job_id))
            except review.ReviewError as e:
                raise JobError(str(e)) from None

    async def reject(self, job_id: int) -> Job:
        """Review mode: drop a ready job; its paths are free again, its branch is kept."""
        async with self._one_at_a_time(job_id):
            try:
                return await review.reject(self.board, self.pool, await self.get(job_id))
            except review.ReviewError as e:
                raise JobError(str(e)) from None

    async def revise(self, job_id: int, feedback: str) -> Job:
        """Send a job back to its agent with `feedback`; it goes on in the worktree it kept, from its earlier work,
        and is ready (or lands) again. A ready job runs again at once (its paths and slot stay taken throughout);
        a failed or interrupted one waits for admission first (its paths are free), keeping its base and worktree.
        The feedback is stored with the move, so a crash at any point leaves the job as it was or waiting with it."""
        if not feedback.strip():
            raise BadRequest("the feedback is empty: say what the agent should change")
        if len(feedback) > MAX_FEEDBACK:
            raise BadRequest(f"the feedback is {len(feedback)} characters; at most {MAX_FEEDBACK} reach an agent CLI")
        async with self._one_at_a_time(job_id):
            job = await self.get(job_id)
            if job.node and not self.store.team.mine(job):  # team mode: its worktree is on the node that ran it
                raise JobError(f"job {job_id} ran on node {job.node!r}: revise it there, where its worktree is")
            kept = job.state in (JobState.FAILED, JobState.INTERRUPTED) and await self._worktree_kept(job)
            how = on_revise(job.state, worktree_kept=kept)
            if how in (Revise.NOT_NOW, Revise.NO_WORKTREE):
                raise JobError(_not_revised(job, how))
            if job.runner not in self.runners:
                instead = "`orchestrator land` or `orchestrator reject` it" if how is Revise.NOW else "configure it"
                raise JobError(f"job {job_id}'s runner {job.runner!r} is not configured any more; {instead}")
            round_ = job.revisions + 1
            data = {"code": Code.REVISED, "round": round_, "feedback": feedback[:2000], "from": str(job.state)}
            await testhook.reach("revise", job_id)
            extra: dict[str, Any] = {}
            if how is Revise.NOW:
                to, reason = JobState.RUNNING, f"revision {round_}: runs again in its worktree with your feedback"
            else:
                # Its paths are free since it ended: it asks for them again, with all its kept worktree touched.
                to = JobState.PLANNED
                reason = f"revision {round_}: waits for admission, then goes on in its kept worktree with your feedback"
                grown = job.grown | claims.outside(job.actual, job.view().claim.paths)
                extra = {"grown": grown, "finished_at": None, "exit_code": None, "decision": None}
            moved = await self.board.transition(
                job_id, {job.state}, to, JobEvent.REVISED, revisions=round_, feedback=feedback, reason=reason,
                code=Code.REVISED, data=data, **extra,
            )  # fmt: skip
            if moved is None:
                raise JobError(f"job {job_id} changed while it was being revised; `orchestrator show {job_id}`")
            if how is Revise.NOW:
                self.scheduler.resume(moved)
            else:
                self.scheduler.wake()
            olog.get(job_id=job_id, repo=job.repo).info(
                olog.Event.JOB_REVISED, round=round_, chars=len(feedback), waits=how is Revise.ADMIT
            )
            return moved

    async def _worktree_kept(self, job: Job) -> bool:
        """The job's own workspace is on disk where its record says (a failed or interrupted job keeps it)."""
        if not job.worktree:
            return False
        ws = self.pool.workspace(Path(job.repo), job.id)
        return Path(job.worktree) == ws.root and await asyncio.to_thread(lambda: ws.exists() and ws.root.is_dir())

    async def retry(self, job_id: int) -> Job:
        async with self._one_at_a_time(job_id):
            job = await self.get(job_id)
            if job.state not in RETRYABLE:
                raise JobError(
                    f"job {job_id} is {job.state}; only failed, cancelled, conflicted, interrupted or unchanged jobs "
                    "can be retried"
                )
            await self.scheduler.settled(job_id)  # no task of an earlier decision can start the new attempt
            try:
                # Always: a crash may leave a worktree or branch the job's record does not name yet.
                kept = await retire_attempt(self.pool, job)
            except AttemptKept as e:
                raise JobError(str(e)) from None
            done = await self.board.transition(
                job_id,
                {job.state},
                JobState.QUEUED,
                JobEvent.RETRIED,
                **fresh_attempt(job),
                reason="retried" + (f"; previous attempt kept on {kept}" if kept else ""),
                code=Code.RETRIED,
                data={"kept": kept, "code": Code.RETRIED},
            )
            if done is None:
                raise JobError(f"job {job_id} changed while it was being retried; `orchestrator show {job_id}`")
            olog.get(job_id=job_id, repo=job.repo).info(olog.Event.JOB_RETRIED, code=Code.RETRIED, kept=kept)
            return done

    async def clean(self, job_id: int) -> list[str]:
        """Forget an ended job: its worktree, its branch, its earlier attempts' branches, its log and its record.

        Landed commits stay in git; only the bookkeeping goes.
        """
        async with self._one_at_a_time(job_id):
            job = await self.get(job_id)
            if not job.state.terminal:
                raise JobError(f"job {job_id} is {job.state}; cancel it first (`orchestrator cancel {job_id}`)")
            waiting = [j.id for j in await self.store.jobs.all(OPEN) if job_id in j.after]
            if waiting:
                raise JobError(f"job {job_id} is a dependency (--after) of open jobs {waiting}; clean it once they end")
            await self.pool.clean(Path(job.repo), job_id)
            dropped = await asyncio.to_thread(retire.drop_attempts, Path(job.repo), job_id)
            if not await self.board.forget(job_id, ENDED):
                raise JobError(f"job {job_id} changed while it was being cleaned; `orchestrator show {job_id}`")
            await asyncio.to_thread(self.private_dirs.remove, job_id)  # its private dir, log and transcript
            olog.get(job_id=job_id, repo=job.repo).info(olog.Event.JOB_CLEANED, branches=dropped)
            return dropped

    async def control(self, scope: str, *, paused: bool | None = None, slots: int | bool | None = False) -> None:
        """Pause, resume or limit a repo (or every repo): stored first, then a fact of the next snapshot."""
        await self.store.limits.set_control(scope, paused=paused, slots=slots)
        self.scheduler.controls = controls = await self.store.limits.controls()
        olog.get(repo=scope).info(
            olog.Event.CONTROL_CHANGED,
            scope=scope,
            paused=controls.get(scope, (False, None))[0],
            slots=controls.get(scope, (False, None))[1],
        )
        await self.board.announce()


def _not_revised(job: Job, how: Revise) -> str:
    """Why `job` cannot be revised (`how`: NOT_NOW or NO_WORKTREE), and what to do instead."""
    i = job.id
    if how is Revise.NO_WORKTREE:
        gone = f"{job.worktree} is gone" if job.worktree else "it ended before it had one"
        return (
            f"job {i} is {job.state} with no worktree kept ({gone}), so its agent has nothing to go on from: "
            f"`orchestrator retry {i}` runs it again from the start"
        )
    if job.state in RETRYABLE:
        hint = f"`orchestrator retry {i}` runs it again from the start"
    elif job.state is JobState.LANDED:
        hint = "its work is on its branch; enqueue a new job for more"
    else:
        hint = f"`orchestrator why {i}` says when it will be"
    return (
        f"job {i} is {job.state}; only a ready job, or a failed or interrupted one whose worktree is kept, can be "
        f"revised: {hint}"
    )


async def resolve(repo_raw: str, branch: str | None) -> tuple[Path, str, str]:
    """A request's repository, target branch (None: the default one) and that branch's head, or a RepoError
    saying what to fix."""
    repo = await asyncio.to_thread(repos.canonical, Path(repo_raw))
    target: str = branch if branch else await asyncio.to_thread(repos.default_branch, repo)
    head = await asyncio.to_thread(repos.branch_head, repo, target)
    return repo, target, head


async def plan_for(planner: Planner, request: rq.Plan) -> dict[str, Any]:
    """The claim `planner` makes for a request's text, with the evidence for each path; nothing is queued. What
    `orchestrator plan` prints, from the daemon or in-process."""
    repo, branch, head = await resolve(request.repo, request.branch)
    base = await asyncio.to_thread(repos.resolve_rev, repo, request.base) if request.base else head
    paths = sorted(declared.claim(request.paths).paths)
    probe = Job(0, str(repo), branch, request.text, "", JobState.QUEUED, declared=tuple(paths))
    plan = await planner.plan(probe, base)
    return {"repo": str(repo), "branch": branch, "base": base, **plan.to_json()}
