"""Land a job's commit: merge in memory, check, compare-and-swap the target; on a branch, keep checkouts in step.

One loop for every target (`land_on`): read the target's head → refuse a head that no longer contains the job's
base (the target was rewritten: merging would bring back history it dropped; the job is planned again) → merge
in memory → run the landing check on the result if there is one (a `Check` handed in by the caller, such as
`jobs.landing_check`'s command in a scratch worktree) → swap the target to the result; HEAD_MOVED, and all of it
again on the new head (a check passed on one merge says nothing about another). What each outcome says is
`git.outcomes`. A target is a branch of this repository (`Branch`, `land`) or a team's shared remote
(`git.remote`, where the swap is a push with a lease).

On a branch the swap is `prepare` (every checkout of the branch checked, the intent journaled), then `move`
(the ref, then the checkouts).

The ref move is a true compare-and-swap: `Reference.set_target` is libgit2's `git_reference_set_target`,
which is `git_reference_create_matching` with the value the reference had when looked up, checked
under git's own `refs/heads/B.lock`; a concurrent `git update-ref` either happens before it (we see
HEAD_MOVED) or fails on its own old-value check. A `git commit` in a checkout of the branch is waited for:
the move holds each such checkout's `index.lock`, which a commit holds from reading HEAD to moving it
(`checkouts.hold_index`), so the person's commit is never refused because a landing moved the branch under it.

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
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, Required, TypedDict, Unpack

import pygit2

from orchestrator import testhook
from orchestrator.git import checkouts, commits, outcomes, repos
from orchestrator.git.checkouts import FAULT, SPACE_MARGIN
from orchestrator.git.journal import Intent, Journal, NoJournal
from orchestrator.git.merging import LandStyle, Mergeable, merge_for_landing
from orchestrator.git.outcomes import LandOutcome, LandResult

REFLOG = "orchestrator: "
"""How every reflog entry the daemon writes begins: the git hook tells the commit that ran it from a landing by it."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    ok: bool
    returncode: int | None
    """The command's exit status (negative: killed by that signal); None if it never ran."""
    output_tail: str
    """The end of its stdout and stderr, interleaved as written."""
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
    checkout of the branch updated in index and work tree. Reflog message: "orchestrator: land job N" (`REFLOG`).
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
        journal.begin(Intent(str(repo_path), refname, str(old), str(new), tuple(map(str, on)), job_id, time.time()))
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
    """Each checkout's index held (a commit the person is making there finishes first), the ref (compare-and-swap),
    then every checkout; all put back if any step fails (sync: run in a thread)."""
    held: list[Path] = []
    try:
        blocked = _hold_checkouts(p, held)
        if blocked is not None:
            p.journal.end(p.token)
            return blocked
        try:
            p.ref.set_target(p.new, f"{REFLOG}{p.what}")  # CAS against the target `ref` was looked up with
        except (pygit2.GitError, OSError) as e:  # a lock it cannot take, a file it cannot write: OSError
            p.journal.end(p.token)
            now = p.repo.lookup_reference(p.ref.name).target
            if now != p.old:
                return _head_moved(p.branch, str(p.old), str(now))
            return _fault(p.branch, str(p.old), f"{p.ref.name} could not be written ({e})")
        result, settled = _update_checkouts(p, held)
    finally:
        for lock in held:  # those kept are the index already
            checkouts.drop_index(lock)
    if settled:
        p.journal.end(p.token)  # only once every checkout is level again; else it is left for recovery
    return result


COMMIT_WAIT = 10.0
"""Seconds a landing waits for a git commit (merge, rebase...) of the person's in a checkout of its branch to end
before it lets go and tries again later."""


QUIET = 0.3
"""Seconds a landing lets pass after a person's git command under way ended before it takes the index: a next
command (`git add`, another commit) would otherwise meet the landing's lock."""


def _hold_checkouts(p: Prepared, held: list[Path]) -> LandResult | None:
    """Hold every checkout's index (appended to `held`) with no git command of the person's under way there that
    will move HEAD: such a command reads HEAD first and moves it last (after its hooks and the editor), so the
    landing waits for it (up to `COMMIT_WAIT`), else git would refuse the person's commit. Once the indexes are
    held, a command that starts fails at once on the lock (git commit takes it right after reading HEAD); one that
    held a lock before the landing took it may have read HEAD already, so then the look is taken again."""
    deadline = time.monotonic() + COMMIT_WAIT
    seen = False
    while True:
        running = checkouts.git_under_way(p.checkouts)
        if running is None and seen:  # the person's next git command often follows at once: let it start first
            seen = False
            time.sleep(QUIET)
            continue
        if running is None:
            contended = False
            for checkout in p.checkouts:
                got = checkouts.hold_index(checkout)
                if not isinstance(got, checkouts.Held):
                    paths, reason, kind = got
                    if kind == FAULT:
                        return _fault(p.branch, str(p.old), f"your checkout {checkout} cannot be updated ({reason})")
                    return _user_dirty(p.branch, str(p.old), checkout, paths, reason)
                held.append(got.lock)
                contended = contended or got.waited
            running = checkouts.git_under_way(p.checkouts) if contended else None
            if running is None:
                return None
            while held:  # one started before the locks were taken: it goes first
                checkouts.drop_index(held.pop())
        seen = True
        if time.monotonic() > deadline:
            pid, command, checkout = running
            why = f"has your `git {command}` under way (pid {pid}), which must end first"
            return _user_dirty(p.branch, str(p.old), checkout, (), why)
        time.sleep(0.05)


