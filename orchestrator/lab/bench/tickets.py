"""`bench predict --tickets FILE`: real tickets with the files their fixes changed, planned at their base.

A ticket set is JSON lines, one ticket each: `{"instance_id", "repo": "owner/name", "base_commit",
"problem_statement", "gold_files": [...], "test_files": [...]}`; a row of SWE-bench itself (its `patch` and
`test_patch` instead of the file lists) reads as the files its diffs change. The
repositories must be cloned locally (`--repos DIR` holds them as `DIR/name`, `DIR/owner+name` or
`DIR/owner/name`); every base commit must be in the clone.

Per repository, oldest base first: its history is mined once, each ticket sees only the changes that are
ancestors of its base; its record (`plan.record`) is replayed once, on the changes before the earliest
base (nothing from any ticket's future). Each ticket is planned by local evidence at its base, timed
(the tree index moved there first, reported apart: a daemon plans at a branch head the index is at).

Then every pair of tickets of one repository is put to admission (`core.admission.decide`, the pure
decision the daemon makes): one active, the other waiting. A pair *truly overlaps* when its gold files
meet. Reported: FN-concurrency (truly overlapping pairs admission lets run at once, over all truly
overlapping pairs) and over-serialisation (disjoint pairs held apart, over all disjoint pairs), per
repository and overall, beside published anchors. And what costs: of the pairs run at once whose fixes meet,
those whose fixes would not merge (`plan.merges.result`), where both fixes can be found in the clone's history
(`fix_commit`: a ticket set has the fixes' files, not the fixes). `--scope source` (the default) leaves tests and
docs out of claims and risks, as the gold files leave them out; `--scope all` keeps them.

And what the plans' probabilities allow (`bound`): the least over-serialisation any claim rule of the form "claim
every file at least t likely" could reach with FN-concurrency at most `BOUND_FN`, t chosen knowing the gold files
(per repository, and one t for all). Where that is above the floor, the evidence is the limit, not the rule.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pygit2

from orchestrator.core import claims
from orchestrator.core.admission import clear_caches, decide
from orchestrator.core.models import CHANGELOGS, Claim, JobView, Policy, Snapshot
from orchestrator.core.risk import Escapes, pair_risk
from orchestrator.git import merging
from orchestrator.lab.bench import riskbins
from orchestrator.lab.bench import schedule as sched
from orchestrator.plan import accuracy, merges, record
from orchestrator.plan import index as index_mod
from orchestrator.plan.evidence import local_plan
from orchestrator.plan.history import KEEP, History, mine
from orchestrator.plan.kinds import is_doc, is_test

MERGEABLE = CHANGELOGS
ANCHORS = (
    ("LocAgent (Claude 3.5), top-5 files", 0.067, 0.125),
    ("BM25 + graph ranking (no LLM), top-5 files", 0.057, 0.415),
    ("oracle directories", 0.0, 0.081),
    ("one job per repository", 0.0, 1.0),
)
"""Published FN-concurrency / over-serialisation figures on the same kind of data."""


class TicketsError(ValueError):
    """The ticket set or a repository cannot be read; the message says what to do."""


@dataclass
class Ticket:
    id: str
    repo: str
    base: str
    text: str
    gold: frozenset[str]
    tests: frozenset[str]
    time: int = 0
    claim: Claim = field(default_factory=Claim)
    seconds: float = 0.0
    move_seconds: float = 0.0
    rank: int | None = None
    p_gold: float = 0.0
    fix: str | None = None
    """The commit that fixed it in the clone's history, where one can be told (`fix_commit`)."""
    probs: dict[str, float] = field(default_factory=dict)
    """Its plan's ranking: each listed file's chance of being touched (`bound`)."""


