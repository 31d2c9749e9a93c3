"""A job's life as data: the named groups of states, the moves allowed between them, and the decisions taken
after a run, after a landing attempt and on a cancel. Pure, no I/O.

Every change of a job's state is one compare-and-set in the store (`JobTable.transition`): the caller names the
states it expects the job to be in and the state it moves it to, and the store moves it only if the job is
still in one of them. `check` refuses a move this table does not allow, so a wrong expectation is a
programming error found at once, not a job quietly put somewhere it cannot leave.

The shell (scheduler, executor, lander, the verbs) reads a job, asks one of the decision functions here
what to do, and carries that out with the expectation it read; when the store says the job has moved on
meanwhile, the caller backs off (a cancel reads again and decides again).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from orchestrator.core.models import CANCELLABLE, Code, JobEvent, JobState

Q, PLANNING, P = JobState.QUEUED, JobState.PLANNING, JobState.PLANNED
RUNNING, LANDING, READY = JobState.RUNNING, JobState.LANDING, JobState.READY
LANDED, UNCHANGED, CONFLICTED = JobState.LANDED, JobState.UNCHANGED, JobState.CONFLICTED
FAILED = JobState.FAILED
CANCELLED, INTERRUPTED = JobState.CANCELLED, JobState.INTERRUPTED

# -- the moves ---------------------------------------------------------------------------------------------

MOVES: Mapping[JobState, frozenset[JobState]] = {
    Q: frozenset({PLANNING, CANCELLED}),
    PLANNING: frozenset({P, FAILED, Q, CANCELLED}),  # Q: a daemon restart plans it again
    P: frozenset({RUNNING, Q, FAILED, CANCELLED}),  # Q: its base moved, re-plan; FAILED: a dependency failed
    # Q / P / CONFLICTED: a real conflict with a job that lands first stopped it (or its recorded change did not
    # apply): queued afresh, or waiting to go on in its kept worktree (P), or left for a person.
    RUNNING: frozenset({LANDING, READY, UNCHANGED, FAILED, CANCELLED, INTERRUPTED, Q, P, CONFLICTED}),
    LANDING: frozenset({LANDED, FAILED, CONFLICTED, Q, CANCELLED}),  # Q: re-queued on a new head
    READY: frozenset({LANDING, CANCELLED, RUNNING}),  # RUNNING: sent back to its agent with feedback (`revise`)
    INTERRUPTED: frozenset({Q, CANCELLED, P}),  # P: revised, it waits for admission to go on in its kept worktree
    FAILED: frozenset({Q, P}),  # P: revised (as INTERRUPTED)
    CANCELLED: frozenset({Q}),
    CONFLICTED: frozenset({Q}),
    UNCHANGED: frozenset({Q}),
    LANDED: frozenset(),
}
"""From each state, the states a job may move to. A landed job never moves again."""


class MoveError(ValueError):
    """A transition the table does not allow: a bug in the caller, never a user's mistake."""


def check(expect: Collection[JobState], to: JobState) -> frozenset[JobState]:
    """`expect` as a set, if a job may move from every state in it to `to`; MoveError otherwise."""
    sources = frozenset(expect)
    if not sources:
        raise MoveError(f"a move to {to} must expect at least one state")
    bad = sorted(s for s in sources if to not in MOVES[s])
    if bad:
        raise MoveError(f"no move from {', '.join(bad)} to {to}")
    return sources


def allowed(state: JobState, to: JobState) -> bool:
    return to in MOVES[state]


# -- decisions ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """What to write: the move (`to` from `expect`), the stored event, the code and the reason."""

    to: JobState
    expect: frozenset[JobState]
    event: JobEvent
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How a runner's attempt ended, as the executor saw it."""

    job_id: int
    ok: bool
    exit_code: int | None = None
    code: str | None = None
    """The runner's own code for a failure (BudgetSpent, WroteOutside, ...), else None."""
    summary: str = ""
    changed: bool = False
    """It left changes: a result commit was made."""
    review: bool = False
    """Its landing mode is review: it stops `ready`."""
    worktree: str = ""
    revised: bool = False
    """A round of review feedback: its earlier result stands even when this round changed nothing more."""


