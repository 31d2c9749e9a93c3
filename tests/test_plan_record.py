"""A repository's record: the risk's two factors fitted on its own past changes, kept, and kept current."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.core import claims
from orchestrator.core.models import JobState, Policy, Risk
from orchestrator.core.risk import MEET_FLOOR, RISK_FLOOR, Escapes, mapped, pair_risk
from orchestrator.lab.bench import riskbins
from orchestrator.plan import record, riskmap
from orchestrator.plan.accuracy import Settled, outcomes
from orchestrator.plan.evidence import local_plan
from orchestrator.plan.history import History, mine
from orchestrator.plan.local import Records
from orchestrator.plan.score import FLOOR_WEIGHT, NONMERGE_PRIOR, Calibration
from orchestrator.store.sqlite import SqliteStore
from tests.conftest import git
from tests.test_plan_focus import shop  # noqa: F401  (the crafted repository with its 40 past changes)


def test_a_meetings_share_that_would_not_merge_is_its_areas_pulled_towards_the_repositorys() -> None:
    """With no record the share is the prior, a little high; a record of many clean meetings brings it down, an
    area of its own with a few more conflicts lifts it, and an area the record never met in has its parent's."""
    empty = Calibration()
    assert NONMERGE_PRIOR < empty.nonmerge("src/app") < NONMERGE_PRIOR + 0.2
    clean = Calibration(merges=(("", 200, 20), ("src", 150, 10), ("src/app", 10, 8)))
    assert clean.nonmerge("docs") < 0.2 < clean.nonmerge("src/app")
    assert clean.nonmerge("docs") == clean.nonmerge("") and clean.nonmerge("src/other") == clean.nonmerge("src")
    assert clean.nonmerge("src/app") > clean.nonmerge("src/other")


def test_meetings_of_disjoint_claims_rescale_the_share_that_would_not_merge() -> None:
    """The table counts every pair that touched a common file; of the pairs admission weighs (claims disjoint) that
    met, fewer (or more) would not merge: the share follows them, the more the more such pairs, in every area, and
    the daemon's own settled pairs count among them."""
    table = (("", 100, 60), ("src", 50, 35))
    plain = Calibration(merges=table)
    edge = Calibration(merges=table, disjoint=(40, 8))
    core = Calibration(merges=table, disjoint=(40, 36))
    for area in ("", "src", "docs"):
        assert edge.nonmerge(area) < plain.nonmerge(area) < core.nonmerge(area)
    assert Calibration(merges=table, disjoint=(400, 80)).nonmerge("src") < edge.nonmerge("src")
    assert plain.edge_share == 1.0
    got = record.refit(edge, [Settled(-3.0, True, True)] * 10 + [Settled(-3.0, False, True)] * 5)
    assert got.disjoint == (40 + 10, 8) and got.nonmerge("src") < edge.nonmerge("src")  # each counts once (RECENT)


def test_the_daemons_settled_pairs_count_as_one_record_pair_each() -> None:
    """A pair the daemon ran side by side weighs as much as one of the record's: weighed three times, the risk
    followed each busy or quiet period a period late on small repositories, where one is as often followed by the
    other, and ranked pairs the wrong way round."""
    table = (("", 100, 60),)
    c = Calibration(merges=table, disjoint=(40, 8), points=((-3.0, False),) * 60)
    got = record.refit(c, [Settled(-3.0, True, False, 0.05, 0.05)] * 10)
    assert got.disjoint == (50, 18) and dict((a, (n, k)) for a, n, k in got.merges)[""] == (110, 70)
    assert len(got.points) == 70 and len(got.checked) == 10


