"""Admission invariants under random job sets and random event orders (hypothesis)."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import event, given, settings
from hypothesis import strategies as st

from orchestrator.core.admission import decide, decide_all
from orchestrator.core.claims import ambiguity, overlaps, reaches, split_mergeable
from orchestrator.core.models import ROOT, Claim, ClaimSource, Decision, JobView, Outcome, Policy, Snapshot

# A small universe with every hard case: siblings sharing a prefix, a bare name and its directory, nested
# paths, a changelog (mergeable), a barrier and the root.
FILES = (
    "src/a.py",
    "src/ab.py",
    "src/sub/c.py",
    "lib/x.py",
    "lib/y.py",
    "tests/t.py",
    "docs/x.md",
    "README.md",
    "CHANGES.rst",
    "pyproject.toml",
)
CLAIMABLE = (*FILES, "src/", "src", "docs/", "lib/", ROOT)
REPOS = ("r1", "r2")
BRANCHES = ("main", "dev")
POLICIES = (
    Policy(max_concurrent=3, per_repo=2, barriers=("pyproject.toml",)),
    Policy(max_concurrent=8, per_repo=8, barriers=("pyproject.toml", "docs/*")),
    Policy(max_concurrent=1, per_repo=1),
)
SETTINGS = settings(max_examples=200, deadline=None)


PLACES = st.sampled_from((None, None, None, 0.5, 2.5, 3.0, 4.75, -1.0))
"""A job's place in the queue: mostly its id (None), sometimes moved between or before the others."""


@st.composite
def job_sets(draw: st.DrawFn, max_jobs: int = 8) -> list[JobView]:
    """Jobs 1..n with random claims; `after` only names earlier ids, so dependencies are acyclic."""
    jobs = []
    for i in range(1, draw(st.integers(1, max_jobs)) + 1):
        paths = draw(
            st.frozensets(st.sampled_from(CLAIMABLE), min_size=draw(st.sampled_from((0, 1, 1, 1))), max_size=3)
        )
        confidence = draw(st.sampled_from((0.3, *[0.9] * 7)))
        after = (
            draw(st.lists(st.integers(1, i - 1), max_size=2, unique=True))
            if i > 1 and draw(st.sampled_from((True, False, False)))
            else []
        )
        jobs.append(
            JobView(
                id=i,
                repo=draw(st.sampled_from(REPOS)),
                branch=draw(st.sampled_from(BRANCHES)),
                claim=Claim(paths, confidence, ClaimSource.MODEL),
                priority=draw(st.integers(0, 2)),
                after=tuple(sorted(after)),
                place=draw(PLACES),  # a person moved it (`switch`, `move --before`): its place is not its id
            )
        )
    return jobs


def held(job: JobView, policy: Policy) -> frozenset[str]:
    """Oracle: the counted paths a job holds (claim and actual, minus mergeable)."""
    return split_mergeable(job.claim.paths | job.actual, policy.mergeable, job.mergeable)[0]


def alone(job: JobView, policy: Policy) -> bool:
    """Oracle: the job must run alone in its repo."""
    touched = job.claim.paths | job.actual
    return ambiguity(job.claim, policy) is not None or any(reaches(p, policy.barriers) for p in touched)


def covered(job: JobView) -> list[str]:
    """Files inside the job's claim: what it may touch without escaping it."""
    return [f for f in FILES if any(c == ROOT or f == c or f.startswith(c.rstrip("/") + "/") for c in job.claim.paths)]


