"""Land a job's commit on its target branch: merge in memory, compare-and-swap the branch, keep checkouts in step.

Sequencing. Without a landing check the daemon calls `land` (in a thread). With one it calls
`land_checked`, or the three steps itself: `merge_for_landing` → `run_check` on the result → `advance`
with the head the merge was made on; if `advance` says HEAD_MOVED, all three again on the new head (a
check passed on one merge says nothing about another).

The ref move is a true compare-and-swap: `Reference.set_target` is libgit2's `git_reference_set_target`,
which is `git_reference_create_matching` with the value the reference had when looked up, checked
under git's own `refs/heads/B.lock`; a concurrent `git commit` or `git update-ref` either happens
before it (we see HEAD_MOVED) or fails on its own old-value check.

Checkouts. Every worktree (the main one or a linked one) whose HEAD is `refs/heads/<branch>` is kept
in step the way `git merge` would: before the ref moves, the paths that change between the old and
new head are compared with that checkout's uncommitted state (staged, unstaged, untracked, even
ignored files at those paths, and an unfinished merge); any overlap → USER_DIRTY and nothing moves.
Otherwise the ref moves and `git read-tree -m -u OLD NEW` (git's two-tree merge: it updates exactly
the changed paths in index and work tree, and refuses rather than overwrite anything) runs in each
checkout; should it still refuse (the user edited a file in the few milliseconds between), the
checkouts already updated are put back and the ref is swapped back. Bare repositories have no checkout.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import tempfile
import time
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path, PurePosixPath

import pygit2
from pygit2.enums import FileStatus

from orchestrator.git import repos
from orchestrator.git.journal import Intent, Journal, NoJournal
from orchestrator.git.merging import LandStyle, Mergeable, MergeResult, merge_for_landing
from orchestrator.git.workspace import Workspace, WorkspaceError, remove_tree
from orchestrator.runners import process
from orchestrator.runners.sandbox import Sandbox

TAIL_BYTES = process.TAIL_BYTES
"""How much of a check's output `CheckResult.output_tail` keeps."""
KILL_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL for a check that timed out."""
LOCK_WAIT = 2.0
"""Seconds to wait for a user's running git command to release a checkout's index.lock."""



class LandOutcome(StrEnum):
    """How a landing attempt ended."""

    LANDED = "landed"
    """The branch now points at the job's work (fast-forward or merge commit); checkouts updated."""
    NOOP = "noop"
    """The job's commits were already on the branch; nothing moved."""
    CONFLICT = "conflict"
    """The job's changes conflict with the branch head in `conflicts`; nothing moved."""
    HEAD_MOVED = "head-moved"
    """The branch no longer pointed at the head the merge was made on; nothing moved."""
    USER_DIRTY = "user-dirty"
    """A checkout of the branch has uncommitted work at `user_paths`, which the landing would change; nothing moved."""
    CHECK_FAILED = "check-failed"
    """The landing check failed on the merge result (`check_output`); nothing moved."""


@dataclass(frozen=True, slots=True)
class LandResult:
    outcome: LandOutcome
    sha: str | None
    """The branch head after this attempt (the new one when LANDED, else unchanged); None if unknown."""
    old_head: str
    """The branch head the attempt started from."""
    conflicts: tuple[str, ...]
    user_paths: tuple[str, ...]
    """The user's uncommitted paths in the way (USER_DIRTY)."""
    message: str
    """One line for a person: what happened and what happens next."""
    check_output: str = ""


@dataclass(frozen=True, slots=True)
class CheckResult:
    ok: bool
    returncode: int | None
    """The command's exit status (negative: killed by that signal); None if it never ran."""
    output_tail: str
    """The last `TAIL_BYTES` of stdout and stderr, interleaved as written."""
    timed_out: bool = False


