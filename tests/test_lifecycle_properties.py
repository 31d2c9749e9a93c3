"""The transition table and the decisions after a run, a landing and on a cancel, as properties.

The interleaving property drives the real store (a SQLite file, its compare-and-set transitions) with the
shell's pattern for every writer — read, decide with `core.lifecycle` / `core.admission`, write expecting what
was read — and lets hypothesis choose which writer takes its next step at every await point. Whatever the
order: no job that was cancelled or rejected lands (until it is retried), the branch holds exactly the landed
jobs, and no two jobs whose claims overlap are ever active at once.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestrator.core import admission, claims, lifecycle
from orchestrator.core.lifecycle import Cancel, Landed, LandingPolicy, RunEnd, Then
from orchestrator.core.models import (
    ACTIVE,
    ANY,
    CANCELLABLE,
    DEAD,
    DONE,
    ENDED,
    HELD,
    OPEN,
    RETRYABLE,
    WAITING,
    Claim,
    ClaimSource,
    JobState,
    Policy,
    Snapshot,
)
from orchestrator.git.outcomes import LandOutcome
from orchestrator.jobs.rounds import keeps_place
from orchestrator.store import Store
from orchestrator.store.sqlite import SqliteStore

STATES = list(JobState)


# -- the table and the groups ---------------------------------------------------------------------------


def test_every_group_is_named_once_and_they_partition_the_states():
    """Open, held and ended jobs partition the states; active and waiting jobs are open; landed never moves."""
    assert OPEN | ENDED == ANY and not OPEN & ENDED
    assert HELD <= ENDED and DEAD <= ENDED and DONE <= ENDED and {JobState.LANDED, JobState.UNCHANGED} == DONE
    assert ACTIVE | WAITING == OPEN and not ACTIVE & WAITING
    assert DEAD | HELD | {JobState.UNCHANGED} == RETRYABLE and CANCELLABLE == OPEN | HELD
    assert lifecycle.MOVES[JobState.LANDED] == frozenset()
    assert set(lifecycle.MOVES) == set(JobState)


@given(st.sets(st.sampled_from(STATES), min_size=1), st.sampled_from(STATES))
def test_check_allows_exactly_the_tables_moves(expect, to):
    """`check` accepts a move only when every expected state may move to the target."""
    ok = all(lifecycle.allowed(s, to) for s in expect)
    try:
        lifecycle.check(expect, to)
    except lifecycle.MoveError:
        assert not ok
    else:
        assert ok


def test_every_state_can_reach_an_end_and_only_retry_leaves_one():
    """From every state some path ends; out of an ended state the only move is back to the queue (or cancel), or
    for a failed or interrupted job a revision's wait for admission (`planned`)."""
    for s in STATES:
        seen, todo = {s}, [s]
        while todo:
            for nxt in lifecycle.MOVES[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert seen & ENDED, s
    for s in ENDED - HELD:
        revised = {JobState.PLANNED} if s is JobState.FAILED else set()
        assert lifecycle.MOVES[s] <= {JobState.QUEUED, *revised}
    assert lifecycle.MOVES[JobState.INTERRUPTED] == {JobState.QUEUED, JobState.CANCELLED, JobState.PLANNED}


@given(st.sampled_from(STATES), st.booleans())
def test_only_ready_jobs_and_stopped_jobs_with_a_kept_worktree_are_revised(state, kept):
    """A ready job runs again at once; a failed or interrupted one waits for admission, and only when its worktree is
    kept (else it is told to retry); no other state is revised; every revision's move is one the table allows."""
    how = lifecycle.on_revise(state, worktree_kept=kept)
    if state is JobState.READY:
        assert how is lifecycle.Revise.NOW and lifecycle.allowed(state, JobState.RUNNING)
    elif state in (JobState.FAILED, JobState.INTERRUPTED):
        assert how is (lifecycle.Revise.ADMIT if kept else lifecycle.Revise.NO_WORKTREE)
        assert lifecycle.allowed(state, JobState.PLANNED)
    else:
        assert how is lifecycle.Revise.NOT_NOW
    assert (how is not lifecycle.Revise.NOT_NOW) == (state in lifecycle.REVISABLE)


@given(st.booleans(), st.none() | st.integers(0, 3), st.booleans(), st.booleans())
def test_after_run_lands_only_a_change_and_fails_every_failure(ok, exit_code, changed, review):
    """A failed run fails; a run without changes is unchanged (nothing landed); a change is ready or landing."""
    step = lifecycle.after_run(RunEnd(7, ok, exit_code, None, "boom", changed, review, "/w"))
    assert step.expect == {JobState.RUNNING} and lifecycle.allowed(JobState.RUNNING, step.to)
    if not ok:
        assert step.to is JobState.FAILED and step.code in ("RunnerFailed", "TimedOut")
    elif not changed:
        assert step.to is JobState.UNCHANGED and step.code == "NoChanges"
    else:
        assert step.to is (JobState.READY if review else JobState.LANDING)


@given(st.sampled_from(list(Landed)), st.integers(0, 5), st.booleans(), st.integers(1, 5))
def test_after_landing_lands_only_what_landed(outcome, attempts, retry, max_attempts):
    """Only LANDED and NOOP end in `landed`; a conflict re-queues while attempts remain; a rewritten target
    always re-plans; a fault (or a remote's refusal) never lands; a lost race, or a fenced push, goes again."""
    then, to = lifecycle.after_landing(outcome, attempts, LandingPolicy(retry, max_attempts))
    assert (to is JobState.LANDED) == (outcome in (Landed.LANDED, Landed.NOOP))
    if to is not None:
        assert then is Then.END and lifecycle.allowed(JobState.LANDING, to)
    if outcome is Landed.REWRITTEN:
        assert to is JobState.QUEUED
    if outcome is Landed.CONFLICT:
        assert to is (JobState.QUEUED if retry and attempts + 1 < max_attempts else JobState.CONFLICTED)
    if outcome in (Landed.FAULT, Landed.REFUSED, Landed.NO_BRANCH):
        assert to is JobState.FAILED
    if outcome in (Landed.HEAD_MOVED, Landed.FENCED):
        assert (then, to) == (Then.AGAIN, None)


def test_the_lander_reads_every_way_a_landing_ends():
    """Every outcome a landing can end with, on a branch or on a shared remote, is one the lander reads, by the
    same value (it reads `Landed(str(outcome))`)."""
    assert {str(o) for o in LandOutcome} == {str(o) for o in Landed}


@given(st.sampled_from(STATES), st.booleans(), st.booleans())
def test_on_cancel_never_cancels_a_landing_under_way(state, task, landing_now):
    """A cancel stops a live task first, refuses while its landing holds the lock, and writes only what may move."""
    how = lifecycle.on_cancel(state, task=task, landing_now=landing_now)
    if task:
        assert how is Cancel.STOP_RUN
    elif state not in CANCELLABLE:
        assert how is Cancel.ENDED
    elif state is JobState.LANDING and landing_now:
        assert how is Cancel.LANDING_NOW
    else:
        assert lifecycle.allowed(state, JobState.CANCELLED)


# -- every writer, interleaved at every await point --------------------------------------------------------

PATHS = ("a.py", "b.py", "src/", "src/c.py")


class World:
    """The shell around the store, reduced to its decisions: which jobs have a task (the scheduler's `running`),
    which task was asked to stop, which job holds the landing lock, which landing tasks are alive, and what the
    branch holds."""

    def __init__(self, store: Store, policy: LandingPolicy, lives: dict[int, tuple[bool, bool, bool]]) -> None:
        self.store = store
        self.policy = policy
        self.lives = lives
        """Per job: how each of its runs goes (ok, changed, review)."""
        self.landing_now: set[int] = set()
        self.withdrawn: set[int] = set()
        self.running: set[int] = set()
        """Jobs whose task is alive, from its start (before it moves the job to `running`) to its end."""
        self.stops: dict[int, JobState] = {}
        """The state a task asked to stop writes (its job's cancel)."""
        self.branch: list[int] = []
        self.spawned: list[Step] = []
        """Writers started by others (an admitted job's task), for the driver to interleave too."""


Step = AsyncIterator[None]


LOOPS = 6
"""Rounds each daemon-side writer makes (it waits for its job between them, as the daemon's tasks do)."""


async def admitter(w: World) -> Step:
    """Scheduler rounds (one at a time), as `Scheduler._decide_round` makes them: the planned jobs and those that
    keep their place (one read), the planned ones split at once into those with a task (starting: active already)
    and the waiting ones; then the active jobs (another read); then the decision, and a task registered for each
    admitted job before anything else runs."""
    for _ in range(LOOPS):
        both = await w.store.jobs.all(HELD | {JobState.QUEUED, JobState.PLANNING, JobState.PLANNED})
        planned = [j for j in both if j.state is JobState.PLANNED]
        held = [j for j in both if keeps_place(j)]
        starting = [j for j in planned if j.id in w.running]
        waiting = [j for j in planned if j.id not in w.running]
        yield
        active = [*await w.store.jobs.all(ACTIVE), *starting]
        yield  # the snapshot's facts (heads, moves) are read
        snap = Snapshot(
            active=tuple(j.view() for j in active),
            waiting=tuple(j.view() for j in waiting),
            held=tuple(j.view() for j in held),
            policy=Policy(max_concurrent=4),
        )
        for job_id in [d.job_id for d in admission.decide_all(snap) if d.admitted]:
            w.running.add(job_id)  # `Scheduler._start`: the task is registered at once
            w.spawned.append(task(w, job_id))


async def task(w: World, job_id: int) -> Step:
    """An admitted job's task (`Scheduler._execute`, then `_carry`): it moves the job to `running` if the job is
    still planned, runs it, and ends the run the way it went; asked to stop, it writes the stop's state if it had
    moved the job to `running`. The job counts as starting until the task ends (`Scheduler._ran`), whatever the
    store says meanwhile."""
    try:
        yield  # `testhook.reach("admit")`: the task has not run yet
        if job_id in w.stops:
            return
        if await w.store.jobs.transition(job_id, {JobState.PLANNED}, JobState.RUNNING, "admitted") is None:
            return  # it left `planned` meanwhile: nothing ran
        yield  # the run
        stop = w.stops.get(job_id)
        if stop is not None:
            await w.store.jobs.transition(job_id, {JobState.RUNNING}, stop, str(stop))
            return
        ok, changed, review = w.lives[job_id]
        step = lifecycle.after_run(RunEnd(job_id, ok, 0 if ok else 1, None, "x", changed, review, "/w"))
        await w.store.jobs.transition(job_id, step.expect, step.to, step.event)
    finally:
        w.stops.pop(job_id, None)
        w.running.discard(job_id)


async def lander(w: World, job_id: int, outcome: Landed) -> Step:
    """The job's landing: queued (withdrawable), then under the lock (not cancellable) it moves the branch, then
    records what it did."""
    for _ in range(LOOPS):
        job = await w.store.jobs.get(job_id)
        yield
        if job is None or job.state is not JobState.LANDING or job_id in w.withdrawn:
            continue
        w.landing_now.add(job_id)
        try:
            current = await w.store.jobs.get(job_id)  # read again under the lock
            yield
            if current is None or current.state is not JobState.LANDING:
                continue
            if outcome in (Landed.LANDED, Landed.NOOP):
                w.branch.append(job_id)  # the ref moves
                yield
            _, to = lifecycle.after_landing(outcome, job.attempts, w.policy)
            if to is not None:
                done = await w.store.jobs.transition(job_id, {JobState.LANDING}, to, str(to))
                assert done is not None or to is not JobState.LANDED, f"job {job_id} is on the branch, not landed"
        finally:
            w.landing_now.discard(job_id)


async def cancel(w: World, job_id: int, rejecting: bool = False) -> Step:
    """A person's cancel (`Jobs.cancel`), or a review's reject: a job with a live task is stopped by its task
    (which writes `cancelled` if it had started), anything else cancellable is written `cancelled` expecting the
    state read."""
    stopped = False
    for _ in range(4):
        job = await w.store.jobs.get(job_id)
        yield
        if job is None:
            return
        if rejecting:
            if job.state is JobState.READY:
                await w.store.jobs.transition(job_id, {JobState.READY}, JobState.CANCELLED, "rejected")
            return
        if stopped and job.state is JobState.CANCELLED:
            return  # its task wrote it
        how = lifecycle.on_cancel(job.state, task=job_id in w.running, landing_now=job_id in w.landing_now)
        if how in (Cancel.ENDED, Cancel.LANDING_NOW):
            return
        if how is Cancel.STOP_RUN:
            w.stops[job_id] = JobState.CANCELLED
            while job_id in w.running:  # `Scheduler.stop_job` awaits the task's end
                yield
            stopped = True
            continue
        if how is Cancel.STOP_LANDING:
            w.withdrawn.add(job_id)
        if await w.store.jobs.transition(job_id, {job.state}, JobState.CANCELLED, "cancelled") is not None:
            return


async def approve(w: World, job_id: int) -> Step:
    job = await w.store.jobs.get(job_id)
    yield
    if job is not None and job.state is JobState.READY:
        await w.store.jobs.transition(job_id, {JobState.READY}, JobState.LANDING, "approved")


async def retry(w: World, job_id: int) -> Step:
    """`Jobs.retry`: an ended job back to the queue, once no task of it is alive (`Scheduler.settled`)."""
    job = await w.store.jobs.get(job_id)
    yield
    if job is None or job.state not in RETRYABLE:
        return
    while job_id in w.running:
        yield
    if await w.store.jobs.transition(job_id, {job.state}, JobState.QUEUED, "retried", attempts=job.attempts + 1):
        w.withdrawn.discard(job_id)


async def planner(w: World, job_id: int) -> Step:
    for _ in range(LOOPS):
        if await w.store.jobs.transition(job_id, {JobState.QUEUED}, JobState.PLANNING, "planning") is None:
            yield
            continue
        yield
        await w.store.jobs.transition(job_id, {JobState.PLANNING}, JobState.PLANNED, "planned")


Actor = Callable[[World], Step]
N_JOBS = 3


def _verb(kind: int, job_id: int) -> Actor:
    return [
        lambda w: cancel(w, job_id),
        lambda w: cancel(w, job_id, rejecting=True),
        lambda w: approve(w, job_id),
        lambda w: retry(w, job_id),
    ][kind]


lives = st.tuples(st.booleans(), st.booleans(), st.booleans(), st.sampled_from(list(Landed)))
"""Per job: how its run goes (ok, changed, review) and how its landing attempts end."""
verbs = st.tuples(st.integers(0, 3), st.integers(1, N_JOBS))
"""A person's verb (cancel, reject, land, retry) on one job."""


# Job 1 cancelled after a round read it planned, admitted on that read, then retried and planned again while
# the task of that admission lives: a retry that did not wait for that task (`Scheduler.settled`) lets the task
# start the new attempt beside job 2, admitted meanwhile on the same path.
@example(
    claim_paths=[{"a.py"}, {"a.py"}, {"b.py"}],
    lives_=[(False, False, False, Landed.LANDED)] * 3,
    spawned=[(1, 1), (0, 1), (0, 1), (1, 1), (3, 1), (0, 1)],
    order=[0, 0, 1, 2, 2, 1, 1, 8, 2, 21, 2, 1, 0, 0, 1, 23, 0, 0, 10, 25],
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sets(st.sampled_from(PATHS), min_size=1, max_size=2), min_size=N_JOBS, max_size=N_JOBS),
    st.lists(lives, min_size=N_JOBS, max_size=N_JOBS),
    st.lists(verbs, min_size=1, max_size=6),
    st.lists(st.integers(0, 31), min_size=20, max_size=200),
)
def test_no_interleaving_lands_a_cancelled_job_or_runs_overlapping_ones(claim_paths, lives_, spawned, order):
    """Writers that read, decide and write expecting what they read, interleaved at every await as hypothesis
    chooses: a cancelled or rejected job never lands, the branch holds exactly the landed jobs, and no two
    active jobs' claims overlap."""
    asyncio.run(_interleave(claim_paths, lives_, spawned, order))


