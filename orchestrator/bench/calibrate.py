"""Fit the Ollama double's engine profile to the seed's naive table, in virtual time.

    python -m orchestrator.bench.calibrate            # how far the shipped `seed` profile is from the seed
    python -m orchestrator.bench.calibrate --search   # search the parameters again (a few minutes)

Each candidate runs the real naive pipeline (`orchestrator.bench.simulate`) at N=1, 2 and 4 and is scored
by its relative errors over the seed's figures (first-Ollama mean, done min / mean / max, drained), in
an L4 norm: close to the worst figure's error, but smooth enough to descend.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import asdict, replace
from typing import Any

from orchestrator.bench.simulate import simulate
from orchestrator.doubles.engine import Profile
from orchestrator.doubles.ollama import PROFILES

SEED: dict[int, dict[str, float]] = {
    1: {"first_ollama_mean_s": 0.9, "done_min_s": 2.1, "done_mean_s": 2.1, "done_max_s": 2.1, "wall_drained_s": 9.5},
    2: {"first_ollama_mean_s": 1.1, "done_min_s": 3.5, "done_mean_s": 4.2, "done_max_s": 5.0, "wall_drained_s": 12.9},
    4: {"first_ollama_mean_s": 1.5, "done_min_s": 5.9, "done_mean_s": 7.7, "done_max_s": 10.3, "wall_drained_s": 20.7},
}
"""The seed's naive rows (hermes3 8B through Ollama; its blog post's table)."""


def rows(profile: Profile, policy: str = "naive", slots: int | None = None) -> dict[int, dict[str, Any]]:
    return {n: simulate(profile, policy, n, slots).to_json() for n in SEED}


def errors(got: dict[int, dict[str, Any]]) -> dict[str, float]:
    """Relative error of every seed figure, keyed `N:figure`."""
    out = {}
    for n, want in SEED.items():
        for k, v in want.items():
            out[f"{n}:{k}"] = (float(got[n][k] or 0.0) - v) / v
    return out


def score(profile: Profile) -> float:
    """The L4 norm of the relative errors: smooth enough to descend, close to the worst figure's error."""
    errs = list(errors(rows(profile)).values())
    return float(sum(e**4 for e in errs) / len(errs)) ** 0.25


# name -> (low, high, log-scale); contention is 1 + a·(k−1) for k = 1..4
SPACE: dict[str, tuple[float, float, bool]] = {
    "overhead_s": (0.0, 0.3, False),
    "step_s": (0.0, 0.05, False),
    "prefill_s": (0.0005, 0.03, True),
    "decode_s": (0.003, 0.08, True),
    "contention_a": (0.0, 1.5, False),
    "format_s": (0.0, 0.06, False),
    "batch": (16, 512, True),
    "reply_tokens": (8, 120, True),
    "intent_tokens": (4, 16, False),
    "memories_tokens": (30, 400, True),
}


def build(base: Profile, x: dict[str, float]) -> Profile:
    a = x["contention_a"]
    return replace(
        base,
        overhead_s=round(x["overhead_s"], 4), step_s=round(x["step_s"], 4), prefill_s=round(x["prefill_s"], 5),
        decode_s=round(x["decode_s"], 4), contention=tuple(round(1 + a * k, 3) for k in range(4)),
        format_s=round(x["format_s"], 4), batch=int(x["batch"]), reply_tokens=int(x["reply_tokens"]),
        json_tokens=(("intent", int(x["intent_tokens"])), ("memories", int(x["memories_tokens"]))),
    )  # fmt: skip


def _draw(rng: random.Random, name: str) -> float:
    lo, hi, log = SPACE[name]
    return math.exp(rng.uniform(math.log(lo), math.log(hi))) if log else rng.uniform(lo, hi)


def search(
    base: Profile,
    tries: int,
    refine: int,
    seed: int = 1,
    fixed: dict[str, float] | None = None,
    start: dict[str, float] | None = None,
) -> tuple[Profile, float]:
    """Random draws, then coordinate steps from the best one: the worst-figure error, minimised."""
    rng = random.Random(seed)
    fixed = fixed or {}
    free = [k for k in SPACE if k not in fixed]
    best_x: dict[str, float] = {**start, **fixed} if start else {}
    best = score(build(base, best_x)) if start else math.inf
    for i in range(tries):
        x = {**{k: _draw(rng, k) for k in free}, **fixed}
        s = score(build(base, x))
        if s < best:
            best, best_x = s, x
            print(f"  draw {i}: score {best:.3f}", file=sys.stderr, flush=True)
    step = 0.3
    for r in range(refine):
        improved = False
        for k in free:
            lo, hi, _ = SPACE[k]
            for f in (1 + step, 1 / (1 + step)):
                x = dict(best_x)
                x[k] = min(hi, max(lo, x[k] * f if x[k] else lo + (hi - lo) * step / 4))
                s = score(build(base, x))
                if s < best:
                    best, best_x, improved = s, x, True
        print(f"  refine {r}: score {best:.3f} (step {step:.3f})", file=sys.stderr, flush=True)
        if not improved:
            step /= 2
            if step < 0.01:
                break
    return build(base, best_x), best


def table(profile: Profile) -> list[dict[str, Any]]:
    got = rows(profile)
    out = []
    for n, want in SEED.items():
        out.append({"source": "seed", "n": n, **want})
        out.append({"source": f"double:{profile.name}", "n": n, **{k: got[n][k] for k in want}})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.bench.calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="seed")
    ap.add_argument("--search", action="store_true", help="search the parameters (keeps num_parallel, batch...)")
    ap.add_argument("--parallel", type=int, help="num_parallel for the search (default: the profile's)")
    ap.add_argument("--share-prefix", choices=["yes", "no"], help="the multi-user prefix cache for the search")
    ap.add_argument("--tries", type=int, default=300)
    ap.add_argument("--refine", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=json.loads, help="a JSON object of the parameters to start from")
    ap.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE", help=f"hold one of {', '.join(SPACE)}")
    args = ap.parse_args(argv)
    profile = PROFILES[args.profile]
    if args.search:
        base = replace(profile, num_parallel=args.parallel or profile.num_parallel)
        if args.share_prefix:
            base = replace(base, share_prefix=args.share_prefix == "yes")
        fixed = {k: float(v) for k, v in (f.split("=", 1) for f in args.fix)}
        profile, best = search(base, args.tries, args.refine, args.seed, fixed, args.start)
        print(json.dumps({"score": round(best, 3), "profile": asdict(profile)}))
    for row in table(profile):
        print(json.dumps(row))
    errs = errors(rows(profile))
    worst = max(errs, key=lambda k: abs(errs[k]))
    print(f"worst relative error {errs[worst]:+.1%} ({worst})", file=sys.stderr)


if __name__ == "__main__":
    main()
