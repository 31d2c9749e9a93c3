"""A running job's claim grows: may the paths it touched outside its claim join it? Pure, no I/O.

A job that writes outside what it claimed asks admission again, for those paths only, as if they were a new
declared claim beside the other active jobs of its repository (`admission.decide` on a snapshot of them, with
no limit of slots: the job holds its slot already, and waiting jobs come after a running one; what they hold
decides, not the estimated risk of what they might touch yet). Admitted, the
paths join its claim (`Job.grown`), so the next job's admission keeps away from them. Refused (another
active job claims or touched them, runs alone, or they reach a barrier), they join it too — the job did touch
them — and the job is serialised with the jobs that hold them: the later started lands after the earlier
(`land_after`), and an in-memory merge of both says whether they really conflict.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from orchestrator.core import admission, claims
from orchestrator.core.models import Claim, ClaimSource, Decision, JobView, Policy, Reason, Snapshot

UNLIMITED = 1 << 30
"""Slots for the growth question: a running job has its slot; only paths decide."""


@dataclass(frozen=True, slots=True)
class Growth:
    """What admission said of the paths a running job touched outside its claim."""

    paths: frozenset[str]
    """Touched outside its claim and its earlier growth (union-merged files left out): empty, nothing to ask."""
    decision: Decision | None = None
    """Admission's answer for `paths` (None when there were none)."""

    @property
    def grows(self) -> bool:
        """The paths join its claim and nothing else holds them. A pair risk over `Policy.risk` (checked after
        every check on what the others hold) is no holding: the paths are written already, and the agent's check
        must not refuse a path nobody holds."""
        d = self.decision
        return bool(self.paths) and d is not None and (d.admitted or d.reason is Reason.RISK)

    @property
    def held_by(self) -> tuple[int, ...]:
        """The active jobs that hold what it touched (their landings and its are ordered)."""
        return () if self.decision is None or self.grows else self.decision.blocking


def outside(job: JobView, touched: Iterable[str], policy: Policy) -> frozenset[str]:
    """The paths of `touched` that `job`'s claim (its growth included) does not hold, union-merged ones left out."""
    wide = claims.outside(touched, job.claim.paths)
    counted, _ = claims.split_mergeable(wide, policy.mergeable, job.mergeable)
    return counted


def decide(job: JobView, touched: Iterable[str], others: Iterable[JobView], policy: Policy) -> Growth:
    """May the paths `job` touched outside its claim join it, beside `others` (the other active jobs)?"""
    paths = outside(job, touched, policy)
    if not paths:
        return Growth(frozenset())
    probe = JobView(
        id=job.id,
        repo=job.repo,
        branch=job.branch,
        claim=Claim(paths, 1.0, ClaimSource.DECLARED),
        mergeable=job.mergeable,
    )
    snapshot = Snapshot(
        active=tuple(o for o in others if o.repo == job.repo and o.id != job.id),
        policy=replace(policy, max_concurrent=UNLIMITED, per_repo=UNLIMITED, raised=()),
    )
    return Growth(paths, admission.decide(probe, snapshot))


def held(path: str, job: JobView, others: Iterable[JobView], policy: Policy) -> Decision | None:
    """Whether `job` may write `path` beside `others` (None: it may; else the refusal, naming the jobs that hold
    it): the built-in agent asks before it writes outside its claim."""
    g = decide(job, (claims.normalize(path),), others, policy)
    return None if not g.paths or g.grows else g.decision
