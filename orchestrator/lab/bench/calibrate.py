"""Fit the Ollama double's engine profile to the seed's naive table, in virtual time.

    python -m orchestrator.lab.bench.calibrate                    # the shipped `seed` profile against the seed
    python -m orchestrator.lab.bench.calibrate --search           # a global search (about half an hour, 2 cores)
    python -m orchestrator.lab.bench.calibrate --search --from-profile --others 0   # refine around the shipped one

Each candidate runs the real naive pipeline (`orchestrator.lab.bench.simulate`: the benches' sessions, each with
its earlier conversation) at N=1, 2 and 4 and is scored by its relative errors over the seed's figures in a
weighted L4 norm: the five `NAMED` figures weigh 1, the others `--others`. The search is differential
evolution over the unit cube of `SPACE`. The shipped profile came from a global search and a refinement
around its best point with `--others 0`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import asdict, replace
from typing import Any

from orchestrator.lab.bench.simulate import simulate
from orchestrator.lab.doubles.engine import Profile
from orchestrator.lab.doubles.ollama import PROFILES

SEED: dict[int, dict[str, float]] = {
    1: {"first_ollama_mean_s": 0.9, "done_min_s": 2.1, "done_mean_s": 2.1, "done_max_s": 2.1, "wall_drained_s": 9.5},
    2: {"first_ollama_mean_s": 1.1, "done_min_s": 3.5, "done_mean_s": 4.2, "done_max_s": 5.0, "wall_drained_s": 12.9},
    4: {"first_ollama_mean_s": 1.5, "done_min_s": 5.9, "done_mean_s": 7.7, "done_max_s": 10.3, "wall_drained_s": 20.7},
}
"""The seed's naive rows (hermes3 8B through Ollama; its blog post's table)."""


ENGINE: dict[int, dict[str, float]] = {
    1: {"first_ollama_mean_s": 1.39, "done_min_s": 7.13, "done_mean_s": 7.13, "done_max_s": 7.13,
        "wall_drained_s": 14.85},
    4: {"first_ollama_mean_s": 2.8, "done_min_s": 8.11, "done_mean_s": 10.71, "done_max_s": 13.6,
        "wall_drained_s": 30.59},
}  # fmt: skip
"""The real engine's naive rows: llama-server with 2 slots, the random-weight model on 2 cores (load 4-9), the
median of `bench chat --llama-server --slots 2` runs (3 at N=1, 6 at N=4)."""

TARGETS: dict[str, dict[int, dict[str, float]]] = {"seed": SEED, "llama-server": ENGINE}
"""What a profile is fitted to: the profile of the same name is fitted to the table of the same name."""


def rows(
    profile: Profile, policy: str = "naive", slots: int | None = None, target: str = "seed"
) -> dict[int, dict[str, Any]]:
    return {n: simulate(profile, policy, n, slots).to_json() for n in TARGETS[target]}


def errors(got: dict[int, dict[str, Any]], target: str = "seed") -> dict[str, float]:
    """Relative error of every figure of the target's table, keyed `N:figure`."""
    out = {}
    for n, want in TARGETS[target].items():
        for k, v in want.items():
            out[f"{n}:{k}"] = (float(got[n][k] or 0.0) - v) / v
    return out


NAMED = frozenset({
    "1:first_ollama_mean_s", "1:done_max_s", "1:wall_drained_s", "4:done_max_s", "4:wall_drained_s",
})  # fmt: skip
"""The figures a profile must meet (N=1: first-Ollama, done, drained; N=4: done-wall, drained): drained at
N=4 over N=1 is how far the server's parallel decoding paid off. The others weigh `OTHERS` each."""
OTHERS = 0.1


def score(profile: Profile, others: float = OTHERS, target: str = "seed") -> float:
    """The weighted L4 norm of the relative errors: close to the worst named figure's error, smooth enough
    to descend."""
    errs = errors(rows(profile, target=target), target)
    weights = {k: 1.0 if k in NAMED else others for k in errs}
    total = sum(weights[k] * e**4 for k, e in errs.items())
    return float(total / sum(weights.values())) ** 0.25


# name -> (low, high, log-scale); the contention profile is 1, c2, c2 + d3, c2 + d3 + d4 for k = 1..4
SPACE: dict[str, tuple[float, float, bool]] = {
    "overhead_s": (0.0, 0.3, False),
    "step_s": (0.0, 0.05, False),
    "prefill_s": (0.0003, 0.03, True),
    "decode_s": (0.002, 0.1, True),
    "c2": (1.0, 2.5, False),
    "d3": (0.0, 1.5, False),
    "d4": (0.0, 1.5, False),
    "format_s": (0.0, 0.08, False),
    "batch": (16, 512, True),
    "reply_tokens": (8, 150, True),
    "intent_tokens": (4, 16, False),
    "memories_tokens": (30, 400, True),
}


def build(base: Profile, x: dict[str, float]) -> Profile:
    c3 = x["c2"] + x["d3"]
    d4 = x["d4"] if base.num_parallel > 3 else x["d3"]  # never 4 sequences at once: extrapolated
    return replace(
        base,
        overhead_s=round(x["overhead_s"], 4), step_s=round(x["step_s"], 4), prefill_s=round(x["prefill_s"], 5),
        decode_s=round(x["decode_s"], 4), contention=(1.0, round(x["c2"], 3), round(c3, 3), round(c3 + d4, 3)),
        format_s=round(x["format_s"], 4), batch=int(x["batch"]), reply_tokens=int(x["reply_tokens"]),
        json_tokens=(("intent", int(x["intent_tokens"])), ("memories", int(x["memories_tokens"]))),
    )  # fmt: skip


