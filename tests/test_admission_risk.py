"""Admission on measured risk: disjoint claims run side by side only when the estimated risk that they make a conflict
the landing cannot merge is small."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.admission import decide, decide_all
from orchestrator.core.claims import overlaps
from orchestrator.core.models import Claim, ClaimSource, JobView, Outcome, Policy, Reason, Risk, Snapshot, risk_json
from orchestrator.core.risk import KNOWN, MEET_FLOOR, Escapes, pair_logit, pair_risk, raw_meet
from tests.test_admission_properties import BRANCHES, CLAIMABLE, FILES, REPOS, World, held

RISKY = Policy(max_concurrent=8, per_repo=8, risk=0.03)


NONMERGE = 0.4
"""A record's share of meetings that would not merge, for the jobs of these tests."""


def evidence(
    i: int, paths: set[str], near: dict[str, float] | None, rest: float = 0.0, repo: str = "r", kind: str = ""
) -> JobView:
    risk = None if near is None else Risk(tuple(sorted(near.items())), rest, nonmerge=NONMERGE, kind=kind)
    return JobView(i, repo, "main", Claim(frozenset(paths), 0.3, ClaimSource.EVIDENCE, risk))


def test_the_estimate_sums_what_each_may_touch_of_the_other() -> None:
    """A's chance of touching what B holds, B's of touching what A claims, and both touching one path combine."""
    a = Escapes.of(Risk((("src/b.py", 0.02), ("lib/", 0.01)), 0.001))
    b = Escapes.of(Risk((("src/a.py", 0.01), ("lib/x.py", 0.1)), 0.0))
    assert a is not None and b is not None
    assert a.at("src/b.py") == 0.02 and a.at("lib/y.py") == 0.01 and a.at("docs/x.md") == 0.001
    assert a.at("src/") == 0.02  # a directory holds what is listed under it
    expected = 1 - (1 - 0.02) * (1 - 0.01) * (1 - 0.0)
    assert abs(raw_meet(a, ["src/a.py"], b, ["src/b.py"]) - expected) < 1e-9
    assert pair_risk(None, ["src/a.py"], None, ["src/b.py"]).risk == 0.0


def test_the_estimate_is_the_larger_of_files_and_areas() -> None:
    """Disjoint files with small chances are estimated higher when the record says their areas often met; a job
    without an estimate is weighed by the other's record of meeting the areas of its paths."""
    meets = (("", 0.01), ("docs", 0.02), ("src", 0.08))
    a = Escapes.of(Risk((("src/b.py", 0.001),), 0.0, "src", meets))
    b = Escapes.of(Risk((), 0.0, "docs", (("", 0.01), ("src", 0.02))))
    assert a is not None and b is not None
    assert abs(raw_meet(a, ["src/a.py"], b, ["docs/x.md"]) - 0.02) < 1e-9  # a's record of docs, b's of src
    c = Escapes.of(Risk((), 0.0, "src", meets))
    assert abs(raw_meet(a, ["src/a.py"], c, ["src/c.py"]) - 0.08) < 1e-9
    assert abs(raw_meet(None, ["src/d.py"], a, ["src/a.py"]) - 0.08) < 1e-9  # a declared claim's area: src


def test_the_risk_is_the_chance_of_meeting_times_the_chance_such_a_meeting_would_not_merge() -> None:
    """The shipped model turns the estimate into the chance of meeting (never below the floor), each repository's
    record rescales it (the larger of the two jobs' rescalings counts), and the larger of the two jobs' shares of
    meetings that would not merge multiplies it. A job claiming a test file first is likelier to meet; a change of
    a known kind (a dependency update) less."""
    near = (("src/b.py", 0.3),)
    a = Escapes.of(Risk(near, 0.0, "src", nonmerge=0.3))
    b = Escapes.of(Risk((), 0.0, "src", nonmerge=0.5))
    assert a is not None and b is not None
    r = pair_risk(a, ["src/a.py"], b, ["src/b.py"])
    z = pair_logit(0.3, ("", ""))
    assert abs(r.logit - z) < 1e-12 and abs(r.meet - 1 / (1 + math.exp(-z))) < 1e-12
    assert r.nonmerge == 0.5 and abs(r.risk - r.meet * 0.5) < 1e-12
    assert str(r) == f"{r.risk:.1%} (meet {r.meet:.1%} \u00d7 no merge 50%)"
    far = Escapes.of(Risk((("src/b.py", 1e-6),), 0.0, "src", nonmerge=0.5))
    assert pair_risk(far, ["src/a.py"], b, ["src/b.py"]).meet == MEET_FLOOR
    rescaled = Escapes.of(Risk(near, 0.0, "src", nonmerge=0.3, meet=(1.0, 1.0)))
    assert pair_risk(rescaled, ["src/a.py"], b, ["src/b.py"]).meet > r.meet  # this repository met more
    assert pair_logit(0.3, ("test", "source")) > z > pair_logit(0.3, (KNOWN, "source"))


