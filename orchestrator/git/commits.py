"""Turn what a job left in its workspace into one commit on the job's branch, built from the files.

Sync pygit2 code: the daemon calls it with `asyncio.to_thread`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

import pygit2
import structlog

from orchestrator.core import person as people
from orchestrator.git import repos
from orchestrator.git.workspace import MAX_FILE_BYTES, Workspace, WorkspaceError
from orchestrator.logging import Event

log = structlog.get_logger(__name__)

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


def job_of(message: str) -> int | None:
    """The job a commit message says it is the work of: its `Orchestrator-Job: N` trailer, read as git reads
    trailers (the message's last paragraph only; `job_message` puts the job's own text before it, so no text of a
    job can name another job there). None when it names none."""
    last = message.strip().rsplit("\n\n", 1)[-1]
    for line in last.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == TRAILER and value.strip().isdigit():
            return int(value.strip())
    return None


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
    prior: str | None = None,
    max_file: int = MAX_FILE_BYTES,
    max_total: int = 0,
    publish: bool = True,
    author: str = "",
) -> str | None:
    """Commit the workspace's files as one commit on `base`, on `branch` (default orchestrator/<job_id>).

    The commit is built by the daemon from the files themselves (`Workspace.tree`: like `git add -A`,
    `.git` never, nothing followed through a link), never from the job's own index, HEAD or commits; its
    objects are written into the workspace's quarantine. `author` (`Name <email>`, who queued the job) authors
    it when the daemon has no git identity (`signature`). Returns the new commit's sha; None when the files do
    not differ from the parent (nothing to land; no commit and no branch are made then). The parent is `base`,
    or with `stack` the branch's own tip when it exists, else `prior` (an earlier result of the job, maybe not
    published yet): leftovers of an attempt, or a revision, go on top of what it committed. With `publish`
    (`publish_result`) the commit and the branch go into the repository at once; without, they stay in the
    quarantine until the job lands. A file over `max_file` bytes, or more than `max_total` to write (0: no
    limit), is ResultRefused before anything is written.
    """
    ws = check_belongs(worktree, repo_path)
    repo = repos.open_repo(repo_path)
    own = ws.repo()  # reads the repository's objects too; writes go to the quarantine
    name = branch or f"orchestrator/{job_id}"
    parent = own.revparse_single(base).peel(pygit2.Commit)
    if stack and (tip := repo.branches.local.get(name)) is not None:
        parent = own[tip.target].peel(pygit2.Commit)
    elif stack and prior:
        parent = own.revparse_single(prior).peel(pygit2.Commit)
    tree = ws.tree(max_file=max_file, max_total=max_total, record=True)
    if tree == parent.tree_id:
        return None
    sha = own.create_commit(
        None,
        signature(repo, "author", person=author),
        signature(repo, "committer"),
        job_message(message, job_id),
        tree,
        [parent.id],
    )
    if publish:
        publish_result(worktree, repo_path, str(sha), name)
    return str(sha)


def publish_result(worktree: Path | str | None, repo_path: Path, sha: str, branch: str) -> None:
    """Bring a job's result commit into the repository and point `branch` at it (`place_branch`).

    The objects the repository lacks (the commit, and what of its trees and blobs is new: the walk stops at
    anything the repository has) are copied from the job's workspace, where they were written, each after the
    objects it names (so what the repository has, it has whole); nothing else of the quarantine (previews,
    overlap checks) comes along. Idempotent: a result already there only moves
    the branch. A missing workspace with a result the repository lacks is a WorkspaceError saying so.
    """
    repo = repos.open_repo(repo_path)
    oid = pygit2.Oid(hex=sha)
    if not repo.odb.exists(oid):
        if worktree is None or not Workspace.at(worktree).exists():
            raise WorkspaceError(f"the result {sha[:12]} is in no workspace any more and not in {repo_path}")
        _copy_objects(check_belongs(Path(worktree), repo_path).repo(), repo, oid)
    place_branch(repo, branch, oid)


def _copy_objects(source: pygit2.Repository, repo: pygit2.Repository, top: pygit2.Oid) -> None:
    """Write into `repo` what of `top` it lacks, each object after every object it names (blobs, the trees holding
    them, the commit last): whatever the repository has, it has whole, so a copy cut short (kill -9 during a
    landing) is taken up again from the top by the next `publish_result`, never stopped at a commit whose trees
    or files are missing."""
    order: list[pygit2.Oid] = []
    seen: set[pygit2.Oid] = set()
    todo: list[tuple[pygit2.Oid, bool]] = [(top, False)]
    while todo:
        oid, named_done = todo.pop()
        if named_done:  # everything it names is written (or was there): its turn
            order.append(oid)
            continue
        if oid in seen or repo.odb.exists(oid):
            continue
        seen.add(oid)
        todo.append((oid, True))
        obj = source[oid]
        if isinstance(obj, pygit2.Commit):
            todo.extend((o, False) for o in (obj.tree_id, *obj.parent_ids))
        elif isinstance(obj, pygit2.Tree):
            # A gitlink (a submodule's commit) names no object of this repository.
            todo.extend((e.id, False) for e in obj if e.filemode != pygit2.enums.FileMode.COMMIT)
    for oid in order:
        kind, data = source.odb.read(oid)
        repo.odb.write(kind, data)


_LOADED = time.time()
"""When this process loaded this module (the daemon: at its start, before any landing). A lock older than that is no
lock of this process's (the kernel's start time of a process may be off the file clock by a second or more)."""


def drop_stale_lock(repo: pygit2.Repository, name: str) -> None:
    """Remove a job branch's `refs/heads/<name>.lock` made before this process began: a daemon killed while it
    moved that branch left it, and git would refuse every later move of the branch (the job could never land).
    A newer lock, or one on a branch not the daemon's own, is left to whoever holds it."""
    if not name.startswith(JOB_BRANCHES):
        return
    lock = Path(repo.path) / "refs" / "heads" / f"{name}.lock"
    try:
        made = lock.lstat().st_mtime
    except FileNotFoundError:
        return
    if made < _LOADED:
        lock.unlink(missing_ok=True)
        log.warning(Event.BRANCH_LOCK_REMOVED, repo=repo.path, branch=name, lock=str(lock))


def result_repo(repo_path: Path | str, worktree: str | None) -> str:
    """Where a job's result can be read and a preview of it written: its workspace's admin dir (which reads the
    repository's objects too) while it has a quarantine, since its result may not be in the repository yet;
    else the repository."""
    if worktree:
        ws = Workspace.at(worktree)
        if ws.quarantine is not None:
            return str(ws.admin)
    return str(repo_path)


JOB_BRANCHES = "orchestrator/"
"""Where the jobs' branches are (`orchestrator/<id>`): only the daemon writes them."""


def place_branch(repo: pygit2.Repository, name: str, sha: pygit2.Oid) -> None:
    """Point local branch `name` at `sha`, keeping any other commit it pointed at under a name of its own (a
    branch that only moves forward keeps nothing aside: its old commit is in the new one's history)."""
    drop_stale_lock(repo, name)
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