def _to_unit(name: str, v: float) -> float:
    lo, hi, log = SPACE[name]
    u = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) if log else (v - lo) / (hi - lo)
    return min(1.0, max(0.0, u))


def params(profile: Profile) -> dict[str, float]:
    """`SPACE`'s parameters of a profile (the inverse of `build`)."""
    c = profile.contention
    tokens = dict(profile.json_tokens)
    return {
        "overhead_s": profile.overhead_s, "step_s": profile.step_s, "prefill_s": profile.prefill_s,
        "decode_s": profile.decode_s, "c2": c[1], "d3": c[2] - c[1], "d4": c[3] - c[2], "format_s": profile.format_s,
        "batch": profile.batch, "reply_tokens": profile.reply_tokens, "intent_tokens": tokens["intent"],
        "memories_tokens": tokens["memories"],
    }  # fmt: skip


def _from_unit(name: str, u: float) -> float:
    lo, hi, log = SPACE[name]
    u = min(1.0, max(0.0, u))
    return math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if log else lo + u * (hi - lo)


def search(
    base: Profile,
    generations: int,
    seed: int = 1,
    fixed: dict[str, float] | None = None,
    others: float = OTHERS,
    population: int = 10,
    start: dict[str, float] | None = None,
    target: str = "seed",
) -> tuple[Profile, float]:
    """Differential evolution (rand/1/bin) over the unit cube of `SPACE`: `population` × the free parameters
    candidates, `generations` rounds; each candidate runs the naive pipeline at N=1, 2, 4 in virtual time.
    With `start`, the candidates begin around that point (itself one of them) instead of anywhere."""
    rng = random.Random(seed)
    fixed = fixed or {}
    free = [k for k in SPACE if k not in fixed and not (k == "d4" and base.num_parallel <= 3)]
    fixed = {**fixed, **({"d4": 0.0} if "d4" not in free and "d4" not in fixed else {})}

    def cost(u: list[float]) -> float:
        x = {**{k: _from_unit(k, v) for k, v in zip(free, u, strict=True)}, **fixed}
        return score(build(base, x), others, target)

    size = population * len(free)
    if start:
        centre = [_to_unit(k, start[k]) for k in free]
        pop = [centre] + [[min(1.0, max(0.0, rng.gauss(c, 0.08))) for c in centre] for _ in range(size - 1)]
    else:
        pop = [[rng.random() for _ in free] for _ in range(size)]
    costs = [cost(u) for u in pop]
    for g in range(generations):
        for i in range(len(pop)):
            a, b, c = rng.sample([j for j in range(len(pop)) if j != i], 3)
            f = rng.uniform(0.5, 1.0)
            forced = rng.randrange(len(free))
            trial = [
                pop[a][d] + f * (pop[b][d] - pop[c][d]) if d == forced or rng.random() < 0.7 else pop[i][d]
                for d in range(len(free))
            ]
            trial = [min(1.0, max(0.0, v)) for v in trial]
            t = cost(trial)
            if t <= costs[i]:
                pop[i], costs[i] = trial, t
        print(f"  generation {g}: score {min(costs):.4f}", file=sys.stderr, flush=True)
    best = min(range(len(pop)), key=costs.__getitem__)
    x = {**{k: _from_unit(k, v) for k, v in zip(free, pop[best], strict=True)}, **fixed}
    return build(base, x), costs[best]


def table(profile: Profile, target: str = "seed") -> list[dict[str, Any]]:
    got = rows(profile, target=target)
    out = []
    for n, want in TARGETS[target].items():
        out.append({"source": target, "n": n, **want})
        out.append({"source": f"double:{profile.name}", "n": n, **{k: got[n][k] for k in want}})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.lab.bench.calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="seed", help="the profile, fitted to the table of the same name")
    ap.add_argument("--search", action="store_true", help="search the parameters (keeps num_parallel, batch...)")
    ap.add_argument("--parallel", type=int, help="num_parallel for the search (default: the profile's)")
    ap.add_argument("--share-prefix", choices=["yes", "no"], help="the multi-user prefix cache for the search")
    ap.add_argument("--generations", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--others", type=float, default=OTHERS, help="weight of the figures beyond the named five")
    ap.add_argument("--population", type=int, default=10, help="candidates per free parameter")
    ap.add_argument("--from-profile", action="store_true", help="start around the profile's own parameters")
    ap.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE", help=f"hold one of {', '.join(SPACE)}")
    args = ap.parse_args(argv)
    if args.profile not in TARGETS:
        ap.error(f"--profile: one of {', '.join(TARGETS)} (the profiles fitted to a table)")
    profile = PROFILES[args.profile]
    if args.search:
        base = replace(profile, num_parallel=args.parallel or profile.num_parallel)
        if args.share_prefix:
            base = replace(base, share_prefix=args.share_prefix == "yes")
        fixed = {k: float(v) for k, v in (f.split("=", 1) for f in args.fix)}
        start = params(profile) if args.from_profile else None
        profile, best = search(
            base, args.generations, args.seed, fixed, args.others, args.population, start, args.profile
        )
        print(json.dumps({"score": round(best, 3), "profile": asdict(profile)}))
    for row in table(profile, args.profile):
        print(json.dumps(row))
    errs = errors(rows(profile, target=args.profile), args.profile)
    worst = max(errs, key=lambda k: abs(errs[k]))
    print(f"worst relative error {errs[worst]:+.1%} ({worst})", file=sys.stderr)


if __name__ == "__main__":
    main()
