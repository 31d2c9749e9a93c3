"""How a landing attempt ends, and what it says: one set of outcomes and one wording for a landing on a branch
of the local repository (`git.landing`) and on a team's shared remote (`git.remote`).

Both read the target's head, refuse a head that no longer contains the job's base, merge in memory, run the
landing check and compare-and-swap the target; the facts they meet on the way (a conflict, a no-op, a failed
check, a rewritten target, a lost race, a landing) are said here once, of `where` (a branch name, or a remote
and its branch). What only one of them meets has a member of its own: a person's checkout in the way
(USER_DIRTY, NO_SPACE) is local; a remote that refuses the push, has no such branch, cannot be reached, or a
node that no longer holds the job (REFUSED, NO_BRANCH, UNREACHABLE, FENCED) is team mode's.

The values are what the lander reads (`core.lifecycle.Landed` has the same ones) and what its logs carry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from orchestrator.git.merging import MergeResult


class LandOutcome(StrEnum):
    """How a landing attempt ended."""

    LANDED = "landed"
    """The target now points at the job's work (fast-forward or merge commit); checkouts updated."""
    NOOP = "noop"
    """The job's commits were already on the target; nothing moved."""
    CONFLICT = "conflict"
    """The job's changes conflict with the target's head in `conflicts`; nothing moved."""
    HEAD_MOVED = "head-moved"
    """The target no longer pointed at the head the merge was made on (a branch moved, another node's push won
    the race), on every attempt; nothing moved."""
    USER_DIRTY = "user-dirty"
    """A checkout of the branch has uncommitted work at `user_paths`, which the landing would change; nothing moved."""
    CHECK_FAILED = "check-failed"
    """The landing check failed on the merge result (`check_output`); nothing moved."""
    REWRITTEN = "rewritten"
    """The target no longer contains the job's base (force-pushed, reset): nothing moved; plan it again."""
    NO_SPACE = "no-space"
    """A checkout's file system has less free space than the landing writes there; nothing moved."""
    UNREACHABLE = "unreachable"
    """Team mode: the shared remote could not be reached; nothing is known to have moved (it waits, then tries)."""
    REFUSED = "refused"
    """Team mode: the remote refused the push (branch protection, a hook): `message` has its words; nothing moved."""
    NO_BRANCH = "no-branch"
    """Team mode: the remote has no such branch; nothing moved (push it once by hand)."""
    FENCED = "fenced"
    """Team mode: this node no longer holds the job (another node took it over); nothing pushed."""
    FAULT = "fault"
    """An error moving the ref or updating a checkout (a full disk, an unwritable file or ref): everything put
    back, nothing moved (`message` says what failed, and what could not be put back if anything)."""


@dataclass(frozen=True, slots=True)
class LandResult:
    outcome: LandOutcome
    sha: str | None
    """The target's head after this attempt (the new one when LANDED, else unchanged); None if unknown."""
    old_head: str
    """The head the last attempt started from ("" when not known: a remote that could not be fetched)."""
    conflicts: tuple[str, ...]
    user_paths: tuple[str, ...]
    """The user's uncommitted paths in the way (USER_DIRTY)."""
    message: str
    """One line for a person: what happened and what happens next."""
    check_output: str = ""
    attempts: int = 1
    """How many times the head was read and merged on (a lost race is one more)."""


def merge_outcome(merged: MergeResult, where: str, job_id: int) -> LandResult | None:
    """The result of a merge that needs no move (conflict, noop); None when one is needed."""
    head = merged.head
    if merged.kind == "conflict":
        n = len(merged.conflicts)
        return LandResult(
            LandOutcome.CONFLICT,
            head,
            head,
            merged.conflicts,
            (),
            f"job {job_id} conflicts with {where} at {head[:12]} in {n} path{'s' * (n != 1)}: "
            f"{some(merged.conflicts)}; {where} not moved",
        )
    if merged.kind == "noop":
        return LandResult(
            LandOutcome.NOOP, head, head, (), (), f"job {job_id} is already on {where} at {head[:12]}; nothing to land"
        )
    return None


def landed_before(where: str, head: str, found: str, job_id: int) -> LandResult:
    """The target holds a commit of this job already: an earlier attempt's landing (a node that lost the job
    pushed it after all). Nothing lands again; the job is landed at that commit."""
    return LandResult(
        LandOutcome.NOOP,
        found,
        head,
        (),
        (),
        f"job {job_id} is on {where} already (commit {found[:12]}, an earlier attempt's landing); nothing landed again",
    )


def rewritten(where: str, head: str, base: str, job_id: int) -> LandResult:
    return LandResult(
        LandOutcome.REWRITTEN,
        head,
        head,
        (),
        (),
        f"{where} was rewritten: its head {head[:12]} no longer contains job {job_id}'s base {base[:12]}; "
        f"not merged (that would bring back what {where} dropped): the job is planned again on the new head",
    )


def check_failed(command: str, status: str, output: str, where: str, head: str, sha: str) -> LandResult:
    """`status`: how the check ended ("exited 3", "timed out after 30s")."""
    return LandResult(
        LandOutcome.CHECK_FAILED,
        head,
        head,
        (),
        (),
        f"landing check `{command}` {status} on {sha[:12]}; {where} stays at {head[:12]}",
        output,
    )


def landed(result: LandResult, merged: MergeResult, where: str, job_id: int) -> LandResult:
    """A LANDED result said as the landing it was (any other result as it is)."""
    if result.outcome is not LandOutcome.LANDED or result.sha is None:
        return result
    how = {"fast-forward": "fast-forward", "rebase": "rebased", "squash": "squashed"}.get(merged.kind, "merge commit")
    return replace(result, message=f"landed job {job_id} on {where}: {how} {result.old_head[:12]} → {result.sha[:12]}")


def kept_moving(last: LandResult, where: str, job_id: int) -> LandResult:
    """The last of `last.attempts` attempts that all found the target moved (HEAD_MOVED)."""
    n = last.attempts
    return replace(last, message=f"{where} kept moving: {n} attempts to land job {job_id}; try again later")


def some(paths: tuple[str, ...], limit: int = 5) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
