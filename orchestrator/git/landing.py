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
import shutil
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
from orchestrator.runners import process

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
            repo_path, merged.sha, command, timeout=timeout, log_path=log_path, scratch_root=scratch_root, owner=owner
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
) -> CheckResult:
    """Run the shell `command` in a scratch detached worktree at `sha`; always remove the worktree.

    The command runs through `process.run`: its own process group, recorded by `owner`; on timeout the
    group gets SIGTERM, then SIGKILL after `KILL_GRACE`, and whatever it left running in the background
    is killed once it exits anyway (its worktree is about to go). Output is appended to `log_path` if given.
    """
    scratch = Path(tempfile.mkdtemp(prefix="orchestrator-check-", dir=scratch_root))
    worktree = scratch / sha[:12]
    try:
        add = await asyncio.create_subprocess_exec(
            "git",
            "worktree",
            "add",
            "--detach",
            "--quiet",
            str(worktree),
            sha,
            cwd=repo_path,
            env=repos.git_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await add.communicate()
        if add.returncode != 0:
            return CheckResult(False, None, f"could not make a worktree at {sha}: {out.decode(errors='replace')}")
        return await _run_command(command, worktree, timeout, log_path, owner)
    finally:
        await asyncio.to_thread(_remove_scratch, repo_path, worktree, scratch)


async def _run_command(
    command: str, cwd: Path, limit: float, log_path: Path | None, owner: process.Owner | None
) -> CheckResult:
    done = await process.run(
        command,
        cwd=cwd,
        env=process.environment(),
        timeout=limit,
        log_path=log_path,
        grace=KILL_GRACE,
        owner=owner,
        what=f"landing check in {cwd}",
    )
    return CheckResult(ok=done.ok, returncode=done.returncode, output_tail=done.output_tail, timed_out=done.timed_out)


def remove_stale_scratch(repo_path: Path, scratch_root: Path, state_root: Path | None = None) -> list[str]:
    """On start: the landing-check worktrees a killed daemon left under `scratch_root` for this repo, removed.

    First the admin dirs that a `git worktree add` of ours (under `state_root`, default `scratch_root`)
    killed half-way left with an empty or no `commondir`: git itself then fails every `git worktree list`
    in the repository, the user's included.
    """
    root = scratch_root.resolve()
    ours = (state_root or scratch_root).resolve()
    admin_root = repos.common_dir(repos.open_repo(repo_path)) / "worktrees"
    for admin in sorted(admin_root.iterdir()) if admin_root.is_dir() else []:
        pointer = admin / "gitdir"
        common = admin / "commondir"
        if (common.is_file() and common.stat().st_size > 0) or not pointer.is_file():
            continue
        target = Path(pointer.read_text().strip()).parent.resolve()
        if target.is_relative_to(ours):
            shutil.rmtree(admin, ignore_errors=True)
            shutil.rmtree(target, ignore_errors=True)
            if target.parent.is_relative_to(root) and target.parent != root:
                shutil.rmtree(target.parent, ignore_errors=True)
    listing = _git(repo_path, "worktree", "list", "--porcelain")
    stale = [
        Path(line.removeprefix("worktree "))
        for line in listing.stdout.splitlines()
        if line.startswith("worktree ") and Path(line.removeprefix("worktree ")).resolve().is_relative_to(root)
    ]
    for worktree in stale:
        _remove_scratch(repo_path, worktree, worktree.parent)
    return [str(w) for w in stale]


def _remove_scratch(repo_path: Path, worktree: Path, scratch: Path) -> None:
    # Twice --force: removes it even if dirty or locked. If git cannot, delete the files and prune.
    done = _git(repo_path, "worktree", "remove", "--force", "--force", str(worktree))
    shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        _git(repo_path, "worktree", "prune")


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
