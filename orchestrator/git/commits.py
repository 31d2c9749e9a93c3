"""Turn what a job left in its workspace into one commit on the job's branch, built from the files.

Sync pygit2 code: the daemon calls it with `asyncio.to_thread`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pygit2

from orchestrator.core import person as people
from orchestrator.git import repos
from orchestrator.git.workspace import MAX_FILE_BYTES, Workspace

FALLBACK_NAME = "orchestrator"
FALLBACK_EMAIL = "orchestrator@localhost"
TRAILER = "Orchestrator-Job"


def signature(
    repo: pygit2.Repository, role: Literal["author", "committer"] = "committer", person: str = ""
) -> pygit2.Signature:
    """The identity `git commit` would use in `repo`; else `person` (`Name <email>`: who queued the job); else the
    orchestrator's own.

    Same precedence as git, field by field: `GIT_AUTHOR_*` / `GIT_COMMITTER_*` from the environment,
    then `user.name` / `user.email` from the repository's config (local, global, XDG), then `person`, then
    `orchestrator <orchestrator@localhost>`. Never raises for lack of identity: a daemon under systemd
    often has no HOME config at all, and a job's work must not be lost over it.
    """
    prefix = f"GIT_{role.upper()}_"
    who, mail = people.split(person)
    name = os.environ.get(prefix + "NAME") or _config(repo, "user.name") or who or FALLBACK_NAME
    email = os.environ.get(prefix + "EMAIL") or _config(repo, "user.email") or mail or FALLBACK_EMAIL
    return pygit2.Signature(name, email)


def person_of(sig: pygit2.Signature) -> str:
    """`Name <email>` of a commit's author or committer."""
    return f"{sig.name} <{sig.email}>"


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
    """The workspace is not (or no longer) one of the job's repository; nothing was committed."""


def check_belongs(worktree: Path, repo_path: Path) -> Workspace:
    """The job's workspace, checked to have been made from `repo_path` (its admin dir shares that
    repository's objects); ForeignWorktree if not. The job's own `.git` plays no part in this."""
    ws = Workspace.at(worktree)
    if not ws.exists():
        raise ForeignWorktree(f"{worktree} is not an orchestrator workspace (no admin dir); nothing was committed")
    try:
        ok = ws.belongs_to(repo_path)
    except (repos.RepoError, OSError) as exc:
        raise ForeignWorktree(f"the workspace {worktree} cannot be checked against {repo_path} ({exc})") from None
    if not ok:
        raise ForeignWorktree(
            f"the workspace {worktree} was made from another repository than {repo_path}; nothing was committed"
        )
    return ws


def commit_worktree(
    worktree: Path,
    *,
    message: str,
    job_id: int,
    base: str,
    repo_path: Path,
    branch: str | None = None,
    stack: bool = False,
    max_file: int = MAX_FILE_BYTES,
    author: str = "",
) -> str | None:
    """Commit the workspace's files as one commit on `base`, on `branch` (default orchestrator/<job_id>).

    The commit is built by the daemon from the files themselves (`Workspace.tree`: like `git add -A`,
    `.git` never, nothing followed through a link), never from the job's own index, HEAD or commits.
    `author` (`Name <email>`, who queued the job) authors it when the daemon has no git identity (`signature`).
    Returns the new commit's sha; None when the files do not differ from the parent (nothing to land;
    no commit and no branch are made then). The parent is `base`, or with `stack` the branch's own tip
    when it exists (leftovers of an attempt go on top of what it committed). A branch of that name that
    already exists and points elsewhere (an older state dir's job of the same id, a crash between commit
    and record) is kept under `<branch>-kept-<sha>` first: nothing is ever force-overwritten.
    """
    ws = check_belongs(worktree, repo_path)
    repo = repos.open_repo(repo_path)
    name = branch or f"orchestrator/{job_id}"
    parent = repo.revparse_single(base).peel(pygit2.Commit)
    if stack and (tip := repo.branches.local.get(name)) is not None:
        parent = tip.peel(pygit2.Commit)
    tree = ws.tree(max_file=max_file, record=True)
    if tree == parent.tree_id:
        return None
    sha = repo.create_commit(
        None,
        signature(repo, "author", person=author),
        signature(repo, "committer"),
        job_message(message, job_id),
        tree,
        [parent.id],
    )
    place_branch(repo, name, sha)
    return str(sha)


def place_branch(repo: pygit2.Repository, name: str, sha: pygit2.Oid) -> None:
    """Point local branch `name` at `sha`, keeping any other commit it pointed at under a name of its own (a
    branch that only moves forward keeps nothing aside: its old commit is in the new one's history)."""
    existing = repo.branches.local.get(name)
    if existing is not None and existing.target != sha and repo.descendant_of(sha, existing.target):
        existing.set_target(sha)
        return
    if existing is not None and existing.target != sha:
        kept = f"{name}-kept-{str(existing.target)[:12]}"
        if kept in repo.branches.local:
            existing.delete()  # the same commit is kept already
        else:
            existing.rename(kept)
    repo.branches.local.create(name, repo[sha].peel(pygit2.Commit), force=True)
