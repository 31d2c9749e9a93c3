"""The chance that two jobs with disjoint claims still make a conflict the landing cannot merge. Pure, no I/O.

It is the product of two factors, both estimated from the jobs' repository's record (`plan.record`):

- `meet`, the chance that they touch a common path. Each job's `Risk` (from local evidence and the record,
  see `plan.focus`) gives, for the paths evidence says it may touch beyond its claim, a probability each
  (`rest` for any other path), and how often past changes of its area met changes in each other area. For
  jobs A and B the estimate is the larger of:
  - by their files: 1 - (1 - A escapes into what B holds) (1 - B escapes into what A claims)
    (1 - both escape to one path), where "A escapes into a set" is 1 - Π(1 - p_A(x)) over its paths (a
    directory: the entries under it), and "both escape to one path" is Σ p_A(z) p_B(z) over the paths both
    list;
  - by their areas: how often past changes in A's area met one in B's although their estimate by files was
    small (A's record of it, and B's): what no file-level evidence accounts for;
  then the shipped model (`PAIR_WEIGHTS`: that estimate, and what the two claims are) gives the chance they
  meet, rescaled as the repository's own later changes say such chances came true (`Risk.meet`), and never
  below `MEET_FLOOR`, nor below the repository's own floor (`Risk.floor`: how often its pairs that nothing
  connected met anyway).
- `nonmerge`, the chance that such a meeting would not merge: how often past changes in their areas that met
  would not have (`plan.merges`: a conflict, or one built on the other), the larger of the two jobs'.

Their product is then mapped by the repository's own check of it (`Risk.scale`, `plan.riskmap`): a monotone map,
fitted on its record's later pairs, from the product to the share of such pairs that really would not merge.
It is never below `RISK_FLOOR`: below it the estimate knows no better (a map fitted on a record says less of the
next period's quietest pairs than it seems to: measured by `bench predict`, such pairs mapped to 1-3% did not merge
3.5-17% of the time). The map
changes the risk, not the chance of meeting: `nonmerge` is what is left of it (where the map says more than the
chance of meeting, that chance is raised to it).

A job without a `Risk` (a declared or a model claim) escapes nowhere: its claim stands as given, and only
the other job's record counts. Union-merged paths are left out by the caller (admission passes counted
paths only).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.core import claims
from orchestrator.core.models import Risk

__all__ = [
    "KNOWN",
    "RISK_FLOOR",
    "Escapes",
    "PairRisk",
    "area_of",
    "by_files",
    "mapped",
    "pair_logit",
    "pair_risk",
    "raw_meet",
]


def area_of(path: str) -> str:
    """The area a path is in: its directory (a directory claim is its own area, and so is a top-level file:
    `README.md` and `requirements.txt` are areas apart, not all of the root)."""
    name = claims.glob_prefix(path) if claims.is_glob(path) else path
    if name.endswith("/"):
        return name.rstrip("/")
    return name.rsplit("/", 1)[0] if "/" in name else name


@dataclass(frozen=True, slots=True, eq=False)
class Escapes:
    """A job's `Risk`, indexed by path name for lookups in O(depth)."""

    point: dict[str, float]
    """name → probability, for each listed path."""
    below: dict[str, float]
    """name → the summed probability of the listed paths strictly under it."""
    rest: float
    area: str
    meets: dict[str, float]
    """area → how often this job's area met it (the longest listed prefix of an area answers)."""
    nonmerge: float = 1.0
    meet: tuple[float, float] = (1.0, 0.0)
    kind: str = ""
    floor: float = 0.0
    scale: tuple[tuple[float, float], ...] = ()

    @classmethod
    def of(cls, risk: Risk | None) -> Escapes | None:
        if risk is None:
            return None
        point: dict[str, float] = {}
        below: dict[str, float] = {}
        for path, p in risk.near:
            if claims.is_glob(path):
                path = claims.glob_prefix(path) or claims.ROOT
            name = claims.name_of(path)
            point[name] = point.get(name, 0.0) + p
            for a in claims.ancestors(name):
                below[a] = below.get(a, 0.0) + p
        meets = dict(risk.meets)
        return cls(
            point, below, risk.rest, risk.area, meets, risk.nonmerge, risk.meet, risk.kind, risk.floor, risk.scale
        )

    def at(self, path: str) -> float:
        """The chance the job touches `path` (for a directory or a name that may be one: anything under it)."""
        if claims.is_glob(path):
            path = claims.glob_prefix(path)
        name = claims.name_of(path)
        p = self.point.get(name, 0.0) + self.below.get(name, 0.0)
        p += sum(self.point.get(a, 0.0) for a in claims.ancestors(name))
        return min(1.0, p) if p > 0 else self.rest

    def meeting(self, area: str) -> float:
        """How often past changes in this job's area met one in `area`: its deepest listed directory, or
        where it leaves this job's own areas for one not listed, the rate of the siblings there (`p/*`)."""
        a, below = area, None
        while True:
            sibling = f"{a}/*" if a else "*"
            if below is not None and sibling in self.meets and _within(a, self.area) and not _within(below, self.area):
                return self.meets[sibling]
            if a in self.meets:
                return self.meets[a]
            if not a:
                return 0.0
            a, below = (a.rsplit("/", 1)[0] if "/" in a else ""), a

    def into(self, paths: Iterable[str]) -> float:
        """The chance the job touches at least one of `paths`."""
        miss = 1.0
        for p in paths:
            miss *= 1.0 - self.at(p)
        return 1.0 - miss


