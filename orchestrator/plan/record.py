"""A repository's record: the planner replayed on the repository's own past changes, and the calibration
(`score.Calibration`) that makes its probabilities, and its risks, say what happened there.

`replay` plans each of the last `REPLAY` authored changes from its own message at its own parent, with the
history of the changes before it only (nothing from its future), and keeps what the plan's probabilities
are computed from (`focus.Spread`) beside the files the change really touched (union-mergeable files left
out). `merges.record` merges the pairs of them that met, three ways. `fit` (pure) then learns, from the plans
that named something (the others run alone anyway):
- `a`, `b`: Platt scaling of the shipped model's log-odds, candidates touched or not;
- `escape`: per kind of claim and kind of path (source, tests, docs, config), a factor on the estimated
  chance of touching such paths outside such a claim, so that over the record it adds up to how many its
  changes really touched (a docs change rarely reaches the code: its factor there is small);
- `rest`: how often they touched a file nothing pointed at, per file;
- `areas`: of the pairs of changes near each other whose claims were disjoint and whose estimate by files
  was small (`AREA_CUT`), per pair of areas (directories of their most likely files), how many touched a
  common path anyway: the risk no file-level evidence accounts for;
- `merges`: per area, how many pairs of changes near each other met, and how many would not have merged (the
  risk's second factor, `Calibration.nonmerge`);
- `meet`: the risk's first factor checked against the record itself. The plans of its later changes (from each
  of `FOLDS` on), calibrated on the changes before them only, give each pair of them the shipped model's
  chance of meeting (`core.risk.pair_logit`); what they really touched rescales it (Platt, pulled towards none
  by `MEET_PRIOR`).
With fewer than `MIN_RECORD` such plans there is no calibration, and with fewer than `MIN_PAIRS` pairs to check
the risk against it is not known (`Calibration.unknown`): either way those jobs run alone. `refit` keeps a
calibration current with the pairs the daemon itself ran side by side (`plan.accuracy.outcomes`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pygit2

from orchestrator.core import claims
from orchestrator.core.models import Risk
from orchestrator.core.risk import KNOWN, MEET_FLOOR, Escapes, by_files, pair_logit, raw_meet, sigmoid
from orchestrator.git import repos
from orchestrator.plan import evidence, manifests, merges, riskmap
from orchestrator.plan import focus as focus_mod
from orchestrator.plan import index as index_mod
from orchestrator.plan.accuracy import Settled
from orchestrator.plan.history import MAX_FILES, Change, History, landings, title
from orchestrator.plan.kinds import CLASSES, path_class
from orchestrator.plan.rank import rank
from orchestrator.plan.score import Calibration, area_pairs, platt
from orchestrator.plan.text import mentions

REPLAY = 150
"""Most recent past changes replayed."""
MIN_RECORD = 20
"""Replayed plans naming something needed before the risk can be estimated."""
SCALE_RANGE = (0.02, 20.0)
"""The range the escape factors are fitted in."""
WINDOW = 16
"""Replayed changes at most this far apart count as a pair queued together."""
AREA_CUT = 0.03
"""The pairs an area's rate is learned from: those whose estimate by files is at most this (the default
`plan.risk`: the pairs admission would let run side by side on their files alone)."""
FOLDS = (0.5, 0.75)
"""Where the record is cut to check the risk against it: the plans of the changes from each cut to the next
(the last: to the end) are calibrated on the changes before the cut only."""
MIN_PAIRS = 50
"""Pairs of the record's later changes needed before its risk is trusted (fewer: its jobs run alone)."""
MEET_PRIOR = 25.0
"""Weight of the prior that pulls the record's scaling of a pair's chance of meeting towards none (`score.platt`)."""
REBUILD = 50
"""New changes in a repository's history after which its record is replayed and fitted again (the daemon's
`plan.local.Records`, and `bench predict` as it replays a range)."""
SHRINK = 2.0
"""Estimated escapes a (claim kind, path kind) pair needs before its own factor outweighs its path kind's."""
RECENT = 1
"""How many of the record's pairs each pair the daemon itself ran side by side counts as, once settled (`refit`).
One: a period whose changes meet more (or merge less) than the record's is as often followed by one that meets less,
and weighed three times the risk followed each period a period late. Replayed with `bench predict` (which refits as
the daemon does), three made the estimate rank pairs the wrong way round on small repositories (aiofiles: pairs
estimated 12-20% did not merge 25.7% of the time, those estimated above 35% 13.6%) and failed calibration on
aiofiles, humanize and gunicorn; one held it there (seen repositories, docs/benchmarks.md round 7)."""