def test_the_record_maps_the_risk_it_estimates_to_what_its_own_pairs_did(shop: Path) -> None:  # noqa: F811
    """Over the record's later pairs (claims disjoint), each pair's estimate (before the map) is kept beside whether
    it would not have merged, and the map is fitted on them; the daemon's own settled pairs add theirs (`RECENT`
    times each, by the estimate before the map they were admitted on) and refit it."""
    head = git(shop, "rev-parse", "HEAD")
    full = record.fit(record.replay(shop, History(mine(shop, head)[0]).changes))
    assert full is not None and len(full.checked) >= record.MIN_PAIRS and full.scale == riskmap.fit(full.checked)
    assert Calibration.load(full.dump()) == full
    quiet = record.checking(Calibration(), [(0.02, False)] * 300)
    assert mapped(quiet.scale, 0.02) < 0.02
    got = record.refit(quiet, [Settled(-3.0, True, False, 0.01, 0.02)] * 60 + [Settled(-3.0, False, True, 0.01, 0.02)])
    assert len(got.checked) == 300 + record.RECENT * 61 and mapped(got.scale, 0.02) > 0.1
    old = record.refit(quiet, [Settled(-3.0, True, False, 0.01)] * 20)  # an event without the estimate before the map
    assert got.checked[300:303] == ((0.02, True),) * 3 and old.checked[300] == (0.01, True)


def test_the_map_is_monotone_pooled_where_the_estimate_does_not_rank_and_a_little_high() -> None:
    """An estimate that ranks pairs: the map follows it above the record's base rate, each bin a little above what
    happened (an upper bound); one that ranks them the wrong way round: its bins pool, near the base rate for every
    pair (pulled a little towards the estimate); a thin bin is pulled towards the estimate; no points, no map (the
    estimate itself)."""
    ranks = [(0.05, i < 15) for i in range(300)] + [(0.3, i < 90) for i in range(300)]
    knots = riskmap.fit(ranks)
    assert [x for x, _ in knots] == sorted(x for x, _ in knots) and [y for _, y in knots] == sorted(y for _, y in knots)
    assert mapped(knots, 0.3) > 0.3 and abs(mapped(knots, 0.001) - 0.175) < 1e-9  # the base rate, 105 of 600
    assert abs(mapped(knots, 0.4) - mapped(knots, 0.3) - 0.1) < 1e-9
    rates = ((0.03, 0.17), (0.08, 0.11), (0.15, 0.08), (0.3, 0.05))
    inverted = [(x, i < round(200 * rate)) for x, rate in rates for i in range(200)]
    knots = riskmap.fit(inverted)
    assert 0.1 < mapped(knots, 0.03) == mapped(knots, 0.08) < mapped(knots, 0.3) < 0.15  # 10.3% happened
    thin = [(0.02, i < 10) for i in range(500)] + [(0.5, True)] * 5  # five pairs at 50%, all bad: not 100%
    assert mapped(riskmap.fit(thin), 0.5) < 0.6
    assert riskmap.fit([]) == () and mapped((), 0.07) == 0.07


def test_no_bin_of_the_map_is_below_the_records_base_rate() -> None:
    """Pairs the record ranks below its base rate are mapped to the base rate (the share of all its checked pairs
    that would not merge), not to their own bin's: on a small repository the next period's quietest-looking pairs
    did not merge as often as its others."""
    ranks = [(0.02, i < 3) for i in range(300)] + [(0.2, i < 60) for i in range(300)]
    knots = riskmap.fit(ranks)
    base = 63 / 600
    assert abs(mapped(knots, 0.02) - base) < 1e-12 and mapped(knots, 0.001) == mapped(knots, 0.02)
    assert 0.2 < mapped(knots, 0.2) < 0.22


def test_a_pair_is_weighed_by_its_repositorys_map_and_never_below_the_shipped_floor() -> None:
    """With a map, the pair's risk is the map's value at the estimate (its chance of meeting kept, its share that
    would not merge what is left), the estimate itself kept as `raw`; never below the shipped `RISK_FLOOR`."""
    knots = ((0.015, 0.01), (0.1, 0.2))
    low = Risk(area="src", nonmerge=0.3, floor=0.05, scale=knots)  # 5% × 30% = 1.5%: mapped to 1%, floored at 3%
    pair = pair_risk(Escapes.of(low), ("src/a.py",), Escapes.of(Risk(area="docs", nonmerge=0.2)), ("docs/b.md",))
    assert pair.meet == MEET_FLOOR and abs(pair.raw - 0.015) < 1e-12 and abs(pair.risk - RISK_FLOOR) < 1e-12
    mid = Risk(area="src", nonmerge=0.8, floor=0.05, scale=knots)  # 4%: mapped to 1% + 0.19 × 25/85 = 6.6%
    pair = pair_risk(Escapes.of(mid), ("src/a.py",), None, ("docs/b.md",))
    assert abs(pair.risk - mapped(knots, 0.04)) < 1e-12 and abs(pair.risk - (0.01 + 0.19 * 0.025 / 0.085)) < 1e-12
    high = Risk(area="src", nonmerge=0.6, floor=0.2, scale=knots)  # 12%: 22% (2% above the last knot's 20%)
    pair = pair_risk(Escapes.of(high), ("src/a.py",), None, ("docs/b.md",))
    assert abs(pair.risk - 0.22) < 1e-12 and abs(pair.meet - 0.22) < 1e-12 and pair.nonmerge == 1.0  # above meeting
    assert Risk.from_json(high.to_json()) == high


