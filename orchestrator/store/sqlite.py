"""The store on SQLite, one machine's: a file in the state dir on a thread of its own, WAL, schema versioned by
migrations (`schema`). Its parts implement the store's Protocols (`store.base`); the records beside the jobs are
in `store.sqlite_records`.

Every state change is committed before the daemon acts on it, together with an append-only event in
`job_events`, so a killed daemon restarts where it was. A job's state changes only through `transition`, a
compare-and-set (`UPDATE … WHERE id = ? AND state IN (…) RETURNING *`) checked against the table of allowed
moves (`core.lifecycle`); every other write of a job's fields names the states it expects too, so a writer
that acted on a stale read backs off instead of overwriting what happened meanwhile. Each transaction is one
call to the database thread; no SQLite type leaks out.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from orchestrator import logging as olog
from orchestrator.core.job import FIELDS, Codec, Job, encode, from_row
from orchestrator.core.models import Claim, Code, JobEvent, JobState
from orchestrator.store.base import DuplicateTicket, StoreFull, StoreUnusable, Write
from orchestrator.store.guarded import COLUMNS, LIVE, Guarded
from orchestrator.store.reserve import Reserve
from orchestrator.store.schema import SQLITE as MIGRATIONS
from orchestrator.store.sqlite_records import (
    SqliteChat,
    SqliteEvents,
    SqliteJournal,
    SqliteLimits,
    SqlitePlans,
    SqliteProcesses,
    in_,
)
from orchestrator.store.sqlite_thread import Connection, transaction

__all__ = ["SqliteJobs", "SqliteStore", "SqliteTeam"]


def _private(path: Path) -> None:
    """Create `path` 0600 if missing, or make it 0600: job texts and reasons are the owner's alone."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)
    except FileNotFoundError:
        pass  # -wal / -shm not there (yet)
    except IsADirectoryError:
        raise StoreUnusable(f"{path} is a directory, not a database: move it aside") from None


def _damaged(path: Path, what: str) -> str:
    return (
        f"the database {path} is damaged ({what}): stop here, move it aside (mv {path} {path}.broken) "
        "and restore it from a backup, or start with an empty queue; `sqlite3 FILE .recover` may save its rows"
    )


def _unusable(path: Path, e: sqlite3.Error) -> StoreUnusable:
    return StoreUnusable(_damaged(path, f"{type(e).__name__}: {e}"))


# -- a job's row, from the one field list (`core.job.FIELDS`) -------------------------------------------------


def _json_expr(name: str) -> str:
    """SQL rendering column `name` as `Job.to_json` does: a long list is encoded by SQLite, not per job in Python."""
    codec = FIELDS.get(name, Codec.PLAIN)  # `id` is plain
    if codec in (Codec.LIST, Codec.SET):
        return f"json({name})"
    if codec is Codec.CLAIM:
        empty = json.dumps(Claim().to_json())
        return f"CASE WHEN {name} IS NULL OR {name} = '' THEN json('{empty}') ELSE json({name}) END"
    if codec in (Codec.OBJECT, Codec.ARGV):
        return f"CASE WHEN {name} IS NULL OR {name} = '' THEN NULL ELSE json({name}) END"
    if codec is Codec.TIME:
        # `core.job.iso`: the time rounded to the microsecond, then cut (not rounded) to the millisecond.
        return (
            f"CASE WHEN {name} IS NULL THEN NULL ELSE strftime('%Y-%m-%dT%H:%M:%f', "
            f"(CAST(round({name} * 1000000) AS INTEGER) / 1000) / 1000.0, 'unixepoch') || '+00:00' END"
        )
    return name


def _json_object(names: Iterable[str]) -> str:
    return "json_object(" + ", ".join(f"'{n}', {_json_expr(n)}" for n in names) + ")"


_JOB_JSON = (
    f"SELECT id, state, {_json_object(['id', *(c for c in COLUMNS if c not in LIVE)])} AS body, "
    f"{_json_object(LIVE)} AS live FROM jobs"
)


def _encode(name: str, value: Any) -> Any:
    return encode(FIELDS[name], value)


