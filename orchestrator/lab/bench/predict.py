"""How good are the claims? Replay a repository's own history through the local planner.

For each authored change (oldest first, by commit time): plan from its message on its parent commit,
with the co-change history of the changes before it only, and compare the claim with the files the
change really touched (union-mergeable files such as changelogs left out, as admission leaves them out).
Printed per basis (what the confidence rests on) and in total: recall, precision, confident share and
confident-miss rate; and, over every pair of changes within `--window` of each other (as if queued
together), how many the claims would have run concurrently, and how many of those really overlapped. And the
risk admission weighs (`core.risk`): over the pairs within `--window` whose claims are disjoint and whose risk is
known, the estimate against how often the pair would not have merged (three-way merged on their base,
`plan.merges`), per bin with its interval, and whether every bin of 50 pairs or more keeps within 1.5 times its
estimate (`riskbins`); the record it is estimated from is the changes before the replayed ones only.

Merge commits are not replayed: a job is one authored change with its own message, while a merge's files
(against its first parent) are a whole branch's sum and its subject ("Merge branch 'x'") names none of
them; the commits it brings are replayed instead, each on its own parent. `--merges` replays the
first-parent line as it is (each merge one change, the commits it brings none), for comparison.

    orchestrator bench predict --repo PATH [--range A..B] [--limit N] [--merges] [--risk 0.08] [--json]
    orchestrator bench predict --history [FILE.jsonl] [--limit N] [--risk 0.08] [--json]
    orchestrator bench predict --tickets FILE --repos DIR [--only R,..] [--risk 0.08] [--scope source|all] [--json]

`--history` replays a touch-pattern file (`{"sha", "parent", "subject", "files": [[path, +, -], ...]}` per
line, oldest first; without FILE the one that ships with the package, 496 changes of a public project) on
a repository synthesised with those paths and commits. It has subjects and paths but no file contents and
no message bodies, so only part of local evidence is measured there (`SYNTHESISED_MEASURES`); a real
repository (`--repo`) measures all of it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pygit2

from orchestrator.config import PlanConfig
from orchestrator.core import claims
from orchestrator.core.admission import decide
from orchestrator.core.models import JobView, Policy, Snapshot
from orchestrator.core.risk import Escapes, PairRisk, pair_risk
from orchestrator.git import merging, repos
from orchestrator.lab.bench import riskbins, tickets
from orchestrator.lab.bench.history import bundled
from orchestrator.plan import accuracy, merges, record
from orchestrator.plan.accuracy import Record, Settled
from orchestrator.plan.evidence import local_plan
from orchestrator.plan.history import Change, History, landings, mine
from orchestrator.plan.score import Calibration

SYNTHESISED_MEASURES = {
    "measured": [
        "paths, file names, modules and file stems named in subjects",
        "test files by naming convention",
        "co-change and widening from the replayed history",
        "past changes described in the same words",
        "words confirmed by past changes",
    ],
    "not_measured": [
        "identifiers resolved to their definitions (no file contents)",
        "tests found by their imports (no file contents)",
        "message bodies (subjects only)",
    ],
}
"""What a replay of a touch-pattern history (subjects and paths, no contents) can and cannot measure."""
MERGES_LEFT_OUT = (
    "authored changes, merge commits not replayed: a merge's files are its whole branch's sum and its subject "
    "(\"Merge branch 'x'\") describes none of them; the commits it brings are replayed each on its own parent"
)
"""What a replayed change is (a job is one authored change with its own message); `--merges` for the old way."""
BUNDLED = "bundled"
"""`--history` without a file: the history that ships with the package."""
WARMUP = 1000
"""Changes before the replayed range that seed the history (when the range leaves room)."""
RISK = PlanConfig.risk
"""`plan.risk` for the `risk` rows: pairs admitted on their estimated risk, as the daemon does by default."""


def replay(
    repo: Path,
    changes: list[Change],
    start: int,
    policy: Policy,
    tip: str | None = None,
    rebuild: int = record.REBUILD,
    risk: float = RISK,
) -> list[Record]:
    """Plan changes[start:] each on its parent, the history growing one change at a time, as the daemon would have
    planned them as jobs: the record the risk is estimated from is the changes before it only (`plan.record`),
    built again every `rebuild` changes as the daemon builds it again after as many new ones (0: once, from the
    changes before `start`), and refitted in between on the pairs it would have run side by side (risk at most
    `risk`) once both had landed (`SETTLE` changes later), as the daemon refits it on its own (`record.refit`).
    `tip`: a commit they lead to (its first-parent line says which landed together)."""
    built: Calibration | None = None
    settled: list[Settled] = []
    done = 0  # records whose pairs with the ones before them have settled
    history = History(changes[:start])
    out: list[Record] = []
    commits = repos.open_repo(repo)
    with merging.scratch(repo) as git:
        for n, change in enumerate(changes[start:]):
            if n == 0 or (rebuild and n % rebuild == 0):
                built, settled = record.build(repo, changes[: start + n], policy.mergeable, tip), []
            while done < len(out) and out[done].job_id <= n - SETTLE:
                done += 1
                if rebuild:
                    settled += _settle(git, changes[start:], out[:done], policy.mergeable, risk)
            calibration = record.refit(built, settled) if built is not None else None
            commit = commits[change.sha]
            parents = getattr(commit, "parent_ids", [])
            message = getattr(commit, "message", change.subject)
            actual, _ = claims.split_mergeable(change.files, policy.mergeable)
            if parents and actual:
                plan = local_plan(repo, str(parents[0]), message, history, policy.mergeable, calibration)
                out.append(Record(n, str(repo), plan.claim, plan.basis, actual))
            history.add(change)
    return out


SETTLE = merges.WINDOW
"""Changes after which a pair of replayed jobs counts as settled: both landed, their outcome known to the daemon."""


def _settle(
    git: pygit2.Repository, changes: Sequence[Change], records: Sequence[Record], mergeable: Sequence[str], risk: float
) -> list[Settled]:
    """The last of `records` beside each of the `merges.WINDOW` before it that admission would have run side by side
    (claims disjoint, risk known and at most `risk`): the pairs the daemon learns from once they settle."""
    pattern = tuple(mergeable)
    b = records[-1]
    eb, held_b = Escapes.of(b.claim.risk), claims.split_mergeable(b.claim.paths, pattern)[0]
    out = []
    for a in records[-1 - merges.WINDOW : -1]:
        ea, held_a = Escapes.of(a.claim.risk), claims.split_mergeable(a.claim.paths, pattern)[0]
        if ea is None or eb is None or claims.PathIndex(held_a).meeting(held_b):
            continue
        estimate = pair_risk(eb, held_b, ea, held_a)
        if estimate.risk > risk:
            continue
        met, merged = _outcome(git, changes[a.job_id].sha, changes[b.job_id].sha, a.actual, b.actual, pattern)
        out.append(Settled(estimate.logit, met or not merged, merged, estimate.risk, estimate.raw))
    return out


def _outcome(
    git: pygit2.Repository,
    sha_a: str,
    sha_b: str,
    actual_a: frozenset[str],
    actual_b: frozenset[str],
    pattern: tuple[str, ...],
) -> tuple[bool, bool]:
    """Whether two changes touched a common path, and whether they would have merged (`merges.result`: the later
    replayed on the earlier one's base, then merged)."""
    if not claims.PathIndex(actual_a).meeting(actual_b):
        return False, True
    earlier, later = git[sha_a].peel(pygit2.Commit), git[sha_b].peel(pygit2.Commit)
    is_union = merging.union_paths(git, earlier.id, lambda p: claims.matches(p, pattern))
    return True, merges.result(git, earlier, later, is_union).merges


def summarise(records: list[Record], window: int, policy: Policy, risk: float = RISK) -> dict[str, Any]:
    """Per basis and in total (`accuracy.summary`), and the pairs of changes the claims would have run
    concurrently, among those within `window` of each other, with how many really overlapped; and the
    same in total with calibrated thresholds (`calibrated`)."""
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        groups[r.basis].append(r)
    groups["all"] = records
    thresholds = calibrated(records, policy, window)
    confident = [r.confident(replace(policy, min_confidence=t)) for r, t in zip(records, thresholds, strict=True)]
    risky = replace(policy, risk=risk, max_concurrent=8, per_repo=8)
    return {
        "by_basis": {k: accuracy.summary(v, policy) for k, v in sorted(groups.items())},
        "claim_pairs": claim_pairs(records, window, policy.mergeable),
        "pairs": pairs(records, [r.confident(policy) for r in records], window),
        "risk": {"plan_risk": risk, **pairs(records, [], window, risky)},
        "calibrated": {
            "all": accuracy.summary(records, policy, confident),
            "pairs": pairs(records, confident, window),
            "raised": sum(t > policy.min_confidence for t in thresholds),
            "thresholds": sorted(set(thresholds)),
        },
    }


HUBS = 5
"""Files listed in `claim_pairs` as those most pairs' claims met on."""


def claim_pairs(records: Sequence[Record], window: int, mergeable: Sequence[str]) -> dict[str, Any]:
    """The claims as walls, on the pairs of changes within `window` of each other: how many pairs' claims meet, and
    how many of those really touched a common path (precision); how many pairs really touched one, and how many of
    those had claims that meet (recall); and the files claims met on most (`HUBS`), each with how many pairs' claims
    met on it and in how many both changes really touched it."""
    pattern = tuple(mergeable)
    held = [claims.split_mergeable(r.claim.paths, pattern)[0] for r in records]
    walls = met = real = caught = 0
    on: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for i, a in enumerate(records):
        for j in range(i + 1, min(len(records), i + 1 + window)):
            b = records[j]
            meeting = claims.PathIndex(held[i]).meeting(held[j])
            touched = bool(claims.PathIndex(a.actual).meeting(b.actual))
            walls += bool(meeting)
            met += bool(meeting) and touched
            real += touched
            caught += touched and bool(meeting)
            for path in meeting:
                on[path][0] += 1
                on[path][1] += path in a.actual and path in b.actual
    hubs = sorted(on.items(), key=lambda kv: (-kv[1][0], kv[0]))[:HUBS]
    return {
        "window": window,
        "claims_meet": walls,
        "really_met": met,
        "precision": round(met / walls, 3) if walls else None,
        "met": real,
        "claims_met": caught,
        "recall": round(caught / real, 3) if real else None,
        "hubs": [[path, n, k] for path, (n, k) in hubs],
    }


def risk_points(
    repo: Path,
    changes: Sequence[Change],
    records: Sequence[Record],
    window: int,
    mergeable: Sequence[str],
    landed: Mapping[str, str],
) -> tuple[list[tuple[PairRisk, bool, bool]], int]:
    """For the pairs of replayed changes within `window` of each other whose claims are disjoint and whose risk
    is known (the pairs `plan.risk` decides): the estimated risk, whether they really touched a common file, and
    whether they would have merged (`merges.result`: the later replayed on the earlier one's base, then merged);
    and how many of them landed together (steps of one pull request: a queue holds them too)."""
    pattern = tuple(mergeable)
    escapes = [Escapes.of(r.claim.risk) for r in records]
    counted = [claims.split_mergeable(r.claim.paths, pattern)[0] for r in records]
    out: list[tuple[PairRisk, bool, bool]] = []
    together = 0
    with merging.scratch(repo) as git:
        for i, a in enumerate(records):
            for j in range(i + 1, min(len(records), i + 1 + window)):
                b = records[j]
                ea, eb = escapes[i], escapes[j]
                if ea is None or eb is None or claims.PathIndex(counted[i]).meeting(counted[j]):
                    continue
                sha_a, sha_b = changes[a.job_id].sha, changes[b.job_id].sha
                together += bool(landed.get(sha_a) and landed.get(sha_a) == landed.get(sha_b))
                met, merged = _outcome(git, sha_a, sha_b, a.actual, b.actual, pattern)
                out.append((pair_risk(eb, counted[j], ea, counted[i]), met, merged))
    return out, together


def risk_summary(points: Sequence[tuple[PairRisk, bool, bool]], together: int, risk: float) -> dict[str, Any]:
    """The risk's calibration on the pairs (`riskbins`): the estimate against pairs that would not merge, the
    chance of meeting against pairs that met; and of the pairs estimated at most `risk`, how many would not merge."""
    admitted = [p for p in points if p[0].risk <= risk]
    table = riskbins.bins([(r.risk, not merged) for r, _, merged in points])
    return {
        "plan_risk": risk,
        "pairs": len(points),
        "landed_together": together,
        "met": sum(met for _, met, _ in points),
        "not_merged": sum(not merged for _, _, merged in points),
        "calibration": table,
        "holds": riskbins.holds(table),
        "meet": riskbins.bins([(r.meet, met) for r, met, _ in points]),
        "admitted": len(admitted),
        "admitted_not_merged": sum(not merged for _, _, merged in admitted),
    }


def calibrated(records: list[Record], policy: Policy, lag: int) -> list[float]:
    """The threshold calibration would have set for each change (`accuracy.threshold`), learning only from
    the changes at least `lag` before it: those nearer were still running, their outcome unknown."""
    return [accuracy.threshold([q for q in records if q.job_id <= r.job_id - lag], policy) for r in records]


def pairs(records: list[Record], confident: list[bool], window: int, policy: Policy | None = None) -> dict[str, int]:
    """Of the pairs of changes within `window` of each other: how many admission would have run concurrently
    (both claims confident under `confident`, and with `policy` the pure admission decision, risk included,
    one active and the other waiting), how many of those really overlapped, and how many pairs that did not
    overlap were held apart."""
    n = concurrent = bad = apart = 0
    views = [JobView(i + 1, "repo", "main", r.claim) for i, r in enumerate(records)]
    for i, a in enumerate(records):
        for j in range(i + 1, min(len(records), i + 1 + window)):
            b = records[j]
            n += 1
            real = bool(claims.PathIndex(a.actual).meeting(b.actual))
            if policy is not None:
                snap = Snapshot(active=(views[i],), waiting=(views[j],), policy=policy)
                together = decide(views[j], snap).admitted
            else:
                together = confident[i] and confident[j] and not claims.PathIndex(a.claim.paths).meeting(b.claim.paths)
            concurrent += together
            bad += together and real
            apart += not together and not real
    return {
        "window": window,
        "pairs": n,
        "concurrent": concurrent,
        "really_overlapped": bad,
        "disjoint_held_apart": apart,
    }


def synthesise(history_file: Path, root: Path, limit: int | None) -> list[str]:
    """A repository with the history's paths and commits (one line per change in each touched file)."""
    rows = [json.loads(line) for line in history_file.read_text().splitlines() if line.strip()]
    if limit:
        rows = rows[-(limit + WARMUP) :]
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    lines = []
    mark = 0
    for n, row in enumerate(rows, 1):
        msg = (row.get("subject") or f"change {n}").encode()
        lines.append(b"commit refs/heads/main\n")
        lines.append(f"mark :{n}\n".encode())
        lines.append(f"committer Replay <replay@example.com> {int(row.get('time', n))} +0000\n".encode())
        lines.append(f"data {len(msg)}\n".encode() + msg + b"\n")
        if mark:
            lines.append(f"from :{mark}\n".encode())
        for path, *_ in row.get("files", []):
            body = f"{path}\nchange {n}\n".encode()
            lines.append(f"M 100644 inline {path}\ndata {len(body)}\n".encode() + body + b"\n")
        mark = n
    subprocess.run(["git", "-C", str(root), "fast-import", "--quiet"], input=b"".join(lines), check=True)
    return [r.get("sha", "") for r in rows]


def run(
    repo: Path,
    rev_range: str | None,
    limit: int | None,
    window: int = 8,
    merges: bool = False,
    risk: float = RISK,
    rebuild: int = record.REBUILD,
) -> dict[str, Any]:
    head = rev_range.split("..", 1)[1] if rev_range and ".." in rev_range else (rev_range or "HEAD")
    since = rev_range.split("..", 1)[0] if rev_range and ".." in rev_range else None
    head_sha = repos.resolve_rev(repo, head or "HEAD")
    since_sha = repos.resolve_rev(repo, since) if since else None
    limit = limit or 100_000
    changes, _ = mine(repo, head_sha, since_sha, limit + WARMUP, first_parent=merges)
    start = max(0, len(changes) - limit)
    if since_sha and start < WARMUP:
        before, _ = mine(repo, since_sha, None, WARMUP - start, first_parent=merges)
        changes, start = before + changes, start + len(before)
    if start < record.MIN_RECORD:  # nothing before the replayed changes: the first third is their record
        start = len(changes) // 3
    t = time.perf_counter()
    policy = Policy()
    outcomes = replay(repo, changes, start, policy, head_sha, rebuild, risk)
    elapsed = time.perf_counter() - t
    out = summarise(outcomes, window, policy, risk)
    replayed = changes[start:]
    landed = landings(repo, head_sha, (c.sha for c in replayed))
    points, together = risk_points(repo, replayed, outcomes, window, policy.mergeable, landed)
    out["conflicts"] = risk_summary(points, together, risk)
    out.update(repo=str(repo), range=f"{since_sha or ''}..{head_sha}", replayed=len(outcomes), rebuild=rebuild)
    out["changes"] = "first-parent line, merges included" if merges else MERGES_LEFT_OUT
    out["seconds"] = round(elapsed, 2)
    out["ms_per_plan"] = round(1000 * elapsed / max(1, len(outcomes)), 1)
    return out


def _print(r: dict[str, Any]) -> None:
    print(f"predict: {r['replayed']} changes of {r['repo']} replayed, local evidence only ({r['ms_per_plan']} ms/plan)")
    cols = ("jobs", "confident_share", "recall", "precision", "confident_miss_rate")
    print(f"  {'basis':<10}" + "".join(f"{'changes' if c == 'jobs' else c:>21}" for c in cols))
    for basis, row in r["by_basis"].items():
        print(f"  {basis:<10}" + "".join(f"{'-' if row[c] is None else row[c]!s:>21}" for c in cols))
    if "synthesised" in r:
        print("  no file contents or message bodies here: not measured: " + "; ".join(r["synthesised"]["not_measured"]))
    c = r["calibrated"]
    print(f"  {'calibrated':<10}" + "".join(f"{'-' if c['all'][k] is None else c['all'][k]!s:>21}" for k in cols))
    print(f"  (calibrated: thresholds learnt from earlier changes, {c['raised']} changes judged above the default)")
    for label, p in (("", r["pairs"]), ("calibrated: ", c["pairs"])):
        print(
            f"  {label}pairs within {p['window']} changes: {p['pairs']}; the claims run {p['concurrent']} "
            f"concurrently, {p['really_overlapped']} of which really overlapped"
        )
    w = r["claim_pairs"]
    print(
        f"  claims as walls: {w['claims_meet']} pairs' claims meet, {w['really_met']} of them really met (precision "
        f"{w['precision']}); {w['met']} pairs met, the claims of {w['claims_met']} of them meet (recall {w['recall']})"
    )
    for path, n, k in w["hubs"]:
        print(f"    {path}: {n} pairs' claims meet on it, {k} of them both touched it")
    k = r["risk"]
    print(
        f"  on risk (plan.risk {k['plan_risk']:.0%}): {k['concurrent']} of {k['pairs']} pairs run concurrently, "
        f"{k['really_overlapped']} of which really overlapped; {k['disjoint_held_apart']} disjoint pairs held apart"
    )
    c = r["conflicts"]
    print(
        f"  risk of a conflict the landing cannot merge, on the {c['pairs']} pairs within {r['pairs']['window']} with "
        f"disjoint claims and a known risk ({c['met']} met, {c['not_merged']} would not merge; "
        f"{c['landed_together']} of them steps of one pull request):"
    )
    for line in riskbins.lines(c["calibration"], "would not merge"):
        print("    " + line)
    verdict = "holds" if c["holds"] else "does NOT hold"
    print(f"    every bin of {riskbins.MIN_PAIRS}+ pairs at most {riskbins.FACTOR:g}x its estimate: {verdict}")
    print(
        f"    at plan.risk {c['plan_risk']:.0%}: {c['admitted']} pairs run side by side, "
        f"{c['admitted_not_merged']} of which would not merge"
    )
    print("  their chance of meeting against how often they met:")
    for line in riskbins.lines(c["meet"], "met"):
        print("    " + line)
    print(f"  {r['changes']}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="orchestrator bench predict", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, help="a repository to replay")
    parser.add_argument("--range", dest="rev_range", help="A..B: the changes after A up to B (or B: up to B)")
    parser.add_argument("--limit", type=int, help="replay at most the last N changes")
    parser.add_argument(
        "--history",
        nargs="?",
        const=BUNDLED,
        help="a touch-pattern JSON lines file to replay instead (alone: the one that ships with the package)",
    )
    parser.add_argument(
        "--merges",
        action="store_true",
        help="replay the first-parent line instead: each merge as one change, the commits it brings not at all",
    )
    parser.add_argument("--window", type=int, default=8, help="pairs of changes at most this far apart")
    parser.add_argument(
        "--tickets", type=Path, help="a ticket set (JSON lines with gold files) to plan at each ticket's base instead"
    )
    parser.add_argument("--repos", type=Path, default=Path("."), help="with --tickets: where the clones are")
    parser.add_argument("--only", default="", help="with --tickets: only these repositories (comma-separated)")
    parser.add_argument("--risk", type=float, default=RISK, help=f"plan.risk pairs are admitted at (default {RISK:g})")
    parser.add_argument(
        "--frontier", default="", help="with --tickets: other plan.risk values to admit the same plans at (0.01,0.05)"
    )
    parser.add_argument(
        "--scope", choices=("source", "all"), default="source", help="with --tickets: leave tests and docs out"
    )
    parser.add_argument(
        "--rebuild",
        type=int,
        default=record.REBUILD,
        help=f"build the record again every N replayed changes, as the daemon does (default {record.REBUILD}; 0: once)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")
    args = parser.parse_args(argv)
    if sum(map(bool, (args.repo, args.history, args.tickets))) != 1:
        parser.error(
            "give one of --repo PATH, --history [FILE.jsonl] (alone: the history that ships with it) "
            "or --tickets FILE --repos DIR"
        )
    try:
        if args.tickets:
            only = [o.strip() for o in args.only.split(",") if o.strip()]
            frontier = [float(x) for x in args.frontier.split(",") if x.strip()]
            r = tickets.run(args.tickets, args.repos, args.limit, args.risk, args.scope, only, frontier)
            if args.json:
                print(json.dumps(r, indent=2))
            else:
                tickets.print_report(r)
            if r["overall"]["failed"]:
                print(f"bench predict: {', '.join(r['overall']['failed'])} failed (above)", file=sys.stderr)
                sys.exit(1)
            return
        if args.history:
            history = bundled() if args.history == BUNDLED else Path(args.history)
            if not history.is_file():
                parser.error(f"--history {history}: no such file")
            with tempfile.TemporaryDirectory(prefix="orchestrator-predict-") as tmp:
                synthesise(history, Path(tmp) / "repo", args.limit)
                r = run(Path(tmp) / "repo", None, args.limit, args.window, args.merges, args.risk, args.rebuild)
                r["repo"] = f"{history} (synthesised)"
                r["synthesised"] = SYNTHESISED_MEASURES
        else:
            r = run(
                repos.canonical(args.repo),
                args.rev_range,
                args.limit,
                args.window,
                args.merges,
                args.risk,
                args.rebuild,
            )
    except (repos.RepoError, tickets.TicketsError) as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        sys.exit(2)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        _print(r)


if __name__ == "__main__":
    main()