@dataclass
class Sample:
    """One replayed change: what its plan was computed from, and what it really touched."""

    sha: str
    spread: focus_mod.Spread
    touched: frozenset[str]
    files: int
    """Files in the tree at its parent."""
    kind: frozenset[str] = frozenset()
    """For a change of a known kind (`manifests`): the files that kind claims, which its plan claims (and
    whose area it is in) instead of what the ranking says."""
    landing: str = ""
    """The first-parent commit that brought it in (`history.landings`; empty: not known)."""


def build(
    repo: Path,
    changes: Sequence[Change],
    ignore: Sequence[str] = (),
    tip: str | None = None,
    limit: int = REPLAY,
    scope: str = "all",
) -> Calibration | None:
    """A repository's record, from scratch (blocking: run it in a thread): the planner replayed on the last
    `limit` of `changes` (oldest first), their pairs that met merged (`merges.record`), and the calibration fitted
    on both (`fit`). `tip`: a commit the changes lead to, whose first-parent line tells which landed together."""
    start = max(0, len(changes) - limit)
    landed = landings(repo, tip, (c.sha for c in changes[start:])) if tip else {}
    samples = replay(repo, changes, ignore, limit, landed=landed)
    mets = merges.record(repo, changes[start:], ignore)
    return fit(samples, ignore, scope, mets)


def refit(calibration: Calibration, outcomes: Sequence[Settled]) -> Calibration:
    """The record's calibration kept current by the pairs the daemon itself ran side by side: their estimates and
    whether they met refit `Calibration.meet` beside the record's own pairs (and are kept after them in `points`,
    the most recent: `Calibration.floor` reads them too); whether those that met merged count in the repository's
    share that would not (`Calibration.nonmerge`, at ROOT, and among the meetings of disjoint claims), and what
    admission estimated for them before the map, with whether they merged, refit the map (`Calibration.checked`,
    `Calibration.scale`). Each counts `RECENT` times
    a record's pair in all but the floor: they are the repository's present, the record its past."""
    if not outcomes:
        return calibration
    points = [*calibration.points, *((o.logit, o.met) for o in outcomes)]
    a, b = platt([*points, *((o.logit, o.met) for o in outcomes for _ in range(RECENT - 1))], prior=MEET_PRIOR)
    met = [o for o in outcomes if o.met]
    unmerged = sum(not o.merged for o in met)
    table = {x: (n, k) for x, n, k in calibration.merges}
    n, k = table.get("", (0, 0))
    table[""] = (n + RECENT * len(met), k + RECENT * unmerged)
    unknown = calibration.unknown if len(points) < MIN_PAIRS else ""
    rows = tuple((x, n, k) for x, (n, k) in sorted(table.items()))
    n_d, k_d = calibration.disjoint
    checked = [(o.raw if o.raw is not None else o.risk, not o.merged) for o in outcomes for _ in range(RECENT)]
    refitted = replace(
        calibration,
        meet=(a, b),
        merges=rows,
        unknown=unknown,
        points=tuple(points),
        disjoint=(n_d + RECENT * len(met), k_d + RECENT * unmerged),
    )
    return checking(refitted, (*calibration.checked, *checked))


def checking(calibration: Calibration, points: Sequence[tuple[float, bool]]) -> Calibration:
    """`calibration` with `points` (estimate before the map, would not merge) as its check, and its map
    (`Calibration.scale`) fitted on them (`riskmap.fit`)."""
    checked = tuple(points)
    return replace(calibration, checked=checked, scale=riskmap.fit(checked))


