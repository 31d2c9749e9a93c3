"""A landing's work in the checkouts of its branch: which worktrees are on it, whether each is clean where the
landing writes and has room for it, carrying it from the old head to the new one, putting it back.

Every function here is sync (run it in a thread) and speaks for one checkout; `git.landing` sequences them
around the ref move so that the whole is all or nothing.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path, PurePosixPath

import pygit2
from pygit2.enums import FileStatus

from orchestrator.git import journal, repos

LOCK_WAIT = 2.0
"""Seconds to wait for a user's running git command to release a checkout's index.lock."""
SPACE_MARGIN = 1 << 20
"""Bytes a checkout's file system keeps free beyond what a landing writes there."""


def on_branch(repo: pygit2.Repository, refname: str) -> list[Path]:
    """Worktrees (main and linked) whose HEAD is `refname`. git lets two share a branch only if forced."""
    return [path for path, head in repos.worktrees(repo) if _head_is(head, refname)]


def _head_is(head: Path, refname: str) -> bool:
    try:
        return head.read_text().strip() == f"ref: {refname}"
    except (FileNotFoundError, NotADirectoryError):
        return False


Blocked = tuple[tuple[str, ...], str, str]
"""Why a checkout blocks a landing: the paths, a reason for a person, and its kind (REFUSED, LOCKED or FAULT)."""
REFUSED, LOCKED, FAULT = "refused", "locked", "fault"


def short_of_space(
    repo: pygit2.Repository, checkout: Path, new: pygit2.Oid, changed: frozenset[str]
) -> tuple[int, int] | None:
    """(bytes the landing writes in `checkout`, bytes free there) when that does not fit with a margin; None if
    it fits. The files git writes are the changed paths' contents at NEW."""
    tree = repo[new].peel(pygit2.Tree)
    needed = 0
    for path in changed:
        try:
            obj = tree[path]
        except KeyError:
            continue  # deleted: frees space
        if isinstance(obj, pygit2.Blob):
            needed += obj.size
    if not needed:
        return None
    st = os.statvfs(checkout)
    free = st.f_bavail * st.f_frsize
    return (needed, free) if needed + SPACE_MARGIN > free else None


def in_the_way(checkout: Path, changed: frozenset[str]) -> Blocked | None:
    """The checkout's uncommitted paths that the landing would overwrite, with a reason; None if none."""
    repo = repos.open_repo(checkout)
    index = repo.index
    if index.conflicts is not None:
        unmerged = sorted({e.path for c in index.conflicts for e in c if e is not None})
        return tuple(unmerged), "has an unfinished merge", REFUSED
    dirty: set[str] = set()
    for path in changed:
        # Per path, not a status of the whole tree: cost follows the landing's size, not the repo's.
        try:
            flags = repo.status_file(path)
        except KeyError:  # in neither HEAD, index nor work tree
            flags = FileStatus.CURRENT
        # Anything but "unchanged" is the user's: staged, unstaged, untracked, even ignored files (git
        # itself would overwrite ignored ones, but an ignored `.env` is still someone's work).
        if flags != FileStatus.CURRENT or (path not in index and os.path.lexists(checkout / path)):
            dirty.add(path)
        for parent in PurePosixPath(path).parents:  # a file where the landing needs a directory
            p = str(parent)
            if p != "." and p not in index and os.path.lexists(checkout / p) and not (checkout / p).is_dir():
                dirty.add(p)
    if dirty:
        return tuple(sorted(dirty)), "has uncommitted work where the landing writes", REFUSED
    return None


def dry_run(checkout: Path, old: pygit2.Oid, new: pygit2.Oid) -> Blocked | None:
    """git's own verdict on the two-tree merge, for whatever `in_the_way` does not model."""
    repos.run_git(checkout, "update-index", "-q", "--refresh")  # stat-only changes are not edits
    dry = repos.run_git(checkout, "read-tree", "-m", "-u", "-n", str(old), str(new))
    return _refusal(dry.stderr) if dry.returncode != 0 else None


def read_tree(checkout: Path, old: pygit2.Oid, new: pygit2.Oid, *, refreshed: bool = False) -> Blocked | None:
    """Carry the checkout from `old` to `new` (two-tree merge); why not, if git refuses or fails.

    `refreshed`: the dry run refreshed its index an instant ago, so the first try skips that process (a
    stat-only change in between makes git refuse; the landing is then undone and tried again).
    """
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        if not refreshed:
            repos.run_git(checkout, "update-index", "-q", "--refresh")
        refreshed = False
        done = repos.run_git(checkout, "read-tree", "-m", "-u", str(old), str(new))
        if done.returncode == 0:
            return None
        if "index.lock" not in done.stderr or time.monotonic() > deadline:
            return _refusal(done.stderr)
        time.sleep(0.05)  # a git command of the user's holds the index; it will be quick


_REFUSALS = ("not uptodate", "would be overwritten", "would be removed", "would be lost", "unmerged")
"""What git says when the two-tree merge refuses to touch a person's work (the rest is a failure)."""


def _refusal(stderr: str) -> Blocked:
    """Why git's two-tree merge did not go through: a person's work in the way ("error: Entry 'p' not
    uptodate", "... file 'p' would be overwritten"), an index.lock, or a failure (a full disk, a file it
    cannot write)."""
    lines = [line.removeprefix("error: ").removeprefix("fatal: ") for line in stderr.splitlines() if line.strip()]
    first = lines[0] if lines else "refused"
    lock = next((m for line in lines for m in re.findall(r"'([^']+index\.lock)'", line)), None)
    if lock is not None:
        return (
            (),
            (
                f"is locked: a git command holds {lock}, or one that was killed left it behind; if no git runs "
                f"there, remove that file (rm {lock})"
            ),
            LOCKED,
        )
    if any(r in line for line in lines for r in _REFUSALS):
        paths = tuple(sorted({m for line in lines for m in re.findall(r"'([^']+)'", line)}))
        return paths, f"is not clean where the landing writes (git: {first})", REFUSED
    return (), f"git: {first}", FAULT


def swap_back(repo: pygit2.Repository, refname: str, new: pygit2.Oid, old: pygit2.Oid, message: str) -> bool:
    ref = repo.lookup_reference(refname)
    if ref.target != new:
        return False
    try:
        ref.set_target(old, message)
    except (pygit2.GitError, OSError):
        return False
    return True




def put_back(repo: pygit2.Repository, checkout: Path, changed: frozenset[str], old: pygit2.Oid) -> tuple[str, ...]:
    """Every changed path of `checkout` back to OLD, index entry and file; the paths that could not be."""
    try:
        return journal.put_back(repo, checkout, sorted(changed), str(old))
    except (OSError, pygit2.GitError, repos.RepoError) as e:
        return (f"(all: {type(e).__name__}: {e})",)