def advance(
    repo_path: Path,
    branch: str,
    expected_head: str,
    new_sha: str,
    *,
    job_id: int | None = None,
    journal: Journal | None = None,
) -> LandResult:
    """Move `branch` from `expected_head` to `new_sha` if it still points at `expected_head`.

    HEAD_MOVED if it does not (nothing changed); USER_DIRTY if a checkout of the branch has uncommitted
    work at paths that differ between the two heads (nothing changed); else LANDED, with every checkout
    of the branch updated in index and work tree. Reflog message: "orchestrator: land job N".
    When a checkout is on the branch, the intent is stored in `journal` before our first git command in
    it (the dry run takes its index.lock) and cleared once the checkouts are level again (see
    git/journal.py), so a crash anywhere in between is recoverable.
    """
    repo = repos.open_repo(repo_path)
    refname = _refname(branch)
    ref = repo.lookup_reference(refname)
    old = repo.revparse_single(expected_head).peel(pygit2.Commit).id
    new = repo.revparse_single(new_sha).peel(pygit2.Commit).id
    if ref.target != old:
        return _head_moved(branch, str(old), str(ref.target))

    checkouts = _checkouts_on(repo, refname)
    journal = journal or NoJournal()
    # Before our first git command in a checkout: a crash from here on may leave its index.lock behind.
    token = (
        journal.begin(
            Intent(str(repo_path), refname, str(old), str(new), tuple(map(str, checkouts)), job_id, time.time())
        )
        if checkouts
        else None
    )
    if checkouts:
        changed = repos.changed_paths(repo_path, str(old), str(new))
        for checkout in checkouts:
            blocked = _in_the_way(checkout, changed) or _dry_run(checkout, old, new)
            if blocked:
                journal.end(token)
                return _user_dirty(branch, str(old), checkout, *blocked)

    what = f"land job {job_id}" if job_id is not None else "land"
    try:
        ref.set_target(new, f"orchestrator: {what}")  # CAS against the target `ref` was looked up with
    except pygit2.GitError:
        journal.end(token)
        return _head_moved(branch, str(old), str(repo.lookup_reference(refname).target))
    result = _update_checkouts(repo, refname, checkouts, old, new, what, branch)
    journal.end(token)  # only once every checkout is level again; an exception leaves it for recovery
    return result


def _update_checkouts(
    repo: pygit2.Repository,
    refname: str,
    checkouts: list[Path],
    old: pygit2.Oid,
    new: pygit2.Oid,
    what: str,
    branch: str,
) -> LandResult:
    """After the ref moved: carry each checkout to `new`, or put everything back if git refuses one."""
    updated: list[Path] = []
    for checkout in checkouts:
        refused = _read_tree(checkout, old, new, refreshed=True)
        if refused is not None:
            for done in reversed(updated):
                _read_tree(done, new, old)
            if _swap_back(repo, refname, new, old, f"orchestrator: undo {what}"):
                return _user_dirty(branch, str(old), checkout, *refused)
            # Someone moved the branch on from our commit already: the work has landed, the checkout lags.
            return LandResult(
                LandOutcome.LANDED,
                str(new),
                str(old),
                (),
                refused[0],
                f"{branch} advanced {str(old)[:12]} → {str(new)[:12]} but your checkout {checkout} was not updated "
                f"({refused[1]}); `git read-tree -m -u {str(old)[:12]} {str(new)[:12]}` there brings it level",
            )
        updated.append(checkout)
    return LandResult(
        LandOutcome.LANDED, str(new), str(old), (), (), f"{branch} advanced {str(old)[:12]} → {str(new)[:12]}"
    )


def land(
    repo_path: Path,
    branch: str,
    job_commit: str,
    *,
    job_id: int,
    message: str,
    mergeable: Mergeable | None = None,
    retries: int = 3,
    style: LandStyle = "merge",
    journal: Journal | None = None,
) -> LandResult:
    """Merge `job_commit` onto the branch head and advance the branch, retrying if the head moves.

    CONFLICT and NOOP return at once; HEAD_MOVED (someone moved the branch between read and swap)
    retries from the new head up to `retries` times; USER_DIRTY returns for the daemon to wait on.
    `message` is the merge commit's message when a merge commit is needed.
    """
    result: LandResult | None = None
    for _ in range(retries + 1):
        head = repos.branch_head(repo_path, branch)
        merged = merge_for_landing(repo_path, head, job_commit, mergeable, message=message, style=style)
        early = _merge_outcome(merged, branch, job_id)
        if early is not None:
            return early
        assert merged.sha is not None
        result = advance(repo_path, branch, head, merged.sha, job_id=job_id, journal=journal)
        if result.outcome is not LandOutcome.HEAD_MOVED:
            return _landed_message(result, merged, branch, job_id)
    assert result is not None
    return replace(
        result, message=f"{branch} kept moving: {retries + 1} attempts to land job {job_id}; try again later"
    )


