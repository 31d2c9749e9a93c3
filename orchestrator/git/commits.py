"""Turn what an agent left in its worktree into one commit on the job's branch.

Sync pygit2 code: the daemon calls it with `asyncio.to_thread`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pygit2

from orchestrator.git import repos

FALLBACK_NAME = "orchestrator"
FALLBACK_EMAIL = "orchestrator@localhost"
TRAILER = "Orchestrator-Job"


def signature(repo: pygit2.Repository, role: Literal["author", "committer"] = "committer") -> pygit2.Signature:
    """The identity `git commit` would use in `repo`, or the orchestrator's own when none is configured.

    Same precedence as git, field by field: `GIT_AUTHOR_*` / `GIT_COMMITTER_*` from the environment,
    then `user.name` / `user.email` from the repository's config (local, global, XDG), then
    `orchestrator <orchestrator@localhost>`. Never raises for lack of identity: a daemon under systemd
    often has no HOME config at all, and a job's work must not be lost over it.
    """
    prefix = f"GIT_{role.upper()}_"
    name = os.environ.get(prefix + "NAME") or _config(repo, "user.name") or FALLBACK_NAME
    email = os.environ.get(prefix + "EMAIL") or _config(repo, "user.email") or FALLBACK_EMAIL
    return pygit2.Signature(name, email)


def _config(repo: pygit2.Repository, key: str) -> str | None:
    try:
        value = repo.config[key]
    except (KeyError, pygit2.GitError):
        return None
    return str(value) if value else None


def job_message(message: str, job_id: int) -> str:
    """`message`, a blank line, and the `Orchestrator-Job: N` trailer."""
    body = message.strip() or f"orchestrator job {job_id}"
    return f"{body}\n\n{TRAILER}: {job_id}\n"


class ForeignWorktree(repos.RepoError):
    """The worktree is not (or no longer) a worktree of the job's repository; nothing was committed."""


def check_belongs(worktree: Path, repo_path: Path) -> pygit2.Repository:
    """Open `worktree` (no parent search) and check it shares `repo_path`'s git dir; ForeignWorktree if not."""
    try:
        wt = repos.open_repo(worktree)
    except repos.RepoError as exc:
        raise ForeignWorktree(
            f"the job's worktree {worktree} is no longer a git worktree (its .git is gone or broken: {exc}); "
            "nothing was committed from it"
        ) from None
    ours, theirs = repos.common_dir(wt), repos.common_dir(repos.open_repo(repo_path))
    if ours != theirs:
        raise ForeignWorktree(
            f"the job's worktree {worktree} belongs to the repository at {ours}, not to {theirs}; "
            "nothing was committed from it"
        )
    return wt


def commit_worktree(
    worktree: Path, *, message: str, job_id: int, base: str, repo_path: Path | None = None
) -> str | None:
    """Stage everything in the job's worktree and commit it on the worktree's HEAD branch.

    Stages like `git add -A`: added, modified and deleted files, untracked files unless ignored; `.git`
    never. Returns the new commit's sha; the current HEAD sha when the agent already committed
    everything itself; None when the result does not differ from `base` at all (nothing to land; no
    commit is made then, even if the agent's own commits cancel out). With `repo_path`, the worktree
    must belong to that repository (`check_belongs`), or ForeignWorktree is raised and nothing committed.
    """
    repo = check_belongs(worktree, repo_path) if repo_path is not None else repos.open_repo(worktree)
    head = repo.head.peel(pygit2.Commit)
    base_tree = repo.revparse_single(base).peel(pygit2.Tree).id

    index = repo.index
    index.add_all()
    index.write()
    tree = index.write_tree()

    if tree == base_tree:
        return None
    if tree == head.tree_id:
        return str(head.id)
    # Updating "HEAD" moves the branch HEAD points to, and libgit2 refuses if that branch no longer
    # points at `head` (someone committed meanwhile) instead of silently dropping their commit.
    sha = repo.create_commit(
        "HEAD", signature(repo, "author"), signature(repo, "committer"), job_message(message, job_id), tree, [head.id]
    )
    return str(sha)