def load(path: Path, limit: int | None = None) -> list[Ticket]:
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise TicketsError(f"cannot read the ticket set {path}: {e.strerror}; pass a JSON-lines file") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(
                Ticket(
                    str(row["instance_id"]),
                    str(row["repo"]),
                    str(row["base_commit"]),
                    str(row["problem_statement"]),
                    frozenset(row["gold_files"] if "gold_files" in row else patched(row["patch"])),
                    frozenset(row.get("test_files") or patched(row.get("test_patch") or "")),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise TicketsError(
                f"{path}:{n}: not a ticket ({e}); each line needs instance_id, repo, base_commit, "
                "problem_statement and gold_files (or the fix's patch)"
            ) from None
    if not out:
        raise TicketsError(f"{path} holds no ticket")
    return out[:limit] if limit else out


_DIFF_HEAD = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)


def patched(patch: str) -> list[str]:
    """The files a unified git diff changes (SWE-bench's `patch` and `test_patch`), by their headers' old names."""
    if not isinstance(patch, str):
        raise TypeError("patch is not a string")
    return sorted(set(_DIFF_HEAD.findall(patch)))


def clone_of(repos_dir: Path, name: str) -> Path:
    """The local clone of `owner/name` under `repos_dir`."""
    owner, _, short = name.partition("/")
    for cand in (repos_dir / short, repos_dir / f"{owner}+{short}", repos_dir / owner / short, repos_dir / name):
        if (cand / ".git").exists() or (cand / "HEAD").exists():
            return cand
    raise TicketsError(
        f"no clone of {name} under {repos_dir}: `git clone https://github.com/{name} {repos_dir / short}`"
    )


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise TicketsError(f"`git {' '.join(args[:3])}` in {repo} failed: {out.stderr.strip()[:200]}")
    return out.stdout


def plan_repo(clone: Path, tickets: list[Ticket], scope: str = "source", replay: int = record.REPLAY) -> dict[str, Any]:
    """Plan every ticket of one repository (see the module's docstring); returns the record's facts."""
    for t in tickets:
        try:
            t.time = int(_git(clone, "show", "-s", "--format=%ct", t.base + "^{commit}").strip())
        except TicketsError:
            msg = f"{t.id}: base commit {t.base[:12]} is not in {clone}: clone a fork with its full history"
            raise TicketsError(msg) from None
    tickets.sort(key=lambda t: t.time)
    first, last = tickets[0].base, tickets[-1].base
    span = int(_git(clone, "rev-list", "--count", "--no-merges", f"{first}..{last}").strip() or 0)
    changes, _ = mine(clone, last, None, span + KEEP + replay)
    t0 = time.perf_counter()
    before = _ancestors(clone, first, KEEP + replay)
    past = [c for c in changes if c.sha in before]
    calibration = record.build(clone, past, MERGEABLE, first, replay, scope)
    record_s = time.perf_counter() - t0
    index = index_mod.for_repo(clone)
    taken: set[str] = set()
    for t in tickets:
        mine_ = _ancestors(clone, t.base, KEEP)
        history = History([c for c in changes if c.sha in mine_][-KEEP:])
        start = time.perf_counter()
        with index.lock:
            index.move(t.base)
        t.move_seconds = time.perf_counter() - start
        start = time.perf_counter()
        plan = local_plan(clone, t.base, t.text, history, MERGEABLE, calibration)
        t.seconds = time.perf_counter() - start
        t.claim = plan.claim
        ranked = [str(r["path"]) for r in plan.ranking]
        gold = sorted(t.gold)[0] if t.gold else ""
        t.rank = ranked.index(gold) + 1 if gold in ranked else None
        t.p_gold = next((float(r["p"]) for r in plan.ranking if r["path"] == gold), 0.0)
        t.probs = {str(r["path"]): float(r["p"]) for r in plan.ranking}
        t.fix = fix_commit(clone, t, taken)
    return {
        "replayed": min(len(past), replay),
        "calibration": calibration.to_json() if calibration is not None else None,
        "record_seconds": round(record_s, 1),
    }


FIX_WITHIN = 2 * 365 * 86400
"""How long after a ticket's base its fix is looked for."""


def fix_commit(clone: Path, t: Ticket, taken: set[str] | None = None) -> str | None:
    """The commit that fixed `t` in the clone's history, where one can be told, descending from its base and
    within `FIX_WITHIN` after it: the one whose message names its pull request (`#N` of an instance id
    `owner__name-N`; a merge stands for the whole request, against its first parent), else the first authored
    commit whose source files, tests, docs and changelogs aside, are exactly its gold files and that no other
    ticket took (`taken`). A fix found neither way is not told (None)."""
    taken = set() if taken is None else taken
    since, until = f"--since=@{t.time}", f"--until=@{t.time + FIX_WITHIN}"
    number = t.id.rsplit("-", 1)[-1]
    if number.isdigit():
        named = _git(clone, "log", "--all", "--format=%H", since, until, "-E", f"--grep=#{number}([^0-9]|$)")
        for sha in reversed(named.split()):
            if sha not in taken and _descends(clone, t.base, sha):
                taken.add(sha)
                return sha
    if not t.gold:
        return None
    args = ("log", "--all", "--no-merges", "--reverse", "--format=%H", since, until, "--", *sorted(t.gold))
    for sha in _git(clone, *args).split()[:FIX_CANDIDATES]:
        if sha in taken:
            continue
        files = _git(clone, "diff-tree", "--no-commit-id", "--name-only", "-r", sha).split("\n")
        source = {f for f in files if f and not is_test(f) and not is_doc(f) and not claims.matches(f, MERGEABLE)}
        if source == t.gold and _descends(clone, t.base, sha):
            taken.add(sha)
            return sha
    return None


FIX_CANDIDATES = 40
"""Commits touching a ticket's gold files that `fix_commit` looks at."""


def _descends(clone: Path, base: str, sha: str) -> bool:
    out = subprocess.run(["git", "-C", str(clone), "merge-base", "--is-ancestor", base, sha], capture_output=True)
    return out.returncode == 0


def _ancestors(clone: Path, rev: str, n: int) -> frozenset[str]:
    return frozenset(_git(clone, "rev-list", "--no-merges", f"--max-count={n}", rev).split())


def scoped(claim: Claim, scope: str) -> Claim:
    """The claim as the ticket set judges it: `source` leaves tests and docs out (gold files are source)."""
    if scope == "all":
        return claim
    keep = frozenset(p for p in claim.paths if not is_test(p) and not is_doc(p))
    risk = claim.risk
    if risk is not None:
        risk = replace(risk, near=tuple((p, q) for p, q in risk.near if not is_test(p) and not is_doc(p)))
    return replace(claim, paths=keep, risk=risk)


def pairs(tickets: Sequence[Ticket], policy: Policy, scope: str, clone: Path | None = None) -> dict[str, Any]:
    """Every pair of one repository's tickets put to admission: one active, the other waiting. With `clone`, each
    pair admitted at once whose fixes meet is merged (`plan.merges.result`, the later fix replayed on the earlier
    one's base, then merged with it) where both fixes are known (`fix_commit`): would it merge?"""
    clear_caches()
    views = [JobView(i + 1, "repo", "main", scoped(t.claim, scope)) for i, t in enumerate(tickets)]
    fn = overlapping = over = disjoint = 0
    run_met: list[tuple[Ticket, Ticket]] = []
    for (i, a), (j, b) in itertools.combinations(enumerate(tickets), 2):
        together = decide(views[j], Snapshot(active=(views[i],), waiting=(views[j],), policy=policy)).admitted
        if claims.PathIndex(a.gold).meeting(b.gold):
            overlapping += 1
            fn += together
            if together:
                run_met.append((a, b))
        else:
            disjoint += 1
            over += not together
    known = [(a, b) for a, b in run_met if a.fix and b.fix]
    failed = sum(not merged for merged in _merged(clone, known)) if clone is not None else 0
    return {
        "pairs": overlapping + disjoint,
        "overlapping": overlapping,
        "fn_concurrency": round(fn / overlapping, 4) if overlapping else None,
        "fn_pairs": fn,
        "over_serialisation": round(over / disjoint, 4) if disjoint else None,
        "held_apart": over,
        "run_and_met_fixes_known": len(known),
        "run_and_not_merged": failed,
        "run_and_not_merged_share": _share(failed, overlapping + disjoint),
    }


BOUND_FN = 0.05
"""The FN-concurrency `bound` allows (the floor's)."""


def pair_scores(tickets: Sequence[Ticket], scope: str) -> list[tuple[float, bool]]:
    """For each pair of one repository's tickets: the largest t at which "claim every file at least t likely" would
    make their claims meet (the most the less likely of the two gives a file both list), and whether their gold
    files meet."""
    kept = [{p: q for p, q in t.probs.items() if scope == "all" or not (is_test(p) or is_doc(p))} for t in tickets]
    out = []
    for (i, a), (j, b) in itertools.combinations(enumerate(tickets), 2):
        pa, pb = kept[i], kept[j]
        score = max((min(q, pb[p]) for p, q in pa.items() if p in pb), default=0.0)
        out.append((score, bool(claims.PathIndex(a.gold).meeting(b.gold))))
    return out


def bound(scores: Sequence[tuple[float, bool]], fn_max: float = BOUND_FN) -> dict[str, float | None]:
    """The least over-serialisation a threshold t on `pair_scores` gives (pairs scoring at least t held apart) with
    FN-concurrency at most `fn_max`, and that t (None: no pair met, nothing need be held apart)."""
    met = sorted(s for s, m in scores if m)
    apart = sorted(s for s, m in scores if not m)
    if not apart:
        return {"threshold": None, "fn_concurrency": None, "over_serialisation": None}
    if not met:
        return {"threshold": None, "fn_concurrency": None, "over_serialisation": 0.0}
    # The highest t letting at most fn_max of the meeting pairs through: the k-th lowest meeting score.
    k = int(fn_max * len(met) + 1e-9)
    t = met[k]
    through = sum(s < t for s in met)
    held = sum(s >= t for s in apart)
    return {
        "threshold": round(t, 4),
        "fn_concurrency": round(through / len(met), 4),
        "over_serialisation": round(held / len(apart), 4),
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _merged(clone: Path, pairs_: Sequence[tuple[Ticket, Ticket]]) -> list[bool]:
    """Whether each pair's fixes would have merged (the later fix, by time, replayed on the earlier one's base)."""
    out = []
    with merging.scratch(clone) as git:
        for a, b in pairs_:
            assert a.fix is not None and b.fix is not None
            fa, fb = git[a.fix].peel(pygit2.Commit), git[b.fix].peel(pygit2.Commit)
            earlier, later = (fa, fb) if fa.commit_time <= fb.commit_time else (fb, fa)
            is_union = merging.union_paths(git, earlier.id, lambda p: claims.matches(p, MERGEABLE))
            _, paths = merges.conflicts(git, earlier, later, is_union)
            # A pull request's merge may bring files beside its fix (a branch behind its mainline): only the fixes'
            # own files, and their tests, count.
            own = claims.PathIndex(a.gold | b.gold | a.tests | b.tests)
            out.append(not own.meeting(paths))
    return out


def estimates(tickets: Sequence[Ticket], scope: str) -> list[tuple[float, bool]]:
    """For each pair of one repository's tickets whose claims are disjoint and both estimated: the chance that
    they meet as admission estimates it (the risk's first factor), and whether their gold files really meet."""
    scoped_ = [scoped(t.claim, scope) for t in tickets]
    escapes = [Escapes.of(c.risk) for c in scoped_]
    out = []
    for (i, a), (j, b) in itertools.combinations(enumerate(tickets), 2):
        ca, cb = scoped_[i], scoped_[j]
        if escapes[i] is None or escapes[j] is None or claims.PathIndex(ca.paths).meeting(cb.paths):
            continue
        met = bool(claims.PathIndex(a.gold).meeting(b.gold))
        out.append((pair_risk(escapes[j], cb.paths, escapes[i], ca.paths).meet, met))
    return out


def summary(tickets: Sequence[Ticket], policy: Policy, scope: str) -> dict[str, Any]:
    known = [t for t in tickets if claims.ambiguity(scoped(t.claim, scope), policy) is None]
    covered = [t for t in known if t.gold and accuracy.foreseen(scoped(t.claim, scope).paths, t.gold) == t.gold]
    secs = sorted(t.seconds for t in tickets)
    return {
        "tickets": len(tickets),
        "beside_others": len(known),
        "claims_covering_gold": len(covered),
        "claim_paths_median": statistics.median(len(t.claim.paths) for t in tickets) if tickets else None,
        "gold_top1": sum(t.rank == 1 for t in tickets),
        "gold_top5": sum(t.rank is not None and t.rank <= 5 for t in tickets),
        "plan_p50_s": sched.fig(sched.pct(secs, 0.5), 3),
        "plan_p95_s": sched.fig(sched.pct(secs, 0.95), 3),
        "plan_max_s": sched.fig(sched.most(secs), 3),
        "move_p95_s": sched.fig(sched.pct([t.move_seconds for t in tickets], 0.95), 3),
    }


def run(
    path: Path,
    repos_dir: Path,
    limit: int | None,
    risk: float,
    scope: str,
    only: Sequence[str] = (),
    frontier: Sequence[float] = (),
) -> dict:
    tickets = load(path, limit)
    by_repo: dict[str, list[Ticket]] = defaultdict(list)
    for t in tickets:
        if not only or t.repo in only or t.repo.split("/")[-1] in only:
            by_repo[t.repo].append(t)
    policy = Policy(max_concurrent=8, per_repo=8, mergeable=MERGEABLE, risk=risk)
    rows: dict[str, Any] = {}
    totals: dict[str, int] = defaultdict(int)
    points: list[tuple[float, bool]] = []
    every_score: list[tuple[float, bool]] = []
    failed: dict[str, str] = {}
    for name, ts in sorted(by_repo.items()):
        clone = clone_of(repos_dir, name)
        try:
            facts = plan_repo(clone, ts, scope)
        except pygit2.GitError as e:  # a clone that lacks objects (a partial one): the other repositories still count
            failed[name] = f"GitError: {e} (a partial or damaged clone? fetch it whole: `git fetch --refetch`)"
            rows[name] = {"tickets": len(ts), "failed": failed[name]}
            print(f"  {name}: {len(ts)} tickets, FAILED: {failed[name]}", file=sys.stderr)
            continue
        scores = pair_scores(ts, scope)
        every_score += scores
        row = {**summary(ts, policy, scope), **pairs(ts, policy, scope, clone), "bound": bound(scores), "record": facts}
        points += estimates(ts, scope)
        rows[name] = row
        print(
            f"  {name}: {len(ts)} tickets, FN-concurrency {_fmt(row['fn_concurrency'])}, "
            f"over-serialisation {_fmt(row['over_serialisation'])}",
            file=sys.stderr,
        )
        for k in ("pairs", "overlapping", "fn_pairs", "held_apart", "run_and_met_fixes_known", "run_and_not_merged"):
            totals[k] += row[k]
    for name in failed:
        del by_repo[name]
    every = [t for ts in by_repo.values() for t in ts]
    others = []
    for r in frontier:  # the same plans admitted at other thresholds
        p = replace(policy, risk=r)
        got = [pairs(ts, p, scope) for ts in by_repo.values()]
        ov, fn = sum(g["overlapping"] for g in got), sum(g["fn_pairs"] for g in got)
        dj, held = sum(g["pairs"] - g["overlapping"] for g in got), sum(g["held_apart"] for g in got)
        others.append(
            {
                "risk": r,
                "fn_concurrency": round(fn / ov, 4) if ov else None,
                "over_serialisation": round(held / dj, 4) if dj else None,
            }
        )
    disjoint = totals["pairs"] - totals["overlapping"]
    overall = {
        **summary(every, policy, scope),
        **dict(totals),
        "fn_concurrency": round(totals["fn_pairs"] / totals["overlapping"], 4) if totals["overlapping"] else None,
        "over_serialisation": round(totals["held_apart"] / disjoint, 4) if disjoint else None,
        "run_and_not_merged_share": _share(totals["run_and_not_merged"], totals["pairs"]),
        "fixes_known": sum(t.fix is not None for t in every),
        "failed": sorted(failed),
        "bound": bound(every_score),
    }
    return {
        "tickets_file": str(path),
        "scope": scope,
        "risk": risk,
        "repos": rows,
        "overall": overall,
        "anchors": [{"method": m, "fn_concurrency": f, "over_serialisation": o} for m, f, o in ANCHORS],
        "frontier": others,
        "calibration": riskbins.bins(points),
        "per_ticket": [
            {
                "id": t.id,
                "repo": t.repo,
                "claim": sorted(t.claim.paths),
                "risk_known": t.claim.risk is not None,
                "gold": sorted(t.gold),
                "gold_rank": t.rank,
                "gold_p": round(t.p_gold, 4),
                "fix": t.fix,
                "seconds": round(t.seconds, 3),
            }
            for t in every
        ],
    }


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def print_report(r: dict[str, Any]) -> None:
    print(f"predict: {r['overall']['tickets']} tickets of {r['tickets_file']}, local evidence only, "
          f"plan.risk {r['risk']:.0%}, scope {r['scope']}")  # fmt: skip
    cols = ("tickets", "beside", "pairs", "overlap", "FN-conc", "over-ser", "top1", "top5", "plan p50", "p95")
    print("  " + f"{'repository':<28}" + "".join(f"{c:>10}" for c in cols))

    def line(name: str, row: dict[str, Any]) -> None:
        vals = (
            row["tickets"], row["beside_others"], row["pairs"], row["overlapping"],
            _fmt(row["fn_concurrency"]), _fmt(row["over_serialisation"]), row["gold_top1"], row["gold_top5"],
            _secs(row["plan_p50_s"]), _secs(row["plan_p95_s"]),
        )  # fmt: skip
        print("  " + f"{name:<28}" + "".join(f"{v!s:>10}" for v in vals))

    for name, row in r["repos"].items():
        if "failed" in row:
            print(f"  {name:<28}{row['tickets']:>10}  FAILED: {row['failed']}")
        else:
            line(name, row)
    line("overall", r["overall"])
    o = r["overall"]
    print(
        f"  run at once and their fixes would not merge: {o['run_and_not_merged']} of {o['pairs']} pairs "
        f"({_fmt(o['run_and_not_merged_share'])}); of the {o['fn_pairs']} pairs run at once whose fixes meet, "
        f"{o['run_and_met_fixes_known']} have both fixes found in the history ({o['fixes_known']} of "
        f"{o['tickets']} tickets' fixes found)"
    )
    print(f"  the least over-serialisation with FN-concurrency <= {BOUND_FN:.0%} that claiming every file at least t "
          "likely could give, t chosen knowing the gold files:")  # fmt: skip
    for name, row in [*r["repos"].items(), ("overall (one t)", r["overall"])]:
        if "failed" in row:
            continue
        b = row["bound"]
        if b["over_serialisation"] is not None:
            t = "-" if b["threshold"] is None else f"{b['threshold']:.3f}"
            print(
                f"    {name:<28} {_fmt(b['over_serialisation']):>8} (t {t}, FN-concurrency {_fmt(b['fn_concurrency'])})"
            )
    for f in r.get("frontier", ()):
        fn, over = _fmt(f["fn_concurrency"]), _fmt(f["over_serialisation"])
        print(f"  at plan.risk {f['risk']:.0%}: FN-concurrency {fn}, over-serialisation {over}")
    if r.get("calibration"):
        print("  estimated chance of meeting of the pairs with disjoint claims against how often their fixes met:")
        for text in riskbins.lines(r["calibration"], "met"):
            print("    " + text)
    print("  anchors (published, same kind of data): FN-concurrency / over-serialisation")
    for a in r["anchors"]:
        print(f"    {a['method']:<46} {_fmt(a['fn_concurrency']):>8} {_fmt(a['over_serialisation']):>8}")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"