class World:
    """The scheduler's facts, moved by events; admission decides, the world carries decisions out."""

    def __init__(self, jobs: list[JobView], policy: Policy) -> None:
        self.policy = policy
        self.waiting = {j.id: j for j in jobs}
        self.active: dict[int, JobView] = {}
        self.landed: set[int] = set()
        self.admitted: set[int] = set()
        self.moved: dict[int, frozenset[str] | None] = {}
        self.landing: set[tuple[str, str]] = set()

    def snapshot(self) -> Snapshot:
        return Snapshot(
            active=tuple(self.active[i] for i in sorted(self.active)),
            waiting=tuple(self.waiting[i] for i in sorted(self.waiting)),
            moved=dict(self.moved),
            landing=frozenset(self.landing),
            landed=frozenset(self.landed),
            policy=self.policy,
        )

    def admit(self) -> list[Decision]:
        s = self.snapshot()
        decisions = decide_all(s)
        self.check_order(s, decisions)
        flipped = replace(
            s, active=s.active[::-1], waiting=s.waiting[::-1], moved=dict(reversed(list(s.moved.items())))
        )
        assert decide_all(flipped) == decisions
        for d in decisions:
            assert d.outcome is not Outcome.FAIL
            if d.admitted:
                self.active[d.job_id] = self.waiting.pop(d.job_id)
                self.admitted.add(d.job_id)
            elif d.outcome is Outcome.REPLAN:
                del self.moved[d.job_id]  # re-planned on the new head, same claim
        self.landing.clear()
        self.check()
        return decisions

    def check(self) -> None:
        assert len(self.active) <= self.policy.max_concurrent
        for repo in REPOS:
            jobs = [j for j in self.active.values() if j.repo == repo]
            assert len(jobs) <= self.policy.per_repo
            if len(jobs) > 1:
                assert not any(alone(j, self.policy) for j in jobs), jobs
            for x, y in itertools.combinations(jobs, 2):
                hx, hy = held(x, self.policy), held(y, self.policy)
                assert not any(overlaps(p, q) for p in hx for q in hy), (x, y)

    def check_order(self, s: Snapshot, decisions: list[Decision]) -> None:
        """No job overtakes an earlier ready waiting job of its repo that it conflicts with."""
        admitted = {d.job_id for d in decisions if d.admitted}
        ordered = sorted(s.waiting, key=lambda j: j.order_key)
        for k, b in enumerate(ordered):
            if b.id not in admitted:
                continue
            for e in ordered[:k]:
                if e.id in admitted or e.repo != b.repo or not all(i in self.landed for i in e.after):
                    continue
                he, hb = held(e, self.policy), held(b, self.policy)
                assert not alone(e, self.policy) and not alone(b, self.policy), (e, b)
                assert not any(overlaps(p, q) for p in he for q in hb), (e, b)

    def finish(self, k: int) -> None:
        if self.active:
            i = sorted(self.active)[k % len(self.active)]
            del self.active[i]
            self.landed.add(i)

    def touch(self, k: int, escape: bool) -> None:
        """An active job touches a file in its claim, or escapes into a path no other active job holds.

        Escapes never reach a barrier: a running job that does so breaks "runs alone" by itself, which
        admission cannot prevent (the scheduler is told and records it).
        """
        if not self.active:
            return
        j = self.active[sorted(self.active)[k % len(self.active)]]
        inside = covered(j)
        others = [p for o in self.active.values() if o.id != j.id and o.repo == j.repo for p in held(o, self.policy)]
        outside = [
            f
            for f in (*FILES, f"scratch/job{j.id}.py")
            if not reaches(f, self.policy.barriers) and not any(overlaps(f, p) for p in others)
        ]
        # Escaping into what a waiting job claims is the case that matters: prefer it.
        wanted = [c for w in self.waiting.values() if w.repo == j.repo for c in w.claim.paths]
        targets = [f for f in outside if any(overlaps(f, c) for c in wanted)] or outside
        choices = targets if escape or not inside else inside
        path = choices[k % len(choices)]
        self.active[j.id] = replace(j, actual=j.actual | {path})

    def move(self, k: int) -> None:
        """The branch of a waiting job moves: in some files, or in unknown paths."""
        if self.waiting:
            i = sorted(self.waiting)[k % len(self.waiting)]
            self.moved[i] = None if k % 5 == 0 else frozenset(f for n, f in enumerate(FILES) if (k >> n) & 1)

    def start_landing(self, k: int) -> None:
        self.landing.add((REPOS[k % 2], BRANCHES[(k // 2) % 2]))


EVENTS = st.lists(
    st.tuples(st.sampled_from(("admit", "finish", "touch", "escape", "move", "landing")), st.integers(0, 63))
)


@SETTINGS
@given(jobs=job_sets(), policy=st.sampled_from(POLICIES), events=EVENTS, finish_order=st.lists(st.integers(0, 63)))
def test_invariants_and_no_starvation(
    jobs: list[JobView], policy: Policy, events: list[tuple[str, int]], finish_order: list[int]
) -> None:
    """No two active jobs of a repo overlap, exclusive jobs run alone, and every job is admitted in the end."""
    world = World(jobs, policy)
    for kind, k in events:
        if kind == "admit":
            world.admit()
        elif kind == "finish":
            world.finish(k)
        elif kind in ("touch", "escape"):
            world.touch(k, escape=kind == "escape")
        elif kind == "move":
            world.move(k)
        else:
            world.start_landing(k)
    # Drain: no new jobs arrive, active jobs keep touching paths and finishing; everyone must get in.
    world.moved.clear()
    world.landing.clear()
    for step in range(4 * len(jobs) + 4):
        if not world.waiting and not world.active:
            break
        decisions = world.admit()
        if world.waiting and not world.active:
            raise AssertionError(f"starvation: nothing active, still waiting: {decisions}")
        k = finish_order[step % len(finish_order)] if finish_order else 0
        world.touch(k // 8, escape=k % 2 == 1)
        world.admit()
        world.finish(k)
    assert not world.waiting and world.admitted == {j.id for j in jobs}


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    """Any snapshot: random split into active and waiting, random facts, ids possibly unknown."""
    jobs = draw(job_sets(max_jobs=10))
    active = [j for j in jobs if draw(st.sampled_from((True, False, False)))]
    active = [
        replace(j, actual=frozenset(draw(st.lists(st.sampled_from((*FILES, "x/y")), max_size=2)))) for j in active
    ]
    ids = st.integers(1, 12)
    waiting = [j for j in jobs if j.id not in {a.id for a in active}]
    return Snapshot(
        active=tuple(active),
        waiting=tuple(waiting),
        moved=draw(st.dictionaries(ids, st.none() | st.frozensets(st.sampled_from(FILES), max_size=3), max_size=3)),
        landing=draw(st.frozensets(st.tuples(st.sampled_from(REPOS), st.sampled_from(BRANCHES)), max_size=1)),
        landed=draw(st.frozensets(ids, max_size=4)),
        dead=draw(st.frozensets(ids, max_size=2)),
        policy=draw(st.sampled_from(POLICIES)),
    )


@SETTINGS
@given(s=snapshots(), data=st.data())
def test_decisions_are_deterministic(s: Snapshot, data: st.DataObject) -> None:
    """Equal snapshots give equal decisions, whatever the order of their active and waiting tuples."""
    first = decide_all(s)
    assert [d.job_id for d in first] == [j.id for j in sorted(s.waiting, key=lambda j: j.order_key)]
    shuffled = replace(
        s, active=tuple(data.draw(st.permutations(s.active))), waiting=tuple(data.draw(st.permutations(s.waiting)))
    )
    assert decide_all(shuffled) == first
    assert decide_all(replace(s)) == first
    assert [decide(j, shuffled) for j in s.waiting] == [decide(j, s) for j in s.waiting]


@SETTINGS
@given(s=snapshots())
def test_decide_all_equals_decide_step_by_step(s: Snapshot) -> None:
    """decide_all decides each job as `decide` would with the jobs admitted before it made active."""
    active, waiting = list(s.active), list(s.waiting)
    for d, j in zip(decide_all(s), sorted(s.waiting, key=lambda j: j.order_key), strict=True):
        assert decide(j, replace(s, active=tuple(active), waiting=tuple(waiting))) == d
        if d.admitted:
            waiting.remove(j)
            active.append(j)


@SETTINGS
@given(s=snapshots())
def test_admission_is_safe_in_any_snapshot(s: Snapshot) -> None:
    """Whatever the active jobs hold (claims or stray actual paths), an admitted job meets none of them."""
    active = list(s.active)
    landed = s.landed
    for d in decide_all(s):
        if not d.admitted:
            continue
        job = next(j for j in s.waiting if j.id == d.job_id)
        assert all(i in landed for i in job.after) and (job.repo, job.branch) not in s.landing
        same = [a for a in active if a.repo == job.repo]
        assert not same or not (alone(job, s.policy) or any(alone(a, s.policy) for a in same)), (job, same)
        mine = held(job, s.policy)
        event(f"admitted beside {min(len(same), 2)}")
        for a in same:
            assert not any(overlaps(p, q) for p in mine for q in held(a, s.policy)), (job, a)
        assert len(active) < s.policy.max_concurrent and len(same) < s.policy.per_repo
        active.append(job)