def test_no_two_jobs_are_less_likely_to_meet_than_their_repositorys_floor() -> None:
    """A repository whose pairs that nothing connected met 15% of the time anyway: two of its jobs the evidence
    puts far apart are still 15% likely to meet (6% risky at a share of 40% that would not merge), and wait at
    plan.risk 3%; the floor of either job counts, and one below the shipped floor changes nothing."""
    far = {"src/b.py": 1e-4}
    active = evidence(4, {"src/a.py"}, {"src/b.py": 1e-4})
    plain = evidence(5, {"src/b.py"}, {"src/a.py": 1e-4})
    r = pair_risk(Escapes.of(plain.claim.risk), ["src/b.py"], Escapes.of(active.claim.risk), ["src/a.py"])
    assert r.meet == MEET_FLOOR and r.risk <= RISKY.risk + 1e-12
    assert decide(plain, Snapshot(active=(active,), waiting=(plain,), policy=RISKY)).admitted
    risk = Risk(tuple(far.items()), 0.0, nonmerge=NONMERGE, floor=0.15)
    floored = JobView(6, "r", "main", Claim(frozenset({"src/b.py"}), 0.3, ClaimSource.EVIDENCE, risk))
    r = pair_risk(Escapes.of(risk), ["src/b.py"], Escapes.of(active.claim.risk), ["src/a.py"])
    assert r.meet == 0.15 and abs(r.risk - 0.15 * NONMERGE) < 1e-12
    d = decide(floored, Snapshot(active=(active,), waiting=(floored,), policy=RISKY))
    assert (d.outcome, d.reason, d.blocking) == (Outcome.DEFER, Reason.RISK, (4,))
    assert pair_risk(Escapes.of(active.claim.risk), ["src/a.py"], Escapes.of(risk), ["src/b.py"]).meet == 0.15
    low = Escapes.of(Risk(tuple(far.items()), 0.0, nonmerge=NONMERGE, floor=0.01))
    assert pair_risk(low, ["src/b.py"], Escapes.of(active.claim.risk), ["src/a.py"]).meet == MEET_FLOOR
    assert Risk.from_json(risk.to_json()) == risk