def test_no_pair_is_estimated_below_the_risk_floor() -> None:
    """Two jobs whose chance to meet is at the floor, in areas where meetings mostly merge, are still estimated at
    the shipped `RISK_FLOOR`: below it the estimate tells no pairs apart."""
    quiet = Risk(area="src", nonmerge=0.3, floor=0.05)  # 5% × 30% = 1.5%
    pair = pair_risk(Escapes.of(quiet), ("src/a.py",), Escapes.of(Risk(area="docs", nonmerge=0.2)), ("docs/b.md",))
    assert pair.meet == MEET_FLOOR and abs(pair.risk - RISK_FLOOR) < 1e-12
    busy = Risk(area="src", nonmerge=0.9, floor=0.2)
    assert pair_risk(Escapes.of(busy), ("src/a.py",), None, ("docs/b.md",)).risk == 0.2 * 0.9


def test_a_text_naming_nothing_is_weighed_at_the_repositorys_base_rate(shop: Path) -> None:  # noqa: F811
    """A text that names nothing claims nothing; with a good record its risk beside any job is the rate at which the
    record's changes that named nothing met their neighbours (at least the floor), times the share that would not
    merge, and it is not ambiguous; with a thin record it runs alone."""
    head = git(shop, "rev-parse", "HEAD")
    history = History(mine(shop, head)[0])
    samples = record.replay(shop, history.changes)
    full = record.fit(samples)
    thin = record.fit(samples[-25:])
    assert full is not None and thin is not None and not full.unknown and thin.unknown
    policy = Policy(risk=0.08)
    vague = local_plan(shop, head, "make it faster", history, ("CHANGES*",), full)
    risk = vague.claim.risk
    assert not vague.claim.paths and risk is not None and [c for c, _ in vague.notes] == ["NamesNothing"]
    assert risk.floor == full.blind_meet >= full.floor and risk.nonmerge == full.nonmerge("")
    assert claims.ambiguity(vague.claim, policy) is None
    other = local_plan(shop, head, "Cart.total is wrong for a cart with a single item", history, ("CHANGES*",), full)
    pair = pair_risk(Escapes.of(risk), (), Escapes.of(other.claim.risk), other.claim.paths)
    assert pair.meet >= full.blind_meet and pair.raw >= full.blind_meet * full.nonmerge("")
    assert full.scale and abs(pair.risk - max(RISK_FLOOR, mapped(full.scale, pair.raw))) < 1e-12  # then the map
    alone = local_plan(shop, head, "make it faster", history, ("CHANGES*",), thin)
    assert alone.claim.risk is None and claims.ambiguity(alone.claim, policy) == "empty claim"
    busy = Calibration(blind=(100, 30))
    assert 0.25 < busy.blind_meet < 0.35 and Calibration(blind=(0, 0)).blind_meet > MEET_FLOOR
    assert Calibration(blind=(1000, 20)).blind_meet < 0.05