_EVENT_SQL = "INSERT INTO job_events (job_id, at, kind, data) VALUES (?, ?, ?, ?)"


def _write_one(conn: sqlite3.Connection, w: Write, now: float) -> sqlite3.Row | None:
    """One guarded write on the database thread: the job's row after it, or None if it was not in `expect`."""
    values = dict(w.fields)
    if w.to is not None:
        values["state"] = w.to
    expect = sorted(str(s) for s in w.expect)
    if values:
        sets = ", ".join(f"{k} = ?" for k in values)
        sql = f"UPDATE jobs SET {sets} WHERE id = ? AND state IN ({in_(expect)}) RETURNING *"
        row: sqlite3.Row | None = conn.execute(
            sql, [*(_encode(k, v) for k, v in values.items()), w.job_id, *expect]
        ).fetchone()
    else:
        row = conn.execute(
            f"SELECT * FROM jobs WHERE id = ? AND state IN ({in_(expect)})", [w.job_id, *expect]
        ).fetchone()
    if row is None:
        return None
    if w.event:
        payload = dict(w.data or {})
        if w.to is not None:
            payload.setdefault("state", str(w.to))
        conn.execute(_EVENT_SQL, (w.job_id, now, w.event, json.dumps(payload, default=str)))
    return row


class _Missed(Exception):
    """An all-or-nothing batch found a job outside the states its write expects: the batch is rolled back."""


def _write_sync(
    conn: sqlite3.Connection, writes: Sequence[Write], now: float, atomic: bool = False
) -> list[sqlite3.Row | None]:
    try:
        with transaction(conn):
            rows = [_write_one(conn, w, now) for w in writes]
            if atomic and any(r is None for r in rows):
                raise _Missed
            return rows
    except _Missed:
        return [None] * len(writes)


T = TypeVar("T")
RESERVE_LOOK = 30.0
"""Seconds between two looks whether a spent reserve can be made again."""