async def land_checked(
    repo_path: Path,
    branch: str,
    job_commit: str,
    *,
    job_id: int,
    message: str,
    command: str,
    timeout: float,
    log_path: Path | None = None,
    scratch_root: Path | None = None,
    mergeable: Mergeable | None = None,
    retries: int = 3,
    style: LandStyle = "merge",
    owner: process.Owner | None = None,
    journal: Journal | None = None,
    sandbox: Sandbox | None = None,
) -> LandResult:
    """`land` with a landing check: the branch moves only to a result on which `command` passed.

    If the branch moves while the check runs, the job is merged onto the new head and checked again.
    """
    result: LandResult | None = None
    for _ in range(retries + 1):
        head = await asyncio.to_thread(repos.branch_head, repo_path, branch)
        merged = await asyncio.to_thread(
            functools.partial(merge_for_landing, message=message, style=style), repo_path, head, job_commit, mergeable
        )
        early = _merge_outcome(merged, branch, job_id)
        if early is not None:
            return early
        assert merged.sha is not None
        check = await run_check(
            repo_path,
            merged.sha,
            command,
            timeout=timeout,
            log_path=log_path,
            scratch_root=scratch_root,
            owner=owner,
            sandbox=sandbox,
        )
        if not check.ok:
            status = f"timed out after {timeout:g}s" if check.timed_out else f"exited {check.returncode}"
            return LandResult(
                LandOutcome.CHECK_FAILED,
                head,
                head,
                (),
                (),
                f"landing check `{command}` {status} on {merged.sha[:12]}; {branch} stays at {head[:12]}",
                check.output_tail,
            )
        result = await asyncio.to_thread(
            advance, repo_path, branch, head, merged.sha, job_id=job_id, journal=journal
        )
        if result.outcome is not LandOutcome.HEAD_MOVED:
            return _landed_message(result, merged, branch, job_id)
    assert result is not None
    return replace(
        result, message=f"{branch} kept moving: {retries + 1} attempts to land job {job_id}; try again later"
    )


async def run_check(
    repo_path: Path,
    sha: str,
    command: str,
    *,
    timeout: float,
    log_path: Path | None = None,
    scratch_root: Path | None = None,
    owner: process.Owner | None = None,
    sandbox: Sandbox | None = None,
) -> CheckResult:
    """Run the shell `command` in a scratch workspace at `sha`, confined like a job; always remove it.

    The workspace is made like a job's (its own git dir, no shared writable git state), and the command
    runs in `sandbox` when there is one: the merged result is the job's code, so the check is the job's
    code running. Through `process.run`: its own process group, recorded by `owner`; on timeout the group
    gets SIGTERM, then SIGKILL after `KILL_GRACE`, and whatever it left running is ended once it exits
    (its workspace is about to go). Output is appended to `log_path` if given.
    """
    if sandbox is not None and (why := sandbox.check()):
        return CheckResult(False, None, why)
    scratch = Path(tempfile.mkdtemp(prefix="orchestrator-check-", dir=scratch_root))
    ws = Workspace(scratch / sha[:12])
    tmp = scratch / "tmp"
    try:
        try:
            await asyncio.to_thread(ws.create, repo_path, sha, None)
        except (WorkspaceError, repos.RepoError, OSError) as e:
            return CheckResult(False, None, f"could not make a workspace at {sha}: {e}")
        tmp.mkdir(mode=0o700)
        prefix = sandbox.confine(ws.root, tmp=tmp, repo=repo_path) if sandbox is not None else []
        env = process.environment((), {"TMPDIR": str(tmp)} if prefix else None)
        done = await process.run(
            command,
            cwd=ws.root,
            env=env,
            timeout=timeout,
            log_path=log_path,
            grace=KILL_GRACE,
            owner=owner,
            what=f"landing check in {ws.root}",
            prefix=prefix,
        )
        return CheckResult(done.ok, done.returncode, done.output_tail, timed_out=done.timed_out)
    finally:
        await asyncio.to_thread(remove_tree, scratch)


