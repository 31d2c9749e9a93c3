"""The one store: SQLite through aiosqlite, WAL, schema versioned by migrations.

Every state change is committed before the daemon acts on it, together with an append-only event in
`job_events`, so a killed daemon restarts where it was. The chat plane's sessions and memories live here
too. Everything SQL stays in this module (a PostgreSQL store can replace it behind the same methods).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiosqlite

from orchestrator.core.job import Job
from orchestrator.core.models import Claim, JobState
from orchestrator.git.journal import Intent
from orchestrator.runners.process import Group

MIGRATIONS: tuple[str, ...] = (
    # 1: jobs and their history; chat sessions, messages and memories.
    """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        repo TEXT NOT NULL,
        branch TEXT NOT NULL,
        text TEXT NOT NULL,
        runner TEXT NOT NULL,
        state TEXT NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        after TEXT NOT NULL DEFAULT '[]',
        declared TEXT NOT NULL DEFAULT '[]',
        claim TEXT,
        actual TEXT NOT NULL DEFAULT '[]',
        base TEXT,
        result TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        land_after TEXT NOT NULL DEFAULT '[]',
        worktree TEXT,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        landed_sha TEXT,
        reason TEXT NOT NULL DEFAULT '',
        decision TEXT,
        exit_code INTEGER
    );
    CREATE INDEX jobs_state ON jobs(state);
    CREATE TABLE job_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX job_events_job ON job_events(job_id);
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        meta TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        at REAL NOT NULL,
        extracted INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE memories (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        content TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    # 2: argv jobs, reason codes on jobs, run-time controls (pause, per-repo slot limits).
    """
    ALTER TABLE jobs ADD COLUMN argv TEXT;
    ALTER TABLE jobs ADD COLUMN code TEXT NOT NULL DEFAULT '';
    CREATE TABLE controls (
        scope TEXT PRIMARY KEY,
        paused INTEGER NOT NULL DEFAULT 0,
        slots INTEGER
    );
    """,
    # 3: process groups the daemon started (runners, landing checks), so a restarted daemon ends survivors;
    # the landing journal (a landing's intent, stored before the ref moves while a checkout is on the branch).
    """
    CREATE TABLE processes (
        pgid INTEGER NOT NULL,
        start_time INTEGER NOT NULL,
        boot_id TEXT NOT NULL,
        job_id INTEGER,
        what TEXT NOT NULL DEFAULT '',
        started_at REAL NOT NULL,
        PRIMARY KEY (pgid, start_time)
    );
    CREATE TABLE landing_journal (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER,
        repo TEXT NOT NULL,
        branch TEXT NOT NULL,
        old TEXT NOT NULL,
        new TEXT NOT NULL,
        checkouts TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    # 4: tickets a git hook queued: one job per idempotency key; the ticket id lets a newer one supersede.
    """
    CREATE TABLE tickets (
        key TEXT PRIMARY KEY,
        repo TEXT NOT NULL,
        ticket TEXT,
        job_id INTEGER NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX tickets_repo_ticket ON tickets(repo, ticket);
    """,
    # 5: the planner's output kept on the job (the model's plan text, the evidence for each claimed path),
    # and each repository's mined change history (co-change evidence), extended incrementally.
    """
    ALTER TABLE jobs ADD COLUMN plan_text TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN evidence TEXT NOT NULL DEFAULT '[]';
    CREATE TABLE plan_history (
        repo TEXT PRIMARY KEY,
        head TEXT NOT NULL,
        changes TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    # 6: model usage and cost of a job's runner; its landing mode (auto, or review before landing).
    """
    ALTER TABLE jobs ADD COLUMN usage TEXT;
    ALTER TABLE jobs ADD COLUMN land TEXT NOT NULL DEFAULT 'auto';
    """,
)

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


_JSON_LIST = {"after", "declared", "actual", "land_after", "evidence"}
_COLUMNS = [
    "repo", "branch", "text", "runner", "state", "priority", "after", "declared", "claim", "actual", "base",
    "result", "attempts", "land_after", "worktree", "created_at", "started_at", "finished_at", "landed_sha",
    "reason", "decision", "exit_code", "argv", "code", "plan_text", "evidence", "usage", "land",
]  # fmt: skip


_LIVE = ("reason", "code", "decision")
"""The fields a waiting job's live admission decision overrides (see `Store.jobs_json`)."""
_TIMES = ("created_at", "started_at", "finished_at")


def _json_expr(name: str) -> str:
    """SQL rendering `name` as `Job.to_json` does: a long list is encoded by SQLite, not per job in Python."""
    if name in _JSON_LIST:
        return f"json({name})"
    if name == "claim":
        empty = json.dumps(Claim().to_json())
        return f"CASE WHEN claim IS NULL OR claim = '' THEN json('{empty}') ELSE json(claim) END"
    if name in ("decision", "argv", "usage"):
        return f"CASE WHEN {name} IS NULL OR {name} = '' THEN NULL ELSE json({name}) END"
    if name in _TIMES:
        # `core.job.iso`: the time rounded to the microsecond, then cut (not rounded) to the millisecond.
        return (
            f"CASE WHEN {name} IS NULL THEN NULL ELSE strftime('%Y-%m-%dT%H:%M:%f', "
            f"(CAST(round({name} * 1000000) AS INTEGER) / 1000) / 1000.0, 'unixepoch') || '+00:00' END"
        )
    return name


def _json_object(names: Iterable[str]) -> str:
    return "json_object(" + ", ".join(f"'{n}', {_json_expr(n)}" for n in names) + ")"


_JOB_JSON = (
    f"SELECT id, state, {_json_object(['id', *(c for c in _COLUMNS if c not in _LIVE)])} AS body, "
    f"{_json_object(_LIVE)} AS live FROM jobs"
)


def _encode(name: str, value: Any) -> Any:
    if name in _JSON_LIST:
        return json.dumps(sorted(value) if isinstance(value, frozenset | set) else list(value))
    if name == "claim":
        return json.dumps(value.to_json())
    if name in ("decision", "argv", "usage"):
        return None if value is None else json.dumps(list(value) if name == "argv" else value)
    if name == "state":
        return str(value)
    return value


def _row_to_job(row: aiosqlite.Row) -> Job:
    return Job(
        id=row["id"],
        repo=row["repo"],
        branch=row["branch"],
        text=row["text"],
        runner=row["runner"],
        state=JobState(row["state"]),
        priority=row["priority"],
        after=tuple(json.loads(row["after"])),
        declared=tuple(json.loads(row["declared"])),
        claim=Claim.from_json(json.loads(row["claim"]) if row["claim"] else None),
        actual=frozenset(json.loads(row["actual"])),
        base=row["base"],
        result=row["result"],
        attempts=row["attempts"],
        land_after=tuple(json.loads(row["land_after"])),
        worktree=row["worktree"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        landed_sha=row["landed_sha"],
        reason=row["reason"],
        decision=json.loads(row["decision"]) if row["decision"] else None,
        exit_code=row["exit_code"],
        argv=tuple(json.loads(row["argv"])) if row["argv"] else None,
        code=row["code"],
        plan_text=row["plan_text"],
        evidence=tuple(json.loads(row["evidence"])),
        usage=json.loads(row["usage"]) if row["usage"] else None,
        land=row["land"],
    )


@dataclass(frozen=True, slots=True)
class Write:
    """One job's field changes and event, for `Store.update_many`."""

    job_id: int
    fields: dict[str, Any]
    event: str | None = None
    data: dict[str, Any] | None = None


_EVENT_SQL = "INSERT INTO job_events (job_id, at, kind, data) VALUES (?, ?, ?, ?)"
_HISTORY_SQL = "SELECT id, role, content, at, extracted FROM messages WHERE session_id = ? ORDER BY id DESC LIMIT ?"
_MEMORIES_SQL = "SELECT content FROM memories WHERE session_id = ? ORDER BY id DESC LIMIT ?"


@contextlib.contextmanager
def _sync_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """On the database thread: BEGIN IMMEDIATE, then COMMIT (ROLLBACK on error)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")

JSON_CACHE_MAX = 20_000
"""Jobs whose rendered JSON `Store.jobs_json` keeps between calls (past that, each call renders them all)."""

EX_STATE = 65
"""Exit status of a daemon whose database cannot be used (corrupt, truncated, newer schema): EX_DATAERR.
Restarting cannot fix it, so the systemd unit lists it in RestartPreventExitStatus."""


class StoreUnusable(RuntimeError):
    """The database file cannot be used as it is; the message names the file and what to do."""


class Store:
    """Async access to the SQLite file. One connection; aiosqlite serialises its calls."""

    def __init__(self, conn: aiosqlite.Connection, path: Path | None = None) -> None:
        self._db = conn
        self.path = path or "the database"
        # One connection serves every task: transactions must not interleave on it.
        self._tx = asyncio.Lock()
        # Ids of jobs written since the scheduler last asked (`take_changed`): its rounds re-read only those.
        self._changed: set[int] = set()
        # `jobs_json`'s rendered rows by id (None: not read yet), and the ids written since it last read.
        self._json: dict[int, tuple[str, str, str]] | None = None
        self._stale_json: set[int] = set()
        self._json_lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path) -> Store:
        """Open (or create) the database, private to its owner; StoreUnusable at once if it is corrupt or newer."""
        _private(path)
        try:
            conn = await aiosqlite.connect(path, isolation_level=None)
        except sqlite3.Error as e:
            raise _unusable(path, e) from None
        try:
            conn.row_factory = aiosqlite.Row
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA synchronous=NORMAL")
            await conn.execute("PRAGMA foreign_keys=ON")
            await conn.execute("PRAGMA busy_timeout=5000")
            async with conn.execute("PRAGMA quick_check") as cur:
                problems = [str(r[0]) for r in await cur.fetchall()]
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
        return store

    async def close(self) -> None:
        await self._db.close()

    async def _migrate(self) -> None:
        async with self._db.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        version = int(row[0]) if row else 0
        if version > len(MIGRATIONS):
            raise StoreUnusable(
                f"{self.path} has schema version {version}, newer than this orchestrator knows "
                f"({len(MIGRATIONS)}): a newer orchestrator wrote it. Upgrade orchestrator, or move the file "
                "aside to start with an empty queue"
            )
        for n, script in enumerate(MIGRATIONS[version:], start=version + 1):
            await self._db.executescript(f"BEGIN;\n{script}\nPRAGMA user_version={n};\nCOMMIT;")

    async def schema_version(self) -> int:
        async with self._db.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    # -- jobs -------------------------------------------------------------------------------------

    async def add_job(
        self,
        *,
        repo: str,
        branch: str,
        text: str,
        runner: str,
        priority: int = 0,
        after: Sequence[int] = (),
        declared: Sequence[str] = (),
        claim: Claim | None = None,
        ticket: tuple[str, str | None] | None = None,
        argv: Sequence[str] | None = None,
        land: str = "auto",
    ) -> Job:
        """Queue a job; `ticket` (key, ticket id) is recorded in the same transaction (a duplicate key raises)."""
        now = time.time()
        job = Job(
            id=0,
            repo=repo,
            branch=branch,
            text=text,
            runner=runner,
            state=JobState.QUEUED,
            priority=priority,
            after=tuple(after),
            declared=tuple(declared),
            claim=claim or Claim(),
            created_at=now,
            argv=None if argv is None else tuple(argv),
            land=land,
        )
        values = [_encode(c, getattr(job, c)) for c in _COLUMNS]
        async with self._transaction():
            cur = await self._db.execute(
                f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})", values
            )
            job_id = cur.lastrowid
            assert job_id is not None
            self._changed.add(job_id)
            self._stale_json.add(job_id)
            await self._event(job_id, "enqueued", {"state": "queued"}, now)
            if ticket is not None:
                await self._db.execute(
                    "INSERT INTO tickets (key, repo, ticket, job_id, at) VALUES (?, ?, ?, ?, ?)",
                    (ticket[0], repo, ticket[1], job_id, now),
                )
        return replace(job, id=job_id)

    async def ticket_job(self, key: str) -> int | None:
        """The job a ticket key already queued, if any."""
        async with self._db.execute("SELECT job_id FROM tickets WHERE key = ?", (key,)) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else None

    async def ticket_jobs(self, repo: str, ticket: str) -> list[int]:
        """Every job queued for this ticket id in this repository, oldest first."""
        async with self._db.execute(
            "SELECT job_id FROM tickets WHERE repo = ? AND ticket = ? ORDER BY at, job_id", (repo, ticket)
        ) as cur:
            rows = await cur.fetchall()
        return [int(r[0]) for r in rows]

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        async with self._tx:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
            await self._db.execute("COMMIT")

    async def get(self, job_id: int) -> Job | None:
        async with self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)) as cur:
            row = await cur.fetchone()
        return _row_to_job(row) if row else None

    async def jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        args: tuple[str, ...] = ()
        if states is None:
            sql = "SELECT * FROM jobs ORDER BY id"
        else:
            names = tuple(str(s) for s in states)
            sql = f"SELECT * FROM jobs WHERE state IN ({', '.join('?' * len(names))}) ORDER BY id"
            args = names
        async with self._db.execute(sql, args) as cur:
            rows = await cur.fetchall()
        return [_row_to_job(r) for r in rows]

    async def jobs_json(self, states: Iterable[JobState] | None = None) -> list[tuple[int, str, str, str]]:
        """Each job's `Job.to_json()` as JSON text, rendered by SQLite: (id, state, body, live), by id.

        `body` is every field but `_LIVE` (reason, code, decision), which are in `live`, so a caller can
        splice in a waiting job's in-memory decision without parsing anything.
        """
        # Rendered rows are kept, and only the jobs written since are rendered again: a long queue's ended
        # jobs never change, and `status` is asked often while it drains. Taken before reading, like
        # `take_changed`: a write during the read is rendered next time.
        async with self._json_lock:  # two callers at once: the second waits for the first's refresh
            return await self._jobs_json(states)

    async def _jobs_json(self, states: Iterable[JobState] | None) -> list[tuple[int, str, str, str]]:
        stale, self._stale_json = self._stale_json, set()
        if self._json is None:
            rendered = {row[0]: row[1:] for row in await self._render_json("", ())}
            self._json = rendered if len(rendered) <= JSON_CACHE_MAX else None
        elif stale:
            wanted = sorted(stale)
            for i in range(0, len(wanted), 500):  # SQLite caps the number of bound parameters
                chunk = wanted[i : i + 500]
                fresh = {
                    row[0]: row[1:]
                    for row in await self._render_json(f" WHERE id IN ({', '.join('?' * len(chunk))})", chunk)
                }
                for job_id in chunk:
                    if job_id in fresh:
                        self._json[job_id] = fresh[job_id]
                    else:
                        self._json.pop(job_id, None)  # deleted
            if any(a > b for a, b in itertools.pairwise(self._json)):  # ids are new at the end; keep id order
                self._json = dict(sorted(self._json.items()))
        names = None if states is None else {str(s) for s in states}
        rows = self._json if self._json is not None else rendered
        return [(i, *row) for i, row in rows.items() if names is None or row[0] in names]

    async def _render_json(self, where: str, args: Sequence[Any]) -> list[tuple[int, str, str, str]]:
        async with self._db.execute(_JOB_JSON + where, tuple(args)) as cur:
            rows = await cur.fetchall()
        return [(int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in sorted(rows, key=lambda r: int(r[0]))]

    async def count(self, states: Iterable[JobState]) -> int:
        """How many jobs are in these states (without reading them)."""
        names = tuple(str(s) for s in states)
        sql = f"SELECT count(*) FROM jobs WHERE state IN ({', '.join('?' * len(names))})"
        async with self._db.execute(sql, names) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    def take_changed(self) -> set[int]:
        """Ids of the jobs written since the last call (for one consumer: the scheduler's rounds)."""
        changed, self._changed = self._changed, set()
        return changed

    async def get_many(self, ids: Iterable[int]) -> list[Job]:
        """These jobs (missing ids are left out), by id."""
        wanted = sorted(set(ids))
        out: list[Job] = []
        for i in range(0, len(wanted), 500):  # SQLite caps the number of bound parameters
            chunk = wanted[i : i + 500]
            sql = f"SELECT * FROM jobs WHERE id IN ({', '.join('?' * len(chunk))}) ORDER BY id"
            async with self._db.execute(sql, chunk) as cur:
                out += [_row_to_job(r) for r in await cur.fetchall()]
        return out

    async def states(self, ids: Iterable[int]) -> dict[int, JobState]:
        """The current state of each of these jobs (missing ids are left out)."""
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        sql = f"SELECT id, state FROM jobs WHERE id IN ({', '.join('?' * len(wanted))})"
        async with self._db.execute(sql, wanted) as cur:
            rows = await cur.fetchall()
        return {int(r["id"]): JobState(r["state"]) for r in rows}

    async def update(
        self, job_id: int, *, event: str | None = None, data: dict[str, Any] | None = None, **fields: Any
    ) -> Job:
        """Change fields of a job and append one event, in one transaction, before anyone acts on it."""
        row = await self._write([Write(job_id, fields, event, data)], changed=True, read=job_id)
        if row is None:
            raise KeyError(job_id)
        return _row_to_job(row)

    async def update_many(self, writes: Sequence[Write], *, changed: bool = True) -> None:
        """Several jobs' changes and events in one transaction (a scheduler round's batch).

        `changed=False`: the writer needs not see these jobs again in `take_changed` (a round's own
        deferral reasons, which it keeps in memory; re-reading thousands of them made the next round slow).
        """
        await self._write(writes, changed=changed, read=None)

    async def _write(self, writes: Sequence[Write], *, changed: bool, read: int | None) -> sqlite3.Row | None:
        """The writes in one transaction, and the row of job `read` after them, in ONE call to the database
        thread (a call per statement cost each job's every state change a dozen thread hand-offs)."""
        for w in writes:
            unknown = set(w.fields) - set(_COLUMNS)
            if unknown:
                raise ValueError(f"unknown job fields: {sorted(unknown)}")
        async with self._tx:
            self._stale_json.update(w.job_id for w in writes)
            if changed:
                self._changed.update(w.job_id for w in writes)
            # aiosqlite's own way to run a function on its connection's thread (as its execute_fetchall does).
            return await self._db._execute(self._write_sync, writes, time.time(), read)

    def _write_sync(self, writes: Sequence[Write], now: float, read: int | None) -> sqlite3.Row | None:
        """Runs on the database thread: BEGIN IMMEDIATE, the updates and events, COMMIT (ROLLBACK on error)."""
        conn = self._db._conn
        with _sync_transaction(conn):
            for w in writes:
                if w.fields:
                    sets = ", ".join(f"{k} = ?" for k in w.fields)
                    conn.execute(
                        f"UPDATE jobs SET {sets} WHERE id = ?",
                        [*(_encode(k, v) for k, v in w.fields.items()), w.job_id],
                    )
                if w.event:
                    payload = dict(w.data or {})
                    if "state" in w.fields:
                        payload.setdefault("state", str(w.fields["state"]))
                    conn.execute(_EVENT_SQL, (w.job_id, now, w.event, json.dumps(payload, default=str)))
        if read is None:
            return None
        row: sqlite3.Row | None = conn.execute("SELECT * FROM jobs WHERE id = ?", (read,)).fetchone()
        return row

    async def delete_job(self, job_id: int) -> None:
        """Forget an ended job: its record and its history (`orchestrator clean`)."""
        async with self._transaction():
            self._changed.add(job_id)
            self._stale_json.add(job_id)
            await self._db.execute("DELETE FROM job_events WHERE job_id = ?", (job_id,))
            await self._db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    # -- run-time controls (pause, per-repo slot limits) ---------------------------------------

    async def controls(self) -> dict[str, tuple[bool, int | None]]:
        """Every control scope (a repo path, or `*` for all) → (paused, slot limit or None)."""
        async with self._db.execute("SELECT scope, paused, slots FROM controls") as cur:
            rows = await cur.fetchall()
        return {r["scope"]: (bool(r["paused"]), r["slots"]) for r in rows}

    async def set_control(self, scope: str, *, paused: bool | None = None, slots: int | bool | None = False) -> None:
        """Set a scope's pause flag and/or slot limit (`slots=None` clears the limit; False leaves it)."""
        async with self._transaction():
            await self._db.execute("INSERT OR IGNORE INTO controls (scope) VALUES (?)", (scope,))
            if paused is not None:
                await self._db.execute("UPDATE controls SET paused = ? WHERE scope = ?", (int(paused), scope))
            if slots is not False:
                await self._db.execute("UPDATE controls SET slots = ? WHERE scope = ?", (slots, scope))
            await self._db.execute("DELETE FROM controls WHERE paused = 0 AND slots IS NULL")

    async def _event(self, job_id: int, kind: str, data: dict[str, Any], at: float) -> None:
        await self._db.execute(
            _EVENT_SQL,
            (job_id, at, kind, json.dumps(data, default=str)),
        )

    async def events(self, job_id: int) -> list[dict[str, Any]]:
        async with self._db.execute(
            "SELECT at, kind, data FROM job_events WHERE job_id = ? ORDER BY id", (job_id,)
        ) as cur:
            rows = await cur.fetchall()
        return [{"at": r["at"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    async def event_jobs(self, kind: str) -> list[tuple[int, dict[str, Any]]]:
        """(job id, data) of every event of one kind, oldest first (e.g. `overlap` for calibration)."""
        async with self._db.execute("SELECT job_id, data FROM job_events WHERE kind = ? ORDER BY id", (kind,)) as cur:
            rows = await cur.fetchall()
        return [(int(r["job_id"]), json.loads(r["data"])) for r in rows]

    # -- planning evidence ------------------------------------------------------------------------

    async def plan_history(self, repo: str) -> tuple[str, list[list[Any]]] | None:
        """A repository's cached change history: (the head it was mined to, its changes), or None."""
        async with self._db.execute("SELECT head, changes FROM plan_history WHERE repo = ?", (repo,)) as cur:
            row = await cur.fetchone()
        return (row["head"], json.loads(row["changes"])) if row else None

    async def save_plan_history(self, repo: str, head: str, changes: list[list[Any]]) -> None:
        async with self._transaction():
            await self._db.execute(
                "INSERT INTO plan_history (repo, head, changes, at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(repo) DO UPDATE SET head = excluded.head, changes = excluded.changes, at = excluded.at",
                (repo, head, json.dumps(changes), time.time()),
            )

    # -- process groups ---------------------------------------------------------------------------

    async def own_process(self, group: Group, job_id: int | None = None) -> None:
        """Record a process group before it may run (see `runners.process`)."""
        async with self._transaction():
            await self._db.execute(
                "INSERT OR REPLACE INTO processes (pgid, start_time, boot_id, job_id, what, started_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (group.pgid, group.start_time, group.boot_id, job_id, group.what, time.time()),
            )

    async def disown_process(self, group: Group) -> None:
        async with self._transaction():
            await self._db.execute(
                "DELETE FROM processes WHERE pgid = ? AND start_time = ?", (group.pgid, group.start_time)
            )

    async def processes(self) -> list[tuple[Group, int | None]]:
        """Every recorded process group, with the job it ran for."""
        async with self._db.execute("SELECT * FROM processes ORDER BY started_at") as cur:
            rows = await cur.fetchall()
        return [(Group(r["pgid"], r["start_time"], r["boot_id"], r["what"]), r["job_id"]) for r in rows]

    # -- landing journal --------------------------------------------------------------------------

    async def journal_begin(self, intent: Intent) -> int:
        async with self._transaction():
            cur = await self._db.execute(
                "INSERT INTO landing_journal (job_id, repo, branch, old, new, checkouts, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    intent.job_id,
                    intent.repo,
                    intent.branch,
                    intent.old,
                    intent.new,
                    json.dumps(list(intent.checkouts)),
                    intent.at,
                ),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    async def journal_end(self, entry: int) -> None:
        async with self._transaction():
            await self._db.execute("DELETE FROM landing_journal WHERE id = ?", (entry,))

    async def journal_open(self) -> list[tuple[int, Intent]]:
        """Landings whose checkouts were not level again when the daemon stopped, oldest first."""
        async with self._db.execute("SELECT * FROM landing_journal ORDER BY id") as cur:
            rows = await cur.fetchall()
        return [
            (
                r["id"],
                Intent(
                    r["repo"], r["branch"], r["old"], r["new"], tuple(json.loads(r["checkouts"])), r["job_id"], r["at"]
                ),
            )
            for r in rows
        ]

    async def recover(self) -> dict[str, list[int]]:
        """After a crash: running jobs become interrupted, planning ones go back to the queue.

        Landing jobs stay landing: their result commit is stored and landing again is safe (an already
        landed commit is a no-op), so nothing is lost and nothing runs twice.
        """
        running = [j.id for j in await self.jobs([JobState.RUNNING])]
        planning = [j.id for j in await self.jobs([JobState.PLANNING])]
        for job_id in running:
            await self.update(
                job_id,
                state=JobState.INTERRUPTED,
                reason="the daemon stopped while this job ran; `orchestrator retry` runs it again",
                code="Interrupted",
                event="interrupted",
            )
        for job_id in planning:
            await self.update(job_id, state=JobState.QUEUED, event="requeued", data={"why": "daemon restarted"})
        landing = [j.id for j in await self.jobs([JobState.LANDING])]
        return {"interrupted": running, "requeued": planning, "landing": landing}

    # -- chat: sessions, messages, memories (the chat plane's; nothing else reads them) --------------

    async def add_message(self, session: str, role: str, content: str) -> int:
        """Append one message to a session's history (the session is created on its first message)."""
        async with self._tx:
            return await self._db._execute(self._add_message_sync, session, role, content, time.time())

    def _add_message_sync(self, session: str, role: str, content: str, now: float) -> int:
        conn = self._db._conn
        with _sync_transaction(conn):
            conn.execute("INSERT OR IGNORE INTO sessions (id, created_at) VALUES (?, ?)", (session, now))
            cur = conn.execute(
                "INSERT INTO messages (session_id, role, content, at) VALUES (?, ?, ?, ?)",
                (session, role, content, now),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    async def open_turn(self, session: str, text: str, history: int, memories: int = 50) -> tuple[
        list[dict[str, Any]], list[str]
    ]:
        """A new user message: the session's last `history` messages and its memories (as before the message),
        then the message stored, in ONE call to the database thread (a burst of turns would otherwise spend
        the daemon's loop on thread hand-offs while other sessions wait for their acknowledgement)."""
        async with self._tx:
            return await self._db._execute(self._open_turn_sync, session, text, history, memories, time.time())

    def _open_turn_sync(
        self, session: str, text: str, history: int, memories: int, now: float
    ) -> tuple[list[dict[str, Any]], list[str]]:
        conn = self._db._conn
        rows = conn.execute(_HISTORY_SQL, (session, history)).fetchall()
        mems = conn.execute(_MEMORIES_SQL, (session, memories)).fetchall()
        self._add_message_sync(session, "user", text, now)
        return [dict(r) for r in reversed(rows)], [r["content"] for r in mems]

    async def history(self, session: str, limit: int = 20) -> list[dict[str, Any]]:
        """The session's last `limit` messages, oldest first: `id, role, content, at, extracted`."""
        async with self._db.execute(_HISTORY_SQL, (session, limit)) as cur:
            rows = await cur.fetchall()
        return [dict(r) for r in reversed(list(rows))]

    async def unextracted(self, session: str) -> list[dict[str, Any]]:
        """Messages whose memories have not been extracted yet, oldest first."""
        async with self._db.execute(
            "SELECT id, role, content, at FROM messages WHERE session_id = ? AND extracted = 0 ORDER BY id", (session,)
        ) as cur:
            return [dict(r) for r in await cur.fetchall()]

    async def unextracted_sessions(self) -> list[str]:
        """Sessions with messages whose memories have not been extracted yet (after a restart: to resume)."""
        async with self._db.execute("SELECT DISTINCT session_id FROM messages WHERE extracted = 0") as cur:
            return [r[0] for r in await cur.fetchall()]

    async def remember(self, session: str, upto: int, memories: Sequence[str]) -> None:
        """Store extracted memories and mark the session's messages up to `upto` as extracted, atomically."""
        now = time.time()
        async with self._transaction():
            await self._db.executemany(
                "INSERT INTO memories (session_id, content, at) VALUES (?, ?, ?)", [(session, m, now) for m in memories]
            )
            await self._db.execute(
                "UPDATE messages SET extracted = 1 WHERE session_id = ? AND id <= ?", (session, upto)
            )

    async def memories(self, session: str, limit: int = 50) -> list[str]:
        """The session's memories, newest first."""
        async with self._db.execute(_MEMORIES_SQL, (session, limit)) as cur:
            return [r["content"] for r in await cur.fetchall()]
