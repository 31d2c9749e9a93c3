"""A repository's map from the risk its record estimates to the share of such pairs that really would not merge.
Pure, no I/O.

The estimate (`core.risk`: the chance two jobs meet times the chance such a meeting would not merge) is checked
against the record's own later pairs (`plan.record.fit`: each estimated from the changes before it only, then
whether it would have merged). The map is fitted on those pairs as pooled bins: `BINS` bins of as many pairs each
(at least `MIN_BIN`) by their estimate, adjacent bins whose rates (or mean estimates: ties) do not increase pooled
(so the map is monotone, and where the estimate does not rank a repository's pairs, one bin: its base rate), each
bin's rate pulled towards the bin's own mean estimate by `PRIOR` pseudo-pairs (a thin bin says little of itself)
and taken at the upper end of its Wilson interval at `Z` (the period's drift stays within it), and never below the
share of all the pairs that would not merge (the record's base rate: a pair the record ranks below it is only as safe
as its repository's other pairs; where the record's ranking does not carry into the next period, and on a small
repository it often does not, a bin below the base rate was the record's noise). Between the bins' mean estimates
the map is linear; below the first it keeps the first bin's value, above the last it grows as the estimate does.

The base rate as the floor, measured side by side (`bench predict`, the record's own outcomes each counted once,
`plan.record.RECENT`) on thirteen seen repositories: every bin of 50 pairs or more within 1.5 times its estimate on
all of them, where the lowest bins, pulled towards their own estimate, came out below what happened on
pytest-rerunfailures (5-8%: 6.1% estimated, 13.9% happened) and gunicorn (3-5%).

Fitted on the record's own later pairs (the first half of them, 26 repositories) and judged on the rest, this beat
the single ratio it replaces and an isotonic map of every pair shrunk to the repository's base rate (a few hundred
pairs a repository: it fit their noise): log-loss 0.244 against 0.250 and 0.268, two repositories of 26 above 1.5
times their estimate on the later half against six and ten.

`fit` gives the map as knots (estimate, value), both increasing; `core.risk.mapped` applies them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

BINS = 4
"""Bins of the record's pairs, by their estimate."""
MIN_BIN = 40
"""Pairs a bin needs (fewer: one bin fewer)."""
PRIOR = 100.0
"""Pseudo-pairs at its own mean estimate by which each bin's rate is pulled towards it."""
Z = 0.52
"""The normal quantile of the upper bound each bin is taken at (one-sided 70%)."""


def upper(k: float, n: float, z: float = Z) -> float:
    """The upper end of the Wilson score interval of `k` in `n` (1 when `n` is 0)."""
    if n <= 0:
        return 1.0
    p = min(1.0, max(0.0, k / n))
    d = 1 + z * z / n
    c = p + z * z / (2 * n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return min(1.0, (c + h) / d)


def fit(points: Sequence[tuple[float, bool]]) -> tuple[tuple[float, float], ...]:
    """The knots of the map from `points` (estimate, would not merge): () when there are none."""
    if not points:
        return ()
    pts = sorted(points)
    size = max(MIN_BIN, math.ceil(len(pts) / BINS))
    bins = [_Bin.of(pts[i : i + size]) for i in range(0, len(pts), size)]
    if len(bins) > 1 and bins[-1].n < MIN_BIN:
        bins[-2:] = [bins[-2] + bins[-1]]
    pooled: list[_Bin] = []
    for b in bins:
        pooled.append(b)
        while len(pooled) > 1 and (pooled[-1].rate <= pooled[-2].rate or pooled[-1].mean <= pooled[-2].mean):
            pooled[-2:] = [pooled[-2] + pooled[-1]]
    base = sum(b.k for b in bins) / len(pts)
    knots: list[tuple[float, float]] = []
    for b in pooled:
        value = max(base, upper(b.k + PRIOR * b.mean, b.n + PRIOR))
        knots.append((b.mean, max(value, knots[-1][1]) if knots else value))
    return tuple(knots)


class _Bin:
    """Pairs pooled: their summed estimate, how many, how many would not merge."""

    __slots__ = ("k", "n", "sx")

    def __init__(self, sx: float, n: int, k: int) -> None:
        self.sx, self.n, self.k = sx, n, k

    @classmethod
    def of(cls, pts: Sequence[tuple[float, bool]]) -> _Bin:
        return cls(sum(x for x, _ in pts), len(pts), sum(y for _, y in pts))

    def __add__(self, other: _Bin) -> _Bin:
        return _Bin(self.sx + other.sx, self.n + other.n, self.k + other.k)

    @property
    def mean(self) -> float:
        return self.sx / self.n

    @property
    def rate(self) -> float:
        """The bin's rate as the map takes it (before the upper bound)."""
        return (self.k + PRIOR * self.mean) / (self.n + PRIOR)