def test_a_calibration_is_dumped_and_loaded_whole() -> None:
    """What the daemon keeps of a record reads back equal, its pairs and merges included."""
    c = Calibration(
        a=0.8,
        b=-0.3,
        escape=(("source", "doc", 0.5),),
        rest=0.01,
        changes=120,
        escapes=40,
        areas=(("", "", 30, 2),),
        merges=(("", 12, 5), ("src", 4, 1)),
        meet=(0.9, -0.2),
        points=((-2.5, False), (-1.0, True)),
        unknown="",
        disjoint=(9, 3),
        blind=(40, 7),
        checked=((0.02, False), (0.05, True)),
        scale=((0.02, 0.03), (0.05, 0.06)),
    )
    assert Calibration.load(c.dump()) == c and c.pairs == 2
    with pytest.raises(KeyError):
        Calibration.load({"a": 1.0})


def test_a_record_too_thin_to_check_says_so_and_its_jobs_run_alone(shop: Path) -> None:  # noqa: F811
    """Of 40 replayed changes, the later ones are estimated from the earlier only and checked against what
    they touched: enough pairs, and the risk is known. Of the last 25, too few pairs: the calibration says why,
    and a plan with it has no risk (runs alone) and the note Uncalibrated."""
    head = git(shop, "rev-parse", "HEAD")
    history = History(mine(shop, head)[0])
    samples = record.replay(shop, history.changes)
    full = record.fit(samples)
    assert full is not None and not full.unknown and full.pairs >= record.MIN_PAIRS
    assert all(isinstance(z, float) and isinstance(met, bool) for z, met in full.points)
    thin = record.fit(samples[-25:])
    assert thin is not None and thin.pairs < record.MIN_PAIRS and "pairs of past changes" in thin.unknown
    text = "Cart.total is wrong for a cart with a single item\n\nThe total comes out as zero."
    known = local_plan(shop, head, text, history, ("CHANGES*",), full)
    unknown = local_plan(shop, head, text, history, ("CHANGES*",), thin)
    assert known.claim.risk is not None and known.claim.risk.nonmerge == full.nonmerge(known.claim.risk.area)
    assert unknown.claim.paths == known.claim.paths and unknown.claim.risk is None
    assert [c for c, _ in unknown.notes] == ["Uncalibrated"]


def test_the_daemons_own_outcomes_refit_the_risk() -> None:
    """Pairs the daemon ran side by side that met although estimated unlikely raise the chance of meeting it
    gives such pairs; those that met and would not merge raise the repository's share; a thin record becomes
    known once enough pairs are in."""
    c = Calibration(points=tuple((-3.0, False) for _ in range(30)), unknown="too few pairs")
    assert record.refit(c, []) is c
    met = [Settled(-3.0, True, False)] * 10 + [Settled(-3.0, False, True)] * 10
    got = record.refit(c, met)
    assert got.meet[0] * -3.0 + got.meet[1] > c.meet[0] * -3.0 + c.meet[1]
    assert got.nonmerge("") > c.nonmerge("") and got.unknown == ""
    assert got.points == (*c.points, *((o.logit, o.met) for o in met))


def test_a_repositorys_floor_is_how_often_its_pairs_that_nothing_connected_met_anyway() -> None:
    """With no pairs the floor is the shipped one; of the record's pairs, those estimated at the floor that met
    raise it (those estimated likelier say nothing of it); the daemon's own settled pairs are kept after the
    record's and count too."""
    assert Calibration().floor == MEET_FLOOR
    low, high = -6.0, 0.0  # the shipped model's log-odds: far below the floor, and a sure 50%
    c = Calibration(points=((low, True),) * 25 + ((low, False),) * 75 + ((high, True),) * 100)
    assert abs(c.floor - (25 + FLOOR_WEIGHT * MEET_FLOOR) / (100 + FLOOR_WEIGHT)) < 1e-12
    quiet = Calibration(points=((low, False),) * 100 + ((high, True),) * 100)
    assert quiet.floor < MEET_FLOOR < c.floor
    own = Calibration(points=(*quiet.points, *((low, True),) * 50))
    assert got_floor(own) > 0.25 > got_floor(quiet)
    got = record.refit(quiet, [Settled(low, True, False)] * 50)
    assert got.points == own.points and got_floor(got) > 0.25  # the rescaling itself lifts them now
    assert Calibration.load(own.dump()).floor == own.floor


def got_floor(c: Calibration, z: float = -6.0) -> float:
    """The chance of meeting a pair at log-odds `z` is given (`core.risk.pair_risk`, one job's record)."""
    a, b = c.meet
    return max(MEET_FLOOR, c.floor, 1 / (1 + math.exp(-(a * z + b))))


