"""Rounds cost what changed: per-job waits, repositories whose facts did not change, events only on change."""

from __future__ import annotations

import asyncio

from orchestrator.client import Client
from orchestrator.config import Config, JobsConfig
from orchestrator.core import admission
from orchestrator.core.models import Claim, ClaimSource, JobState, JobView, Policy, Reason, Snapshot
from orchestrator.daemon import warm_size
from orchestrator.jobs.board import Board
from orchestrator.jobs.rounds import Planned, RepoFacts
from orchestrator.store import Store, Write
from orchestrator.store.sqlite import SqliteStore
from tests.jobstates import put


def _view(i: int, repo: str, path: str) -> JobView:
    return JobView(i, repo, "main", Claim(frozenset({path}), 1.0, ClaimSource.DECLARED))


def test_unchanged_repository_is_not_decided_again():
    """A repo whose facts match the last round and whose jobs were all deferred drops out; a changed one stays."""
    policy = Policy(max_concurrent=4, per_repo=1)
    a_active, b_active = _view(1, "/a", "x"), _view(2, "/b", "x")
    a_wait, b_wait = _view(3, "/a", "y"), _view(4, "/b", "y")
    first = Snapshot(active=(a_active, b_active), waiting=(a_wait, b_wait), policy=policy)
    facts = RepoFacts()
    assert facts.narrow(first, deferred={3, 4}) is first
    facts.commit()
    again = Snapshot(active=(a_active, b_active), waiting=(a_wait, b_wait), policy=policy)
    assert [v.id for v in facts.narrow(again, deferred={3, 4}).waiting] == []
    facts.commit()
    b_landed = Snapshot(active=(a_active,), waiting=(a_wait, b_wait), policy=policy)
    narrowed = facts.narrow(b_landed, deferred={3, 4})
    assert [v.id for v in narrowed.waiting] == [3, 4], "the global count changed: both repos are decided again"
    assert [d.admitted for d in admission.decide_all(narrowed)] == [False, True]
    facts.commit()
    assert [v.id for v in facts.narrow(b_landed, deferred={3}).waiting] == [4], "job 4 was not deferred last time"


def test_priority_blocking_list_is_bounded():
    """A job behind thousands of conflicting waiting jobs lists the first few as blocking and says there are more."""
    n = admission.BLOCKING_LIMIT * 5
    waiting = tuple(_view(i, "/r", "same.py") for i in range(2, n + 2))
    s = Snapshot(active=(_view(1, "/r", "same.py"),), waiting=waiting, policy=Policy(max_concurrent=4))
    last = admission.decide_all(s)[-1]
    assert last.reason is Reason.OVERLAP
    d = admission.decide(_view(n + 5, "/r", "same.py"), Snapshot(waiting=waiting, policy=s.policy))
    assert d.reason is Reason.PRIORITY
    assert d.blocking == tuple(range(2, admission.BLOCKING_LIMIT + 2))
    assert d.message.startswith(f"at least {admission.BLOCKING_LIMIT} earlier waiting jobs")


async def _store(tmp_path) -> Store:
    return await SqliteStore.open(tmp_path / "state.db")


async def test_wait_is_woken_per_job_without_rereading(tmp_path):
    """`wait_ended` returns once every job it waits for ended, reading the store once, whatever else changes."""
    store = await _store(tmp_path)
    try:
        board = Board(store)
        ids = [(await store.jobs.add(repo="/r", branch="main", text="t", runner="shell")).id for _ in range(3)]
        reads = 0
        states = store.jobs.states

        async def counted(wanted):
            nonlocal reads
            reads += 1
            return await states(wanted)

        store.jobs.states = counted  # type: ignore[method-assign]
        waiter = asyncio.create_task(board.wait_ended(ids[:2], timeout=10))
        await asyncio.sleep(0.05)
        for _ in range(20):
            await board.update(ids[2], {JobState.QUEUED}, reason="unrelated change")
        await put(board, ids[0], JobState.LANDED)
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await board.transition(ids[1], {JobState.QUEUED}, JobState.CANCELLED, "cancelled")
        assert await asyncio.wait_for(waiter, 5) is True
        assert reads == 1
        assert await board.wait_ended([ids[2]], timeout=0.1) is False
    finally:
        await store.close()


