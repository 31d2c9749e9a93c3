"""A running job whose attempt met a real conflict: stopped, its work kept, and run again behind the job it met.

Two things find such a conflict while a job runs: the conflict watch (`jobs.conflicts`: an in-memory merge of two
running jobs' trees, or of a running job's tree with what just landed), and the replay runner (its recorded
change does not apply on the job's base). Either way the attempt is stopped (its runner's processes end; its
workspace stays for this module), what it made so far is committed on an attempt branch of its own (`retire`:
nothing is lost), and the job goes back to the queue with `land_after` naming the jobs it met: admission starts
it once they have ended, planned again on a base that has their change. With no attempt left, or no job whose
landing could settle it (the same base would meet the same conflict), it is left `conflicted` for a person, its
worktree kept.

A job whose run ended well with nothing to change, on a base without the change of an earlier-queued job it went
ahead of (`core.overtake`), goes back to the queue the same way (`recheck`, event `recheck`, code `Overtook`): the
queue's order promised it that change, and with it there may be something to do after all.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator import logging as olog
from orchestrator.core import claims, lifecycle
from orchestrator.core.admission_index import plist
from orchestrator.core.job import Job, fresh_attempt
from orchestrator.core.models import OPEN, Code, JobEvent, JobState
from orchestrator.core.overtake import Unseen, unseen
from orchestrator.git import repos
from orchestrator.git.repos import RepoError
from orchestrator.git.worktrees import WorktreePool
from orchestrator.jobs.board import Board
from orchestrator.jobs.retire import AttemptKept, retire_attempt

RUNNING = frozenset({JobState.RUNNING})
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Rerun:
    """Why a running job's attempt stops, and what it runs again behind."""

    reason: str
    """One line: what met what (`a real conflict with job 3 in a.py`)."""
    behind: tuple[int, ...] = ()
    """The jobs it runs again after (they land first); empty when what it met has landed already."""
    conflicts: tuple[str, ...] = ()
    """The paths that conflict."""
    settles: bool = True
    """A fresh attempt can settle it: it meets another base (the jobs `behind` land first, or one landed)."""


async def requeue(
    board: Board, pool: WorktreePool, policy: lifecycle.LandingPolicy, job: Job, rerun: Rerun, ran: float
) -> Job:
    """Carry a `running` job whose attempt stopped on `rerun` (its processes ended) back to the queue behind
    `rerun.behind`, or to `conflicted`; returns the job as stored. `ran`: seconds the stopped attempt ran (the
    work thrown away, in the requeued event for the benchmark)."""
    log = olog.get(job_id=job.id, repo=job.repo)
    to = lifecycle.on_conflict(job.attempts, policy, behind=rerun.settles)
    data: dict[str, Any] = {
        "code": Code.CONFLICT,
        "why": rerun.reason,
        "conflicts": list(rerun.conflicts[:50]),
        "behind": list(rerun.behind),
        "ran_s": round(ran, 3),
    }
    after = f"stopped after {ran:.1f} s"
    if to is JobState.QUEUED:
        try:
            kept = await retire_attempt(pool, job)
        except AttemptKept as e:
            return await _conflicted(board, pool, job, f"{rerun.reason}; {after}; {e}", data)
        waits = f"runs again once {_jobs(rerun.behind)} landed" if rerun.behind else "runs again on the new head"
        reason = (
            f"{rerun.reason}; {after}: {waits} (attempt {job.attempts + 2} of {policy.max_attempts}); "
            f"its work so far kept as {kept}"
        )
        fields = {**fresh_attempt(job), "land_after": rerun.behind}
        done = await board.transition(
            job.id, RUNNING, JobState.QUEUED, JobEvent.REQUEUED, code=Code.CONFLICT, reason=reason,
            data={**data, "kept": kept}, **fields,
        )  # fmt: skip
        log.info(olog.Event.JOB_REQUEUED, attempt=job.attempts + 2, kept=kept, **data)
        return done or await board.store.jobs.get(job.id) or job
    why = "no attempt left" if rerun.settles else "another attempt on this base would meet it again"
    return await _conflicted(board, pool, job, f"{rerun.reason}; {after}; not run again ({why})", data)


async def hold(
    board: Board, pool: WorktreePool, policy: lifecycle.LandingPolicy, job: Job, rerun: Rerun, ran: float
) -> Job:
    """For an agent CLI that resumes its own session: carry a `running` job whose attempt stopped on `rerun` back to
    `planned`, its worktree and session kept, behind `rerun.behind`. Admitted again (once they have ended) it starts
    on the branch head: what landed is merged into its files and its agent goes on, told what moved (`moved_from`,
    the executor). Or `conflicted`, as `requeue`, when no attempt is left."""
    if lifecycle.on_conflict(job.attempts, policy, behind=rerun.settles) is not JobState.QUEUED:
        return await requeue(board, pool, policy, job, rerun, ran)
    log = olog.get(job_id=job.id, repo=job.repo)
    first = f"once {_jobs(rerun.behind)} landed" if rerun.behind else "at once"
    note = (
        f"You were stopped while you worked: {rerun.reason}, which lands first. Your work so far is kept in your "
        "working tree; you go on from there once the other change is in."
    )
    reason = (
        f"{rerun.reason}; stopped after {ran:.1f} s: goes on in its kept worktree on the new head {first} "
        f"(attempt {job.attempts + 2} of {policy.max_attempts})"
    )
    data: dict[str, Any] = {
        "code": Code.CONFLICT, "why": rerun.reason, "conflicts": list(rerun.conflicts[:50]),
        "behind": list(rerun.behind), "ran_s": round(ran, 3), "resume": True,
    }  # fmt: skip
    await pool.release(Path(job.repo), job.id, keep=True)
    # Its paths are held while it waits, all its kept worktree touched with them (as a revision waits).
    grown = job.grown | claims.outside(job.actual, job.view().claim.paths)
    done = await board.transition(
        job.id, RUNNING, JobState.PLANNED, JobEvent.REQUEUED, attempts=job.attempts + 1, land_after=rerun.behind,
        feedback=note, moved_from=job.base or "", grown=grown, decision=None, code=Code.CONFLICT, reason=reason,
        data=data,
    )  # fmt: skip
    log.info(olog.Event.JOB_REQUEUED, attempt=job.attempts + 2, **data)
    return done or await board.store.jobs.get(job.id) or job


