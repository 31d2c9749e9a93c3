"""A focused claim from a ranking: each file's probability, the smallest claim holding what the job most
likely touches, and the risk beyond it. Pure over its inputs.

Each candidate's probability comes from its features (`plan.score`, recalibrated on the repository's
record). Two things carry probability to files the text does not point at, noisy-or'd in:
- co-change: a file that changed in k of the n past changes to a likely file gets that file's
  probability times k/n (its tests, its docs, its siblings; the strongest such source counts);
- tests by convention: `test_x.py` of a likely `x.py`.

The claim is every file at least `CLAIM_P` likely (at least the most likely one). Its `Risk` has two
parts, both from the repository's record (`plan.record`):
- the files with evidence of their own beyond the claim (a name, a definition, a traceback, a past
  change in similar words, a co-change with a claimed file), each with its calibrated chance;
- the job's area (the directory of its most likely file) and, for each area of the repository, how often
  replayed past changes there met a past change in that area although their claims were disjoint: the
  chance no file-level evidence accounts for (content retrieval alone, a job's unforeseen edits).
"""

from __future__ import annotations

import posixpath
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orchestrator.core import claims
from orchestrator.core.models import Risk
from orchestrator.core.risk import area_of
from orchestrator.plan.base import Kind
from orchestrator.plan.history import History
from orchestrator.plan.index import TreeIndex
from orchestrator.plan.kinds import is_doc, is_test, path_class
from orchestrator.plan.rank import Ranking
from orchestrator.plan.score import Calibration, logit

CLAIM_P = 0.4
"""A file at least this likely to be touched is claimed."""
LONG = 0.5
"""From this `rank.length` on, a text is a ticket: every candidate counts in its risk, and spill too."""
SPILL_LEVELS = (1.0, 0.5, 0.25)
"""How much of a job's weight in a directory (its file's, its parent's, its grandparent's) spills to the
directory's busiest files, in proportion to how busy they are (fitted on the tuning tickets)."""
GROUND_P = 0.05
"""A long text whose claimed files are all less likely than this says nowhere where it works: its claim is a
guess (`Focus.grounded`, said in its plan's notes), whatever pointed at it (a past change in a few similar words)."""
BUDGET = 2.5
"""For a long text, the most files its risk may expect it to touch beyond its claim. Its candidates are
alternatives for where the fix is, not independent chances: a ticket's fix touches a file or two beyond
its claim, so where their chances add up to more, they are scaled down to this (the tickets bench's
FN-concurrency / over-serialisation frontier sets its value, with `NEAR_CLAIM`)."""
NEAR_CLAIM = 0.03
"""A ticket claims every file it is at least this likely to touch beyond its most likely ones (after `BUDGET`): its
fix lands on one of its alternatives, and admission's chance that two jobs meet, fitted on commit messages, says
little of tickets (nearly every pair of tickets comes out at `MEET_FLOOR`, which lets them run at once). Set with
`BUDGET` on the tuning tickets' FN-concurrency / over-serialisation frontier (SWE-bench Lite and half of Verified:
3% and 2.5 hold apart all but 4.2% of their pairs that met, and 41% of the others; 5% and 1.5 let 18% through)."""
WIDE_FROM = 0.3
"""From this `rank.length` on (about 40 words), a text is a ticket as far as `NEAR_CLAIM` goes: a short ticket's
alternatives are claimed too; a commit subject, or one with a line or two of body, claims only what is likely."""
APART_BELOW = WIDE_FROM
"""Below this `rank.length` (about 40 words), a text that reports what is wrong or wanted instead of saying what to
change (`Spread.report`: an issue's title) and names no file (by its path or its name), no traceback frame and no
`Class.member` runs apart from the repository's other jobs (`Focus.apart`): where its work is cannot be told. Planned
as a commit subject is, 70% of the pairs of SWE-bench-Live's titles whose fixes met ran at once, and no claim threshold
would have held 95% of them apart with fewer than 72% of the others held too (`bench predict --tickets`'s bound);
apart, 4% of them run at once and 96% of the others wait (set on those titles). Commit messages rarely read so (2.5% of
1,736 replayed in twelve repositories' records): replayed as jobs, their pairs held apart went from 26.7% to 31.0%."""
SPILL_FILES = 8
"""The busiest files of a directory that spill reaches."""
SPILL_WHY = "changes often where the job likely works"
"""Why a file spill reaches is listed (a reason of kind `Kind.SPILL`). A file nothing else points at (no name,
definition, past change in similar words, co-change with a likely file) is no alternative for where a ticket's fix is:
it stays in the claim's risk, not in the claim (`NEAR_CLAIM`). Claimed, such files held apart 2.8 points more of the
seen tickets' pairs that did not meet (SWE-bench Lite and Verified, 19,965 pairs: 40.3% against 37.5%) for one of their
393 meeting pairs."""
NEAR_MIN = 0.002
"""Files less likely than this are left to the area's rate."""
NEAR_MAX = 100
"""Most files listed in a claim's risk."""
COCHANGE_FROM = 0.05
"""Files at least this likely pass probability on to the files that change with them."""
TEST_SHARE = 0.5
"""The chance a job touching `x.py` also touches `test_x.py` (when history says nothing)."""
CONVENTION_TEST = "the test file of {} (naming convention)"
"""Why a convention test is ranked (`{}` its source file)."""
TEXTUAL = frozenset({Kind.NAMED, Kind.TRACEBACK, Kind.SYMBOL, Kind.HISTORY})
"""Evidence kinds that name something of the repository (content retrieval alone names nothing)."""
LISTED = TEXTUAL | {Kind.COCHANGE, Kind.TEST}
"""Evidence that lists a file in the risk by its own name; the rest is the area's rate."""
INDEPENDENT = (
    frozenset({Kind.NAMED, Kind.TRACEBACK}),
    frozenset({Kind.SYMBOL}),
    frozenset({Kind.HISTORY, Kind.COCHANGE}),
)
"""Groups of evidence kinds that are independent of each other: two of them make a file confident. Content
retrieval is not one: it reads the same words the name or the definition matched."""


