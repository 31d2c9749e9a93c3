"""From a candidate's features to the probability that the job touches it. Pure.

`logit` is a logistic model over the features `plan.rank` computes; its weights were fitted once, offline,
on a tuning set (half of a public ticket set with its fixing patches, and older authored changes of a
few public repositories: never the changes or tickets the benchmarks report), and ship here. Each
repository then recalibrates the model on its own record (`plan.record`): `Calibration.a`/`b` rescale
the logit (Platt scaling), `spill` scales how much of a job's weight on a directory reaches that
directory's often-changed files, `rest` is the chance of touching any one file nothing points at.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from orchestrator.core.risk import MEET_FLOOR
from orchestrator.plan.kinds import path_class

CAPS: Mapping[str, float] = {
    "trace": 3.0,
    "trace_func": 3.0,
    "symbol": 4.0,
    "member": 3.0,
    "stem": 3.0,
    "history": 2.0,
    "literal": 2.0,
    "phrase": 2.0,
    "module": 2.0,
    "module_weak": 2.0,
    "path": 2.0,
    "name": 2.0,
}
"""Counts that say no more past these values."""
WEIGHTS: dict[str, float] = {
    "code_unasked": -1.5,
    "cochange": 1.716,
    "content": -1.765,
    "content_rank": 2.259,
    "content_top": 0.988,
    "doc": 0.113,
    "doc_asked": 1.0,
    "history": 1.554,
    "hot": 1.297,
    "link": 1.0,
    "literal": 0.804,
    "member": 1.309,
    "module": 0.5,
    "module_weak": 0.05,
    "name": 3.007,
    "path": 2.268,
    "phrase": 1.992,
    "stem": 0.776,
    "symbol": 1.765,
    "test": 0.2,
    "trace": 0.698,
    "trace_func": -2.352,
    "trace_inner": 3.303,
}
"""Log-odds per unit of each feature, for a short text (a commit message, a one-line job). `doc_asked` and
`code_unasked` (a title asking for documentation: docs gain, code loses) are set by hand."""
for _kind in ("doc", "config"):  # docs and settings found by their words: as source files in a short text,
    for _f in ("content", "content_rank", "content_top"):  # not at all in a ticket (it names its code)
        WEIGHTS[f"{_kind}_{_f}"] = WEIGHTS[_f]
LONG_WEIGHTS: dict[str, float] = {
    "cochange": -1.264,
    "content": 2.418,
    "content_rank": 0.123,
    "content_top": 0.249,
    "doc": 0.508,
    "history": 0.888,
    "hot": -1.123,
    "link": 0.0,
    "literal": 0.992,
    "member": -1.31,
    "module": -0.3,
    "module_weak": 0.0,
    "name": -2.243,
    "path": -0.194,
    "phrase": 0.016,
    "stem": -0.396,
    "symbol": -1.215,
    "test": 0.17,
    "trace": 1.962,
    "trace_func": -1.447,
    "trace_inner": 2.944,
}
"""What each feature's weight gains (or loses) for a long text (a ticket with prose, code, tracebacks), in
proportion to `long` (0 for 20 words or fewer, 1 for 200 or more): a path named in a ticket is the fix's
file less often than a path named in a commit message, a traceback's frames more often."""
for _kind in ("doc", "config"):
    for _f in ("content", "content_rank", "content_top"):
        LONG_WEIGHTS[f"{_kind}_{_f}"] = -WEIGHTS[_f]
BIAS = -4.229
LONG_BIAS = -1.879
"""The log-odds of a file with no feature at all (and what a long text changes in it). Fitted once, offline,
on half of a public ticket set and on older authored changes of a few public repositories; `link` and
`module`, too rare there to fit, are set by hand to small positive weights."""


def logit(features: Mapping[str, float]) -> float:
    """The log-odds that the job touches a file with these features (`long`: how long the text is, 0 to 1)."""
    long = features.get("long", 0.0)
    z = BIAS + LONG_BIAS * long
    for name, value in features.items():
        w = WEIGHTS.get(name)
        if w is not None and value:
            z += (w + LONG_WEIGHTS.get(name, 0.0) * long) * min(value, CAPS.get(name, 1.0))
    return z


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


AREA_DEPTH = 3
"""Directory levels the record's area table goes down to."""
AREA_PRIOR = 10.0
"""Pseudo-pairs by which an area's rate is pulled towards its parent area's."""
NONMERGE_PRIOR = 0.5
"""The share of past changes that met and would not have merged, before a repository's record says (about
what the tuning repositories' records measure: 37-64%, half of it changes built on the other one)."""
FLOOR_BAND = 1.2
"""Pairs whose estimated chance of meeting is at most this many times `core.risk.MEET_FLOOR` are the pairs nothing
connects, whose rate of meeting anyway is a repository's own floor (`Calibration.floor`)."""
FLOOR_WEIGHT = 25.0
"""Pseudo-pairs by which a repository's floor is pulled towards `core.risk.MEET_FLOOR`."""
NONMERGE_SD = 1.0
"""Standard deviations above its estimate that the share of meetings that would not merge is taken."""


