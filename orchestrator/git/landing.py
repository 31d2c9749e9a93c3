"""Land a job's commit on its target branch: merge in memory, compare-and-swap the branch, keep checkouts in step.

One loop (`land`): read the branch head → refuse a head that no longer contains the job's base (the branch was
rewritten: merging would bring back history it dropped; the job is planned again) → merge in memory → run the
landing check on the result if there is one (`run_check`, in a scratch worktree) → `prepare` the move (every
checkout of the branch checked, the intent journaled) → `move` (the ref, then the checkouts); HEAD_MOVED, and
all of it again on the new head (a check passed on one merge says nothing about another).

The ref move is a true compare-and-swap: `Reference.set_target` is libgit2's `git_reference_set_target`,
which is `git_reference_create_matching` with the value the reference had when looked up, checked
under git's own `refs/heads/B.lock`; a concurrent `git commit` or `git update-ref` either happens
before it (we see HEAD_MOVED) or fails on its own old-value check.

Checkouts. Every worktree (the main one or a linked one) whose HEAD is `refs/heads/<branch>` is kept
in step the way `git merge` would: before the ref moves, the paths that change between the old and
new head are compared with that checkout's uncommitted state (staged, unstaged, untracked, even
ignored files at those paths, and an unfinished merge); any overlap → USER_DIRTY and nothing moves; too little
free space on its file system for what the landing writes → NO_SPACE and nothing moves.
Otherwise the ref moves and `git read-tree -m -u OLD NEW` (git's two-tree merge: it updates exactly
the changed paths in index and work tree, and refuses rather than overwrite anything) runs in each
checkout. All or nothing: should git refuse (the user edited a file in the few milliseconds between) or fail
(a full disk, a file it cannot write), the checkouts are put back at OLD (the failed one path by path: those
paths were clean a moment ago) and the ref is swapped back; only if something cannot be put back does the
journal entry stay open, for the next start to finish. Bare repositories have no checkout.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
import time
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

import pygit2

from orchestrator import testhook
from orchestrator.git import checkouts, repos
from orchestrator.git.checkouts import FAULT, SPACE_MARGIN
from orchestrator.git.journal import Intent, Journal, NoJournal
from orchestrator.git.merging import LandStyle, Mergeable, MergeResult, merge_for_landing
from orchestrator.git.workspace import Workspace, WorkspaceError, remove_tree
from orchestrator.runners import process
from orchestrator.runners.sandbox import Sandbox

TAIL_BYTES = process.TAIL_BYTES
"""How much of a check's output `CheckResult.output_tail` keeps."""
KILL_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL for a check that timed out."""


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
    REWRITTEN = "rewritten"
    """The branch no longer contains the job's base (force-pushed, reset): nothing moved; plan it again."""
    NO_SPACE = "no-space"
    """A checkout's file system has less free space than the landing writes there; nothing moved."""
    UNREACHABLE = "unreachable"
    """Team mode: the shared remote could not be reached; nothing is known to have moved (it waits, then tries)."""
    FAULT = "fault"
    """An error moving the ref or updating a checkout (a full disk, an unwritable file or ref): everything put
    back, nothing moved (`message` says what failed, and what could not be put back if anything)."""


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


@dataclass
class Prepared:
    """A ref move checked and journaled (`prepare`), ready for `move`."""

    repo: pygit2.Repository
    ref: pygit2.Reference
    """Looked up with the expected head: `set_target` on it is the compare-and-swap."""
    branch: str
    old: pygit2.Oid
    new: pygit2.Oid
    checkouts: list[Path]
    changed: frozenset[str]
    journal: Journal
    token: object
    what: str


def advance(
    repo_path: Path,
    branch: str,
    expected_head: str,
    new_sha: str,
    *,
    job_id: int | None = None,
    journal: Journal | None = None,
) -> LandResult:
    """Move `branch` from `expected_head` to `new_sha` if it still points at `expected_head` (`prepare`, then
    `move`, in one go; sync: run in a thread).

    HEAD_MOVED if it does not (nothing changed); USER_DIRTY if a checkout of the branch has uncommitted
    work at paths that differ between the two heads, NO_SPACE if its file system is too full (nothing changed);
    FAULT if the ref or a checkout cannot be written (put back: nothing changed); else LANDED, with every
    checkout of the branch updated in index and work tree. Reflog message: "orchestrator: land job N".
    """
    prepared = prepare(repo_path, branch, expected_head, new_sha, job_id=job_id, journal=journal)
    return prepared if isinstance(prepared, LandResult) else move(prepared)


