"""Review before landing: a `ready` job's diff, and a person's `land` or `reject` of it.

Under `land = "review"` a finished job stops in `ready` with its result commit on its branch
`orchestrator/<id>`; admission keeps its paths taken (it is active) until it lands or is rejected.
`land` hands it to the branch's landing queue as if it had just finished; `reject` ends it (cancelled, code
Rejected), frees its paths and its worktree, and keeps its branch for inspection.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pygit2

from orchestrator import logging as olog
from orchestrator.core.job import Job
from orchestrator.core.models import Code, JobState
from orchestrator.git import merging, repos
from orchestrator.git.worktrees import WorktreePool, branch_name
from orchestrator.jobs.board import Board
from orchestrator.jobs.landing import Lander


class ReviewError(Exception):
    """A review request cannot be done; the message says why and what to do."""


def _patch(repo: pygit2.Repository, old: str, new: str) -> str:
    a = repo.revparse_single(old).peel(pygit2.Tree)
    b = repo.revparse_single(new).peel(pygit2.Tree)
    return repo.diff(a, b).patch or ""


def diff(job: Job, head: str | None = None) -> dict[str, object]:
    """The job's change as a unified diff: against its base, or (with `head`) what landing it on `head` changes."""
    if job.result is None or job.base is None:
        raise ReviewError(f"job {job.id} has no result yet ({job.state}); a diff needs a finished job")
    repo = pygit2.Repository(job.repo)
    if head is None:
        return {
            "id": job.id,
            "against": "base",
            "from": job.base,
            "to": job.result,
            "diff": _patch(repo, job.base, job.result),
        }
    merged = merging.merge_for_landing(Path(job.repo), head, job.result)
    if merged.sha is None:
        return {
            "id": job.id,
            "against": "head",
            "from": head,
            "to": None,
            "conflicts": list(merged.conflicts),
            "diff": "",
        }
    return {"id": job.id, "against": "head", "from": head, "to": merged.sha, "diff": _patch(repo, head, merged.sha)}


async def land(board: Board, lander: Lander, job: Job) -> Job:
    if job.state is not JobState.READY:
        raise ReviewError(f"job {job.id} is {job.state}; only a ready job (review mode) can be landed by hand")
    job = await board.update(
        job.id,
        state=JobState.LANDING,
        reason="approved in review; waits for its landing",
        code=Code.FINISHED,
        event="approved",
    )
    olog.get(job_id=job.id, repo=job.repo).info(olog.Event.JOB_FINISHED, result=job.result, approved=True)
    lander.submit(job)
    return job


async def reject(board: Board, pool: WorktreePool, job: Job) -> Job:
    if job.state is not JobState.READY:
        raise ReviewError(f"job {job.id} is {job.state}; only a ready job (review mode) can be rejected")
    await pool.release(Path(job.repo), job.id, keep=False, delete_branch=False)
    kept = branch_name(job.id)
    job = await board.update(
        job.id,
        state=JobState.CANCELLED,
        finished_at=time.time(),
        worktree=None,
        reason=f"rejected in review; not landed; its change stays on branch {kept}",
        code=Code.REJECTED,
        event="rejected",
        data={"code": Code.REJECTED, "branch": kept},
    )
    olog.get(job_id=job.id, repo=job.repo).info(olog.Event.JOB_REJECTED, branch=kept)
    return job


async def diff_async(job: Job, against_head: bool) -> dict[str, object]:
    head = await asyncio.to_thread(repos.branch_head, Path(job.repo), job.branch) if against_head else None
    return await asyncio.to_thread(diff, job, head)
