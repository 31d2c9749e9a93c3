"""Pure figures for the jobs benchmark: bounds and schedules of a queue, and what a replay measured. No I/O.

Two yardsticks for a replay's makespan:

- the *ideal* (`lower_bound`): a makespan no schedule of the queue can beat, whatever it admits: the work
  spread over every slot, the longest job, and, where the claims are fixed before the queue runs (declared
  ones), the heaviest chain of jobs whose claims overlap (admission never lets a later one overtake an earlier
  one it overlaps, nor run beside it). A replay at 1.0× of it is perfect.
- the *list schedule* (`list_makespan`): list scheduling with the same durations, slots and claims as the
  replay, no job overtaking an earlier waiting job whose claim it overlaps (or that admission kept it apart
  from on risk), and zero overhead (a job starts the instant it may and lands the instant it ends). The gap
  between it and the replay is the job plane's own overhead; it is not a bound: a replay whose jobs were
  admitted on other claims (re-planned, grown) or beside a job held back anyway can beat it.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.core import claims

Claims = Sequence[frozenset[str] | None]
"""Per job: its counted claim (normalised, mergeable paths removed), or None when it must run alone."""
Apart = Sequence[tuple[int, int]]
"""Pairs of jobs kept apart beyond their claims (their estimated risk above `plan.risk`)."""


def counted(paths: Sequence[str], mergeable: tuple[str, ...]) -> frozenset[str]:
    """The claim paths that can overlap: normalised, union-mergeable files left out."""
    kept, _ = claims.split_mergeable(claims.normalize_all(paths), mergeable)
    return kept


def conflicts(claims_: Claims, apart: Apart = ()) -> list[set[int]]:
    """For each job, the jobs whose claims overlap its own (a job that runs alone overlaps every other), and
    those it is kept `apart` from."""
    n = len(claims_)
    out: list[set[int]] = [set() for _ in range(n)]
    for i, j in apart:
        out[i].add(j)
        out[j].add(i)
    indexes = [claims.PathIndex(c) if c is not None else None for c in claims_]
    for i in range(n):
        for j in range(i + 1, n):
            a, b = claims_[i], claims_[j]
            if a is None or b is None or (a and indexes[j].meeting(a)):  # type: ignore[union-attr]
                out[i].add(j)
                out[j].add(i)
    return out


def lower_bound(durations: Sequence[float], slots: int, fixed: Claims | None = None) -> float:
    """The ideal: a makespan no schedule on `slots` slots can beat. `fixed`: claims the jobs hold from before the
    queue runs to their landing (declared), of which overlapping ones run one after another in queue order."""
    if not durations:
        return 0.0
    bound = max(max(durations), sum(durations) / slots)
    if fixed is not None:
        conf = conflicts(fixed)
        ends: list[float] = []
        for i, d in enumerate(durations):
            ends.append(d + max((ends[j] for j in conf[i] if j < i), default=0.0))
        bound = max(bound, *ends)
    return bound


def list_makespan(durations: Sequence[float], claims_: Claims, slots: int, apart: Apart = ()) -> float:
    """List scheduling in queue order on `slots` slots; a job waits for running and earlier waiting jobs it
    overlaps or is kept apart from."""
    conf = conflicts(claims_, apart)
    waiting = list(range(len(durations)))
    running: list[tuple[float, int]] = []
    now = 0.0
    while waiting or running:
        held = {i for _, i in running}
        passed: set[int] = set()
        still = []
        for i in waiting:
            if len(running) < slots and not (conf[i] & held) and not (conf[i] & passed):
                heapq.heappush(running, (now + durations[i], i))
                held.add(i)
            else:
                passed.add(i)
                still.append(i)
        waiting = still
        if running:
            now, _ = heapq.heappop(running)
            while running and running[0][0] <= now:
                heapq.heappop(running)
    return now


def over_serialized_pairs(policy_claims: Claims, real: Claims, apart: Apart = ()) -> int:
    """Pairs of jobs the policy's claims (and risk) keep apart although the files they really touch are disjoint."""
    policy_conf = conflicts(policy_claims, apart)
    real_conf = conflicts(real)
    return sum(1 for i, js in enumerate(policy_conf) for j in js if j > i and j not in real_conf[i])


