"""Admission speed: how long `decide` and `decide_all` take on a long queue in one repo.

Claims come from a real change history (the packaged `flask-history.jsonl`, or `--history FILE`: the
files of each merged change, at most 8 per claim), or from a synthetic tree with `--synthetic`. The
waiting queue is the history replayed (sampled with replacement); the running jobs are mutually disjoint
changes, each having touched part of its claim. Every waiting job is decided against one snapshot,
the way `orchestrator why` would.

    python -m orchestrator.lab.bench.admission [--waiting 1000] [--running 16] [--seed 0] [--history PATH | --synthetic]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from orchestrator.core import admission, claims
from orchestrator.core.models import Claim, ClaimSource, JobView, Policy, Snapshot
from orchestrator.lab.bench.history import HistoryError, bundled, from_file

DEFAULT_HISTORY = bundled()
REPO = "/src/flask"
MAX_FILES = 8


def load_history(path: Path | None) -> list[list[str]]:
    """The file lists of the changes in a history file; empty for none (synthetic claims)."""
    if path is None:
        return []
    try:
        return [list(c.files) for c in from_file(path)]
    except HistoryError as e:
        raise SystemExit(f"orchestrator bench admission: {e}") from None


def _synthetic(rng: random.Random) -> list[str]:
    return [f"pkg{rng.randrange(20)}/mod{rng.randrange(40)}.py" for _ in range(rng.randint(1, MAX_FILES))]


def _claim(rng: random.Random, history: list[list[str]]) -> Claim:
    files = list(rng.choice(history)) if history else _synthetic(rng)
    if len(files) > MAX_FILES:
        files = rng.sample(files, MAX_FILES)
    paths = set(claims.normalize_all(files))
    if rng.random() < 0.05:  # a few planners claim a whole directory
        first = sorted(paths)[0]
        if "/" in first:
            paths.add(first[: first.rfind("/") + 1])
    confidence = 0.3 if rng.random() < 0.03 else rng.uniform(0.6, 1.0)
    return Claim(frozenset(paths), round(confidence, 2), ClaimSource.MODEL)


def make_snapshot(waiting: int = 1000, running: int = 16, seed: int = 0, history: Path | None = None) -> Snapshot:
    """A snapshot of one repo with `running` mutually disjoint active jobs and `waiting` planned ones."""
    rng = random.Random(seed)
    records = load_history(history)
    policy = Policy(max_concurrent=max(running + 1, 2), per_repo=max(running + 1, 2))
    active: list[JobView] = []
    taken = claims.PathIndex()
    tries = 0
    while len(active) < running and tries < 100 * (running + 1):
        tries += 1
        claim = _claim(rng, records)
        counted, _ = claims.split_mergeable(claim.paths, policy.mergeable)
        if claims.ambiguity(claim, policy) or taken.meeting(counted):
            continue
        for p in counted:
            taken.add(p)
        touched = frozenset(p for p in claim.paths if rng.random() < 0.7)
        active.append(JobView(len(active) + 1, REPO, "main", claim, actual=touched))
    queue = [
        JobView(
            len(active) + 1 + i,
            REPO,
            "main",
            _claim(rng, records),
            priority=1 if rng.random() < 0.1 else 0,
        )
        for i in range(waiting)
    ]
    rng.shuffle(queue)
    return Snapshot(active=tuple(active), waiting=tuple(queue), policy=policy)


def _ms(ns: float) -> float:
    return ns / 1e6


def run(waiting: int = 1000, running: int = 16, seed: int = 0, history: Path | None = DEFAULT_HISTORY) -> dict:
    """Measure `decide` on every waiting job of one snapshot, and `decide_all` on it; times in ms."""
    snapshot = make_snapshot(waiting, running, seed, history)
    jobs = sorted(snapshot.waiting, key=lambda j: j.order_key)

    admission.clear_caches()
    t = time.perf_counter_ns()
    admission.decide(jobs[-1], snapshot)
    first = time.perf_counter_ns() - t

    times = []
    for job in jobs:
        t = time.perf_counter_ns()
        admission.decide(job, snapshot)
        times.append(time.perf_counter_ns() - t)

    admission.clear_caches()
    cold_snapshot = make_snapshot(waiting, running, seed, history)
    t = time.perf_counter_ns()
    decisions = admission.decide_all(cold_snapshot)
    all_cold = time.perf_counter_ns() - t
    t = time.perf_counter_ns()
    admission.decide_all(cold_snapshot)
    all_warm = time.perf_counter_ns() - t

    ordered = sorted(times)
    return {
        "source": "history" if load_history(history) else "synthetic",
        "waiting": len(jobs),
        "running": len(snapshot.active),
        "first_ms": _ms(first),
        "p50_ms": _ms(statistics.median(ordered)),
        "p99_ms": _ms(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]),
        "max_ms": _ms(ordered[-1]),
        "last_ms": _ms(times[-1]),
        "decide_all_ms": _ms(all_cold),
        "decide_all_warm_ms": _ms(all_warm),
        "admitted": sum(d.admitted for d in decisions),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="orchestrator bench admission", description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=1000)
    parser.add_argument("--running", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history", type=Path, default=DEFAULT_HISTORY, help="JSON lines with 'files' per change")
    parser.add_argument("--synthetic", action="store_true", help="synthetic claims instead of a history")
    args = parser.parse_args(argv)
    r = run(args.waiting, args.running, args.seed, None if args.synthetic else args.history)
    print(f"admission: {r['waiting']} waiting, {r['running']} running, one repo, claims from {r['source']}")
    rows = [
        ("decide, first call (builds index)", r["first_ms"]),
        ("decide p50 (every waiting job)", r["p50_ms"]),
        ("decide p99", r["p99_ms"]),
        ("decide max", r["max_ms"]),
        ("decide, last job in order", r["last_ms"]),
        ("decide_all, cold caches", r["decide_all_ms"]),
        ("decide_all, warm job facts", r["decide_all_warm_ms"]),
    ]
    for label, ms in rows:
        print(f"  {label:<36} {ms:9.3f} ms")
    print(f"  {'decide_all admitted':<36} {r['admitted']:9d}")


if __name__ == "__main__":
    main()