def remove_stale_scratch(repo_path: Path, scratch_root: Path, state_root: Path | None = None) -> list[str]:
    """On start: the landing-check workspaces a killed daemon left under `scratch_root`, removed.

    Also git's metadata of the linked worktrees older versions made there (under `state_root`, default
    `scratch_root`): a half-made one with an empty `commondir` makes every `git worktree list` in the
    repository fail, the user's included.
    """
    root = scratch_root.resolve()
    ours = (state_root or scratch_root).resolve()
    admin_root = repos.common_dir(repos.open_repo(repo_path)) / "worktrees"
    for admin in sorted(admin_root.iterdir()) if admin_root.is_dir() else []:
        pointer = admin / "gitdir"
        try:
            target = Path(pointer.read_text().strip()).parent.resolve()
        except OSError:
            continue
        if target.is_relative_to(root) or (target.is_relative_to(ours) and not (admin / "commondir").is_file()):
            remove_tree(admin)
    stale = [str(p) for p in sorted(root.glob("orchestrator-check-*"))] if root.is_dir() else []
    for path in stale:
        remove_tree(Path(path))
    return stale


# ---- the ref and the checkouts -------------------------------------------------------------------------


def _refname(branch: str) -> str:
    return branch if branch.startswith("refs/") else f"refs/heads/{branch}"


def _checkouts_on(repo: pygit2.Repository, refname: str) -> list[Path]:
    """Worktrees (main and linked) whose HEAD is `refname`. git lets two share a branch only if forced.

    Read from git's own files (the common dir's `HEAD`, each `worktrees/<name>/HEAD` and `gitdir`), as
    `git worktree list` does, without a process on every landing.
    """
    common = repos.common_dir(repo)
    found = []
    if _head_is(common / "HEAD", refname):
        top = repo if Path(repo.path).resolve() == common else repos.open_repo(common)
        if not top.is_bare and top.workdir:
            found.append(Path(top.workdir))
    admin_root = common / "worktrees"
    for admin in sorted(admin_root.iterdir()) if admin_root.is_dir() else []:
        try:
            if not _head_is(admin / "HEAD", refname):
                continue
            pointer = Path((admin / "gitdir").read_text().strip())
        except (FileNotFoundError, NotADirectoryError):
            # The worktree pool renames and prunes its own worktrees beside a landing: one vanished as
            # we read. Never the user's (the pool only removes its own), and never on this branch.
            continue
        path = (pointer if pointer.is_absolute() else (admin / pointer).resolve()).parent
        if path.is_dir():
            found.append(path)
    return found


def _head_is(head: Path, refname: str) -> bool:
    try:
        return head.read_text().strip() == f"ref: {refname}"
    except (FileNotFoundError, NotADirectoryError):
        return False


def _in_the_way(checkout: Path, changed: frozenset[str]) -> tuple[tuple[str, ...], str] | None:
    """The checkout's uncommitted paths that the landing would overwrite, with a reason; None if none."""
    repo = repos.open_repo(checkout)
    index = repo.index
    if index.conflicts is not None:
        unmerged = sorted({e.path for c in index.conflicts for e in c if e is not None})
        return tuple(unmerged), "has an unfinished merge"
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
        return tuple(sorted(dirty)), "has uncommitted work where the landing writes"
    return None