def _update_checkouts(p: Prepared, held: list[Path]) -> tuple[LandResult, bool]:
    """After the ref moved: carry each checkout to `new` in its held index, or put everything back if git refuses
    or fails in one (the checkouts' own index files were never touched then: they still hold `old`).

    Returns the result and whether every checkout is level with the ref (else the journal entry stays open).
    """
    old, new, branch = p.old, p.new, p.branch
    updated: list[tuple[Path, Path]] = []
    for checkout, lock in zip(p.checkouts, held, strict=True):
        try:
            failed = checkouts.read_tree(checkout, old, new, refreshed=True, index=lock)
        except OSError as e:  # git could not even be started (no memory, no file descriptors)
            failed = ((), f"git could not run: {e}", FAULT)
        if failed is None:
            updated.append((checkout, lock))
            continue
        paths, reason, kind = failed
        # The failed checkout first, path by path (git may have written some before it failed; those paths were
        # clean a moment ago, so OLD is what was there); then the ones already carried to NEW.
        stuck = {str(checkout): checkouts.put_back(p.repo, checkout, p.changed, old)} if kind == FAULT else {}
        for done, done_lock in reversed(updated):
            if checkouts.read_tree(done, new, old, index=done_lock) is not None:
                stuck[str(done)] = checkouts.put_back(p.repo, done, p.changed, old)
        stuck = {c: ps for c, ps in stuck.items() if ps}
        if checkouts.swap_back(p.repo, p.ref.name, new, old, f"{REFLOG}undo {p.what}"):
            if stuck:
                where = "; ".join(f"{c}: {outcomes.some(ps)}" for c, ps in stuck.items())
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
    for _, lock in updated:
        checkouts.keep_index(lock)
    return LandResult(
        LandOutcome.LANDED, str(new), str(old), (), (), f"{branch} advanced {str(old)[:12]} → {str(new)[:12]}"
    ), True


class Check(Protocol):
    """A repository's landing check, handed in by the caller (`jobs.landing_check`): run on the merged result
    before the target moves."""

    @property
    def command(self) -> str:
        """What it runs, as the person who configured it wrote it."""
        ...

    async def run(self, repo_path: Path, sha: str) -> CheckResult:
        """This check on the commit `sha` of the repository at `repo_path`."""
        ...

    def status(self, ran: CheckResult) -> str:
        """How a run of it ended, for a person."""
        ...


class Landing(TypedDict, total=False):
    """The job's side of a landing, wherever it lands (`land_on`'s keywords, which both `land`s take)."""

    job_id: Required[int]
    message: Required[str]
    """The merge commit's message when a merge commit is needed."""
    base: str | None
    """The job's base: a head that no longer contains it was rewritten (None: not asked)."""
    check: Check | None
    mergeable: Mergeable | None
    style: LandStyle


class Target(Protocol):
    """What a job lands on: a branch of the repository (`Branch`), or a shared remote's branch (`git.remote`)."""

    @property
    def where(self) -> str:
        """The target, for a person: a branch name, or a remote and its branch."""
        ...

    async def head(self) -> str | LandResult:
        """The head to merge onto now, or how the attempt ends without one (a remote that cannot be fetched)."""
        ...

    async def swap(self, head: str, new: str) -> LandResult:
        """Move the target from `head` to `new` if it still points at `head` (the compare-and-swap): LANDED;
        HEAD_MOVED when it no longer does (merged again on the new head); else how it ended, nothing moved."""
        ...