def test_low_risk_runs_beside_high_risk_waits_unknown_runs_alone() -> None:
    """A risk within plan.risk is admitted beside the active job, with both factors; above it the job waits with
    code Risk; a local claim without an estimate runs alone; plan.risk = 0 judges the same claims by confidence.
    The decision carries the risk beside each active job it was weighed against."""
    active = evidence(4, {"src/a.py"}, {"src/b.py": 0.002}, 0.001)
    low = evidence(5, {"src/b.py"}, {"src/a.py": 0.001}, 0.001)
    r = pair_risk(Escapes.of(low.claim.risk), ["src/b.py"], Escapes.of(active.claim.risk), ["src/a.py"])
    assert r.risk <= RISKY.risk
    d = decide(low, Snapshot(active=(active,), waiting=(low,), policy=RISKY))
    assert d.admitted and f"risk {r} \u2264 3.0%: beside job 4" in d.message
    assert d.risks == ((4, r.logit, r.meet, r.nonmerge, r.raw),)
    assert d.to_json()["risks"] == [risk_json(4, r.logit, r.meet, r.nonmerge, r.raw)]
    high = evidence(6, {"src/b.py"}, {"src/a.py": 0.3}, 0.001)
    d = decide(high, Snapshot(active=(active,), waiting=(high,), policy=RISKY))
    assert (d.outcome, d.reason, d.blocking) == (Outcome.DEFER, Reason.RISK, (4,))
    assert " no merge 40%) > 3.0% beside job 4" in d.message and d.risks and d.risks[0][0] == 4
    unknown = evidence(7, {"lib/x.py"}, None)
    d = decide(unknown, Snapshot(active=(active,), waiting=(unknown,), policy=RISKY))
    assert d.reason is Reason.AMBIGUOUS and "risk unknown" in d.message and d.risks == ()
    d = decide(unknown, Snapshot(waiting=(unknown,), policy=RISKY))
    assert d.admitted and "admitted to run alone (risk unknown" in d.message
    strict = Policy(max_concurrent=8, per_repo=8, risk=0.0)  # confidence 0.3 < 0.5: ambiguous, as before
    d = decide(low, Snapshot(active=(active,), waiting=(low,), policy=strict))
    assert not d.admitted and any("confidence 0.30 below 0.50" in c.detail for c in d.checks)


def test_a_later_job_does_not_overtake_an_earlier_one_it_is_risky_beside() -> None:
    """Two waiting jobs, disjoint but risky together: the later one waits for the earlier one (Priority)."""
    first = evidence(1, {"src/a.py"}, {"src/b.py": 0.2}, 0.001)
    second = evidence(2, {"src/b.py"}, {}, 0.001)
    blocker = evidence(3, {"src/a.py"}, {}, 0.0)
    decisions = {d.job_id: d for d in decide_all(Snapshot(active=(blocker,), waiting=(first, second), policy=RISKY))}
    assert decisions[1].reason is Reason.OVERLAP
    assert decisions[2].reason is Reason.PRIORITY and decisions[2].blocking == (1,)


@st.composite
def risky_jobs(draw: st.DrawFn) -> list[JobView]:
    """Local-evidence jobs with random claims and random estimates (some unknown)."""
    jobs = []
    for i in range(1, draw(st.integers(1, 8)) + 1):
        paths = draw(
            st.frozensets(st.sampled_from(CLAIMABLE), min_size=draw(st.sampled_from((0, 1, 1, 1))), max_size=3)
        )
        risk = None
        if draw(st.sampled_from((True, True, True, False))):
            near = draw(
                st.dictionaries(st.sampled_from(FILES), st.sampled_from((0.001, 0.01, 0.02, 0.05, 0.3)), max_size=3)
            )
            rest = draw(st.sampled_from((0.0, 0.001, 0.01)))
            risk = Risk(tuple(sorted(near.items())), rest, nonmerge=draw(st.sampled_from((0.2, 0.4))))
        jobs.append(
            JobView(
                id=i,
                repo=draw(st.sampled_from(REPOS)),
                branch=draw(st.sampled_from(BRANCHES)),
                claim=Claim(paths, 0.3, ClaimSource.EVIDENCE, risk),
                priority=draw(st.integers(0, 2)),
            )
        )
    return jobs


def _risk(x: JobView, y: JobView, policy: Policy) -> float:
    """Oracle: the pair risk, from the counted paths of each."""
    return pair_risk(Escapes.of(x.claim.risk), held(x, policy), Escapes.of(y.claim.risk), held(y, policy)).risk