def prefixes(area: str) -> list[str]:
    """ROOT, then the area's directories down to `AREA_DEPTH` (`a`, `a/b`, `a/b/c`)."""
    parts = [p for p in area.split("/") if p][:AREA_DEPTH]
    return ["", *("/".join(parts[: i + 1]) for i in range(len(parts)))]


def _up(area: str) -> str:
    return area.rsplit("/", 1)[0] if "/" in area else ""


def area_pairs(a: str, b: str) -> list[tuple[str, str]]:
    """The (area, area) cells a pair of changes in areas `a` and `b` counts in: ROOT with ROOT, then each
    level of `a` with the same level of `b`, both ways."""
    pa, pb = prefixes(a), prefixes(b)
    out = [("", "")]
    for depth in range(1, max(len(pa), len(pb))):
        x = pa[depth] if depth < len(pa) else None
        y = pb[depth] if depth < len(pb) else None
        if x is not None and y is not None:
            out += [(x, y), (y, x)] if x != y else [(x, y)]
    return out


@dataclass(frozen=True, slots=True)
class Calibration:
    """One repository's recalibration of the shipped model, fitted on its own record (`plan.record`)."""

    a: float = 1.0
    b: float = 0.0
    escape: tuple[tuple[str, str, float], ...] = ()
    """(kind of claim, kind of path, factor) for the kinds of `CLASSES`: what the estimated chance of
    touching such a path outside such a claim (its most likely file's kind) is multiplied by, so that over
    the record it adds up to what happened (1 when not fitted). A docs change rarely touches the code."""
    rest: float = 0.0
    """The chance of touching one given file that no evidence, co-change or spill points at."""
    changes: int = 0
    """Replayed changes it was fitted on."""
    escapes: int = 0
    """Files those changes touched outside their claims."""
    areas: tuple[tuple[str, str, int, int], ...] = ()
    """(area, area, pairs, met): of the pairs of replayed changes near each other in the record whose
    claims were disjoint, with their areas (most likely files' directories) under these two directories
    (as deep as `AREA_DEPTH`; ROOT for all): how many, and how many touched a common path anyway."""
    merges: tuple[tuple[str, int, int], ...] = ()
    """(area, pairs, would not merge): of the pairs of past changes near each other that touched a common file
    in this area (`plan.merges`; ROOT for all), how many, and how many the landing could not have merged."""
    meet: tuple[float, float] = (1.0, 0.0)
    """(a, b): the shipped model's log-odds z that two jobs meet (`core.risk.pair_logit`) says sigmoid(a z + b)
    here: fitted on the record's later changes, estimated from its earlier ones, against what they really
    touched (`plan.record`; the identity when not fitted)."""
    points: tuple[tuple[float, bool], ...] = ()
    """What `meet` was fitted on: per pair of the record's later changes, the shipped model's log-odds that they
    meet and whether they did (kept, so that the daemon's own outcomes refit it without a replay)."""
    unknown: str = ""
    """Why the record cannot estimate the risk (too few pairs to check it against): its jobs run alone."""
    disjoint: tuple[int, int] = (0, 0)
    """(met, would not merge): of the pairs `meet` was checked on (claims disjoint: the pairs admission weighs) that
    met, how many, and how many would not have merged (the daemon's own settled pairs after the record's). Such
    meetings are at a claim's edge, not in its middle: they merge more often than the `merges` table's pairs, which
    counts every pair that touched a common file. `nonmerge` rescales its table by them."""
    checked: tuple[tuple[float, bool], ...] = ()
    """Per pair `meet` was checked on (the daemon's settled pairs after the record's): the risk the calibration
    estimated for it before its map (`scale`), and whether it would not have merged."""
    scale: tuple[tuple[float, float], ...] = ()
    """The map from that estimate to the share of such pairs that would not merge (`plan.riskmap.fit` on `checked`,
    `plan.record.checking`): what `core.risk` makes of a pair's estimate in this repository."""
    blind: tuple[int, int] = (0, 0)
    """(pairs, met): of the record's pairs of changes near each other where one's message named nothing of the
    repository, how many, and how many touched a common path: the chance a job whose text names nothing meets
    another (`blind_meet`)."""

    @property
    def pairs(self) -> int:
        """Pairs `meet` was fitted on."""
        return len(self.points)

    @property
    def floor(self) -> float:
        """The least chance that two of the repository's jobs meet: of its pairs in `points` (the daemon's own
        settled pairs after the record's) whose chance of meeting, as `meet` rescales it, is at most `FLOOR_BAND`
        times `core.risk.MEET_FLOOR` (the pairs nothing connects), how many met anyway, pulled towards
        `MEET_FLOOR` by `FLOOR_WEIGHT` pseudo-pairs. Where unrelated changes meet more often than the shipped
        floor says (a shared module, a manifest, a release), no two jobs are taken to be less likely to meet."""
        a, b = self.meet
        low = [met for z, met in self.points if sigmoid(a * z + b) <= FLOOR_BAND * MEET_FLOOR]
        return (sum(low) + FLOOR_WEIGHT * MEET_FLOOR) / (len(low) + FLOOR_WEIGHT)

    @property
    def blind_meet(self) -> float:
        """The chance that a job whose text names nothing meets another job: how often the record's pairs with such a
        change met (`blind`), pulled towards the repository's floor by `FLOOR_WEIGHT` pseudo-pairs, and taken one
        standard deviation high (no claim narrows it: it is the repository's base rate)."""
        n, k = self.blind
        rate = (k + FLOOR_WEIGHT * max(self.floor, MEET_FLOOR)) / (n + FLOOR_WEIGHT)
        return min(1.0, rate + math.sqrt(rate * (1.0 - rate) / (n + FLOOR_WEIGHT + 1.0)))

    def probability(self, z: float) -> float:
        return sigmoid(self.a * z + self.b)

    def toward_shipped(self, long: float) -> Calibration:
        """This calibration applied to a text `long` (0 to 1) long: a record of commit messages says less of a
        ticket's probabilities the longer the ticket, and nothing at 1 (the shipped model, fitted on tickets)."""
        if long <= 0:
            return self
        w = 1.0 - min(1.0, long)
        escape = tuple((c, t, k**w) for c, t, k in self.escape)
        return replace(self, a=1.0 + (self.a - 1.0) * w, b=self.b * w, escape=escape)

    def meets(self, area: str) -> tuple[tuple[str, float], ...]:
        """For a job in `area`: per area of the record, the estimated chance it meets a job there (ROOT:
        anywhere). Each level's rate is pulled towards its parent's by `AREA_PRIOR` pseudo-pairs.

        Two changes in sibling areas meet far less often than two in one: for each of the job's enclosing
        areas `p` (ROOT too), `p/*` (`*`) is the rate of the pairs in different areas just below it, which
        answers for a sibling area the table does not list (`core.risk.Escapes.meeting`), and is the prior
        of the siblings it lists."""
        if not self.areas:
            return ()
        table = {(x, y): (n, k) for x, y, n, k in self.areas}
        mine = prefixes(area)
        out: dict[str, float] = {}
        n0, k0 = table.get(("", ""), (0, 0))
        out[""] = (k0 + 0.5) / (n0 + 1.0)
        parent = {"": out[""]}
        own = out[""]  # the rate of two changes in the job's area at this level (its parent's, if unlisted)
        for depth in range(1, len(mine)):
            a, up_a = mine[depth], mine[depth - 1]
            apart = [
                nk for (x, y), nk in table.items() if x != y and x.count("/") == depth - 1 and _up(x) == _up(y) == up_a
            ]
            n1, k1 = sum(n for n, _ in apart), sum(k for _, k in apart)
            siblings = (k1 + AREA_PRIOR * own) / (n1 + AREA_PRIOR)
            out[f"{up_a}/*" if up_a else "*"] = siblings
            level: dict[str, float] = {}
            for (x, y), (n, k) in table.items():
                if x == a and y.count("/") == depth - 1 and y:
                    if y == a:
                        up = own
                    elif _up(y) == up_a:
                        up = siblings
                    else:
                        up = parent.get(_up(y), siblings)
                    level[y] = (k + AREA_PRIOR * up) / (n + AREA_PRIOR)
            out.update(level)
            parent = level
            own = level.get(a, own)
        return tuple(sorted(out.items()))

    def nonmerge(self, area: str) -> float:
        """The chance that a job in `area` that meets another job would not merge with it: the record's share for
        the area, each level pulled towards its parent's (ROOT's towards `NONMERGE_PRIOR`) by `AREA_PRIOR`
        pseudo-pairs, and taken one standard deviation high, as few pairs as the deepest level that has any
        (a record of a few dozen pairs says it only so closely: an estimate may err high, not low). The risk it
        makes with the chance of meeting is then mapped by the record's check of it (`scale`)."""
        table = {a: (n, k) for a, n, k in self.merges}
        rate, seen = NONMERGE_PRIOR, 0
        for level in prefixes(area):
            n, k = table.get(level, (0, 0))
            rate, seen = (k + AREA_PRIOR * rate) / (n + AREA_PRIOR), n or seen
        rate = min(1.0, rate * self.edge_share)
        return min(1.0, rate + NONMERGE_SD * math.sqrt(rate * (1.0 - rate) / (seen + AREA_PRIOR + 1.0)))

    @property
    def edge_share(self) -> float:
        """How much more (or less) often a meeting of two disjoint claims does not merge than the `merges` table's
        meetings (`disjoint` against ROOT's share, the former pulled towards the latter by `AREA_PRIOR` pairs)."""
        n0, k0 = next(((n, k) for a, n, k in self.merges if a == ""), (0, 0))
        root = (k0 + AREA_PRIOR * NONMERGE_PRIOR) / (n0 + AREA_PRIOR)
        n, k = self.disjoint
        return ((k + AREA_PRIOR * root) / (n + AREA_PRIOR)) / root

    def escaping(self, claim_class: str, path: str, p: float) -> float:
        """The calibrated chance that a job whose claim is of `claim_class` touches `path` beyond it, estimated `p`."""
        k = next((f for c, t, f in self.escape if c == claim_class and t == path_class(path)), 1.0)
        return min(1.0, k * p)

    def to_json(self) -> dict[str, object]:
        return {
            "a": round(self.a, 4),
            "b": round(self.b, 4),
            "areas": len(self.areas),
            "escape": {f"{c}->{t}": round(k, 4) for c, t, k in self.escape},
            "rest": round(self.rest, 6),
            "changes": self.changes,
            "escapes": self.escapes,
            "merges": len(self.merges),
            "nonmerge": round(self.nonmerge(""), 4),
            "meet": [round(self.meet[0], 4), round(self.meet[1], 4)],
            "pairs": self.pairs,
            "floor": round(self.floor, 4),
            "disjoint": list(self.disjoint),
            "blind": list(self.blind),
            "blind_meet": round(self.blind_meet, 4),
            "checked": [len(self.checked), sum(k for _, k in self.checked)],
            "scale": [[round(x, 5), round(y, 5)] for x, y in self.scale],
            **({"unknown": self.unknown} if self.unknown else {}),
        }

    def dump(self) -> dict[str, object]:
        """Everything, as JSON (`load` reads it back): what the daemon keeps of a repository's record."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> Calibration:
        """A calibration `dump` wrote (ValueError or KeyError on anything else)."""
        return cls(
            a=float(data["a"]),
            b=float(data["b"]),
            escape=tuple((str(c), str(t), float(k)) for c, t, k in data["escape"]),
            rest=float(data["rest"]),
            changes=int(data["changes"]),
            escapes=int(data["escapes"]),
            areas=tuple((str(x), str(y), int(n), int(k)) for x, y, n, k in data["areas"]),
            merges=tuple((str(a), int(n), int(k)) for a, n, k in data["merges"]),
            meet=(float(data["meet"][0]), float(data["meet"][1])),
            points=tuple((float(z), bool(met)) for z, met in data["points"]),
            unknown=str(data["unknown"]),
            disjoint=(int(data["disjoint"][0]), int(data["disjoint"][1])),
            blind=(int(data["blind"][0]), int(data["blind"][1])),
            checked=tuple((float(x), bool(k)) for x, k in data["checked"]),
            scale=tuple((float(x), float(y)) for x, y in data["scale"]),
        )


def _loss(points: list[tuple[float, bool]], a: float, b: float, prior: float) -> float:
    out = prior * ((a - 1.0) ** 2 + b * b) / 2
    for z, y in points:
        t = a * z + b
        out += math.log1p(math.exp(-abs(t))) + max(t, 0.0) - (t if y else 0.0)
    return out


def platt(points: list[tuple[float, bool]], prior: float = 25.0, steps: int = 40) -> tuple[float, float]:
    """Fit p = sigmoid(a z + b) to (z, touched) points: Newton's method with backtracking, pulled towards
    a = 1, b = 0 by a Gaussian prior of weight `prior` (a short record moves the model little)."""
    a, b = 1.0, 0.0
    loss = _loss(points, a, b, prior)
    for _ in range(steps):
        ga, gb = prior * (a - 1.0), prior * b
        haa, hab, hbb = prior, 0.0, prior
        for z, y in points:
            p = sigmoid(a * z + b)
            d = p - (1.0 if y else 0.0)
            w = max(p * (1 - p), 1e-9)
            ga += d * z
            gb += d
            haa += w * z * z
            hab += w * z
            hbb += w
        det = haa * hbb - hab * hab
        if det <= 0:
            break
        da = (hbb * ga - hab * gb) / det
        db = (haa * gb - hab * ga) / det
        step = 1.0
        while step > 1e-4:
            na, nb = a - step * da, b - step * db
            new = _loss(points, na, nb, prior)
            if new <= loss:
                break
            step /= 2
        else:
            break
        if loss - new < 1e-7:
            a, b = na, nb
            break
        a, b, loss = na, nb, new
    return a, b