async def test_planned_mirror_rereads_only_changed_jobs(tmp_path):
    """The planned-job mirror follows the store: jobs enter when planned and leave when they move on."""
    store = await _store(tmp_path)
    try:
        a = await store.jobs.add(repo="/r", branch="main", text="t", runner="shell")
        b = await store.jobs.add(repo="/r", branch="main", text="t", runner="shell")
        planned = Planned(store)
        assert await planned.jobs() == []
        for job in (a, b):
            await store.jobs.transition(job.id, {JobState.QUEUED}, JobState.PLANNING, "planning")
        planning = frozenset({JobState.PLANNING})
        await store.jobs.update_many(
            [Write(i, {}, "planned", expect=planning, to=JobState.PLANNED) for i in (a.id, b.id)]
        )
        assert [j.id for j in await planned.jobs()] == [a.id, b.id]
        await store.jobs.transition(a.id, {JobState.PLANNED}, JobState.RUNNING, "admitted")
        assert [j.id for j in await planned.jobs()] == [b.id]
        assert [e["kind"] for e in await store.events.of_job(a.id)] == ["enqueued", "planning", "planned", "admitted"]
    finally:
        await store.close()


def test_warm_pool_is_sized_to_the_slots():
    """The warm pool holds at least one worktree per slot a repository can fill."""
    assert warm_size(Config(jobs=JobsConfig(max_concurrent=4, per_repo=8, warm_worktrees=2))) == 4
    assert warm_size(Config(jobs=JobsConfig(max_concurrent=8, per_repo=3, warm_worktrees=2))) == 3
    assert warm_size(Config(jobs=JobsConfig(max_concurrent=1, per_repo=1, warm_worktrees=2))) == 2


def test_a_long_queue_writes_few_events_per_job(make_repo, daemon_factory):
    """Jobs queued behind one slot get a handful of events each, not one per round."""
    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "1"}).start()
    client = Client(d.socket)
    ids = [
        client.enqueue(repo=str(repo), text=f"echo {i} > f{i}.txt", paths=[f"f{i}.txt"])["id"] for i in range(10)
    ]
    assert client.wait(ids, timeout=120)["done"]
    for i in ids:
        job = client.job(i)
        assert job["state"] == "landed"
        assert len(job["events"]) <= 8, [e["kind"] for e in job["events"]]


async def test_an_overlap_never_makes_two_jobs_wait_for_each_other(tmp_path):
    """A re-run job that meets one already landing after it (through a third) is not made to wait for it."""
    from orchestrator.jobs.facts import GitFacts
    from orchestrator.jobs.watch import OverlapWatch

    store = await _store(tmp_path)
    try:
        board = Board(store)
        watch = OverlapWatch(board, Config(), GitFacts(Config()))
        a, b, c = [(await store.jobs.add(repo="/r", branch="main", text="t", runner="shell")).id for _ in range(3)]
        for job_id, after in ((b, a), (c, b)):
            await put(store, job_id, JobState.RUNNING, land_after=(after,))
        assert await watch._lands_after(c, a), "c lands after b, which lands after a"
        assert not await watch._lands_after(a, c)
        await store.jobs.transition(b, {JobState.RUNNING}, JobState.UNCHANGED, "finished")
        assert not await watch._lands_after(c, a), "an ended job no longer orders anything"
    finally:
        await store.close()


async def test_a_landing_stops_waiting_for_a_job_sent_back_to_the_queue(tmp_path):
    """A landing waits for the jobs it lands after to leave running/landing; a re-queued one never lands its result."""
    store = await _store(tmp_path)
    try:
        board = Board(store)
        job = await store.jobs.add(repo="/r", branch="main", text="t", runner="shell")
        await put(store, job.id, JobState.LANDING)
        waiter = asyncio.create_task(board.wait_ended([job.id], timeout=10, settled=lambda st: not st.active))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await board.transition(job.id, {JobState.LANDING}, JobState.QUEUED, "requeued")
        assert await asyncio.wait_for(waiter, 5) is True
    finally:
        await store.close()


async def test_a_job_sent_back_to_plan_again_keeps_its_place(tmp_path):
    """A planned job that admission sends back (its base moved) keeps its place and claim while it plans
    again, so a later overlapping job cannot start in between; a job never planned holds no place."""
    store = await _store(tmp_path)
    try:
        a = await store.jobs.add(repo="/r", branch="main", text="t", runner="shell")
        b = await store.jobs.add(repo="/r", branch="main", text="t", runner="shell")
        await store.jobs.transition(a.id, {JobState.QUEUED}, JobState.PLANNING, "planning")
        await store.jobs.transition(a.id, {JobState.PLANNING}, JobState.PLANNED, "planned")
        planned = Planned(store)
        assert [j.id for j in await planned.jobs()] == [a.id] and planned.held() == []
        await store.jobs.transition(a.id, {JobState.PLANNED}, JobState.QUEUED, "replan", decision={"outcome": "replan"})
        assert await planned.jobs() == []
        assert [j.id for j in planned.held()] == [a.id]  # b, queued and never planned, holds nothing
        assert b.id not in {j.id for j in planned.held()}
    finally:
        await store.close()