def replay(
    repo: Path,
    changes: Sequence[Change],
    ignore: Sequence[str] = (),
    limit: int = REPLAY,
    tip: str | None = None,
    landed: Mapping[str, str] | None = None,
) -> list[Sample]:
    """Plan the last `limit` of `changes` (oldest first) each at its parent (blocking: run it in a thread).
    `tip`: a commit the changes lead to, whose first-parent line tells which of them landed together (or
    `landed`: that, found already)."""
    git = repos.open_repo(repo)
    start = max(0, len(changes) - limit)
    if landed is None:
        landed = landings(repo, tip, (c.sha for c in changes[start:])) if tip else {}
    history = History(changes[:start])
    index = index_mod.for_repo(repo)  # moved back to each change's parent, change by change, under its lock
    out: list[Sample] = []
    for change in changes[start:]:
        try:
            commit = git.revparse_single(change.sha).peel(pygit2.Commit)
        except (KeyError, ValueError, pygit2.GitError):
            continue
        touched = frozenset(f for f in change.files if not (ignore and claims.matches(f, tuple(ignore))))
        if commit.parents and touched and len(change.files) <= MAX_FILES:
            text = commit.message
            with index.lock:
                index.move(str(commit.parents[0].id))
                ranking = rank(mentions(text), text, index, history)
                spread = focus_mod.spread(ranking, history, index)
                files = len(index.blobs)
                kind = _kind_claim(repo, str(commit.parents[0].id), title(text), index, history, ignore)
            out.append(Sample(change.sha, spread, touched, files, kind, landed.get(change.sha, "")))
        history.add(change)
    return out


def _kind_claim(
    repo: Path, base: str, subject: str, index: index_mod.TreeIndex, history: History, ignore: Sequence[str]
) -> frozenset[str]:
    if manifests.kind_of(subject) is None and not manifests.past(history, manifests.Kind.RECURRING, subject):
        return frozenset()  # the common case, answered without a file list
    known = evidence.kind_files(repo, base, subject, evidence.Files.of(index.blobs), history, ignore)
    return frozenset(known[1]) if known is not None else frozenset()


def fit(
    samples: Sequence[Sample], ignore: Sequence[str] = (), scope: str = "all", mets: Sequence[merges.Met] = ()
) -> Calibration | None:
    """The calibration the record supports (pure), or None when too few of its plans named anything.

    `scope` "source" counts only source files as touched (tests, docs and configuration left out): for
    judging against what touches source files only, as a ticket set's fixing patches do. `mets`: the record's
    pairs of past changes that met, and whether they would have merged (`merges.record`).

    A pair's chance of meeting is then checked against the record itself: the plans of its later changes,
    calibrated on the changes before them only, give each pair of them an estimate, and what they really
    touched says how such estimates came true (`Calibration.meet`, Platt scaling of the estimate's log-odds).
    With fewer than `MIN_PAIRS` such pairs the risk is not known (`Calibration.unknown`)."""
    known = [s for s in samples if s.spread.names and s.spread.logits]
    if len(known) < MIN_RECORD:
        return None
    calibration = _fit(known, ignore, scope)
    results = {(m.earlier, m.later): m.result for m in mets}
    points: list[tuple[float, bool]] = []
    disjoint = [0, 0]
    checked: list[tuple[float, tuple[str, str], bool]] = []  # (log-odds, areas, would not merge)
    for lo, hi in itertools.pairwise([*(round(len(known) * f) for f in FOLDS), len(known)]):
        early = _fit(known[:lo], ignore, scope) if lo >= MIN_RECORD else None
        if early is not None:
            for z, met, earlier, later, areas in _meet_pairs(known[lo:hi], early, ignore, scope):
                points.append((z, met))
                got = results.get((earlier, later)) if met else merges.Result.CLEAN
                if met and got is not None:
                    disjoint[0] += 1
                    disjoint[1] += not got.merges
                if got is not None:
                    checked.append((z, areas, not got.merges))
    a, b = platt(points, prior=MEET_PRIOR)
    unknown = (
        f"the record has {len(points)} pairs of past changes to check the risk against (at least {MIN_PAIRS} needed)"
        if len(points) < MIN_PAIRS
        else ""
    )
    out = replace(
        calibration,
        merges=merges.table(mets),
        meet=(a, b),
        points=tuple(points),
        unknown=unknown,
        disjoint=(disjoint[0], disjoint[1]),
        blind=_blind(samples, scope),
    )
    return checking(out, [(_estimate(out, z, areas), k) for z, areas, k in checked])


