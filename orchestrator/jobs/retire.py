"""Retire a job's attempt without losing it: its work is committed and kept on a branch of its own.

Used when a conflicted job is re-queued on a new head and when a person retries a failed or interrupted
job: the next attempt starts fresh on `orchestrator/<id>`, the old one stays on `orchestrator/<id>-attempt-<n>`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pygit2

from orchestrator import logging as olog
from orchestrator.core.job import Job
from orchestrator.git import commits, repos
from orchestrator.git.workspace import Workspace
from orchestrator.git.worktrees import WorktreeError, WorktreePool


def _keep_branch(repo_path: Path, job: Job) -> str | None:
    repo = repos.open_repo(repo_path)
    branch = repo.branches.local.get(f"orchestrator/{job.id}")
    if branch is None:
        return None
    name = f"orchestrator/{job.id}-attempt-{job.attempts + 1}"
    n = job.attempts + 1
    while name in repo.branches.local:
        n += 1
        name = f"orchestrator/{job.id}-attempt-{n}"
    try:
        branch.rename(name)
    except pygit2.GitError:
        # libgit2 renames the ref, then updates every worktree's HEAD; a warm-pool worktree made or removed
        # beside it at that moment fails the second step ("no error"), the rename itself done.
        again = repos.open_repo(repo_path)
        if name not in again.branches.local or f"orchestrator/{job.id}" in again.branches.local:
            raise
    return name


class AttemptKept(Exception):
    """The attempt's leftovers could not be committed, so its worktree is kept as it is; the message says what to do."""


def _commit_leftovers(job: Job, worktree: Path) -> None:
    """Commit what the attempt's workspace holds beyond what it committed, so retiring it loses nothing.

    Read from the files (a workspace made before admin dirs existed is adopted at the job's base first).
    """
    if job.base and worktree.exists():
        ws = Workspace.at(worktree)
        if not ws.exists():
            ws.adopt(Path(job.repo), job.base)
        commits.commit_worktree(
            worktree,
            message=f"orchestrator: job {job.id} attempt {job.attempts + 1}, kept",
            job_id=job.id,
            base=job.base,
            repo_path=Path(job.repo),
            stack=True,
        )


async def retire_attempt(pool: WorktreePool, job: Job) -> str | None:
    """Commit what the attempt left, release its worktree, and keep its branch under an attempt name.

    Never wipes work: if the leftovers cannot be committed (a file over the size a job may commit, a
    workspace made from another repository), it stays exactly as it is and AttemptKept says what to do.
    """
    repo = Path(job.repo)
    log = olog.get(job_id=job.id, repo=job.repo)
    # Where the pool puts it, never where the record says: a crash may come between the checkout and that record,
    # and in team mode the record is the shared store's, which no path on this machine is taken from.
    worktree = pool.path_for(repo, job.id)
    try:
        await asyncio.to_thread(_commit_leftovers, job, worktree)
    except (WorktreeError, pygit2.GitError, repos.RepoError, OSError, KeyError, ValueError) as e:
        log.warning(olog.Event.ATTEMPT_KEPT, worktree=str(worktree), error=f"{type(e).__name__}: {e}")
        raise AttemptKept(
            f"job {job.id}'s previous attempt left uncommitted work in {worktree} that could not be "
            f"committed ({type(e).__name__}: {e}); the worktree is kept as it is: save what you need from it, "
            f"then `orchestrator clean {job.id}` and retry"
        ) from e
    try:
        await pool.release(repo, job.id, keep=False, delete_branch=False)
    except (WorktreeError, OSError) as e:
        # The work is committed on the branch; only the directory stays behind (`clean` removes it).
        log.warning(olog.Event.WORKTREE_ERROR, worktree=str(worktree), error=f"{type(e).__name__}: {e}")
    return await asyncio.to_thread(_keep_branch, repo, job)


def drop_attempts(repo_path: Path, job_id: int) -> list[str]:
    """Delete the branches that kept a job's earlier attempts (`orchestrator clean`)."""
    repo = repos.open_repo(repo_path)
    prefix = f"orchestrator/{job_id}-attempt-"
    dropped = [name for name in repo.branches.local if name.startswith(prefix)]
    for name in dropped:
        repo.branches.local.delete(name)
    return sorted(dropped)