class SqliteJobs(Guarded):
    """The jobs table of the SQLite file (`store.base.JobTable`)."""

    def __init__(self, db: Connection, path: Path | None = None) -> None:
        super().__init__()
        self._db = db
        self.path = path
        self.reserve = Reserve(Path(f"{path}-reserve")) if path is not None else None
        """Room kept on the database's disk for the writes that settle jobs when it is full (`store.reserve`)."""
        self._reserve_looked = 0.0

    def _row_job(self, row: Any) -> Job:
        return from_row(row)

    async def _insert(self, job: Job, ticket: tuple[str, str | None] | None) -> int:
        values = [_encode(c, getattr(job, c)) for c in COLUMNS]
        return await self._db.call(_add_job_sync, values, ticket, job.repo, job.created_at)

    async def ticket_job(self, key: str) -> int | None:
        """The job a ticket key already queued, if any."""
        row = await self._db.fetchone("SELECT job_id FROM tickets WHERE key = ?", (key,))
        return int(row[0]) if row else None

    async def ticket_jobs(self, repo: str, ticket: str) -> list[int]:
        """Every job queued for this ticket id in this repository, oldest first."""
        rows = await self._db.fetchall(
            "SELECT job_id FROM tickets WHERE repo = ? AND ticket = ? ORDER BY at, job_id", (repo, ticket)
        )
        return [int(r[0]) for r in rows]

    async def get(self, job_id: int) -> Job | None:
        row = await self._db.fetchone("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return from_row(row) if row else None

    async def all(self, states: Iterable[JobState] | None = None) -> list[Job]:
        if states is None:
            rows = await self._db.fetchall("SELECT * FROM jobs ORDER BY id")
        else:
            names = tuple(sorted(str(s) for s in states))
            rows = await self._db.fetchall(f"SELECT * FROM jobs WHERE state IN ({in_(names)}) ORDER BY id", names)
        return [from_row(r) for r in rows]

    async def _render(self, ids: list[int] | None) -> list[tuple[int, str, str, str]]:
        """Rendered by SQLite: a long list is encoded there, not per job in Python."""
        rows = await self._db.call(_render_json_sync, ids)
        return [(int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in sorted(rows, key=lambda r: int(r[0]))]

    async def count(self, states: Iterable[JobState]) -> int:
        """How many jobs are in these states (without reading them)."""
        names = tuple(sorted(str(s) for s in states))
        row = await self._db.fetchone(f"SELECT count(*) FROM jobs WHERE state IN ({in_(names)})", names)
        return int(row[0]) if row else 0

    async def many(self, ids: Iterable[int]) -> list[Job]:
        """These jobs (missing ids are left out), by id."""
        return [from_row(r) for r in await self._db.call(_get_many_sync, sorted(set(ids)))]

    async def landed_as(self, shas: Iterable[str]) -> list[Job]:
        """The landed jobs whose landing commit is one of `shas`, by id (by the landed_sha index)."""
        rows = await self._db.call(_landed_as_sync, sorted(set(shas)))
        return sorted((from_row(r) for r in rows), key=lambda j: j.id)

    async def states(self, ids: Iterable[int]) -> dict[int, JobState]:
        """The current state of each of these jobs (missing ids are left out)."""
        rows = await self._db.call(_states_sync, sorted(set(ids)))
        return {int(r["id"]): JobState(r["state"]) for r in rows}

    async def _write(
        self, writes: Sequence[Write], *, changed: bool = True, atomic: bool = False
    ) -> list[sqlite3.Row | None]:
        """The writes in one transaction, in ONE call to the database thread (a call per statement cost each
        job's every state change a dozen thread hand-offs); `atomic`: every one or none."""
        rows = await self._db.call(_write_sync, writes, time.time(), atomic)
        self._written(writes, rows, changed)
        return rows

    async def _settling(self, write: Callable[[], Awaitable[T]]) -> T:
        """`write()`, a write that settles a job (a move of its state, a deletion): on a full disk the reserve is
        spent on it and it is tried once more (`store.reserve`). Once one goes through while the reserve is spent,
        the store looks (at most every RESERVE_LOOK seconds) whether the disk has room to make it again."""
        try:
            result = await write()
        except StoreFull:
            olog.get().warning(olog.Event.STORE_FULL, path=str(self.path), settles=True)
            if self.reserve is None or not await asyncio.to_thread(self.reserve.spend):
                raise
            olog.get().warning(olog.Event.STORE_RESERVE_SPENT, path=str(self.reserve.path))
            result = await write()
        if self.reserve is not None and time.monotonic() - self._reserve_looked > RESERVE_LOOK:
            self._reserve_looked = time.monotonic()
            if not self.reserve.present and await asyncio.to_thread(self.reserve.make):
                olog.get().info(olog.Event.STORE_RESERVE_MADE, path=str(self.reserve.path))
        return result

    async def delete(self, job_id: int, expect: Collection[JobState]) -> bool:
        """Forget an ended job (`orchestrator clean`): its record and its history, if it is in one of `expect`."""
        states = sorted(str(s) for s in expect)
        done = await self._settling(lambda: self._db.call(_delete_sync, job_id, states))
        self.changes.add([job_id])
        return done

    async def recover(self) -> dict[str, list[int]]:
        """After a crash: running jobs become interrupted, planning ones go back to the queue.

        Landing jobs stay landing: their result commit is stored and landing again is safe (an already
        landed commit is a no-op), so nothing is lost and nothing runs twice.
        """
        running = [j.id for j in await self.all([JobState.RUNNING])]
        planning = [j.id for j in await self.all([JobState.PLANNING])]
        for job_id in running:
            await self.transition(
                job_id,
                {JobState.RUNNING},
                JobState.INTERRUPTED,
                JobEvent.INTERRUPTED,
                reason="the daemon stopped while this job ran; it keeps its place: `orchestrator retry` runs it "
                "again, `orchestrator cancel` gives its place up",
                code=Code.INTERRUPTED,
            )
        for job_id in planning:
            await self.transition(
                job_id, {JobState.PLANNING}, JobState.QUEUED, JobEvent.REQUEUED, data={"why": "daemon restarted"}
            )
        landing = [j.id for j in await self.all([JobState.LANDING])]
        return {"interrupted": running, "requeued": planning, "landing": landing}


class SqliteTeam:
    """One machine is a team of one (`store.base.TeamQueue`): every job is this daemon's, no other node holds any.
    In team mode a node's own file keeps its clones here (`clones`), beside its process groups and journal."""

    def __init__(self, db: Connection, jobs: SqliteJobs, home: Path) -> None:
        self._db = db
        self._jobs = jobs
        self._home = home

    @property
    def home(self) -> Path:
        """The file this daemon keeps its own records in (its process groups, its checkouts' journal): the marks
        of the commands it starts are named after it (`StoreOwner.tag`), so a restart ends its own leftovers
        and nobody else's."""
        return self._home

    async def claim(self) -> list[int]:
        """Take queued jobs from a team's queue for this node: on one machine every job is this node's."""
        return []

    async def everyone(self, states: Iterable[JobState] | None = None) -> list[Job]:
        """Every node's jobs (in these states): on one machine, this daemon's."""
        return await self._jobs.all(states)

    def mine(self, job: Job) -> bool:
        """Whether this node holds `job` (on one machine, every job)."""
        return True

    async def elsewhere(self) -> list[Job]:
        """Other nodes' planned and active jobs of this node's repositories: none on one machine."""
        return []

    def clone_paths(self) -> list[str]:
        """The local clones of a team's repositories this node has: none on one machine."""
        return []

    async def clones(self) -> dict[str, str]:
        """Team mode, kept in a node's own file: each shared repository (`Remote.identity`) → the local path of the
        node's clone of it. Only this node writes it (its config's repos, its own user's enqueues)."""
        rows = await self._db.fetchall("SELECT key, path FROM clones ORDER BY key")
        return {r["key"]: r["path"] for r in rows}

    async def take_over(self, job: Job, *, landed: str | None = None) -> Job | None:
        """No other node's lease ends on one machine: nothing to take over."""
        return None

    async def register_clone(self, key: str, path: str, url: str) -> None:
        """Team mode: this node has a clone of shared repository `key` at `path` (see `clones`)."""
        await self._db.execute(
            "INSERT INTO clones (key, path, url) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET path = excluded.path, url = excluded.url",
            (key, path, url),
        )


class SqliteStore:
    """The SQLite file (`store.base.Store`): one connection on its own thread; each transaction is one call to it."""

    def __init__(self, conn: Connection, path: Path | None = None) -> None:
        self._db = conn
        self.path: str | Path = path or "the database"
        self.jobs = SqliteJobs(conn, path)
        self.team = SqliteTeam(conn, self.jobs, Path(self.path))
        self.events = SqliteEvents(conn)
        self.journal = SqliteJournal(conn)
        self.processes = SqliteProcesses(conn)
        self.limits = SqliteLimits(conn)
        self.chat = SqliteChat(conn)
        self.plans = SqlitePlans(conn)

    @property
    def reserve(self) -> Reserve | None:
        """Room kept on the database's disk for the writes that settle jobs when it is full (`store.reserve`)."""
        return self.jobs.reserve

    @property
    def home(self) -> Path:
        return self.team.home

    @classmethod
    async def open(cls, path: Path) -> SqliteStore:
        """Open (or create) the database, private to its owner; StoreUnusable at once if it is corrupt or newer."""
        _private(path)
        try:
            conn = await Connection.open(path)
        except sqlite3.Error as e:
            raise _unusable(path, e) from None
        try:
            await conn.call(_pragmas)
            problems = [str(r[0]) for r in await conn.fetchall("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise StoreUnusable(_damaged(path, "; ".join(problems[:3])))
            store = cls(conn, path)
            await store._migrate()
        except sqlite3.Error as e:
            await conn.close()  # its thread would keep the process alive, holding the daemon's lock
            raise _unusable(path, e) from None
        except BaseException:
            await conn.close()
            raise
        for extra in ("-wal", "-shm"):
            _private(path.with_name(path.name + extra))
        if store.reserve is not None and not await asyncio.to_thread(store.reserve.make):
            olog.get().warning(olog.Event.STORE_NO_RESERVE, path=str(store.reserve.path), reason="little free space")
        return store

    async def close(self) -> None:
        await self._db.close()

    async def _migrate(self) -> None:
        version = await self.schema_version()
        if version > len(MIGRATIONS):
            raise StoreUnusable(
                f"{self.path} has schema version {version}, newer than this orchestrator knows "
                f"({len(MIGRATIONS)}): a newer orchestrator wrote it. Upgrade orchestrator, or move the file "
                "aside to start with an empty queue"
            )
        for n, script in enumerate(MIGRATIONS[version:], start=version + 1):
            await self._db.script(f"BEGIN;\n{script}\nPRAGMA user_version={n};\nCOMMIT;")

    async def schema_version(self) -> int:
        row = await self._db.fetchone("PRAGMA user_version")
        return int(row[0]) if row else 0

    async def columns(self) -> list[str]:
        """The jobs table's columns, in order (a test holds them to `core.job.FIELDS`)."""
        return [str(r["name"]) for r in await self._db.fetchall("PRAGMA table_info(jobs)")]


# -- on the database thread ----------------------------------------------------------------------------


def _pragmas(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=5000")


def _add_job_sync(
    conn: sqlite3.Connection, values: list[Any], ticket: tuple[str, str | None] | None, repo: str, now: float
) -> int:
    with transaction(conn):
        cur = conn.execute(f"INSERT INTO jobs ({', '.join(COLUMNS)}) VALUES ({in_(COLUMNS)})", values)
        job_id = cur.lastrowid
        assert job_id is not None
        conn.execute(_EVENT_SQL, (job_id, now, JobEvent.ENQUEUED, json.dumps({"state": "queued"})))
        if ticket is not None:
            try:
                conn.execute(
                    "INSERT INTO tickets (key, repo, ticket, job_id, at) VALUES (?, ?, ?, ?, ?)",
                    (ticket[0], repo, ticket[1], job_id, now),
                )
            except sqlite3.IntegrityError:
                raise DuplicateTicket(ticket[0]) from None
    return job_id


_CHUNK = 500
"""Bound parameters per statement (SQLite caps them)."""


def _get_many_sync(conn: sqlite3.Connection, wanted: list[int]) -> list[sqlite3.Row]:
    out: list[sqlite3.Row] = []
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        out += conn.execute(f"SELECT * FROM jobs WHERE id IN ({in_(chunk)}) ORDER BY id", chunk).fetchall()
    return out


def _landed_as_sync(conn: sqlite3.Connection, wanted: list[str]) -> list[sqlite3.Row]:
    out: list[sqlite3.Row] = []
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        out += conn.execute(
            f"SELECT * FROM jobs WHERE landed_sha IN ({in_(chunk)}) AND state = ?", [*chunk, str(JobState.LANDED)]
        ).fetchall()
    return out


def _states_sync(conn: sqlite3.Connection, wanted: list[int]) -> list[sqlite3.Row]:
    out: list[sqlite3.Row] = []
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        out += conn.execute(f"SELECT id, state FROM jobs WHERE id IN ({in_(chunk)})", chunk).fetchall()
    return out


def _render_json_sync(conn: sqlite3.Connection, ids: list[int] | None) -> list[sqlite3.Row]:
    if ids is None:
        return conn.execute(_JOB_JSON).fetchall()
    out: list[sqlite3.Row] = []
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i : i + _CHUNK]
        out += conn.execute(f"{_JOB_JSON} WHERE id IN ({in_(chunk)})", chunk).fetchall()
    return out


def _delete_sync(conn: sqlite3.Connection, job_id: int, expect: list[str]) -> bool:
    with transaction(conn):
        row = conn.execute(
            f"SELECT id FROM jobs WHERE id = ? AND state IN ({in_(expect)})", [job_id, *expect]
        ).fetchone()
        if row is None:
            return False
        conn.execute("DELETE FROM job_events WHERE job_id = ?", (job_id,))
        conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
    return True