@dataclasses.dataclass(frozen=True)
class _Job:
    id: int
    repo: str
    state: JobState
    actual: frozenset[str]


def test_settled_pairs_are_those_of_two_ended_jobs_met_by_their_paths_unmerged_by_their_conflicts() -> None:
    """Job 2 ran beside 1 (they touched a.py: met; 2's landing conflicted there: did not merge) and beside 3
    (a changelog only: did not meet); job 4 ran beside 5, still running: not settled yet."""
    jobs = [
        _Job(1, "r", JobState.LANDED, frozenset({"a.py"})),
        _Job(2, "r", JobState.LANDED, frozenset({"a.py", "CHANGES.rst"})),
        _Job(3, "r", JobState.LANDED, frozenset({"CHANGES.rst", "b.py"})),
        _Job(4, "s", JobState.LANDED, frozenset({"c.py"})),
        _Job(5, "s", JobState.RUNNING, frozenset({"c.py"})),
    ]
    risk = {"meet": 0.1, "nonmerge": 0.5, "risk": 0.05}
    admitted = [
        (2, {"risks": [{"job": 1, "logit": -2.0, **risk}, {"job": 3, "logit": -2.5, **risk}]}),
        (4, {"risks": [{"job": 5, "logit": -2.0, **risk}]}),
        (1, {}),
    ]
    conflicts = [(2, {"conflicts": ["a.py"], "code": "Conflict"})]
    got = outcomes(jobs, admitted, conflicts, ("CHANGES*",))
    assert got == {"r": [Settled(-2.0, True, False, 0.05), Settled(-2.5, False, True, 0.05)]}  # risk: meet × no merge
    assert claims.PathIndex({"a.py"}).meeting({"a.py"})  # the rule the outcomes read paths by


async def test_a_record_is_kept_in_the_store_and_read_back_by_a_restarted_daemon(
    shop: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first plan in a repository builds its record (off the event loop) and keeps it; a new `Records` on the
    same store (a restarted daemon) reads it back instead of replaying; outcomes observed refit it."""
    head = git(shop, "rev-parse", "HEAD")
    history = History(mine(shop, head)[0], tip=head)
    store = await SqliteStore.open(tmp_path / "state.db")
    try:
        first = await Records(("CHANGES*",), store=store).at(str(shop), history)
        assert first is not None and (await store.plans.record(str(shop))) is not None
        built: list[object] = []
        monkeypatch.setattr(record, "build", lambda *a, **k: built.append(a))
        again = Records(("CHANGES*",), store=store)
        assert await again.at(str(shop), history) == first and built == []
        again.observe({str(shop): [Settled(-2.0, True, False)] * 20})
        refit = await again.at(str(shop), history)
        assert refit is not None and refit.nonmerge("") > first.nonmerge("") and built == []
    finally:
        await store.close()


def test_calibration_bins_report_an_interval_and_judge_only_bins_of_enough_pairs() -> None:
    """Each bin: how many, mean estimate, how often, its Wilson interval; a bin of 50+ pairs above 1.5 times its
    estimate breaks the floor, a smaller one is shown but not judged."""
    points = [(0.02, i < 2) for i in range(100)] + [(0.1, i < 3) for i in range(10)]
    table = riskbins.bins(points)
    low, high = table
    assert (low["pairs"], low["happened"], low["judged"], low["holds"]) == (100, 2, True, True)
    assert low["interval"][0] < 0.02 < low["interval"][1] and not high["judged"] and high["holds"] is None
    assert riskbins.holds(table)
    worse = riskbins.bins([(0.02, i < 4) for i in range(100)])
    assert not riskbins.holds(worse) and "ABOVE 1.5x" in riskbins.lines(worse)[0]
    assert riskbins.wilson(0, 0) == (0.0, 1.0)


def test_no_record_no_risk(make_repo: Callable[..., Path]) -> None:
    """A repository of a handful of changes has no record: no calibration at all."""
    repo = make_repo()
    history = History(mine(repo, "HEAD")[0])
    assert record.build(repo, history.changes) is None
