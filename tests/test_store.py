"""The store: a real SQLite file, WAL, migrations, every change with its event."""

from __future__ import annotations

import sqlite3

from orchestrator.core.models import Claim, ClaimSource, JobState
from orchestrator.store import MIGRATIONS, Store


async def test_schema_is_versioned_and_wal(tmp_path):
    """A new store is at the latest schema version and in WAL mode."""
    store = await Store.open(tmp_path / "o.db")
    assert await store.schema_version() == len(MIGRATIONS)
    await store.close()
    conn = sqlite3.connect(tmp_path / "o.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


async def test_job_round_trip_and_history(tmp_path):
    """A job's fields survive a reopen, and each update appends to its history."""
    path = tmp_path / "o.db"
    store = await Store.open(path)
    claim = Claim(frozenset({"src/a.py", "docs/"}), 1.0, ClaimSource.DECLARED)
    job = await store.add_job(
        repo="/r",
        branch="main",
        text="do it",
        runner="shell",
        priority=2,
        after=[],
        declared=["src/a.py", "docs/"],
        claim=claim,
    )
    await store.update(job.id, state=JobState.RUNNING, actual=frozenset({"src/a.py"}), event="admitted")
    await store.close()

    store = await Store.open(path)
    again = await store.get(job.id)
    assert again is not None
    assert again.state is JobState.RUNNING and again.claim == claim and again.actual == {"src/a.py"}
    assert again.priority == 2
    assert [e["kind"] for e in await store.events(job.id)] == ["enqueued", "admitted"]
    await store.close()


async def test_recover_interrupts_running_and_keeps_the_queue(tmp_path):
    """After a crash, running jobs become interrupted, planning ones go back to queued, queued stay queued."""
    store = await Store.open(tmp_path / "o.db")
    a = await store.add_job(repo="/r", branch="main", text="a", runner="shell")
    b = await store.add_job(repo="/r", branch="main", text="b", runner="shell")
    c = await store.add_job(repo="/r", branch="main", text="c", runner="shell")
    await store.update(a.id, state=JobState.RUNNING)
    await store.update(b.id, state=JobState.PLANNING)
    result = await store.recover()
    assert result == {"interrupted": [a.id], "requeued": [b.id], "landing": []}
    assert (await store.get(a.id)).state is JobState.INTERRUPTED
    assert (await store.get(b.id)).state is JobState.QUEUED
    assert (await store.get(c.id)).state is JobState.QUEUED
    await store.close()