def prepare(
    repo_path: Path,
    branch: str,
    expected_head: str,
    new_sha: str,
    *,
    job_id: int | None = None,
    journal: Journal | None = None,
) -> Prepared | LandResult:
    """Everything before the ref moves: the head still expected, each checkout of the branch clean where the
    landing writes and with room for it. When a checkout is on the branch, the intent is stored in `journal`
    before our first git command in it (the dry run takes its index.lock) and cleared by `move` once the
    checkouts are level again (see git/journal.py), so a crash anywhere in between is recoverable."""
    repo = repos.open_repo(repo_path)
    refname = _refname(branch)
    ref = repo.lookup_reference(refname)
    old = repo.revparse_single(expected_head).peel(pygit2.Commit).id
    new = repo.revparse_single(new_sha).peel(pygit2.Commit).id
    if ref.target != old:
        return _head_moved(branch, str(old), str(ref.target))

    on = checkouts.on_branch(repo, refname)
    journal = journal or NoJournal()
    changed: frozenset[str] = frozenset()
    # Before our first git command in a checkout: a crash from here on may leave its index.lock behind.
    token = (
        journal.begin(
            Intent(str(repo_path), refname, str(old), str(new), tuple(map(str, on)), job_id, time.time())
        )
        if on
        else None
    )
    if on:
        changed = repos.changed_paths(repo_path, str(old), str(new))
        for checkout in on:
            short = checkouts.short_of_space(repo, checkout, new, changed)
            if short is not None:
                journal.end(token)
                return _no_space(branch, str(old), checkout, *short)
            blocked = checkouts.in_the_way(checkout, changed) or checkouts.dry_run(checkout, old, new)
            if blocked:
                journal.end(token)
                paths, reason, kind = blocked
                if kind == FAULT:
                    return _fault(branch, str(old), f"your checkout {checkout} cannot be updated ({reason})")
                return _user_dirty(branch, str(old), checkout, paths, reason)
    what = f"land job {job_id}" if job_id is not None else "land"
    return Prepared(repo, ref, branch, old, new, on, changed, journal, token, what)


def move(p: Prepared) -> LandResult:
    """The ref (compare-and-swap), then every checkout; all put back if any step fails (sync: run in a thread)."""
    refname = p.ref.name
    try:
        p.ref.set_target(p.new, f"orchestrator: {p.what}")  # CAS against the target `ref` was looked up with
    except (pygit2.GitError, OSError) as e:  # a lock it cannot take, a file it cannot write: OSError
        p.journal.end(p.token)
        now = p.repo.lookup_reference(refname).target
        if now != p.old:
            return _head_moved(p.branch, str(p.old), str(now))
        return _fault(p.branch, str(p.old), f"{refname} could not be written ({e})")
    result, settled = _update_checkouts(p)
    if settled:
        p.journal.end(p.token)  # only once every checkout is level again; else it is left for recovery
    return result


def _update_checkouts(p: Prepared) -> tuple[LandResult, bool]:
    """After the ref moved: carry each checkout to `new`, or put everything back if git refuses or fails in one.

    Returns the result and whether every checkout is level with the ref (else the journal entry stays open).
    """
    old, new, branch = p.old, p.new, p.branch
    updated: list[Path] = []
    for checkout in p.checkouts:
        try:
            failed = checkouts.read_tree(checkout, old, new, refreshed=True)
        except OSError as e:  # git could not even be started (no memory, no file descriptors)
            failed = ((), f"git could not run: {e}", FAULT)
        if failed is None:
            updated.append(checkout)
            continue
        paths, reason, kind = failed
        # The failed checkout first, path by path (git may have written some before it failed; those paths were
        # clean a moment ago, so OLD is what was there); then the ones already carried to NEW.
        stuck = {str(checkout): checkouts.put_back(p.repo, checkout, p.changed, old)} if kind == FAULT else {}
        for done in reversed(updated):
            if checkouts.read_tree(done, new, old) is not None:
                stuck[str(done)] = checkouts.put_back(p.repo, done, p.changed, old)
        stuck = {c: ps for c, ps in stuck.items() if ps}
        if checkouts.swap_back(p.repo, p.ref.name, new, old, f"orchestrator: undo {p.what}"):
            if stuck:
                where = "; ".join(f"{c}: {_some(ps)}" for c, ps in stuck.items())
                message = (
                    f"{branch} not moved: your checkout {checkout} {reason}; and these paths could not be put "
                    f"back as they were ({where}): `git checkout {str(old)[:12]} -- PATH` there restores each"
                )
                return _fault(branch, str(old), message, stuck_paths=True), False
            if kind == FAULT:
                return _fault(branch, str(old), f"your checkout {checkout} could not be updated ({reason})"), True
            return _user_dirty(branch, str(old), checkout, paths, reason), True
        # Someone moved the branch on from our commit already: the work has landed, the checkout lags.
        return LandResult(
            LandOutcome.LANDED,
            str(new),
            str(old),
            (),
            paths,
            f"{branch} advanced {str(old)[:12]} → {str(new)[:12]} but your checkout {checkout} was not updated "
            f"({reason}); `git read-tree -m -u {str(old)[:12]} {str(new)[:12]}` there brings it level",
        ), False
    return LandResult(
        LandOutcome.LANDED, str(new), str(old), (), (), f"{branch} advanced {str(old)[:12]} → {str(new)[:12]}"
    ), True


