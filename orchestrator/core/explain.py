"""What `orchestrator why` says about a job: true to its state, whichever part of its life it is in. Pure.

Admission decisions only describe a waiting job; once a job runs, lands or ends, its state and code say
where it is (a landing that waits on your uncommitted edit says so), and the last admission decision is
history.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core import claims
from orchestrator.core.job import Job
from orchestrator.core.models import WAITING, Code, JobState


def next_step(job: Job, landing_now: bool = False) -> str:
    """One line: what happens next to `job`, and what a person can do about it."""
    st, code = job.state, job.code
    if st is JobState.PLANNED and job.decision:
        return str(job.decision.get("next") or "waits for admission")
    if st is JobState.PLANNED and code == Code.REVISED:
        return "waits for admission, then its runner goes on with your feedback in its kept worktree"
    if st in (JobState.QUEUED, JobState.PLANNING) and code == Code.OVERTOOK:
        after = f"once jobs {', '.join(map(str, sorted(job.land_after)))} ended, " if job.land_after else ""
        return f"runs again {after}on a base with the change of the earlier jobs it went ahead of"
    if st in (JobState.QUEUED, JobState.PLANNING):
        return "re-plans on the new head" if code == "BaseMoved" else "gets its claim and base, then waits to start"
    if st is JobState.RUNNING and code == Code.RATE_LIMITED:
        return f"waits for its model API's rate limit to end, then its runner goes on by itself: {job.reason}"
    if st is JobState.RUNNING and code == Code.REVISED:
        then = "is ready for review again" if job.land == "review" else "lands"
        return f"its runner goes on with your feedback in its worktree; {then} when it finishes"
    if st is JobState.RUNNING:
        return "runs in its worktree; lands when its runner finishes"
    if st is JobState.LANDING:
        if landing_now:
            return f"lands now: merging onto {job.branch}"
        if code == Code.USER_DIRTY:
            return "lands as soon as you commit or stash your uncommitted changes in the way"
        if code == Code.LAND_AFTER:
            return f"lands after jobs {', '.join(map(str, sorted(job.land_after)))} (it overlapped them)"
        return f"waits for its turn in the landing queue of {job.branch}"
    if st is JobState.READY:
        return (
            f"waits for your review: `orchestrator diff {job.id}` shows its change, `orchestrator land {job.id}` "
            f"lands it, `orchestrator revise {job.id} FEEDBACK` sends it back to its agent, `orchestrator reject "
            f"{job.id}` drops it (its paths stay taken until then)"
        )
    if st is JobState.UNCHANGED:
        return f"nothing: it changed nothing, so nothing landed; `orchestrator retry {job.id}` runs it again"
    if st is JobState.LANDED:
        return "nothing: it has landed" + (f" at {job.landed_sha[:12]}" if job.landed_sha else "")
    revise = (
        f"`orchestrator revise {job.id} FEEDBACK` sends it back to its agent in its kept worktree, "
        if st in (JobState.FAILED, JobState.INTERRUPTED) and job.worktree
        else ""
    )
    return (
        f"nothing by itself: {revise}`orchestrator retry {job.id}` runs it again, `orchestrator clean {job.id}` "
        "forgets it"
    )


def explain(job: Job, landing_now: bool = False) -> dict[str, Any]:
    """The `why` answer: state, code, reason and next step; the admission decision while it waits for one."""
    waiting = job.state in WAITING
    return {
        "id": job.id,
        "state": str(job.state),
        "code": job.code,
        "reason": job.reason,
        "next": next_step(job, landing_now),
        "decision": job.decision if waiting else None,
        "last_decision": None if waiting else job.decision,
        "land_after": list(job.land_after),
        "outside_claim": sorted(claims.outside(job.actual, job.claim.paths)) if job.claim.paths else [],
        "grown": sorted(claims.outside(job.grown, job.claim.paths) if job.claim.paths else job.grown),
    }