def _within(a: str, b: str) -> bool:
    """Area `a` is `b` or encloses it (ROOT encloses every area)."""
    return not a or b == a or b.startswith(a + "/")


@dataclass(frozen=True, slots=True)
class PairRisk:
    """Two jobs' risk: the chance they meet, and that such a meeting would not merge."""

    meet: float = 0.0
    nonmerge: float = 0.0
    logit: float = 0.0
    """The shipped model's log-odds that they meet, before their repository's rescaling (what the daemon's own
    outcomes refit that rescaling on)."""
    raw: float = 0.0
    """The risk as the two factors estimate it, before their repository's map (`Risk.scale`): what the daemon's own
    outcomes refit that map on."""

    @property
    def risk(self) -> float:
        """The chance of a conflict the landing cannot merge: what `plan.risk` bounds."""
        return self.meet * self.nonmerge

    def __str__(self) -> str:
        return f"{self.risk:.1%} (meet {self.meet:.1%} \u00d7 no merge {self.nonmerge:.0%})"


NONE = PairRisk()


PAIR_WEIGHTS = {"bias": -1.751, "estimate": 0.167, "test": 0.6, "known": -0.712}
"""The log-odds that two jobs with disjoint claims touch a common path: per unit of the log-odds of their
estimate (`raw_meet`), and for what their claims are (`Risk.kind`): `test` when one claims a test file first
(its change is mostly elsewhere), `known` per change of a known kind (a dependency update, a release: its claim
is what such changes touch). The estimate itself says little on commit messages (its weight is small): what
their claims are says more. Fitted once, offline, on 3,726 pairs of three public repositories' authored
changes (of their last 200 each, planned on its parent from its message, the pairs at most 8 apart with
disjoint claims), never on a repository the benchmarks report as held out; each repository then rescales it
on its own record (`Risk.meet`)."""


def pair_logit(raw: float, kinds: Iterable[str]) -> float:
    """The shipped model's log-odds that two jobs meet, their estimate `raw` and their claims' `kinds`."""
    kinds = tuple(kinds)
    w = PAIR_WEIGHTS
    z = w["bias"] + w["estimate"] * _logit(raw) + w["test"] * ("test" in kinds)
    return z + w["known"] * kinds.count(KNOWN)


MEET_FLOOR = 0.05
"""No two jobs of a repository are less likely than this to touch a common path: unrelated changes meet through
files nothing points to (a setting, a manifest, a module every change edits). Of the pairs the model puts
least likely (the lowest tenth, of the three repositories it was fitted on), 3.5% met, and on one of them 6%."""