@settings(max_examples=80, deadline=None)
@given(
    jobs=risky_jobs(), events=st.lists(st.tuples(st.sampled_from(("admit", "finish", "escape")), st.integers(0, 63)))
)
def test_risk_admission_never_runs_overlapping_claims_or_unknown_risk_together(
    jobs: list[JobView], events: list[tuple[str, int]]
) -> None:
    """Under any events: no two active jobs of a repo overlap, a claim with unknown risk is never active beside
    another job of its repo (an empty one with a risk, a text naming nothing, may be), every job admitted beside
    others was within plan.risk of each, and all run."""
    world = World(jobs, RISKY)
    for kind, k in [*events, *[("admit", 0), ("finish", 0)] * (len(jobs) + 1)]:
        if kind == "admit":
            before = dict(world.active)
            decisions = world.admit()
            started = [world.active[d.job_id] for d in decisions if d.admitted]
            for j in started:  # each was within the risk of every job active when it was decided
                others = [o for o in (*before.values(), *started) if o.repo == j.repo and o.id != j.id]
                others = [o for o in others if o.id in before or o.id < j.id]
                assert all(_risk(j, o, RISKY) <= RISKY.risk + 1e-12 for o in others), (j, others)
            for repo in REPOS:
                mine = [j for j in world.active.values() if j.repo == repo]
                if len(mine) > 1:
                    assert all(j.claim.risk is not None for j in mine), mine  # an empty claim: the base rate
                for x, y in itertools.combinations(mine, 2):
                    assert not any(overlaps(p, q) for p in held(x, RISKY) for q in held(y, RISKY))
        elif kind == "finish":
            world.finish(k)
        else:
            world.touch(k, escape=True)
    assert not world.waiting and not world.active


def test_a_later_job_fills_a_slot_while_an_earlier_risky_one_is_held_back_by_an_earlier_job() -> None:
    """A later job at risk beside an earlier waiting job starts while an active job queued before that one
    holds it back anyway; once only jobs that started after it hold it back, nothing more overtakes it."""
    blocker = evidence(1, {"src/a.py"}, {}, 0.0)
    first = evidence(2, {"src/a.py", "src/c.py"}, {"src/b.py": 0.2, "src/d.py": 0.2}, 0.001)
    second = evidence(3, {"src/b.py"}, {}, 0.001)
    d = {x.job_id: x for x in decide_all(Snapshot(active=(blocker,), waiting=(first, second), policy=RISKY))}
    assert d[2].reason is Reason.OVERLAP and d[3].admitted
    assert any("starts before job 2 (at risk beside it)" in c.detail for c in d[3].checks)
    third = evidence(4, {"src/d.py"}, {}, 0.001)
    d = {x.job_id: x for x in decide_all(Snapshot(active=(second,), waiting=(first, third), policy=RISKY))}
    assert d[2].reason is Reason.RISK and d[2].blocking == (3,)
    assert d[4].reason is Reason.PRIORITY and d[4].blocking == (2,)


def at(i: int, path: str, risk: float, repo: str = "r") -> JobView:
    """A job claiming `path` whose risk beside any other job of these tests is `risk`: nothing connects them, and
    its repository's pairs meet 10% of the time anyway, `risk / 0.1` of such meetings not merging."""
    r = Risk(((f"elsewhere/{i}.py", 1e-6),), 0.0, nonmerge=risk / 0.1, floor=0.1)
    return JobView(i, repo, "main", Claim(frozenset({path}), 0.3, ClaimSource.EVIDENCE, r))


def test_plan_risk_bounds_each_pair_not_their_sum() -> None:
    """plan.risk bounds a job's risk beside each active job: beside two jobs at 5% it starts at 8% (bounding
    their sum instead, measured on seen repositories, queued pairs at the 3% floor: the median makespan went
    from 0.65x to 0.80x one-per-repo for the same re-runs); beside one at 9% it waits for that one."""
    policy = Policy(max_concurrent=8, per_repo=8, risk=0.08)
    job = at(9, "src/z.py", 0.05)
    two = (at(1, "src/a.py", 0.05), at(2, "src/b.py", 0.05))
    d = decide(job, Snapshot(active=two, waiting=(job,), policy=policy))
    assert d.admitted and "risk 5.0% (meet 10.0% \u00d7 no merge 50%) \u2264 8.0%: beside job" in d.message
    assert len(d.risks) == 2
    risky = at(9, "src/z.py", 0.09)
    d = decide(risky, Snapshot(active=(*two, at(3, "src/c.py", 0.09)), waiting=(risky,), policy=policy))
    assert (d.outcome, d.reason) == (Outcome.DEFER, Reason.RISK) and d.blocking == (1, 2, 3)
    queue = decide_all(Snapshot(waiting=tuple(at(i, f"src/{i}.py", 0.03) for i in range(1, 7)), policy=policy))
    assert all(x.admitted for x in queue)
