"""An estimated risk against what happened, per bin, with each bin's confidence interval. Pure.

`bins` groups (estimate, happened) points by the estimate (`EDGES`) and gives, per bin, how many, their mean
estimate, how often it happened, and the Wilson score interval of that frequency (95%). `holds` is the
calibration floor: in every bin with at least `MIN_PAIRS` points, what happened is at most `FACTOR` times the
mean estimate.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Any

EDGES = (0.0, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.35, 1.0)
"""Edges of the estimated-risk bins."""
MIN_PAIRS = 50
"""Points a bin needs before the floor judges it."""
FACTOR = 1.5
"""How far above its estimate a bin's frequency may be."""
Z = 1.96
"""The normal quantile of the intervals (95%)."""


def wilson(k: int, n: int, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = p + z * z / (2 * n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (c - h) / d), min(1.0, (c + h) / d)


def bins(points: Sequence[tuple[float, bool]], edges: Sequence[float] = EDGES) -> list[dict[str, Any]]:
    """Per bin of the estimate (those with points): how many, the mean estimate, how often it happened, and the
    interval of that frequency; `judged` when the bin has `MIN_PAIRS` points, `holds` whether it keeps the floor."""
    out = []
    for lo, hi in itertools.pairwise(edges):
        got = [(r, m) for r, m in points if lo <= r < hi or (hi == edges[-1] and r == hi)]
        if not got:
            continue
        n, k = len(got), sum(m for _, m in got)
        estimated = statistics.fmean(r for r, _ in got)
        low, high = wilson(k, n)
        judged = n >= MIN_PAIRS
        out.append(
            {
                "from": lo,
                "to": hi,
                "pairs": n,
                "estimated": round(estimated, 4),
                "observed": round(k / n, 4),
                "happened": k,
                "interval": [round(low, 4), round(high, 4)],
                "judged": judged,
                "holds": (k / n <= FACTOR * estimated) if judged else None,
            }
        )
    return out


def holds(table: Sequence[dict[str, Any]]) -> bool:
    """Every judged bin keeps the floor (what happened at most `FACTOR` times its estimate)."""
    return all(b["holds"] for b in table if b["judged"])


def lines(table: Sequence[dict[str, Any]], what: str = "happened") -> list[str]:
    """The table as lines of text."""
    out = []
    for b in table:
        mark = "" if not b["judged"] else ("  ok" if b["holds"] else f"  ABOVE {FACTOR:g}x")
        lo, hi = b["interval"]
        out.append(
            f"{b['from']:>5.0%} to {b['to']:>4.0%}: {b['pairs']:>5} pairs, estimated {b['estimated']:>6.2%}, "
            f"{what} {b['observed']:>6.2%} ({b['happened']}; 95% {lo:.1%} to {hi:.1%}){mark}"
        )
    return out