RISK_FLOOR = 0.03
"""No two jobs of a repository are estimated less likely than this to make a conflict their landings cannot merge.
Of the pairs `bench predict` estimated below it on the repositories it was developed on (2,415 pairs, seven
repositories), 3.6% would not have merged: below it the estimate does not tell pairs apart (one repository's
were 0%, another's 11-14%), only the period does."""

KNOWN = "known"
"""`Risk.kind` of a change of a known kind (a dependency update, a release, a change that recurs)."""


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1.0 - 1e-6)
    return math.log(p / (1.0 - p))


def pair_risk(a: Escapes | None, a_claim: Iterable[str], b: Escapes | None, b_held: Iterable[str]) -> PairRisk:
    """The risk of job A (claiming `a_claim`) beside job B (holding `b_held`: its claim and what it touched),
    their claims being disjoint. Both without an estimate: none (the claims stand)."""
    if a is None and b is None:
        return NONE
    known = [e for e in (a, b) if e is not None]
    z = pair_logit(raw_meet(a, a_claim, b, b_held), (e.kind for e in known))
    floor = max(MEET_FLOOR, *(e.floor for e in known))
    meet = max(floor, *(sigmoid(e.meet[0] * z + e.meet[1]) for e in known))
    raw = meet * min(1.0, max(e.nonmerge for e in known))
    scales = [e.scale for e in known if e.scale]
    risk = max(RISK_FLOOR, *(mapped(s, raw) for s in scales)) if scales else max(RISK_FLOOR, raw)
    meet = max(meet, risk)
    return PairRisk(meet, min(1.0, risk / meet), z, raw)


def mapped(knots: Sequence[tuple[float, float]], raw: float) -> float:
    """The risk a repository's map (`plan.riskmap`: knots (estimate, value), both increasing) gives an estimate `raw`:
    interpolated between the knots around it; below the first the first's value, above the last the last's and what
    the estimate is above it. No knots: `raw`."""
    if not knots:
        return raw
    i = bisect_right([x for x, _ in knots], raw)
    if i == 0:
        return knots[0][1]
    if i == len(knots):
        x, y = knots[-1]
        return min(1.0, y + raw - x)
    (x0, y0), (x1, y1) = knots[i - 1], knots[i]
    return y0 + (y1 - y0) * (raw - x0) / (x1 - x0)


def raw_meet(a: Escapes | None, a_claim: Iterable[str], b: Escapes | None, b_held: Iterable[str]) -> float:
    """The chance that A and B touch a common path as their evidence says it, before their record's scaling:
    the larger of the estimate by files and by areas."""
    a_claim, b_held = tuple(a_claim), tuple(b_held)
    return max(by_files(a, a_claim, b, b_held), _by_areas(a, a_claim, b, b_held))


def by_files(a: Escapes | None, a_claim: Iterable[str], b: Escapes | None, b_held: Iterable[str]) -> float:
    """The estimate by files alone: A into what B holds, B into what A claims, or both into one path."""
    into_b = a.into(b_held) if a is not None else 0.0
    into_a = b.into(a_claim) if b is not None else 0.0
    both = 0.0
    if a is not None and b is not None:
        small, large = (a, b) if len(a.point) <= len(b.point) else (b, a)
        both = min(1.0, sum(p * large.point[n] for n, p in small.point.items() if n in large.point))
    return 1.0 - (1.0 - into_b) * (1.0 - into_a) * (1.0 - both)


def _by_areas(a: Escapes | None, a_claim: tuple[str, ...], b: Escapes | None, b_held: tuple[str, ...]) -> float:
    """How often past changes in one's area met one in the other's (a job without an estimate: the areas of
    its paths), the larger of what either record says."""
    out = 0.0
    if a is not None:
        areas = (b.area,) if b is not None else {area_of(p) for p in b_held}
        out = max((a.meeting(x) for x in areas), default=0.0)
    if b is not None:
        areas = (a.area,) if a is not None else {area_of(p) for p in a_claim}
        out = max(out, max((b.meeting(x) for x in areas), default=0.0))
    return out