@dataclass(frozen=True, slots=True)
class Interval:
    start: float
    end: float


RUN_ENDS = frozenset({"finished", "failed", "requeued", "recheck", "conflicted", "cancelled", "interrupted"})
"""Stored events that end a run (the first after its `admitted`)."""


def runs_of(events: Sequence[dict]) -> list[Interval]:
    """A job's runs, from its stored events in order: each `admitted` to the first event that ends that run (a
    landing's own conflict, after `finished`, ends nothing more)."""
    out: list[Interval] = []
    start: float | None = None
    for e in events:
        if e["kind"] == "admitted":
            start = e["at"]
        elif e["kind"] in RUN_ENDS and start is not None:
            out.append(Interval(start, e["at"]))
            start = None
    return out


def thrown_away(runs: Sequence[Sequence[Interval]], landed: Sequence[bool]) -> float:
    """Job-seconds of runs whose work did not land: every run of a job but the last one of a job that landed (a
    run stopped on a conflict, a run whose landing conflicted, a job that never landed)."""
    total = 0.0
    for job_runs, done in zip(runs, landed, strict=True):
        wasted = job_runs[:-1] if done else job_runs
        total += sum(iv.end - iv.start for iv in wasted)
    return total


def beside(runs: Sequence[Sequence[Interval]]) -> list[set[int]]:
    """For each job, the jobs that ran at the same time as it (some attempt of each overlapping in time)."""
    out: list[set[int]] = [set() for _ in runs]
    for i in range(len(runs)):
        for j in range(i + 1, len(runs)):
            if any(x.start < y.end and y.start < x.end for x in runs[i] for y in runs[j]):
                out[i].add(j)
                out[j].add(i)
    return out


def met(runs: Sequence[Sequence[Interval]], real: Claims) -> list[set[int]]:
    """For each job, the jobs it ran beside that really touched a common file with it (union-mergeable files
    left out of `real`)."""
    indexes = [claims.PathIndex(r) if r else None for r in real]
    out: list[set[int]] = [set() for _ in runs]
    for i, others in enumerate(beside(runs)):
        a = indexes[i]
        for j in others:
            b = real[j]
            if j > i and a is not None and b and a.meeting(b):
                out[i].add(j)
                out[j].add(i)
    return out


def met_side_by_side(runs: Sequence[Sequence[Interval]], real: Claims) -> int:
    """Pairs of jobs that ran at the same time (some attempt of each overlapping in time) and really touched a
    common file (union-mergeable files left out of `real`): what `plan.risk` bounds, whether or not their
    landings then merged cleanly."""
    return sum(len(js) for js in met(runs, real)) // 2


def max_concurrency(intervals: Sequence[Interval]) -> int:
    """The most intervals open at one instant (an end at t closes before a start at t opens)."""
    points = sorted([(iv.start, 1) for iv in intervals] + [(iv.end, -1) for iv in intervals])
    best = cur = 0
    for _, step in points:
        cur += step
        best = max(best, cur)
    return best


def pct(values: Sequence[float], q: float) -> float | None:
    """The q-th quantile (0..1) by nearest rank; None for no values (a figure no sample gave: shown "-", never 0)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def start_latency(starts: Sequence[float], created: Sequence[float], releases: Sequence[float]) -> list[float]:
    """Per job: start minus the last moment something let it start (its enqueue, or the last landing before)."""
    ordered = sorted(releases)
    out = []
    for s, c in zip(starts, created, strict=True):
        prior = [r for r in ordered if r <= s]
        out.append(max(0.0, s - max(c, prior[-1] if prior else c)))
    return out


def mean(values: Sequence[float]) -> float | None:
    """The mean; None for no values."""
    return statistics.fmean(values) if values else None


def fig(value: float | None, digits: int) -> float | None:
    """A figure rounded for a report; None (no samples) stays None."""
    return None if value is None else round(value, digits)


def most(values: Sequence[float]) -> float | None:
    """The largest value; None for no values."""
    return max(values) if values else None