@dataclass
class Ranked:
    """One file of the ranking: its probability and why."""

    path: str
    p: float
    reasons: list[tuple[Kind, str]] = field(default_factory=list)

    @property
    def kinds(self) -> frozenset[Kind]:
        return frozenset(k for k, _ in self.reasons)

    @property
    def independent(self) -> int:
        """How many independent kinds of evidence point at it."""
        return sum(bool(self.kinds & group) for group in INDEPENDENT)

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "p": round(self.p, 4), "why": [f"{k}: {w}" for k, w in self.reasons]}


@dataclass
class Focus:
    ranked: list[Ranked]
    """Every file with a probability, the claimed ones first, then the most likely."""
    claim: frozenset[str]
    risk: Risk
    coverage: float
    """The estimated chance that the job touches none of the listed files outside the claim."""
    names: bool
    """The text names something of the repository (a path, a module, an identifier, a past change)."""
    kind: str = "source"
    """The kind of its most likely file (`kinds.path_class`): what its escapes are calibrated by."""
    grounded: bool = True
    """The text is short (its record calibrates its claims), or its most likely claimed file is one the text
    points at (a name, a frame, a definition, a past change in its words) and its claimed files are not all
    less than `GROUND_P` likely. Else a long text's claim is a guess (`Note.GUESSED`): it says so, and claims its
    alternatives as any ticket does. (Such guesses used to run alone: on the tuning tickets that held apart 5.5
    points more of the pairs that did not meet, for one point fewer of those that did.)"""
    apart: bool = False
    """A short text that reports what is wrong instead of saying what to change, and names no file by its path, no
    traceback frame, no `Class.member` (`APART_BELOW`): where its work is cannot be told, and the job runs apart
    (`Note.APART`)."""