def _estimate(calibration: Calibration, z: float, areas: tuple[str, str]) -> float:
    """The risk `core.risk.pair_risk` gives a pair of the calibration's repository at log-odds `z` in `areas`, before
    the calibration's map (`Calibration.scale`)."""
    meet = max(MEET_FLOOR, calibration.floor, sigmoid(calibration.meet[0] * z + calibration.meet[1]))
    return meet * min(1.0, max(calibration.nonmerge(x) for x in areas))


def _blind(samples: Sequence[Sample], scope: str = "all") -> tuple[int, int]:
    """Of the pairs of `samples` at most `merges.WINDOW` apart where one's message named nothing of the repository
    (nor was of a known kind): how many, and how many touched a common path."""
    blind = [not (s.spread.names and s.spread.logits) and not s.kind for s in samples]
    touched = [_scoped(s.touched, scope) for s in samples]
    n = k = 0
    for i in range(len(samples)):
        for j in range(i + 1, min(len(samples), i + 1 + merges.WINDOW)):
            if (blind[i] or blind[j]) and touched[i] and touched[j]:
                n += 1
                k += bool(claims.PathIndex(touched[i]).meeting(touched[j]))
    return n, k


def meet_points(
    samples: Sequence[Sample], calibration: Calibration, ignore: Sequence[str] = (), scope: str = "all"
) -> list[tuple[float, bool]]:
    """For the pairs of `samples` at most `merges.WINDOW` apart whose claims are disjoint (two steps of one pull
    request too, as `merges.record` counts them): the shipped model's log-odds that they meet, on their estimate by
    `calibration` (`core.risk.pair_logit`), and whether they really touched a common path."""
    return [(z, met) for z, met, *_ in _meet_pairs(samples, calibration, ignore, scope)]


def _meet_pairs(
    samples: Sequence[Sample], calibration: Calibration, ignore: Sequence[str] = (), scope: str = "all"
) -> list[tuple[float, bool, str, str, tuple[str, str]]]:
    """`meet_points`, each with the two changes (earlier, later) and their areas."""
    foci = [focus_mod.focus(s.spread, calibration, ignore) for s in samples]
    held = [tuple(s.kind) if s.kind else f.claim for s, f in zip(samples, foci, strict=True)]
    # A change of a known kind: its kind's claim and area; what its kind's record says it escapes to is left out.
    known = [Risk(area=evidence.claim_area(s.kind), kind=KNOWN) for s in samples]
    escapes = [Escapes.of(k if s.kind else f.risk) for s, f, k in zip(samples, foci, known, strict=True)]
    touched = [_scoped(s.touched, scope) for s in samples]
    out = []
    for i in range(len(samples)):
        index = claims.PathIndex(held[i])
        for j in range(i + 1, min(len(samples), i + 1 + merges.WINDOW)):
            if index.meeting(held[j]) or not held[i] or not held[j]:
                continue
            a, b = escapes[j], escapes[i]
            assert a is not None and b is not None
            met = bool(claims.PathIndex(touched[i]).meeting(touched[j]))
            z = pair_logit(raw_meet(a, held[j], b, held[i]), (a.kind, b.kind))
            out.append((z, met, samples[i].sha, samples[j].sha, (b.area, a.area)))
    return out