async def unseen_of(board: Board, job: Job) -> Unseen:
    """The earlier-queued jobs of `job`'s branch whose change its base lacks (`core.overtake`)."""
    jobs = await board.store.jobs.all(OPEN)
    if job.base is None:
        return unseen(job, jobs, frozenset())
    try:
        since = await asyncio.to_thread(repos.commits_since, Path(job.repo), job.branch, job.base)
    except RepoError as e:  # its branch is gone: nothing landed there since, and what waits will say so
        olog.get(job_id=job.id, repo=job.repo).warning(olog.Event.SCHEDULER_ERROR, error=str(e))
        since = frozenset()
    # Of the landed jobs only those that landed since its base can be unseen: read those, not the whole history.
    landed = await board.store.jobs.landed_as(since) if since else []
    return unseen(job, [*jobs, *landed], since)


async def recheck(board: Board, job: Job, missed: Unseen, said: str) -> Job | None:
    """Carry a `running` job that changed nothing (its runner ended well, `said`) back to the queue to run again once
    the earlier-queued jobs it has not seen (`missed`) have ended, on a base with their change (its worktree, with
    nothing in it, given back already). None when it left `running` meanwhile."""
    then = f"runs again once {_jobs(missed.waiting)} ended" if missed.waiting else "runs again on the new head"
    reason = (
        f"{said} but changed nothing, on a base without the change of {missed.said()}: {then}, so it sees what "
        f"the queue's order promised (attempt {job.attempts + 2})"
    )
    data = {
        "code": Code.OVERTOOK, "behind": list(missed.waiting), "landed": list(missed.landed), "base": job.base,
        "started_at": job.started_at,
    }  # fmt: skip
    done = await board.transition(
        job.id, RUNNING, JobState.QUEUED, JobEvent.RECHECK, code=Code.OVERTOOK, reason=reason, data=data,
        **{**fresh_attempt(job), "land_after": missed.waiting},
    )  # fmt: skip
    if done is not None:
        olog.get(job_id=job.id, repo=job.repo).info(olog.Event.JOB_REQUEUED, attempt=job.attempts + 2, **data)
    return done


async def seen_already(board: Board, job: Job) -> str | None:
    """For a job admitted again after a `recheck`: why its last attempt's "nothing to change" stands (no earlier-
    queued job landed a change since that attempt's base, so it would look at the same files again), or None: it
    runs."""
    if not job.attempts:
        return None
    again = (JobEvent.RECHECK, JobEvent.REQUEUED, JobEvent.RETRIED, JobEvent.REVISED)
    last = next((e for e in reversed(await board.store.events.of_job(job.id)) if e["kind"] in again), None)
    if last is None or last["kind"] != JobEvent.RECHECK:
        return None
    # What the event holds is data (in team mode the shared database's): read as such, and run when it is odd.
    base, started, behind = last.get("base"), last.get("started_at"), last.get("behind")
    if not isinstance(base, str) or not _SHA.fullmatch(base):
        return None
    then = replace(job, base=base, started_at=float(started) if isinstance(started, int | float) else None)
    if await unseen_of(board, then):
        return None
    waited = tuple(i for i in behind if isinstance(i, int)) if isinstance(behind, list) else ()
    them = f" ({_jobs(waited)}, which it waited for)" if waited else ""
    return (
        f"its last attempt changed nothing, and no job queued before it{them} landed a change since: nothing new "
        "to look at, so not run again; nothing landed"
    )


async def _conflicted(board: Board, pool: WorktreePool, job: Job, why: str, data: dict[str, Any]) -> Job:
    await pool.release(Path(job.repo), job.id, keep=True)
    reason = f"{why}: its worktree {job.worktree or ''} is kept for a person (`orchestrator retry {job.id}`)"
    done = await board.transition(
        job.id, RUNNING, JobState.CONFLICTED, JobEvent.CONFLICTED, finished_at=time.time(), code=Code.CONFLICT,
        reason=reason, data=data,
    )  # fmt: skip
    olog.get(job_id=job.id, repo=job.repo).warning(olog.Event.JOB_FAILED, code=Code.CONFLICT, reason=reason)
    return done or await board.store.jobs.get(job.id) or job


def _jobs(ids: tuple[int, ...]) -> str:
    return ("job " if len(ids) == 1 else "jobs ") + plist([str(i) for i in ids], 5)