@dataclass
class Spread:
    """What a plan's probabilities are computed from (kept per replayed change by `plan.record`, so that
    a recalibration recomputes them without the tree or the history at that change)."""

    logits: dict[str, float]
    """Each candidate's log-odds (`score.logit`)."""
    reasons: dict[str, list[tuple[Kind, str]]]
    edges: dict[str, list[tuple[str, float, str]]]
    """candidate → (file, share of its past changes that touched the file, why)."""
    names: bool
    long: float = 0.0
    """How long the text is (`rank.length`): a long one (a ticket) is judged by the shipped model."""
    spill: dict[str, tuple[int, list[tuple[str, int, int]]]] = field(default_factory=dict)
    """directory → (past changes under it, [(one of its busiest files, its changes, its level)])."""
    named: frozenset[str] = frozenset()
    """Files the text names by their path (or links to)."""
    located: frozenset[str] = frozenset()
    """Files the text points at otherwise than by their path: by their file name, a `Class.member` they define, or an
    identifier no other source file defines (`rank.Ranking.defining`)."""
    report: bool = False
    """The text reports what is wrong or wanted (an issue's title) instead of saying what to change, as the commit
    messages its record is replayed on do (`text.reports`)."""


def spread(ranking: Ranking, history: History | None, index: TreeIndex) -> Spread:
    """The ranking's candidates with their co-change edges and convention tests."""
    logits = {c.path: logit(c.features) for c in ranking}
    reasons = {c.path: list(c.reasons) for c in ranking}
    edges: dict[str, list[tuple[str, float, str]]] = {}
    for s in sorted(logits, key=lambda f: -logits[f])[:30]:
        out = []
        if history is not None and (n := history.count.get(s, 0)) >= 2:
            for g, k in history.pairs[s].most_common(10):
                if k >= 2 and g in index.blobs and g != s:  # once together is chance, not co-change
                    out.append((g, k / n, f"changed with {s} in {k} of its {n} past changes"))
        if not is_test(s):
            out += [(t, TEST_SHARE, CONVENTION_TEST.format(s)) for t in _convention_tests(s, index)]
        if out:
            edges[s] = out
    names = any(k in TEXTUAL for c in ranking for k in c.kinds)
    named = frozenset(c.path for c in ranking if c.features.get("path", 0) >= 0.5 or c.features.get("link", 0) > 0)
    located = frozenset(
        c.path
        for c in ranking
        if c.features.get("member", 0) > 0 or c.features.get("name", 0) > 0 or c.path in ranking.defining
    )
    spill = _spill_tables(logits, history, index)
    return Spread(logits, reasons, edges, names, ranking.long, spill, named, located, ranking.report)


def _spill_tables(
    logits: dict[str, float], history: History | None, index: TreeIndex
) -> dict[str, tuple[int, list[tuple[str, int, int]]]]:
    """For the directories of the candidates (`SPILL_LEVELS` up): their busiest files and how busy."""
    if history is None:
        return {}
    hot = Hotness.of(history, index)
    out = {}
    for d in sorted({d for f in logits for d in _dirs_of(f)[: len(SPILL_LEVELS)]}):
        files = [(f, hot.count[f], lv) for f in hot.top.get(d, ()) if (lv := _level(f, d)) is not None]
        if files and hot.total.get(d):
            out[d] = (hot.total[d], files)
    return out


class Hotness:
    """How often each file changed in the repository's history, per directory (for spill)."""

    def __init__(self, history: History, index: TreeIndex) -> None:
        self.count: dict[str, int] = {}
        self.total: dict[str, int] = defaultdict(int)
        self.top: dict[str, list[str]] = defaultdict(list)
        for f, n in history.count.items():
            if n > 0 and f in index.blobs:
                self.count[f] = n
                for d in _dirs_of(f):
                    self.total[d] += n
        for f in sorted(self.count, key=lambda f: (-self.count[f], f)):
            for d in _dirs_of(f)[: len(SPILL_LEVELS)]:
                if len(self.top[d]) < SPILL_FILES:
                    self.top[d].append(f)

    @classmethod
    def of(cls, history: History, index: TreeIndex) -> Hotness:
        """The table of this history and tree, kept while neither changes (one per index)."""
        key = (id(history), len(history.changes), index.base)
        hit = _HOT.get(id(index))
        if hit is not None and hit[0] == key:
            return hit[1]
        hot = cls(history, index)
        _HOT[id(index)] = (key, hot)
        return hot


