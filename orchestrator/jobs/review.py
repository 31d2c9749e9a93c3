"""Review before landing: a `ready` job's diff, and a person's `land` or `reject` of it.

Under `land = "review"` a finished job stops in `ready` with its result commit in its workspace's quarantine
(`git.workspace`): nothing of it is in the repository yet, however big it is. Admission keeps its paths taken
(it is active) until it lands or is rejected. `land` hands it to the branch's landing queue as if it had just
finished (the landing brings the result into the repository, on branch `orchestrator/<id>`); `reject` ends it
(cancelled, code Rejected) and frees its paths and its worktree: its result goes with the worktree, and the
repository is as it was.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pygit2

from orchestrator import logging as olog
from orchestrator import testhook
from orchestrator.core.job import Job
from orchestrator.core.models import Code, JobEvent, JobState
from orchestrator.git import commits, merging, repos
from orchestrator.git.worktrees import WorktreePool, branch_name
from orchestrator.jobs.board import Board
from orchestrator.jobs.landing import Lander
from orchestrator.jobs.recovery import CLEANUP_ERRORS

READY = frozenset({JobState.READY})


class ReviewError(Exception):
    """A review request cannot be done; the message says why and what to do."""


def _patch(repo: pygit2.Repository, old: str, new: str) -> str:
    a = repo.revparse_single(old).peel(pygit2.Tree)
    b = repo.revparse_single(new).peel(pygit2.Tree)
    return a.diff_to_tree(b).patch or ""


def diff(job: Job, head: str | None = None) -> dict[str, object]:
    """The job's change as a unified diff: against its base, or (with `head`) what landing it on `head` changes."""
    if job.result is None or job.base is None:
        raise ReviewError(f"job {job.id} has no result yet ({job.state}); a diff needs a finished job")
    where = commits.result_repo(job.repo, job.worktree)
    repo = pygit2.Repository(where)
    if job.result not in repo:
        raise ReviewError(
            f"job {job.id}'s result {job.result[:12]} is gone: it never landed and its workspace was given back "
            f"({job.state}); `orchestrator retry {job.id}` runs it again"
        )
    if head is None:
        return {
            "id": job.id,
            "against": "base",
            "from": job.base,
            "to": job.result,
            "diff": _patch(repo, job.base, job.result),
        }
    merged = merging.merge_for_landing(Path(where), head, job.result)  # a preview: written where the result is
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
    """Approve a ready job: it moves to `landing` (if it is still ready) and joins its branch's landing queue."""
    if job.state is not JobState.READY:
        raise ReviewError(f"job {job.id} is {job.state}; only a ready job (review mode) can be landed by hand")
    await testhook.reach("review.land", job.id)
    approved = await board.transition(
        job.id,
        READY,
        JobState.LANDING,
        JobEvent.APPROVED,
        reason="approved in review; waits for its landing",
        code=Code.FINISHED,
        approved=job.result or "",  # this result, and no other (in team mode sealed: `core.seal`)
    )
    if approved is None:
        raise ReviewError(_moved(job.id, await board.store.jobs.get(job.id), "landed"))
    olog.get(job_id=job.id, repo=job.repo).info(olog.Event.JOB_FINISHED, result=job.result, approved=True)
    lander.submit(approved)
    return approved


async def reject(board: Board, pool: WorktreePool, job: Job) -> Job:
    """Reject a ready job: it is cancelled first (if it is still ready), then its worktree goes, and its result with
    it (an earlier result on its branch, from a landing that failed before a revision, stays there)."""
    if job.state is not JobState.READY:
        raise ReviewError(f"job {job.id} is {job.state}; only a ready job (review mode) can be rejected")
    await testhook.reach("review.reject", job.id)
    name = branch_name(job.id)
    kept = name if await asyncio.to_thread(_has_branch, Path(job.repo), name) else None
    rejected = await board.transition(
        job.id,
        READY,
        JobState.CANCELLED,
        JobEvent.REJECTED,
        finished_at=time.time(),
        worktree=None,
        reason="rejected in review; not landed; "
        + (f"its earlier change stays on branch {kept}" if kept else "nothing of it was written to your repository"),
        code=Code.REJECTED,
        data={"code": Code.REJECTED, "branch": kept},
    )
    if rejected is None:
        raise ReviewError(_moved(job.id, await board.store.jobs.get(job.id), "rejected"))
    with olog.best_effort("give the rejected job's worktree back", *CLEANUP_ERRORS, job_id=job.id):
        await pool.release(Path(job.repo), job.id, keep=False, delete_branch=False)
    olog.get(job_id=job.id, repo=job.repo).info(olog.Event.JOB_REJECTED, branch=kept)
    return rejected


def _has_branch(repo: Path, name: str) -> bool:
    return repos.open_repo(repo).branches.local.get(name) is not None


def _moved(job_id: int, now: Job | None, verb: str) -> str:
    if now is None:
        return f"job {job_id} is gone (cleaned meanwhile); nothing to do"
    return f"job {job_id} is {now.state} now ({now.reason}); it can no longer be {verb}"


async def diff_async(job: Job, against_head: bool) -> dict[str, object]:
    head = await asyncio.to_thread(repos.branch_head, Path(job.repo), job.branch) if against_head else None
    return await asyncio.to_thread(diff, job, head)
