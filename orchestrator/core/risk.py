"""The chance that two jobs with disjoint claims still touch a common path. Pure, no I/O.

Each job's `Risk` (from local evidence and its repository's record, see `plan.focus`) gives, for the paths
evidence says it may touch beyond its claim, a probability each (`rest` for any other path), and how often
past changes of its area met changes in each other area. For jobs A and B the risk is the larger of:

- by their files: 1 - (1 - A escapes into what B holds) (1 - B escapes into what A claims)
  (1 - both escape to one path), where "A escapes into a set" is 1 - Π(1 - p_A(x)) over its paths (a
  directory: the entries under it), and "both escape to one path" is Σ p_A(z) p_B(z) over the paths both
  list;
- by their areas: how often past changes in A's area met one in B's although their estimate by files was
  small (A's record of it, and B's): what no file-level evidence accounts for.

A job without a `Risk` (a declared or a model claim) escapes nowhere: its claim stands as given, and only
the other job's record of meeting its area counts. Union-merged paths are left out by the caller
(admission passes counted paths only).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.core import claims
from orchestrator.core.models import Risk

__all__ = ["Escapes", "area_of", "by_files", "pair_risk"]


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
        return cls(point, below, risk.rest, risk.area, dict(risk.meets))

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


def pair_risk(a: Escapes | None, a_claim: Iterable[str], b: Escapes | None, b_held: Iterable[str]) -> float:
    """The chance that job A (claiming `a_claim`) and job B (holding `b_held`: its claim and what it touched)
    touch a common path, their claims being disjoint: the larger of the estimate by files and by areas.
    Both without an estimate: 0 (the claims stand)."""
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