def _fit(known: Sequence[Sample], ignore: Sequence[str], scope: str) -> Calibration:
    """Platt scaling of the files' chances, the escape factors, `rest` and the area table, on `known`."""
    touched = [_scoped(s.touched, scope) for s in known]
    points = [(z, f in t) for s, t in zip(known, touched, strict=True) for f, z in s.spread.logits.items()]
    a, b = platt(points)
    base = Calibration(a=a, b=b)
    foci = [focus_mod.focus(s.spread, base, ignore) for s in known]
    kinds = [s.kind for s in known]
    predicted: dict[tuple[str, str], list[float]] = {(c, t): [] for c in CLASSES for t in CLASSES}
    observed = dict.fromkeys(predicted, 0)
    unlisted = slots = escapes = 0
    for s, f, t in zip(known, foci, touched, strict=True):
        listed = dict(f.risk.near)
        for path, q in listed.items():
            predicted[f.kind, path_class(path)].append(q)
        escaped = [x for x in t if not any(claims.overlaps(x, c) for c in f.claim)]
        escapes += len(escaped)
        for x in escaped:
            if x in listed:
                observed[f.kind, path_class(x)] += 1
            else:
                unlisted += 1
        slots += max(1, s.files - len(listed) - len(f.claim))
    escape: list[tuple[str, str, float]] = []
    for kind in CLASSES:  # per kind of path, then per kind of claim, shrunk towards the former on little data
        pooled = [(c, kind) for c in CLASSES]
        k_t = _scale([q for cell in pooled for q in predicted[cell]], sum(observed[cell] for cell in pooled))
        for c in CLASSES:
            mass = sum(predicted[c, kind])
            w = mass / (mass + SHRINK)
            k = math.exp(w * math.log(_scale(predicted[c, kind], observed[c, kind])) + (1 - w) * math.log(k_t))
            escape.append((c, kind, k))
    return Calibration(
        a=a,
        b=b,
        escape=tuple(escape),
        rest=(unlisted + 1) / (slots + 1),
        changes=len(known),
        escapes=escapes,
        areas=_areas(foci, touched, kinds, [s.landing for s in known]),
    )


def _scoped(touched: frozenset[str], scope: str) -> frozenset[str]:
    return touched if scope == "all" else frozenset(t for t in touched if path_class(t) == "source")


def _areas(
    foci: Sequence[focus_mod.Focus],
    touched: Sequence[frozenset[str]],
    kinds: Sequence[frozenset[str]] = (),
    landings: Sequence[str] = (),
) -> tuple[tuple[str, str, int, int], ...]:
    """Of the pairs of replayed changes at most `WINDOW` apart whose claims were disjoint and whose estimate
    by files was at most `AREA_CUT`: per pair of areas (`score.area_pairs`), how many, and how many touched
    a common path anyway. A change of a known kind (`kinds[i]` not empty) claims what its kind does, is in
    that claim's area, and escapes by its kind's record, not the ranking's (its risk is not an area's).
    Two commits that landed together (one `landings` entry, not empty) are steps of one task, each made on
    the other: they say nothing of two tasks queued side by side, and are not counted."""
    counts: dict[tuple[str, str], list[int]] = {}
    kinds = list(kinds) or [frozenset()] * len(foci)
    landings = list(landings) or [""] * len(foci)
    held = [tuple(k) if k else f.claim for f, k in zip(foci, kinds, strict=True)]
    areas = [evidence.claim_area(k) if k else f.risk.area for f, k in zip(foci, kinds, strict=True)]
    escapes = [None if k else Escapes.of(f.risk) for f, k in zip(foci, kinds, strict=True)]
    for i in range(len(foci)):
        index = claims.PathIndex(held[i])
        for j in range(i + 1, min(len(foci), i + 1 + WINDOW)):
            if index.meeting(held[j]) or not touched[i] or not touched[j]:
                continue  # overlapping claims never run side by side: they say nothing of the risk
            if landings[i] and landings[i] == landings[j]:
                continue
            if by_files(escapes[j], held[j], escapes[i], held[i]) > AREA_CUT:
                continue  # kept apart by their files already
            met = bool(claims.PathIndex(touched[i]).meeting(touched[j]))
            for cell in area_pairs(areas[i], areas[j]):
                c = counts.setdefault(cell, [0, 0])
                c[0] += 1
                c[1] += met
    return tuple((x, y, n, k) for (x, y), (n, k) in sorted(counts.items()))


def _scale(predicted: Sequence[float], observed: int) -> float:
    """The factor k at which the estimates, each k-fold (at most 1), add up to what was observed."""
    lo, hi = math.log(SCALE_RANGE[0]), math.log(SCALE_RANGE[1])
    for _ in range(30):
        mid = (lo + hi) / 2
        if sum(min(1.0, math.exp(mid) * q) for q in predicted) < observed:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)