async def land_on(
    target: Target,
    repo_path: Path,
    job_commit: str,
    *,
    job_id: int,
    message: str,
    base: str | None = None,
    check: Check | None = None,
    mergeable: Mergeable | None = None,
    style: LandStyle = "merge",
    retries: int = 3,
) -> LandResult:
    """Merge `job_commit` (an object of the repository at `repo_path`) onto the target's head and swap the target
    to the result; again from the new head while the swap finds it moved, up to `retries` more times.

    REWRITTEN when the head no longer contains `base` (the job's base: merging would bring back history the
    target dropped); CONFLICT, NOOP and CHECK_FAILED end it at once; HEAD_MOVED on every attempt ends it with
    "kept moving". A check passed on one merge says nothing about another: each attempt runs it again.
    `message` is the merge commit's message when a merge commit is needed.
    """
    where = target.where

    async def once() -> LandResult:
        head = await target.head()
        if isinstance(head, LandResult):
            return head
        if base is not None and not await asyncio.to_thread(contains, repo_path, head, base):
            return outcomes.rewritten(where, head, base, job_id)
        if base is not None and (found := await asyncio.to_thread(job_commit_since, repo_path, head, base, job_id)):
            return outcomes.landed_before(where, head, found, job_id)
        merged = await asyncio.to_thread(
            functools.partial(merge_for_landing, message=message, style=style), repo_path, head, job_commit, mergeable
        )
        early = outcomes.merge_outcome(merged, where, job_id)
        if early is not None:
            return early
        assert merged.sha is not None
        if check is not None:
            ran = await check.run(repo_path, merged.sha)
            if not ran.ok:
                return outcomes.check_failed(check.command, check.status(ran), ran.output_tail, where, head, merged.sha)
        return outcomes.landed(await target.swap(head, merged.sha), merged, where, job_id)

    result: LandResult | None = None
    for attempt in range(1, retries + 2):
        result = replace(await once(), attempts=attempt)
        if result.outcome is not LandOutcome.HEAD_MOVED:
            return result
    assert result is not None
    return outcomes.kept_moving(result, where, job_id)


@dataclass(frozen=True, slots=True)
class Branch:
    """A branch of the repository as a landing target: its ref compare-and-swapped, its checkouts kept in step."""

    repo_path: Path
    where: str
    """The branch."""
    job_id: int
    journal: Journal | None = None

    async def head(self) -> str:
        return await asyncio.to_thread(repos.branch_head, self.repo_path, self.where)

    async def swap(self, head: str, new: str) -> LandResult:
        prepared = await asyncio.to_thread(
            functools.partial(prepare, job_id=self.job_id, journal=self.journal), self.repo_path, self.where, head, new
        )
        if isinstance(prepared, LandResult):
            return prepared
        await testhook.reach("landing.move", self.job_id)
        return await asyncio.to_thread(move, prepared)


async def land(
    repo_path: Path,
    branch: str,
    job_commit: str,
    *,
    retries: int = 3,
    journal: Journal | None = None,
    **job: Unpack[Landing],
) -> LandResult:
    """Merge `job_commit` onto the branch head and advance the branch, all or nothing; again if the head moves
    (`land_on`, on `Branch`). Besides the outcomes of `land_on`: USER_DIRTY and NO_SPACE return for the daemon
    to wait on; FAULT when something could not be written (put back)."""
    target = Branch(repo_path, branch, job["job_id"], journal)
    return await land_on(target, repo_path, job_commit, retries=retries, **job)


WALK_LIMIT = 10_000
"""Commits `job_commit_since` looks at, at most (a target that moved that far since a job's base is rare)."""


def job_commit_since(repo_path: Path, head: str, base: str, job_id: int) -> str | None:
    """A commit between `base` and `head` that is job `job_id`'s own (its `Orchestrator-Job` trailer, in the last
    paragraph of the message as git reads trailers): the sha, or None. Only the daemon writes that trailer: a job's
    text is the message's body, never its last paragraph."""
    repo = repos.open_repo(repo_path)
    try:
        walker = repo.walk(repo.revparse_single(head).peel(pygit2.Commit).id, pygit2.enums.SortMode.TOPOLOGICAL)
        walker.hide(repo.revparse_single(base).peel(pygit2.Commit).id)
    except (KeyError, ValueError, pygit2.GitError):
        return None
    for n, commit in enumerate(walker):
        if n >= WALK_LIMIT:
            return None
        if commits.job_of(commit.message) == job_id:
            return str(commit.id)
    return None


def contains(repo_path: Path, head: str, base: str) -> bool:
    """Whether `base` is `head` or one of its ancestors (a base the repository no longer has: no)."""
    repo = repos.open_repo(repo_path)
    try:
        h = repo.revparse_single(head).peel(pygit2.Commit).id
        b = repo.revparse_single(base).peel(pygit2.Commit).id
    except (KeyError, ValueError, pygit2.GitError):
        return False
    return h == b or repo.descendant_of(h, b)


# ---- the ref and the checkouts -------------------------------------------------------------------------


def _refname(branch: str) -> str:
    return branch if branch.startswith("refs/") else f"refs/heads/{branch}"


# ---- results --------------------------------------------------------------------------------------------


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
    shown = f": {outcomes.some(paths)}" if paths else ""
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


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB"
