"""Calibration: how well did the claims predict what jobs really touched? Pure, no I/O.

Every ended job with a predicted claim is a `Record`: its claim, the basis of its confidence, the paths
it really touched (union-mergeable files left out, as admission leaves them out) and whether it touched,
outside its claim, a file another running job held (an `overlap` event). Reported per repo and per
basis: recall, precision, and the confident-miss rate. A repo whose confident predicted claims keep
missing gets a higher confidence threshold: its weaker claims become ambiguous and run alone, until the
claims below it stop missing (`threshold`).

Every pair of jobs admission let run side by side, once both ended, is a `Settled` outcome (`outcomes`): the
shipped model's log-odds that they meet, as their `admitted` event kept it (`core.models.Decision.risks`),
whether their actual paths met (union-mergeable files aside), and whether their landings merged (neither
conflicted in a path the other touched). They keep the repository's risk current (`record.refit`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.core import claims
from orchestrator.core.models import Claim, ClaimSource, JobState, Policy

WINDOW = 20
"""Most recent claims confident at a candidate threshold that judge it."""
MISS_RATE = 0.2
"""The most often the claims confident at a threshold may miss for it to stand."""
STEP = 0.05
"""A raised threshold is this far above the confidence of a claim that missed."""
CEILING = 0.95
"""The highest threshold calibration sets: declared claims (confidence 1.0) always stay confident."""


@dataclass(frozen=True, slots=True)
class Record:
    job_id: int
    repo: str
    claim: Claim
    basis: str
    actual: frozenset[str]
    """Paths really touched, mergeable ones left out."""
    collided: bool = False
    """It touched a file outside its claim that a concurrent job held."""

    def confident(self, policy: Policy) -> bool:
        return claims.ambiguity(self.claim, policy) is None

    @property
    def predicted(self) -> bool:
        """A claim a planner predicted (not one a person declared)."""
        return self.claim.source not in (ClaimSource.DECLARED, ClaimSource.NONE)

    @property
    def covered(self) -> int:
        return len(foreseen(self.claim.paths, self.actual))

    @property
    def useful(self) -> int:
        return len(matched(self.claim.paths, self.actual))

    @property
    def missed(self) -> bool:
        return self.covered < len(self.actual)


def foreseen(claim: Iterable[str], actual: Iterable[str]) -> frozenset[str]:
    """The paths of `actual` the claim foresaw (recall's count): those its paths meet, and a new file in a directory
    it claimed an addition to (`changelog.d/+`: the fragment the job adds, its name not known in advance)."""
    paths, touched = frozenset(claim), frozenset(actual)
    additions = [p for p in paths if claims.is_addition(p)]
    under = {t for t in touched if any(claims.foresees(p, t) for p in additions)}
    return claims.PathIndex(paths).meeting(touched) | under


def matched(claim: Iterable[str], actual: Iterable[str]) -> frozenset[str]:
    """The paths of the claim that found something the job touched (precision's count): an addition when the job
    touched a file in its directory (`claims.foresees`), any other path when it meets a touched one."""
    paths, touched = frozenset(claim), frozenset(actual)
    additions = {p for p in paths if claims.is_addition(p)}
    found = {p for p in additions if any(claims.foresees(p, t) for t in touched)}
    return claims.PathIndex(touched).meeting(paths - additions) | found


def basis_of(evidence: Iterable[Mapping[str, Any]], claim: Claim) -> str:
    """The strongest evidence kind stored with a job (its claim's source when none was stored)."""
    order = ("declared", "model", "named", "symbol", "history", "test", "cochange")
    kinds = {str(e.get("kind", "")) for e in evidence}
    return next((k for k in order if k in kinds), str(claim.source))


def _rate(n: float, d: float) -> float | None:
    return round(n / d, 3) if d else None


def summary(records: Sequence[Record], policy: Policy, confident: Sequence[bool] | None = None) -> dict[str, Any]:
    """Recall, precision, confident share and confident-miss rate, for all records (`confident`: whether each
    was confident, when not at the policy's threshold)."""
    flags = confident if confident is not None else [r.confident(policy) for r in records]
    conf = [r for r, c in zip(records, flags, strict=True) if c]
    return {
        "jobs": len(records),
        "confident": len(conf),
        "confident_share": _rate(len(conf), len(records)),
        "recall": _rate(sum(r.covered for r in conf), sum(len(r.actual) for r in conf)),
        "precision": _rate(sum(r.useful for r in conf), sum(len(r.claim.paths) for r in conf)),
        "confident_miss_rate": _rate(sum(r.missed for r in conf), len(conf)),
        "confident_collision_rate": _rate(sum(r.collided for r in conf), len(conf)),
    }


def report(records: Sequence[Record], policy: Policy) -> dict[str, Any]:
    """Per repo: the total, per basis, and the threshold calibration sets for it."""
    by_repo: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_repo[r.repo].append(r)
    raised = dict(thresholds(records, policy))
    out = {}
    for repo, rs in sorted(by_repo.items()):
        by_basis: dict[str, list[Record]] = defaultdict(list)
        for r in rs:
            by_basis[r.basis].append(r)
        out[repo] = {
            "all": summary(rs, policy),
            "by_basis": {b: summary(v, policy) for b, v in sorted(by_basis.items())},
            "min_confidence": raised.get(repo, policy.min_confidence),
            "raised": repo in raised,
        }
    return out


def threshold(records: Sequence[Record], policy: Policy, after: int = 5) -> float:
    """One repo's threshold: the lowest at which its recent claims that would have been confident missed at
    most MISS_RATE of the time.

    `records` are the repo's, oldest first. Each candidate (the policy's threshold, and just above each
    confidence a claim missed at) is judged on the last WINDOW predicted claims confident at it: fewer than
    `after` of them is no evidence against it. Every job's claim is recorded, confident or not (one that ran
    alone still claimed what it claimed and touched what it touched), so a raised threshold comes back
    down once the claims below it stop missing."""
    judged = [r for r in records if r.predicted and r.actual and r.confident(policy)]
    missed = {r.claim.confidence for r in judged if r.missed or r.collided}
    for t in sorted({policy.min_confidence} | {min(CEILING, round(c + STEP, 2)) for c in missed}):
        recent = [r for r in judged if r.claim.confidence >= t][-WINDOW:]
        if len(recent) < after or sum(r.missed or r.collided for r in recent) <= MISS_RATE * len(recent):
            return t
    return CEILING


def thresholds(records: Sequence[Record], policy: Policy, after: int = 5) -> tuple[tuple[str, float], ...]:
    """Repos whose threshold calibration sets above the policy's (`threshold`), each with it."""
    by_repo: dict[str, list[Record]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r.job_id):
        by_repo[r.repo].append(r)
    out = ((repo, threshold(rs, policy, after)) for repo, rs in sorted(by_repo.items()))
    return tuple((repo, t) for repo, t in out if t > policy.min_confidence)


def records(jobs: Iterable[Any], collided: Iterable[int], policy: Policy) -> list[Record]:
    """Records of ended jobs (`core.job.Job`s) that had a claim and touched something; `collided` holds the
    ids of jobs that touched, outside their claim, a path a concurrent job held."""
    hit = set(collided)
    out = []
    for job in jobs:
        if not job.state.terminal or not job.actual or job.claim.source is ClaimSource.NONE:
            continue
        actual, _ = claims.split_mergeable(job.actual, policy.mergeable)
        if actual:
            out.append(Record(job.id, job.repo, job.claim, basis_of(job.evidence, job.claim), actual, job.id in hit))
    return out


def collisions(jobs: Iterable[Any], overlaps: Iterable[tuple[int, Mapping[str, Any]]]) -> set[int]:
    """Ids of jobs whose `overlap` event names paths outside their own claim (they escaped into another's)."""
    claim_of = {j.id: j.claim.paths for j in jobs}
    out = set()
    for job_id, data in overlaps:
        paths = [str(p) for p in data.get("paths", [])]
        if job_id in claim_of and paths and len(claims.PathIndex(claim_of[job_id]).meeting(paths)) < len(paths):
            out.add(job_id)
    return out


@dataclass(frozen=True, slots=True)
class Settled:
    """One pair the daemon ran side by side, settled."""

    logit: float
    """The shipped model's log-odds that they meet, as admission estimated it."""
    met: bool
    """They touched a common path."""
    merged: bool
    """Their landings merged (always so when they did not meet)."""
    risk: float = 0.0
    """The risk admission estimated for them (meet × no merge)."""
    raw: float | None = None
    """That risk before its repository's map (`core.risk.PairRisk.raw`; None from an event that did not keep it)."""


class Ended(Protocol):
    """What an outcome reads of a job (`core.job.Job` has it)."""

    @property
    def id(self) -> int: ...
    @property
    def repo(self) -> str: ...
    @property
    def state(self) -> JobState: ...
    @property
    def actual(self) -> frozenset[str]: ...


def outcomes(
    jobs: Iterable[Ended],
    admitted: Iterable[tuple[int, Mapping[str, Any]]],
    conflicts: Iterable[tuple[int, Mapping[str, Any]]],
    mergeable: Sequence[str] = (),
) -> dict[str, list[Settled]]:
    """Per repository, the settled pairs: `admitted` and `conflicts` are (job id, event data) of the jobs'
    `admitted` events and of their landing conflicts (`requeued` or `conflicted` with paths); a pair counts once
    both its jobs ended, once per admission (a job run again counts again)."""
    ended = {j.id: j for j in jobs if j.state.terminal}
    touched = {i: claims.split_mergeable(j.actual, tuple(mergeable))[0] for i, j in ended.items()}
    conflicted: dict[int, set[str]] = {}
    for job_id, data in conflicts:
        conflicted.setdefault(job_id, set()).update(str(p) for p in data.get("conflicts") or ())
    out: dict[str, list[Settled]] = {}
    for job_id, data in admitted:
        job = ended.get(job_id)
        if job is None:
            continue
        for risk in data.get("risks") or ():
            other = int(risk.get("job", 0))
            if other not in ended or "logit" not in risk:
                continue
            mine, theirs = touched[job_id], touched[other]
            met = bool(claims.PathIndex(mine).meeting(theirs))
            merged = not (_within(conflicted.get(job_id), theirs) or _within(conflicted.get(other), mine))
            estimate = float(risk.get("meet", 0.0)) * float(risk.get("nonmerge", 0.0))
            raw = float(risk["raw"]) if "raw" in risk else None
            settled = Settled(float(risk["logit"]), met or not merged, merged, estimate, raw)
            out.setdefault(job.repo, []).append(settled)
    return out


def _within(paths: set[str] | None, held: frozenset[str]) -> bool:
    return bool(paths) and bool(claims.PathIndex(held).meeting(paths or ()))