@dataclass(frozen=True, slots=True)
class Check:
    """A repository's landing check: a shell command run on the merged result before the branch moves."""

    command: str
    timeout: float
    log_path: Path | None = None
    scratch_root: Path | None = None
    owner: process.Owner | None = None
    sandbox: Sandbox | None = None
    """Where the check runs: the merged result is the job's code, confined like the job itself."""


async def land(
    repo_path: Path,
    branch: str,
    job_commit: str,
    *,
    job_id: int,
    message: str,
    base: str | None = None,
    check: Check | None = None,
    mergeable: Mergeable | None = None,
    retries: int = 3,
    style: LandStyle = "merge",
    journal: Journal | None = None,
) -> LandResult:
    """Merge `job_commit` onto the branch head and advance the branch, all or nothing; again if the head moves.

    REWRITTEN when the head no longer contains `base` (the job's base: merging would bring back history the
    branch dropped); CONFLICT, NOOP and CHECK_FAILED return at once; HEAD_MOVED (someone moved the branch
    between read and swap) merges, checks and moves again from the new head, up to `retries` times;
    USER_DIRTY and NO_SPACE return for the daemon to wait on; FAULT when something could not be written (put
    back). `message` is the merge commit's message when a merge commit is needed.
    """
    result: LandResult | None = None
    for _ in range(retries + 1):
        head = await asyncio.to_thread(repos.branch_head, repo_path, branch)
        if base is not None and not await asyncio.to_thread(contains, repo_path, head, base):
            return _rewritten(branch, head, base, job_id)
        merged = await asyncio.to_thread(
            functools.partial(merge_for_landing, message=message, style=style), repo_path, head, job_commit, mergeable
        )
        early = _merge_outcome(merged, branch, job_id)
        if early is not None:
            return early
        assert merged.sha is not None
        if check is not None:
            ran = await run_check(
                repo_path,
                merged.sha,
                check.command,
                timeout=check.timeout,
                log_path=check.log_path,
                scratch_root=check.scratch_root,
                owner=check.owner,
                sandbox=check.sandbox,
            )
            if not ran.ok:
                return _check_failed(check, ran, branch, head, merged.sha)
        prepared = await asyncio.to_thread(
            functools.partial(prepare, job_id=job_id, journal=journal), repo_path, branch, head, merged.sha
        )
        if isinstance(prepared, LandResult):
            result = prepared
        else:
            await testhook.reach("landing.move", job_id)
            result = await asyncio.to_thread(move, prepared)
        if result.outcome is not LandOutcome.HEAD_MOVED:
            return _landed_message(result, merged, branch, job_id)
    assert result is not None
    return replace(
        result, message=f"{branch} kept moving: {retries + 1} attempts to land job {job_id}; try again later"
    )


def contains(repo_path: Path, head: str, base: str) -> bool:
    """Whether `base` is `head` or one of its ancestors (a base the repository no longer has: no)."""
    repo = repos.open_repo(repo_path)
    try:
        h = repo.revparse_single(head).peel(pygit2.Commit).id
        b = repo.revparse_single(base).peel(pygit2.Commit).id
    except (KeyError, ValueError, pygit2.GitError):
        return False
    return h == b or repo.descendant_of(h, b)


def _check_failed(check: Check, ran: CheckResult, branch: str, head: str, sha: str) -> LandResult:
    status = f"timed out after {check.timeout:g}s" if ran.timed_out else f"exited {ran.returncode}"
    return LandResult(
        LandOutcome.CHECK_FAILED,
        head,
        head,
        (),
        (),
        f"landing check `{check.command}` {status} on {sha[:12]}; {branch} stays at {head[:12]}",
        ran.output_tail,
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
    then = "commit or stash that, the landing waits" if paths else "the landing waits"
    return LandResult(
        LandOutcome.USER_DIRTY, old, old, (), paths, f"your checkout {checkout} of {branch} {reason}{shown}; {then}"
    )


def _no_space(branch: str, old: str, checkout: Path, needed: int, free: int) -> LandResult:
    return LandResult(
        LandOutcome.NO_SPACE,
        old,
        old,
        (),
        (),
        f"the file system of your checkout {checkout} has {_mb(free)} free and this landing writes {_mb(needed)} "
        f"there (and keeps {_mb(SPACE_MARGIN)} spare); {branch} not moved: free some space and the landing goes on",
    )


def _fault(branch: str, old: str, what: str, *, stuck_paths: bool = False) -> LandResult:
    message = what if stuck_paths else f"{what}; {branch} not moved, nothing changed"
    return LandResult(LandOutcome.FAULT, old, old, (), (), message)


def _rewritten(branch: str, head: str, base: str, job_id: int) -> LandResult:
    return LandResult(
        LandOutcome.REWRITTEN,
        head,
        head,
        (),
        (),
        f"{branch} was rewritten: its head {head[:12]} no longer contains job {job_id}'s base {base[:12]}; "
        f"not merged (that would bring back what {branch} dropped): the job is planned again on the new head",
    )


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB"


def _some(paths: tuple[str, ...], limit: int = 5) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