_HOT: dict[int, tuple[tuple[object, ...], Hotness]] = {}


def _dirs_of(path: str) -> list[str]:
    """The directories holding `path`, nearest first, ROOT ("") last."""
    out = []
    d = posixpath.dirname(path.strip("/"))
    while d:
        out.append(d)
        d = posixpath.dirname(d)
    out.append("")
    return out


def _level(path: str, d: str) -> int | None:
    levels = _dirs_of(path)[: len(SPILL_LEVELS)]
    return levels.index(d) if d in levels else None


def _spilled(s: Spread, direct: dict[str, float]) -> dict[str, float]:
    """For the busiest files of the directories a job likely works in: the chance it touches them there."""
    mass: dict[str, float] = defaultdict(float)
    for f, q in direct.items():
        for d in _dirs_of(f)[: len(SPILL_LEVELS)]:
            mass[d] += q
    out: dict[str, float] = {}
    for d, (total, files) in s.spill.items():
        m = min(1.0, mass.get(d, 0.0))
        for f, n, level in files:
            q = SPILL_LEVELS[level] * m * n / total
            if q >= NEAR_MIN:
                out[f] = 1.0 - (1.0 - out.get(f, 0.0)) * (1.0 - min(q, 1.0))
    return out


def _noisy_or(p: dict[str, float], path: str, q: float) -> None:
    if q > 0:
        p[path] = 1.0 - (1.0 - p.get(path, 0.0)) * (1.0 - min(q, 1.0))


def focus(s: Spread, calibration: Calibration, ignore: Sequence[str] = ()) -> Focus:
    """Probabilities for the candidates and what they pass on to, the claim, and its risk.

    The record recalibrates plans of texts like its own (commit messages); a long text (a ticket with prose,
    code and tracebacks) is judged by the shipped model, fitted on tickets, the more so the longer it is:
    every candidate counts in its risk, and so does the spill to the busy files of where it likely works."""
    calibration = calibration.toward_shipped(s.long)
    long = s.long >= LONG
    p = {f: calibration.probability(z) for f, z in s.logits.items()}
    direct = dict(p)
    reasons = {f: list(r) for f, r in s.reasons.items()}
    for g, q in _passed_on(s, direct, reasons).items():
        _noisy_or(p, g, q)
    mergeable = tuple(ignore)
    ranked = sorted(
        (Ranked(f, v, reasons.get(f, [])) for f, v in p.items() if not (mergeable and claims.matches(f, mergeable))),
        key=lambda r: (-r.p, r.path),
    )
    # A file its words alone point at is no claim: the claim is what evidence names (else nothing is named).
    claimable = [r for r in ranked if r.kinds & LISTED]
    claim = [r.path for r in claimable if r.p >= CLAIM_P or (not long and r.path in s.named)]
    claim = claim or [r.path for r in claimable[:1]]
    if s.long >= WIDE_FROM and claim and all(path_class(c) != "source" for c in claim):
        # A ticket (from `WIDE_FROM` words on, as for its alternatives) is fixed in code: its most likely source file
        # is claimed beside a named test, doc or setting.
        claim += [r.path for r in ranked if path_class(r.path) == "source"][:1]
    mine = set(claim)
    kind = path_class(claim[0]) if claim else "source"
    grounded = bool(claim) and (
        not long or (any(k in TEXTUAL for k, _ in reasons.get(claim[0], ())) and max(p[c] for c in claim) >= GROUND_P)
    )
    where = bool(s.named or s.located) or any(Kind.TRACEBACK in r.kinds for r in ranked)
    apart = s.long < APART_BELOW and s.report and not where
    spilled = _spilled(s, direct) if long else {}
    for f in spilled:
        if f not in p and not (mergeable and claims.matches(f, mergeable)):
            ranked.append(Ranked(f, 0.0, reasons.setdefault(f, [])))
    for r in ranked:  # beyond the claim, a file's probability is its calibrated chance of being touched anyway
        if r.path not in mine:
            if r.path in spilled:
                r.p = 1.0 - (1.0 - r.p) * (1.0 - spilled[r.path])
                _why(reasons, r.path, Kind.SPILL, SPILL_WHY)
            r.p = calibration.escaping(kind, r.path, r.p)
    ranked.sort(key=lambda r: (r.path not in mine, -r.p, r.path))
    near = [(r.path, r.p) for r in ranked if r.path not in mine and r.p >= NEAR_MIN and (long or r.kinds & LISTED)][
        :NEAR_MAX
    ]
    if long and (total := sum(q for _, q in near)) > BUDGET:
        k = BUDGET / total
        near = [(path, q * k) for path, q in near]
        for r in ranked:
            if r.path not in mine:
                r.p *= k
    if s.long >= WIDE_FROM and claim:
        # A ticket's candidates are alternatives for where its fix is: each one at least NEAR_CLAIM likely is
        # claimed, so two tickets that may fix one file wait for each other instead of running on a small risk.
        wide = [path for path, q in near if q >= NEAR_CLAIM and not _spill_only(reasons.get(path, ()))]
        claim += wide
        mine.update(wide)
        near = [(path, q) for path, q in near if path not in mine]
        ranked.sort(key=lambda r: (r.path not in mine, -r.p, r.path))
    coverage = _coverage(near)
    area = area_of(claim[0]) if claim else ""
    # Files no evidence lists are the area's rate's: no per-file rest on top of it.
    risk = Risk(
        tuple(near),
        0.0,
        area,
        calibration.meets(area),
        calibration.nonmerge(area),
        calibration.meet,
        kind,
        calibration.floor,
        calibration.scale,
    )
    return Focus(ranked, frozenset(claim), risk, coverage, s.names and bool(claim), kind, grounded, apart)


