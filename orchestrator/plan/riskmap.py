"""A repository's map from the risk its record estimates to the share of such pairs that really would not merge.
Pure, no I/O.

The estimate (`core.risk`: the chance two jobs meet times the chance such a meeting would not merge) is checked
against the record's own later pairs (`plan.record.fit`: each estimated from the changes before it only, then
whether it would have merged). Within a repository the observed rate is nearly flat across the estimate: the
estimate ranks pairs a little, and its scale per repository is what is wrong. So the map is fitted, per
repository, as a monotone step function (pooled adjacent violators, weighted), each step shrunk towards the
repository's own base rate by `PRIOR` pseudo-pairs (a thin step says little of itself), then taken at the upper
end of its Wilson interval at `Z` (an upper bound: the period's drift stays within what was measured) and kept
monotone. Where the estimate does not rank, every pair gets the repository's base rate: the honest answer.

`fit` gives the knots (lowest estimate of each step, its value); `core.risk.mapped` applies them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PRIOR = 20.0
"""Pseudo-pairs at the repository's base rate that each step of the map is pulled towards."""
Z = 0.84
"""The normal quantile of the upper bound each step is taken at (one-sided 80%)."""
MIN_STEP = 25
"""Pairs a step needs before it stands apart from its neighbour (fewer: pooled with the one below)."""


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
    n_all, k_all = len(pts), sum(y for _, y in pts)
    base = (k_all + 0.5) / (n_all + 1.0)
    # Pooled adjacent violators over the points grouped by estimate: blocks of (lowest x, n, k), rates increasing.
    groups: list[list[float]] = []
    for x, y in pts:
        if groups and groups[-1][0] == x:
            groups[-1][1] += 1
            groups[-1][2] += y
        else:
            groups.append([x, 1.0, float(y)])
    blocks: list[list[float]] = []
    for g in groups:
        blocks.append(g)
        while len(blocks) > 1 and _violates(blocks[-2], blocks[-1]):
            _, n2, k2 = blocks.pop()
            blocks[-1][1] += n2
            blocks[-1][2] += k2
    pooled: list[list[float]] = []
    for b in blocks:  # thin steps join the one below (the lowest one joins the next)
        if pooled and (pooled[-1][1] < MIN_STEP or b[1] < MIN_STEP):
            pooled[-1][1] += b[1]
            pooled[-1][2] += b[2]
        else:
            pooled.append(list(b))
    knots: list[tuple[float, float]] = []
    for x, n, k in pooled:
        value = upper(k + PRIOR * base, n + PRIOR)
        if knots and value <= knots[-1][1]:
            continue  # monotone: a step no higher than the one below adds nothing
        knots.append((x, value))
    return tuple(knots)


def _violates(lo: list[float], hi: list[float]) -> bool:
    """The higher-estimate block's rate is not above the lower one's: they pool."""
    return hi[2] * lo[1] <= lo[2] * hi[1]