def _dry_run(checkout: Path, old: pygit2.Oid, new: pygit2.Oid) -> tuple[tuple[str, ...], str] | None:
    """git's own verdict on the two-tree merge, for whatever `_in_the_way` does not model."""
    _git(checkout, "update-index", "-q", "--refresh")  # stat-only changes are not edits
    dry = _git(checkout, "read-tree", "-m", "-u", "-n", str(old), str(new))
    return _refusal(dry.stderr) if dry.returncode != 0 else None


def _read_tree(
    checkout: Path, old: pygit2.Oid, new: pygit2.Oid, *, refreshed: bool = False
) -> tuple[tuple[str, ...], str] | None:
    """Carry the checkout from `old` to `new` (two-tree merge); the paths and reason if git refuses.

    `refreshed`: the dry run refreshed its index an instant ago, so the first try skips that process (a
    stat-only change in between makes git refuse; the landing is then undone and tried again).
    """
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        if not refreshed:
            _git(checkout, "update-index", "-q", "--refresh")
        refreshed = False
        done = _git(checkout, "read-tree", "-m", "-u", str(old), str(new))
        if done.returncode == 0:
            return None
        if "index.lock" not in done.stderr or time.monotonic() > deadline:
            return _refusal(done.stderr)
        time.sleep(0.05)  # a git command of the user's holds the index; it will be quick


def _refusal(stderr: str) -> tuple[tuple[str, ...], str]:
    """Paths and first reason from git's "error: Entry 'p' not uptodate" / "... file 'p' would be overwritten"."""
    lines = [line.removeprefix("error: ") for line in stderr.splitlines() if line.strip()]
    paths = tuple(sorted({m for line in lines for m in re.findall(r"'([^']+)'", line)}))
    return paths, f"is not clean where the landing writes (git: {lines[0] if lines else 'refused'})"


def _swap_back(repo: pygit2.Repository, refname: str, new: pygit2.Oid, old: pygit2.Oid, message: str) -> bool:
    ref = repo.lookup_reference(refname)
    if ref.target != new:
        return False
    try:
        ref.set_target(old, message)
    except pygit2.GitError:
        return False
    return True


_git = repos.run_git


# ---- results --------------------------------------------------------------------------------------------


def _merge_outcome(merged: MergeResult, branch: str, job_id: int) -> LandResult | None:
    """The LandResult for a merge that needs no ref move (conflict, noop); None when one is needed."""
    head = merged.head
    if merged.kind == "conflict":
        n = len(merged.conflicts)
        return LandResult(
            LandOutcome.CONFLICT,
            head,
            head,
            merged.conflicts,
            (),
            f"job {job_id} conflicts with {branch} at {head[:12]} in {n} path{'s' * (n != 1)}: "
            f"{_some(merged.conflicts)}; {branch} not moved",
        )
    if merged.kind == "noop":
        return LandResult(
            LandOutcome.NOOP, head, head, (), (), f"job {job_id} is already on {branch} at {head[:12]}; nothing to land"
        )
    return None


def _landed_message(result: LandResult, merged: MergeResult, branch: str, job_id: int) -> LandResult:
    if result.outcome is not LandOutcome.LANDED or result.sha is None:
        return result
    how = {"fast-forward": "fast-forward", "rebase": "rebased", "squash": "squashed"}.get(merged.kind, "merge commit")
    return replace(result, message=f"landed job {job_id} on {branch}: {how} {result.old_head[:12]} → {result.sha[:12]}")


def _head_moved(branch: str, expected: str, actual: str) -> LandResult:
    return LandResult(
        LandOutcome.HEAD_MOVED,
        actual,
        expected,
        (),
        (),
        f"{branch} moved from {expected[:12]} to {actual[:12]}; not moved, merge again on the new head",
    )


def _user_dirty(branch: str, old: str, checkout: Path, paths: tuple[str, ...], reason: str) -> LandResult:
    shown = f": {_some(paths)}" if paths else ""
    return LandResult(
        LandOutcome.USER_DIRTY,
        old,
        old,
        (),
        paths,
        f"your checkout {checkout} of {branch} {reason}{shown}; commit or stash that, the landing waits",
    )


def _some(paths: tuple[str, ...], limit: int = 5) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