def after_run(end: RunEnd) -> Step:
    """Where a job goes once its runner is done: failed, unchanged (nothing to land), ready, or landing."""
    i = end.job_id
    if not end.ok:
        code = end.code or (Code.RUNNER_FAILED if end.exit_code is not None else Code.TIMED_OUT)
        reason = f"{end.summary}; worktree kept at {end.worktree} (see `orchestrator logs {i}`)"
        return Step(FAILED, frozenset({RUNNING}), JobEvent.FAILED, str(code), reason)
    if not end.changed and not end.revised:
        reason = f"{end.summary} but changed nothing: nothing landed (`orchestrator logs {i}` says what it did)"
        return Step(UNCHANGED, frozenset({RUNNING}), JobEvent.FINISHED, Code.NO_CHANGES, reason)
    if not end.changed:
        end = replace(end, summary=f"{end.summary}; this round changed nothing more")
    if end.review:
        reason = (
            f"{end.summary + '; ' if end.revised else ''}ready for review: `orchestrator diff {i}`, then "
            f"`orchestrator land {i}`, `orchestrator revise {i} FEEDBACK` or `orchestrator reject {i}`"
        )
        return Step(READY, frozenset({RUNNING}), JobEvent.FINISHED, Code.READY, reason)
    done = f"{end.summary}; waits for its landing" if end.revised else "finished; waits for its landing"
    return Step(LANDING, frozenset({RUNNING}), JobEvent.FINISHED, Code.FINISHED, done)


class Landed(StrEnum):
    """How one landing attempt ended (the values of `git.outcomes.LandOutcome`)."""

    LANDED = "landed"
    NOOP = "noop"
    CONFLICT = "conflict"
    REWRITTEN = "rewritten"
    """The target branch no longer contains the job's base (force-pushed, reset): nothing moved."""
    HEAD_MOVED = "head-moved"
    USER_DIRTY = "user-dirty"
    NO_SPACE = "no-space"
    """A checkout's file system has too little room for the landing: nothing moved; it waits."""
    CHECK_FAILED = "check-failed"
    UNREACHABLE = "unreachable"
    """Team mode: the shared remote could not be reached: nothing moved; it waits."""
    REFUSED = "refused"
    """Team mode: the remote refused the push (branch protection, a hook): nothing moved; it fails."""
    NO_BRANCH = "no-branch"
    """Team mode: the remote has no such branch: nothing moved; it fails."""
    FENCED = "fenced"
    """Team mode: this node no longer holds the job: nothing pushed; the next attempt finds it is not this node's."""
    FAULT = "fault"
    """An error (disk full, an unwritable ref or checkout): everything was put back, nothing landed."""


class Then(StrEnum):
    """What the lander does after an attempt."""

    END = "end"
    """The step was written; this landing is over."""
    WAIT = "wait"
    """Try again after a pause (a person's change is in the way)."""
    AGAIN = "again"
    """Try again now (the branch moved)."""


@dataclass(frozen=True, slots=True)
class LandingPolicy:
    retry_on_conflict: bool = True
    max_attempts: int = 3


def after_landing(outcome: Landed, attempts: int, policy: LandingPolicy) -> tuple[Then, JobState | None]:
    """After one landing attempt of a `landing` job: whether it ends and where it goes (None: it stays landing).

    A conflict re-queues it on the new head while attempts remain, else leaves it for a person; a rewritten
    target re-queues it always (its base is gone, so it must be planned again; merging would bring back
    history the branch dropped). Nothing but LANDED and NOOP ever moves it to `landed`.
    """
    if outcome in (Landed.LANDED, Landed.NOOP):
        return Then.END, LANDED
    if outcome in (Landed.USER_DIRTY, Landed.NO_SPACE, Landed.UNREACHABLE):
        return Then.WAIT, None
    if outcome in (Landed.HEAD_MOVED, Landed.FENCED):
        return Then.AGAIN, None
    if outcome is Landed.REWRITTEN:
        return Then.END, Q
    if outcome is Landed.CONFLICT:
        return Then.END, on_conflict(attempts, policy)
    return Then.END, FAILED  # CHECK_FAILED, FAULT, REFUSED, NO_BRANCH


