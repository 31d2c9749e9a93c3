"""Planning off the scheduler loop: each queued job's plan runs as a task owned here.

Plans are read-only, so several run at once (bounded by `plan.concurrency`); a declared claim needs no
slot and no model, so it is stored at once. Each plan has a deadline: past it the job goes on with what
local evidence gave (the composite planner falls back itself; this deadline is the safety net). Whatever
happens, the job leaves `planning`: to `planned` (an empty claim at worst: ambiguous, runs alone) or to
`failed` when its repository or branch is gone. Every finished plan wakes the scheduler.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import logging as olog
from orchestrator import testhook
from orchestrator.core.job import Job
from orchestrator.core.models import ENDED, Code, JobEvent, JobState, Policy
from orchestrator.git import repos
from orchestrator.jobs.board import Board
from orchestrator.plan import accuracy
from orchestrator.plan.accuracy import Settled, outcomes
from orchestrator.plan.base import Note, Plan, Planner
from orchestrator.plan.composite import declared_plan

REFRESH = 10.0
"""Seconds between recomputations of the calibrated per-repo thresholds and of the planner's outcomes (they change
as jobs end)."""


class Planning:
    def __init__(
        self,
        board: Board,
        planner: Planner,
        concurrency: int,
        deadline: float,
        wake: Callable[[], None],
        policy: Callable[[], Policy] = Policy,
        calibrate_after: int = 5,
        task: Callable[[Job], str] | None = None,
    ):
        self.board = board
        self.policy = policy
        self.calibrate_after = calibrate_after
        self.raised: tuple[tuple[str, float], ...] = ()
        """Calibrated per-repo thresholds, for the admission snapshot's policy."""
        self._refreshed = float("-inf")
        self.planner = planner
        self.task = task
        """What of a job's text its runner reads as the task (`runners.task`): what the planner reads."""
        self.deadline = deadline
        self.wake = wake
        self._slots = asyncio.Semaphore(concurrency)
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def busy(self, job_id: int) -> bool:
        return job_id in self.tasks

    async def submit(self, job: Job) -> None:
        """Mark the job `planning` and start its plan; returns at once."""
        if job.id in self.tasks:
            return
        await self.refresh()
        moved = await self.board.transition(job.id, {JobState.QUEUED}, JobState.PLANNING, JobEvent.PLANNING)
        if moved is None:
            return  # cancelled (or cleaned) since the round read it
        job = moved
        task = asyncio.create_task(self._run(job), name=f"plan-{job.id}")
        self.tasks[job.id] = task
        task.add_done_callback(functools.partial(self._forget, job.id))

    async def records(self) -> list[accuracy.Record]:
        """Every ended job's predicted and actual paths, for calibration and `stats predict`."""
        store = self.board.store
        ended = await store.jobs.all(ENDED)
        hit = accuracy.collisions(ended, await store.events.of_kind(JobEvent.OVERLAP))
        return accuracy.records(ended, hit, self.policy())

    async def outcomes(self) -> dict[str, list[Settled]]:
        """Per repository, the pairs of jobs it ran side by side that have settled (`plan.accuracy.outcomes`)."""
        store = self.board.store
        events = store.events
        conflicts = [*(await events.of_kind(JobEvent.REQUEUED)), *(await events.of_kind(JobEvent.CONFLICTED))]
        ended = await store.jobs.all(ENDED)
        return outcomes(ended, await store.events.of_kind(JobEvent.ADMITTED), conflicts, self.policy().mergeable)

    async def refresh(self, force: bool = False) -> None:
        """Recompute the calibrated thresholds (at most every REFRESH seconds); log each change."""
        now = time.monotonic()
        if not force and now - self._refreshed < REFRESH:
            return
        self._refreshed = now
        observe = getattr(self.planner, "observe", None)
        if observe is not None:
            observe(await self.outcomes())
        raised = accuracy.thresholds(await self.records(), self.policy(), self.calibrate_after)
        if raised != self.raised:
            before = dict(self.raised)
            for repo, threshold in raised:
                if before.get(repo) != threshold:
                    olog.get(repo=repo).warning(
                        olog.Event.PLAN_THRESHOLD,
                        code="ConfidentClaimsMissed",
                        threshold=threshold,
                        reason=f"confident claims in this repo kept missing files: min confidence {threshold:.2f}",
                    )
            self.raised = raised

    def _forget(self, job_id: int, _task: asyncio.Task[None]) -> None:
        self.tasks.pop(job_id, None)
        self.wake()

    async def cancel(self, job_id: int) -> None:
        task = self.tasks.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def stop(self) -> None:
        for t in list(self.tasks.values()):
            t.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        close = getattr(self.planner, "close", None)
        if close is not None:
            await close()

    async def _run(self, job: Job) -> None:
        log = olog.get(job_id=job.id, repo=job.repo)
        await testhook.reach("plan", job.id)
        try:
            head = await asyncio.to_thread(repos.branch_head, Path(job.repo), job.branch)
        except repos.RepoError as e:
            await self._finish(
                job,
                JobState.FAILED,
                JobEvent.FAILED,
                finished_at=time.time(),
                reason=str(e),
                code=Code.REPO_ERROR,
                data={"code": Code.REPO_ERROR},
            )
            log.warning(olog.Event.JOB_FAILED, code=Code.REPO_ERROR, reason=str(e))
            return
        started = time.monotonic()
        plan = declared_plan(job)
        if plan is None:
            async with self._slots:
                log.debug(olog.Event.PLAN_STARTED, planner=self.planner.name, base=head)
                plan = await self._plan(job, head, log)
        await self._store(job, head, plan, time.monotonic() - started, log)

    async def _plan(self, job: Job, head: str, log: Any) -> Plan:
        # The composite falls back to local evidence at its own deadline; a little more is the safety net.
        try:
            if self.task is not None:  # the planner reads what the job's runner reads as its task
                job = dataclasses.replace(job, text=self.task(job))
            return await asyncio.wait_for(self.planner.plan(job, head), self.deadline + 5.0)
        except TimeoutError:
            reason = f"planning took longer than {self.deadline:g}s: the claim is empty, the job runs alone"
            log.warning(olog.Event.PLAN_NOTE, code=str(Note.DEADLINE), reason=reason)
            return Plan(notes=((Note.DEADLINE, reason),))
        except Exception as e:
            reason = f"planner failed: {type(e).__name__}: {e}; the claim is empty, the job runs alone"
            log.error(olog.Event.PLAN_NOTE, code=str(Note.FAILED), reason=reason, exc_info=True)
            return Plan(notes=((Note.FAILED, reason),))

    async def _store(self, job: Job, head: str, plan: Plan, took: float, log: Any) -> None:
        claim = plan.claim
        notes = [{"code": str(c), "reason": r} for c, r in plan.notes]
        done = await self._finish(
            job,
            JobState.PLANNED,
            JobEvent.PLANNED,
            base=head,
            claim=claim,
            plan_text=plan.text,
            evidence=tuple(e.to_json() for e in plan.evidence),
            data={"base": head, "claim": claim.to_json(), "basis": plan.basis, "notes": notes},
        )
        if not done:
            return
        for code, reason in plan.notes:
            if code is Note.NAMES_NOTHING:
                alone = "" if claim.risk is not None else ": the job runs alone in its repo"
                log.info(olog.Event.PLAN_NOTE, code=str(code), reason=reason + alone)
        log.info(
            olog.Event.JOB_PLANNED,
            base=head,
            claim=sorted(claim.paths),
            confidence=claim.confidence,
            source=str(claim.source),
            basis=plan.basis,
            seconds=round(took, 3),
            notes=[n["code"] for n in notes],
        )

    async def _finish(self, job: Job, to: JobState, event: JobEvent, **fields: Any) -> bool:
        """Store the outcome unless the job left `planning` meanwhile (cancelled): True if stored."""
        return await self.board.transition(job.id, {JobState.PLANNING}, to, event, **fields) is not None
