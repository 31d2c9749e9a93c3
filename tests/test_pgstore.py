"""The PostgreSQL store behind the same seam as SQLite: a real server (initdb + pg_ctl in a temp dir), two node
stores on one database standing in for two machines' daemons, each with its own clone of one bare remote."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from orchestrator.core.job import FIELDS
from orchestrator.core.lifecycle import MoveError
from orchestrator.core.models import Claim, JobEvent, JobState
from orchestrator.store.schema import POSTGRES as PG_MIGRATIONS
from orchestrator.store.sqlite import SqliteStore
from tests.conftest import bare_remote, git

pytestmark = pytest.mark.timeout(120)

Q, PLANNED, RUNNING = JobState.QUEUED, JobState.PLANNED, JobState.RUNNING


@pytest.fixture
def clones(tmp_path: Path) -> tuple[Path, Path]:
    """A bare remote and two clones of it (nodes a and b)."""
    bare_remote(tmp_path, {"README.md": "hi\n", "src/a.py": "a = 1\n"})
    for name in ("a", "b"):
        git(tmp_path, "clone", "-q", str(tmp_path / "remote.git"), name)
    return tmp_path / "a", tmp_path / "b"


_HOMES: list[Path] = []
SECRET = b"the team's secret, the same on every node of a test"


@pytest.fixture(autouse=True)
def _homes(tmp_path: Path):
    """Where each node keeps its own file (its processes, its checkouts' journal, its clones)."""
    _HOMES.append(tmp_path / "homes")
    yield
    _HOMES.pop()


async def _node(url: str, name: str, **kw):
    """Node `name`'s store: the team's database, and the node's own file (the same one across its restarts)."""
    from orchestrator.store.postgres import PgStore
    from orchestrator.team.clones import remote_of

    home = _HOMES[-1] / name
    home.mkdir(parents=True, exist_ok=True)
    local = await SqliteStore.open(home / "orchestrator.db")
    return await PgStore.connect(
        url, node=name, remote_of=remote_of, local=local, secret=SECRET, lease=kw.pop("lease", 30.0),
        hold=kw.pop("hold", 4), **kw,
    )  # fmt: skip


def test_the_engines_are_siblings_each_part_its_own():
    """No class of the PostgreSQL store is, or inherits, one of the SQLite store's: each engine is complete on its
    own, sharing only what is engine-free (`store.guarded`)."""
    from orchestrator.store import pgrecords, postgres, sqlite, sqlite_records

    def classes(*modules):
        return {c for m in modules for c in vars(m).values() if isinstance(c, type) and c.__module__ == m.__name__}

    lite = classes(sqlite, sqlite_records)
    for cls in classes(postgres, pgrecords):
        assert not lite & set(cls.__mro__), cls


async def test_a_node_claims_the_team_queue_in_its_order_and_a_switch_is_all_or_nothing(pg_url, clones):
    """A node takes queued jobs in the queue's order, places included (a job moved before the others first); two
    jobs switching places are written both or neither."""
    from orchestrator.core import queue
    from orchestrator.store import Write

    a = await _node(pg_url, "a", hold=1)
    try:
        jobs = [await a.jobs.add(repo=str(clones[0]), branch="main", text=f"j{i}", runner="shell") for i in range(3)]
        last = await a.jobs.add(repo=str(clones[0]), branch="main", text="first", runner="shell", place=0.5)
        assert await a.team.claim() == [last.id]
        first, second = jobs[0], jobs[1]
        await a.jobs.transition(second.id, {Q}, JobState.CANCELLED, JobEvent.CANCELLED)
        pa, pb = queue.switched(first, second)
        writes = [Write(first.id, pa.fields(), JobEvent.MOVED, None, frozenset({Q})),
                  Write(second.id, pb.fields(), JobEvent.MOVED, None, frozenset({Q}))]  # fmt: skip
        assert await a.jobs.update_all(writes) is None
        assert (await a.jobs.get(first.id)).place is None
        pa, pb = queue.switched(first, jobs[2])
        writes = [Write(first.id, pa.fields(), JobEvent.MOVED, None, frozenset({Q})),
                  Write(jobs[2].id, pb.fields(), JobEvent.MOVED, None, frozenset({Q}))]  # fmt: skip
        done = await a.jobs.update_all(writes)
        assert done is not None and [j.place for j in done] == [float(jobs[2].id), float(first.id)]
    finally:
        await a.close()


async def test_postgresql_migrations_leave_each_table_as_it_is_written(pg_url, clones):
    """Every table the PostgreSQL migrations leave has exactly the columns its one definition (`store.schema`) gives
    PostgreSQL, in order."""
    import asyncpg

    from orchestrator.store.schema import TABLES, Dialect, tables

    a = await _node(pg_url, "a")
    await a.close()
    conn = await asyncpg.connect(pg_url)
    try:
        rows = await conn.fetch(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public' "
            "ORDER BY table_name, ordinal_position"
        )
    finally:
        await conn.close()
    found: dict[str, list[str]] = {}
    for r in rows:
        found.setdefault(r["table_name"], []).append(r["column_name"])
    found.pop("schema_version")
    assert set(found) == tables(Dialect.POSTGRES)
    for name, cols in found.items():
        assert sorted(cols) == sorted(c.name for c in TABLES[name].columns if c.only in (None, Dialect.POSTGRES))


async def test_same_columns_migrations_and_guarded_transitions(pg_url, clones):
    """Migrations make the job field list's columns; a transition is a compare-and-set that returns the row, a
    stale expectation writes nothing, and a move the table forbids is refused."""
    a = await _node(pg_url, "a")
    try:
        assert await a.columns() == ["id", *FIELDS]
        claim = Claim(frozenset({"x"}))
        job = await a.jobs.add(repo=str(clones[0]), branch="main", text="t", runner="shell", claim=claim)
        assert job.id > 0 and (await a.jobs.get(job.id)).claim.paths == frozenset({"x"})
        assert await a.team.claim() == [job.id]
        moved = await a.jobs.transition(job.id, {Q}, JobState.PLANNING, "planning")
        assert moved is not None and moved.state is JobState.PLANNING and moved.node == "a"
        assert await a.jobs.transition(job.id, {Q}, JobState.PLANNING, "planning") is None  # stale: it moved on
        with pytest.raises(MoveError):
            await a.jobs.transition(job.id, {JobState.PLANNING}, JobState.LANDED, "landed")
        assert await a.jobs.update(job.id, {JobState.PLANNING}, reason="r") is not None
        assert await a.jobs.update(job.id, {Q}, reason="no") is None
        assert [e["kind"] for e in await a.events.of_job(job.id)] == ["enqueued", "claimed", "planning"]
        assert [j.id for j in await a.jobs.all([JobState.PLANNING])] == [job.id]
        for step in (JobState.PLANNED, JobState.RUNNING, JobState.LANDING):
            assert await a.jobs.transition(job.id, {moved.state}, step, str(step)) is not None
            moved = await a.jobs.get(job.id)
        await a.jobs.transition(job.id, {JobState.LANDING}, JobState.LANDED, "landed", landed_sha="a" * 40)
        assert [j.id for j in await a.jobs.landed_as(["a" * 40, "b" * 40])] == [job.id], "read by its landing commit"
        assert await a.jobs.landed_as(["b" * 40]) == []
        again = await _node(pg_url, "a")  # a restart: migrations are not applied twice
        assert await again.schema_version() == len(PG_MIGRATIONS)
        await again.close()
    finally:
        await a.close()


async def test_two_nodes_share_one_queue_each_job_claimed_once(pg_url, clones):
    """Two nodes claiming at once from one queue (FOR UPDATE SKIP LOCKED) take each job once, each up to its hold,
    and see each job's repository as their own clone."""
    a, b = await _node(pg_url, "a", hold=3), await _node(pg_url, "b", hold=3)
    try:
        add = a.jobs.add
        ids = [(await add(repo=str(clones[0]), branch="main", text=f"j{i}", runner="shell")).id for i in range(6)]
        await _join(b, clones[1])
        got_a, got_b = await asyncio.gather(a.team.claim(), b.team.claim())
        assert sorted(got_a + got_b) == ids and len(got_a) == len(got_b) == 3
        seen_by_b = await b.jobs.get(got_a[0])
        assert seen_by_b.repo == str(clones[1]) and seen_by_b.node == "a"
        assert {j.id for j in await b.jobs.all([Q])} == set(got_b)
        assert await a.team.claim() == []  # holds 3 waiting already
    finally:
        await a.close()
        await b.close()


async def _join(store, clone: Path) -> None:
    """The node `store` has a clone of the shared repository at `clone` (as enqueuing from it would record)."""
    from orchestrator.team import clones as cl

    key, url = await asyncio.to_thread(cl.identity_of, str(clone))
    await store.team.register_clone(key, str(clone), url)


async def test_lapsed_lease_is_taken_over_and_the_old_holder_backs_off(pg_url, clones):
    """A node whose lease ended loses its running job to another node (re-queued for a fresh attempt), and its own
    late write expecting `running` changes nothing; labels keep a job off a node without them."""
    a = await _node(pg_url, "a", lease=2.0, labels=("cuda",))
    b = await _node(pg_url, "b", labels=("gpu",))
    try:
        await _join(b, clones[1])
        job = await a.jobs.add(repo=str(clones[0]), branch="main", text="t", runner="shell")
        pinned = await a.jobs.add(repo=str(clones[0]), branch="main", text="p", runner="shell", labels=("cuda",))
        assert await a.team.claim() == [job.id, pinned.id]
        for src, to in ((Q, JobState.PLANNING), (JobState.PLANNING, PLANNED), (PLANNED, RUNNING)):
            assert await a.jobs.transition(job.id, {src}, to, str(to)) is not None
        assert await b.team.lapsed() == []  # a's lease holds
        await asyncio.sleep(2.3)
        lapsed = {j.id: j for j in await b.team.lapsed()}
        assert set(lapsed) == {job.id, pinned.id}
        taken = await b.team.take_over(lapsed[job.id])
        assert taken is not None and taken.state is Q and taken.node == "" and taken.attempts == 1
        assert await a.jobs.transition(job.id, {RUNNING}, JobState.LANDING, "finished") is None
        await b.team.take_over(lapsed[pinned.id])
        assert await b.team.claim() == [job.id]  # not the job pinned to `cuda`
        assert [e["kind"] for e in await b.events.of_job(job.id)][-3:] == ["interrupted", "requeued", "claimed"]
        # A landing whose push reached the remote before its node died is recorded as landed, once, by the taker.
        for src, to in ((Q, JobState.PLANNING), (JobState.PLANNING, PLANNED), (PLANNED, RUNNING)):
            await b.jobs.transition(job.id, {src}, to, str(to))
        await b.jobs.transition(job.id, {RUNNING}, JobState.LANDING, "finished", result="f" * 40)
        c = await _node(pg_url, "c")
        await _join(c, clones[1])
        await c._db.execute("UPDATE nodes SET lease_until = 0, lease = 0 WHERE name = 'b'")  # b died: lease over
        landing = next(j for j in await c.team.lapsed() if j.id == job.id)
        done = await c.team.take_over(landing, landed="e" * 40)
        assert done is not None and done.state is JobState.LANDED and done.node == "c" and done.landed_sha == "e" * 40
        await c.close()
    finally:
        await a.close()
        await b.close()


async def test_admission_commit_backs_off_when_another_node_started_beside_it(pg_url, clones):
    """A move to running that names the other nodes' active jobs it was decided beside applies only if no other
    node started a job in that repository since (under the repository's advisory lock)."""
    a, b = await _node(pg_url, "a", hold=1), await _node(pg_url, "b", hold=1)
    try:
        await _join(b, clones[1])
        ja = await a.jobs.add(repo=str(clones[0]), branch="main", text="a", runner="shell")
        jb = await b.jobs.add(repo=str(clones[1]), branch="main", text="b", runner="shell")
        await a.team.claim()
        await b.team.claim()
        for store, j in ((a, ja), (b, jb)):
            await store.jobs.transition(j.id, {Q}, JobState.PLANNING, "planning")
            await store.jobs.transition(j.id, {JobState.PLANNING}, PLANNED, "planned")
        assert [j.id for j in await b.team.elsewhere()] == [ja.id]
        assert await a.jobs.transition(ja.id, {PLANNED}, RUNNING, "admitted", beside=set()) is not None
        assert await b.jobs.transition(jb.id, {PLANNED}, RUNNING, "admitted", beside=set()) is None  # a's started
        assert await b.jobs.transition(jb.id, {PLANNED}, RUNNING, "admitted", beside={ja.id}) is not None
    finally:
        await a.close()
        await b.close()


async def test_a_write_whose_answer_was_lost_is_applied_once(pg_url, clones):
    """The connection lost after a transition committed: the retry finds the write by its id and returns the job,
    rather than failing its compare-and-set on its own earlier write (or writing its event twice)."""
    import asyncpg

    from orchestrator import testhook

    a = await _node(pg_url, "a")
    lost = []

    async def lose_once(_name: str, _job: int | None) -> None:
        if not lost:
            lost.append(True)
            raise asyncpg.ConnectionDoesNotExistError("the answer was lost")

    try:
        job = await a.jobs.add(repo=str(clones[0]), branch="main", text="t", runner="shell")
        await a.team.claim()
        testhook.install("pg.committed", lose_once)
        moved = await a.jobs.transition(job.id, {Q}, JobState.PLANNING, "planning")
        assert lost and moved is not None and moved.state is JobState.PLANNING
        assert [e["kind"] for e in await a.events.of_job(job.id)] == ["enqueued", "claimed", "planning"]
    finally:
        testhook.clear()
        await a.close()


async def test_a_write_survives_a_postgresql_restart(pg_url, postgres, clones):
    """PostgreSQL restarted under a node: its next write reconnects and applies once."""
    a = await _node(pg_url, "a")
    try:
        job = await a.jobs.add(repo=str(clones[0]), branch="main", text="t", runner="shell")
        await asyncio.to_thread(postgres.restart)
        await a.team.claim()
        assert await a.jobs.transition(job.id, {Q}, JobState.PLANNING, "planning") is not None
        assert [e["kind"] for e in await a.events.of_job(job.id)] == ["enqueued", "claimed", "planning"]
    finally:
        await a.close()


async def test_postgresql_down_is_a_clear_error(tmp_path):
    """No server at the URL: StoreUnreachable names it and says what to do."""
    from orchestrator.store import StoreUnreachable
    from orchestrator.store.postgres import PgStore
    from orchestrator.team.clones import remote_of

    url = f"postgresql://nobody@/x?host={tmp_path}&port=1"
    local = await SqliteStore.open(tmp_path / "orchestrator.db")
    try:
        with pytest.raises(StoreUnreachable, match=r"cannot reach the team's PostgreSQL.*Start it"):
            await PgStore.connect(url, node="a", remote_of=remote_of, local=local, secret=SECRET)
    finally:
        await local.close()


async def test_rate_limits_are_kept_per_node_and_a_later_end_stands(pg_url, tmp_path):
    """Each node keeps the rate limits its runners met (a longer one replaces a shorter, never the reverse; ended
    ones go when the next is stored), in PostgreSQL as in the embedded file."""
    import time

    now = time.time()
    a, b = await _node(pg_url, "a"), await _node(pg_url, "b")
    embedded = await SqliteStore.open(tmp_path / "state.db")
    try:
        for store in (a, embedded):
            await store.limits.set_rate_limit("old-cli", now - 5)  # ended already
            await store.limits.set_rate_limit("claude-code", now + 600)
            await store.limits.set_rate_limit("claude-code", now + 60)  # shorter: the known end stands
            await store.limits.set_rate_limit("aider", now + 30)
            assert await store.limits.rate_limits() == {"claude-code": now + 600, "aider": now + 30}
        assert await b.limits.rate_limits() == {}, "node b met none"
    finally:
        await a.close()
        await b.close()
        await embedded.close()


def test_a_stalled_daemon_keeps_its_lease(pg_url, postgres, tmp_path):
    """The lease is renewed by a process and a connection of its own: the daemon's loop stalled and its interpreter's
    lock held for more than twice the lease (a C library working on a million files does that) lose nothing; a
    process watching the lease from outside meanwhile never sees it end."""
    import ctypes
    import itertools
    import subprocess
    import threading
    import time

    from orchestrator.team.lease import LeaseKeeper

    beats: list[float] = []
    stalled = threading.Event()

    def beat() -> None:
        """A thread of this interpreter: it cannot run while a C call holds the interpreter's lock."""
        while not stalled.is_set():
            beats.append(time.monotonic())
            time.sleep(0.01)

    def hold(seconds: float) -> None:
        """One C call that holds the interpreter's lock throughout (a `PyDLL` call never releases it), without
        burning a core: libc's `usleep`."""
        ctypes.PyDLL(None).usleep(int(seconds * 1_000_000))

    margins = tmp_path / "margins"
    sql = "SELECT lease_until - extract(epoch from clock_timestamp()) FROM nodes WHERE name = 'a'"
    watch = f'while :; do {postgres.bindir / "psql"} -X -Atc "{sql}" "{pg_url}" >> {margins}; sleep 0.2; done'

    async def register() -> None:
        await (await _node(pg_url, "a", lease=2.0)).close()

    asyncio.run(register())  # node a's row, which its keeper renews
    keeper = LeaseKeeper(pg_url, "a", 2.0)
    keeper.start()
    watcher = subprocess.Popen(["sh", "-c", watch], start_new_session=True)
    beating = threading.Thread(target=beat)
    beating.start()
    try:
        deadline = time.monotonic() + 30
        while not (keeper.renewals and margins.exists() and margins.read_text().strip()):
            assert time.monotonic() < deadline, "no renewal, or no lease read from outside, in 30 s"
            time.sleep(0.05)  # the keeper's first renewal, the watcher's first read
        hold(4.5)  # more than twice the lease
        time.sleep(0.5)  # the reader thread catches up on what the keeper said meanwhile
        stalled.set()
        beating.join()
        assert max(b - a for a, b in itertools.pairwise(beats)) > 4.4, "the interpreter's lock was held throughout"
        seen = [float(x) for x in margins.read_text().split()]
        assert len(seen) > 10 and min(seen) > 0, seen
        assert keeper.renewals >= 3 and keeper.steady_for() > 4
    finally:
        stalled.set()
        beating.join()
        os.killpg(watcher.pid, signal.SIGKILL)
        watcher.wait()
        keeper.stop()