async def _interleave(claim_paths, lives_, spawned, order) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await SqliteStore.open(Path(tmp) / "o.db")
        try:
            runs = {job_id: (ok, changed, review) for job_id, (ok, changed, review, _) in enumerate(lives_, start=1)}
            w = World(store, LandingPolicy(retry_on_conflict=True, max_attempts=3), runs)
            for paths in claim_paths:
                claim = Claim(frozenset(paths), 1.0, ClaimSource.DECLARED)
                job = await store.jobs.add(repo="/r", branch="main", text="t", runner="shell", claim=claim)
                await store.jobs.transition(job.id, {JobState.QUEUED}, JobState.PLANNING, "planning")
                await store.jobs.transition(job.id, {JobState.PLANNING}, JobState.PLANNED, "planned")
            live: list[Any] = [admitter(w)]
            for job_id, (*_, outcome) in enumerate(lives_, start=1):
                live += [planner(w, job_id), lander(w, job_id, outcome)]
            live += [_verb(kind, job_id)(w) for kind, job_id in spawned]
            for pick in itertools.chain(order, itertools.count()):
                if not live:
                    break
                i = pick % len(live)
                seen = (len(w.branch), frozenset(w.landing_now))
                try:
                    await anext(live[i])
                except StopAsyncIteration:
                    del live[i]
                live += w.spawned
                w.spawned.clear()
                if store.jobs.take_changed() or (len(w.branch), frozenset(w.landing_now)) != seen:
                    await _check(w)  # (a step that wrote nothing and moved nothing changed no invariant)
            await _history(w)
        finally:
            await store.close()


async def _check(w: World) -> None:
    jobs = await w.store.jobs.all()
    landed = {j.id for j in jobs if j.state is JobState.LANDED}
    # Between its ref move and its record a landing holds the lock (the journal covers that window).
    moving = {j.id for j in jobs if j.id in w.landing_now and j.state is JobState.LANDING}
    assert set(w.branch) - moving == landed, (w.branch, landed)
    assert len(w.branch) == len(set(w.branch)), f"landed twice: {w.branch}"
    active = [j for j in jobs if j.state in ACTIVE]
    for a, b in itertools.combinations(active, 2):
        assert not claims.overlapping(a.claim.paths, b.claim.paths), f"jobs {a.id} and {b.id} overlap while active"


async def _history(w: World) -> None:
    """Each job's events (kept whole: checked once, at the end): nothing lands after a cancel or reject that no
    retry followed."""
    for j in await w.store.jobs.all():
        kinds = [e["kind"] for e in await w.store.events.of_job(j.id)]
        for n, kind in enumerate(kinds):
            if kind in ("cancelled", "rejected"):
                later = kinds[n + 1 :]
                stop = later.index("retried") if "retried" in later else len(later)
                assert "landed" not in later[:stop], f"job {j.id} landed after it was {kind}: {kinds}"
