"""The store: a real SQLite file, WAL, migrations, every change with its event."""

from __future__ import annotations

import sqlite3

from orchestrator.core.models import Claim, ClaimSource, JobState
from orchestrator.store.schema import SQLITE as MIGRATIONS
from orchestrator.store.sqlite import SqliteStore
from tests.jobstates import put


async def test_schema_is_versioned_and_wal(tmp_path):
    """A new store is at the latest schema version and in WAL mode."""
    store = await SqliteStore.open(tmp_path / "o.db")
    assert await store.schema_version() == len(MIGRATIONS)
    await store.close()
    conn = sqlite3.connect(tmp_path / "o.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


async def test_job_round_trip_and_history(tmp_path):
    """A job's fields survive a reopen, and each update appends to its history."""
    path = tmp_path / "o.db"
    store = await SqliteStore.open(path)
    claim = Claim(frozenset({"src/a.py", "docs/"}), 1.0, ClaimSource.DECLARED)
    job = await store.jobs.add(
        repo="/r",
        branch="main",
        text="do it",
        runner="shell",
        priority=2,
        after=[],
        declared=["src/a.py", "docs/"],
        claim=claim,
    )
    await put(store, job.id, JobState.RUNNING, "admitted", actual=frozenset({"src/a.py"}))
    await store.close()

    store = await SqliteStore.open(path)
    again = await store.jobs.get(job.id)
    assert again is not None
    assert again.state is JobState.RUNNING and again.claim == claim and again.actual == {"src/a.py"}
    assert again.priority == 2
    assert [e["kind"] for e in await store.events.of_job(job.id)] == ["enqueued", "planning", "planned", "admitted"]
    await store.close()


async def test_recover_interrupts_running_and_keeps_the_queue(tmp_path):
    """After a crash, running jobs become interrupted, planning ones go back to queued, queued stay queued."""
    store = await SqliteStore.open(tmp_path / "o.db")
    a = await store.jobs.add(repo="/r", branch="main", text="a", runner="shell")
    b = await store.jobs.add(repo="/r", branch="main", text="b", runner="shell")
    c = await store.jobs.add(repo="/r", branch="main", text="c", runner="shell")
    await put(store, a.id, JobState.RUNNING)
    await put(store, b.id, JobState.PLANNING)
    result = await store.jobs.recover()
    assert result == {"interrupted": [a.id], "requeued": [b.id], "landing": []}
    assert (await store.jobs.get(a.id)).state is JobState.INTERRUPTED
    assert (await store.jobs.get(b.id)).state is JobState.QUEUED
    assert (await store.jobs.get(c.id)).state is JobState.QUEUED
    await store.close()


async def test_jobs_json_is_exactly_to_json(tmp_path):
    """The list's SQLite-rendered JSON equals `Job.to_json()` field for field, timestamps to the millisecond."""
    import json
    import random

    store = await SqliteStore.open(tmp_path / "o.db")
    claim = Claim(frozenset({"src/a.py", "docs/"}), 0.75, ClaimSource.DECLARED)
    full = await store.jobs.add(
        repo="/r", branch="main", text='say "é"\nthen\tmore', runner="shell", priority=-3, after=[1],
        declared=["docs/"], claim=claim, argv=["echo", "x y"], land="review",
    )  # fmt: skip
    bare = await store.jobs.add(repo="/r", branch="dev", text="t", runner="shell")
    rng = random.Random(7)
    for job_id in (full.id, bare.id):
        await store.jobs.update(job_id, {JobState.QUEUED}, created_at=1764512547 + rng.random())
    await put(
        store, full.id, JobState.LANDED, actual=frozenset({"src/a.py", "b"}), base="abc", result="def",
        attempts=2, land_after=(1,), worktree="/w", started_at=1764512547.9999996, finished_at=1764512548.0004,
        landed_sha="fff", reason="landed", decision={"reason": "Overlap", "blocking": [1]}, exit_code=0,
        code="Landed", plan_text="plan", evidence=({"path": "docs/", "kind": "declared", "why": "said so"},),
        usage={"calls": 2, "cost_usd": 0.5},
    )  # fmt: skip
    rows = await store.jobs.json()
    assert [r[0] for r in rows] == [full.id, bare.id]
    for job_id, state, body, live in rows:
        job = await store.jobs.get(job_id)
        assert job is not None and state == str(job.state)
        assert json.loads(body[:-1] + "," + live[1:]) == job.to_json()
    assert [r[0] for r in await store.jobs.json([JobState.QUEUED])] == [bare.id]
    await store.close()


async def test_jobs_json_renders_again_only_what_changed(tmp_path):
    """The list keeps rendered rows: after an update, an add and a delete it matches a fresh render exactly."""
    import json

    store = await SqliteStore.open(tmp_path / "o.db")
    ids = [(await store.jobs.add(repo="/r", branch="main", text=f"t{i}", runner="shell")).id for i in range(3)]
    first = await store.jobs.json()
    assert [r[0] for r in first] == ids
    await put(store, ids[1], JobState.LANDED, "landed", reason="landed")
    await store.jobs.delete(ids[0], {JobState.QUEUED})
    new = (await store.jobs.add(repo="/r", branch="main", text="t3", runner="shell")).id
    rows = await store.jobs.json()
    assert [r[0] for r in rows] == [ids[1], ids[2], new]
    for job_id, state, body, live in rows:
        job = await store.jobs.get(job_id)
        assert job is not None and state == str(job.state)
        assert json.loads(body[:-1] + "," + live[1:]) == job.to_json()
    assert [r[0] for r in await store.jobs.json([JobState.LANDED])] == [ids[1]]
    await store.close()


async def test_the_list_forgotten_while_it_renders_still_answers(tmp_path, monkeypatch):
    """The rendered rows forgotten (a PostgreSQL reconnection: other nodes' changes unknown) while the list renders
    what changed: that list still answers, whole, and the next one renders every job again."""
    import asyncio

    store = await SqliteStore.open(tmp_path / "o.db")
    ids = [(await store.jobs.add(repo="/r", branch="main", text=f"t{i}", runner="shell")).id for i in range(2)]
    await store.jobs.json()  # the rows rendered, kept
    await put(store, ids[1], JobState.LANDED, "landed", reason="landed")  # one to render again
    render, rendering, forgotten = store.jobs._render, asyncio.Event(), asyncio.Event()
    asked: list[list[int] | None] = []

    async def slow_render(which: list[int] | None) -> list[tuple[int, str, str, str]]:
        asked.append(which)
        rendering.set()
        await forgotten.wait()
        return await render(which)

    monkeypatch.setattr(store.jobs, "_render", slow_render)
    listing = asyncio.create_task(store.jobs.json())
    await rendering.wait()
    store.jobs.forget_rendered()
    forgotten.set()
    assert [(r[0], r[1]) for r in await listing] == [(ids[0], "queued"), (ids[1], "landed")]
    assert [(r[0], r[1]) for r in await store.jobs.json()] == [(ids[0], "queued"), (ids[1], "landed")]
    assert asked == [[ids[1]], None], "after the forgetting, every job rendered again"
    await store.close()


async def test_open_turn_reads_history_and_memories_then_stores_the_message(tmp_path):
    """A chat turn's store work is one call: history and memories as they were, then the message, durable."""
    path = tmp_path / "o.db"
    store = await SqliteStore.open(path)
    first = await store.chat.add_message("s", "user", "my dog is Rex")
    await store.chat.add_message("s", "assistant", "noted")
    await store.chat.remember("s", first, ["The user has a dog named Rex"])
    history, memories = await store.chat.open_turn("s", "walks for a spaniel?", 1)
    assert [m["content"] for m in history] == ["noted"] and memories == ["The user has a dog named Rex"]
    fresh, none = await store.chat.open_turn("new", "hello", 12)
    assert fresh == [] and none == []
    await store.close()
    store = await SqliteStore.open(path)
    said = [m["content"] for m in await store.chat.history("s", 5)]
    assert said == ["my dog is Rex", "noted", "walks for a spaniel?"]
    assert [m["content"] for m in await store.chat.history("new", 5)] == ["hello"]
    await store.close()


async def test_the_jobs_table_has_exactly_the_jobs_fields(tmp_path):
    """The migrated table's columns are `id` then `core.job.FIELDS`, in order: a job's fields are listed once."""
    from orchestrator.core.job import FIELDS

    store = await SqliteStore.open(tmp_path / "o.db")
    try:
        assert await store.columns() == ["id", *FIELDS]
    finally:
        await store.close()


async def test_state_moves_only_by_compare_and_set(tmp_path):
    """`transition` writes only from the expected state and only moves the table allows; `update` never moves."""
    import pytest

    from orchestrator.core.lifecycle import MoveError

    store = await SqliteStore.open(tmp_path / "o.db")
    try:
        job = await store.jobs.add(repo="/r", branch="main", text="t", runner="shell")
        assert await store.jobs.transition(job.id, {JobState.PLANNED}, JobState.RUNNING, "admitted") is None
        moved = await store.jobs.transition(job.id, {JobState.QUEUED}, JobState.CANCELLED, "cancelled", reason="stop")
        assert moved is not None and moved.state is JobState.CANCELLED and moved.reason == "stop"
        assert await store.jobs.update(job.id, {JobState.PLANNED}, reason="stale") is None
        with pytest.raises(MoveError):
            await store.jobs.transition(job.id, {JobState.CANCELLED}, JobState.LANDED, "landed")
        with pytest.raises(MoveError):
            await store.jobs.update(job.id, {JobState.CANCELLED}, state=JobState.QUEUED)
        again = await store.jobs.get(job.id)
        assert again is not None and again.reason == "stop"
        assert [e["kind"] for e in await store.events.of_job(job.id)] == ["enqueued", "cancelled"]
    finally:
        await store.close()


async def test_the_jobs_landed_as_some_commits_are_read_by_them(tmp_path):
    """`landed_as` reads the landed jobs whose landing commit is named, and no other job (one that landed elsewhere,
    one still landing with that sha in hand), by the landed_sha index."""
    store = await SqliteStore.open(tmp_path / "o.db")
    jobs = [await store.jobs.add(repo="/r", branch="main", text=f"j{n}", runner="shell") for n in range(4)]
    await put(store, jobs[0].id, JobState.LANDED, "landed", landed_sha="a" * 40)
    await put(store, jobs[1].id, JobState.LANDED, "landed", landed_sha="b" * 40)
    await put(store, jobs[2].id, JobState.LANDING, "landing", landed_sha="c" * 40)
    assert [j.id for j in await store.jobs.landed_as({"a" * 40, "c" * 40, "d" * 40})] == [jobs[0].id]
    assert await store.jobs.landed_as(()) == []
    await store.close()
    conn = sqlite3.connect(tmp_path / "o.db")
    plan = conn.execute("EXPLAIN QUERY PLAN SELECT * FROM jobs WHERE landed_sha IN ('x')").fetchall()
    conn.close()
    assert "jobs_landed_sha" in str(plan), plan