def on_conflict(attempts: int, policy: LandingPolicy, *, behind: bool = True) -> JobState:
    """Where a job goes after a real conflict (at its landing, or seen while it ran): back to the queue for a fresh
    attempt while attempts remain, else left for a person. `behind`: there is a job whose landing can settle it
    (one it runs again after); without one, another attempt would meet the same conflict."""
    retry = policy.retry_on_conflict and behind and attempts + 1 < policy.max_attempts
    return Q if retry else CONFLICTED


def on_unchanged(attempts: int, policy: LandingPolicy, *, unseen: bool) -> JobState:
    """Where a job goes that changed nothing: back to the queue to look again on a base with the change of the
    earlier-queued jobs it went ahead of (`unseen`: its base lacks one; `core.overtake`) while attempts remain, else
    unchanged (nothing to land)."""
    return Q if unseen and attempts + 1 < policy.max_attempts else UNCHANGED


class Revise(StrEnum):
    """How to send a job back to its agent with feedback (`on_revise`)."""

    NOW = "now"
    """A ready job: it holds its paths and slot, so it runs again at once (READY → RUNNING)."""
    ADMIT = "admit"
    """A failed or interrupted job whose worktree is kept: its paths are free, so it waits for admission again
    (→ PLANNED, keeping its base and worktree), then goes on where it stopped."""
    NO_WORKTREE = "no-worktree"
    """Failed or interrupted, but with no worktree to go on in (it never got one, or it is gone): retry instead."""
    NOT_NOW = "not-now"
    """Any other state: nothing to revise (it is waiting, running, landing, or ended for good)."""


REVISABLE = frozenset({READY, FAILED, INTERRUPTED})
"""States a job can be revised in (`on_revise`)."""


def on_revise(state: JobState, *, worktree_kept: bool) -> Revise:
    """What a revise of a job in `state` does; `worktree_kept`: its own workspace is still on disk."""
    if state is READY:
        return Revise.NOW
    if state in (FAILED, INTERRUPTED):
        return Revise.ADMIT if worktree_kept else Revise.NO_WORKTREE
    return Revise.NOT_NOW


class Edit(StrEnum):
    """How to edit a waiting job (`on_edit`)."""

    IN_PLACE = "in-place"
    """Its fields change and it stays where it is: a new priority, or a queued job's new text or paths (it has no
    plan yet)."""
    REPLAN = "replan"
    """Planned: its text or paths changed, so its claim is stale; it goes back to queued and is planned again."""
    STOP_PLAN = "stop-plan"
    """Its plan may be running on the old text: stop it, then back to queued."""
    NOT_NOW = "not-now"
    """It started, or ended: nothing to edit."""


def on_edit(state: JobState, *, replan: bool) -> Edit:
    """What an edit of a job in `state` does; `replan`: its text or paths change (its claim with them)."""
    if state not in (Q, PLANNING, P):
        return Edit.NOT_NOW
    if not replan or state is Q:
        return Edit.IN_PLACE
    return Edit.STOP_PLAN if state is PLANNING else Edit.REPLAN


class Cancel(StrEnum):
    """How to cancel a job in a given state (`on_cancel`)."""

    ENDED = "ended"
    """It ended already: refuse, nothing to cancel."""
    LANDING_NOW = "landing-now"
    """Its merge and branch move are under way: refuse (it is about to land or not), say to wait."""
    STOP_RUN = "stop-run"
    """Its runner task is alive: stop it; the task writes `cancelled` itself."""
    STOP_PLAN = "stop-plan"
    """Its plan may be running: stop it, then write."""
    STOP_LANDING = "stop-landing"
    """It waits in its branch's landing queue: take it out, then write."""
    RELEASE = "release"
    """A ready job: write, then give its worktree back (its branch stays)."""
    WRITE = "write"
    """Nothing of it runs: write."""


def on_cancel(state: JobState, *, task: bool, landing_now: bool) -> Cancel:
    """What a cancel of a job in `state` does. `task`: a runner task of it is alive (it may not have moved the
    job to `running` yet); `landing_now`: its landing holds its branch's lock."""
    if task:
        return Cancel.STOP_RUN
    if state not in CANCELLABLE:
        return Cancel.ENDED
    if state is LANDING:
        return Cancel.LANDING_NOW if landing_now else Cancel.STOP_LANDING
    if state in (Q, PLANNING):
        return Cancel.STOP_PLAN
    if state is READY:
        return Cancel.RELEASE
    return Cancel.WRITE