def _passed_on(s: Spread, direct: dict[str, float], reasons: dict[str, list[tuple[Kind, str]]]) -> dict[str, float]:
    """The strongest co-change each file receives from the candidates (sources overlap: no sum), its reason noted."""
    passed: dict[str, float] = {}
    for src, ps in direct.items():
        textual = any(k in TEXTUAL for k, _ in s.reasons.get(src, ()))
        if ps < COCHANGE_FROM or not (textual or ps >= CLAIM_P):
            continue  # a file only its words matched passes nothing on: that would be a guess of a guess
        for g, share, why in s.edges.get(src, ()):
            if ps * share > passed.get(g, 0.0):
                passed[g] = ps * share
            _why(reasons, g, Kind.TEST if why.startswith("the test") else Kind.COCHANGE, why)
    return passed


def _spill_only(reasons: Iterable[tuple[Kind, str]]) -> bool:
    """Nothing but spill points at the file (its reasons are all of kind `Kind.SPILL`)."""
    return all(kind is Kind.SPILL for kind, _ in reasons)


def _coverage(near: Sequence[tuple[str, float]]) -> float:
    out = 1.0
    for _, q in near:
        out *= 1.0 - q
    return out


def _why(reasons: dict[str, list[tuple[Kind, str]]], path: str, kind: Kind, why: str) -> None:
    rs = reasons.setdefault(path, [])
    if (kind, why) not in rs and len(rs) < 8:
        rs.append((kind, why))


def _convention_tests(path: str, index: TreeIndex) -> Iterable[str]:
    base = posixpath.basename(path)
    stem = base.split(".", 1)[0]
    if stem in ("__init__", "index", "main", "setup", "conf"):
        return []
    out = []
    for name in (f"test_{stem}", f"{stem}_test", f"{stem}.test", f"{stem}.spec", f"{stem}_spec", f"tests_{stem}"):
        out += [t for t in index.by_stem.get(name.lower(), ()) if is_test(t) and not is_doc(t)]
    return sorted(set(out))
