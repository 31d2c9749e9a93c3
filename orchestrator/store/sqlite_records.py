"""The SQLite store's records beside its jobs: job events, the landing journal, process groups, run-time limits,
the chat plane's sessions and the planner's caches, each implementing its Protocol of `store.base` on the one
connection of `store.sqlite.SqliteStore`."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Collection, Sequence
from typing import Any

from orchestrator.core.models import JobEvent
from orchestrator.core.records import Group, Intent
from orchestrator.store.sqlite_thread import Connection, transaction

_HISTORY_SQL = "SELECT id, role, content, at, extracted FROM messages WHERE session_id = ? ORDER BY id DESC LIMIT ?"
_MEMORIES_SQL = "SELECT content FROM memories WHERE session_id = ? ORDER BY id DESC LIMIT ?"


def in_(values: Collection[Any]) -> str:
    """The placeholders of an `IN (...)` list."""
    return ", ".join("?" * len(values))


class SqliteEvents:
    """Each job's history (`store.base.EventLog`)."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    async def of_job(self, job_id: int) -> list[dict[str, Any]]:
        rows = await self._db.fetchall("SELECT at, kind, data FROM job_events WHERE job_id = ? ORDER BY id", (job_id,))
        return [{"at": r["at"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    async def of_kind(self, kind: JobEvent) -> list[tuple[int, dict[str, Any]]]:
        """(job id, data) of every event of one kind, oldest first (e.g. `overlap` for calibration)."""
        rows = await self._db.fetchall("SELECT job_id, data FROM job_events WHERE kind = ? ORDER BY id", (kind,))
        return [(int(r["job_id"]), json.loads(r["data"])) for r in rows]


class SqliteJournal:
    """Landings' intents (`store.base.LandingJournal`)."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    async def begin(self, intent: Intent) -> int:
        return await self._db.execute(
            "INSERT INTO landing_journal (job_id, repo, branch, old, new, checkouts, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
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

    async def end(self, entry: int) -> None:
        await self._db.execute("DELETE FROM landing_journal WHERE id = ?", (entry,))

    async def open(self) -> list[tuple[int, Intent]]:
        """Landings whose checkouts were not level again when the daemon stopped, oldest first."""
        rows = await self._db.fetchall("SELECT * FROM landing_journal ORDER BY id")
        return [
            (
                r["id"],
                Intent(
                    r["repo"], r["branch"], r["old"], r["new"], tuple(json.loads(r["checkouts"])), r["job_id"], r["at"]
                ),
            )
            for r in rows
        ]


class SqliteProcesses:
    """The process groups the daemon started (`store.base.ProcessTable`)."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    async def own(self, group: Group, job_id: int | None = None) -> None:
        """Record a process group before it may run (see `proc.process`)."""
        await self._db.execute(
            "INSERT OR REPLACE INTO processes (pgid, start_time, boot_id, job_id, what, started_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (group.pgid, group.start_time, group.boot_id, job_id, group.what, time.time()),
        )

    async def disown(self, group: Group) -> None:
        await self._db.execute(
            "DELETE FROM processes WHERE pgid = ? AND start_time = ?", (group.pgid, group.start_time)
        )

    async def all(self) -> list[tuple[Group, int | None]]:
        """Every recorded process group, with the job it ran for."""
        rows = await self._db.fetchall("SELECT * FROM processes ORDER BY started_at")
        return [(Group(r["pgid"], r["start_time"], r["boot_id"], r["what"]), r["job_id"]) for r in rows]


class SqliteLimits:
    """Run-time controls and rate limits (`store.base.Limits`)."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    async def controls(self) -> dict[str, tuple[bool, int | None]]:
        """Every control scope (a repo path, or `*` for all) → (paused, slot limit or None)."""
        rows = await self._db.fetchall("SELECT scope, paused, slots FROM controls")
        return {r["scope"]: (bool(r["paused"]), r["slots"]) for r in rows}

    async def set_control(self, scope: str, *, paused: bool | None = None, slots: int | bool | None = False) -> None:
        """Set a scope's pause flag and/or slot limit (`slots=None` clears the limit; False leaves it)."""
        await self._db.call(_set_control_sync, scope, paused, slots)

    async def rate_limits(self) -> dict[str, float]:
        """Every stored rate limit: runner → the UNIX time it ends (ended ones too, until the next is stored)."""
        rows = await self._db.fetchall("SELECT runner, until FROM rate_limits")
        return {r["runner"]: float(r["until"]) for r in rows}

    async def set_rate_limit(self, runner: str, until: float) -> None:
        """Store that `runner` is limited until `until` (a later end stored already stands); forget ended ones."""
        await self._db.call(_set_rate_limit_sync, runner, until, time.time())


class SqliteChat:
    """The chat plane's sessions, messages and memories (`store.base.ChatLog`)."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    async def add_message(self, session: str, role: str, content: str) -> int:
        """Append one message to a session's history (the session is created on its first message)."""
        return await self._db.call(_add_message_sync, session, role, content, time.time())

    async def open_turn(
        self, session: str, text: str, history: int, memories: int = 50
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """A new user message: the session's last `history` messages and its memories (as before the message),
        then the message stored, in ONE call to the database thread (a burst of turns would otherwise spend
        the daemon's loop on thread hand-offs while other sessions wait for their acknowledgement)."""
        return await self._db.call(_open_turn_sync, session, text, history, memories, time.time())

    async def history(self, session: str, limit: int = 20) -> list[dict[str, Any]]:
        """The session's last `limit` messages, oldest first: `id, role, content, at, extracted`."""
        rows = await self._db.fetchall(_HISTORY_SQL, (session, limit))
        return [dict(r) for r in reversed(rows)]

    async def unextracted(self, session: str) -> list[dict[str, Any]]:
        """Messages whose memories have not been extracted yet, oldest first."""
        rows = await self._db.fetchall(
            "SELECT id, role, content, at FROM messages WHERE session_id = ? AND extracted = 0 ORDER BY id", (session,)
        )
        return [dict(r) for r in rows]

    async def unextracted_sessions(self) -> list[str]:
        """Sessions with messages whose memories have not been extracted yet (after a restart: to resume)."""
        rows = await self._db.fetchall("SELECT DISTINCT session_id FROM messages WHERE extracted = 0")
        return [r[0] for r in rows]

    async def remember(self, session: str, upto: int, memories: Sequence[str]) -> None:
        """Store extracted memories and mark the session's messages up to `upto` as extracted, atomically."""
        await self._db.call(_remember_sync, session, upto, list(memories), time.time())

    async def memories(self, session: str, limit: int = 50) -> list[str]:
        """The session's memories, newest first."""
        return [r["content"] for r in await self._db.fetchall(_MEMORIES_SQL, (session, limit))]


class SqlitePlans:
    """The planner's caches of each repository (`store.base.PlanCache`)."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    async def history(self, repo: str) -> tuple[str, list[list[Any]]] | None:
        """A repository's cached change history: (the head it was mined to, its changes), or None."""
        row = await self._db.fetchone("SELECT head, changes FROM plan_history WHERE repo = ?", (repo,))
        return (row["head"], json.loads(row["changes"])) if row else None

    async def save_history(self, repo: str, head: str, changes: list[list[Any]]) -> None:
        await self._db.execute(
            "INSERT INTO plan_history (repo, head, changes, at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(repo) DO UPDATE SET head = excluded.head, changes = excluded.changes, at = excluded.at",
            (repo, head, json.dumps(changes), time.time()),
        )

    async def record(self, repo: str) -> tuple[str, dict[str, Any] | None] | None:
        """A repository's kept record: (the newest change it was built on, its calibration's `dump` or None: too
        short to estimate a risk), or None when none is kept."""
        row = await self._db.fetchone("SELECT newest, record FROM plan_record WHERE repo = ?", (repo,))
        return (row["newest"], json.loads(row["record"]) if row["record"] else None) if row else None

    async def save_record(self, repo: str, newest: str, record: dict[str, Any] | None) -> None:
        await self._db.execute(
            "INSERT INTO plan_record (repo, newest, record, at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(repo) DO UPDATE SET newest = excluded.newest, record = excluded.record, at = excluded.at",
            (repo, newest, json.dumps(record) if record is not None else None, time.time()),
        )


# -- on the database thread ----------------------------------------------------------------------------


def _set_control_sync(conn: sqlite3.Connection, scope: str, paused: bool | None, slots: int | bool | None) -> None:
    with transaction(conn):
        conn.execute("INSERT OR IGNORE INTO controls (scope) VALUES (?)", (scope,))
        if paused is not None:
            conn.execute("UPDATE controls SET paused = ? WHERE scope = ?", (int(paused), scope))
        if slots is not False:
            conn.execute("UPDATE controls SET slots = ? WHERE scope = ?", (slots, scope))
        conn.execute("DELETE FROM controls WHERE paused = 0 AND slots IS NULL")


def _set_rate_limit_sync(conn: sqlite3.Connection, runner: str, until: float, now: float) -> None:
    with transaction(conn):
        conn.execute("DELETE FROM rate_limits WHERE until <= ?", (now,))
        conn.execute(
            "INSERT INTO rate_limits (runner, until) VALUES (?, ?) "
            "ON CONFLICT (runner) DO UPDATE SET until = max(until, excluded.until)",
            (runner, until),
        )


def _add_message_sync(conn: sqlite3.Connection, session: str, role: str, content: str, now: float) -> int:
    with transaction(conn):
        conn.execute("INSERT OR IGNORE INTO sessions (id, created_at) VALUES (?, ?)", (session, now))
        cur = conn.execute(
            "INSERT INTO messages (session_id, role, content, at) VALUES (?, ?, ?, ?)",
            (session, role, content, now),
        )
    assert cur.lastrowid is not None
    return cur.lastrowid


def _open_turn_sync(
    conn: sqlite3.Connection, session: str, text: str, history: int, memories: int, now: float
) -> tuple[list[dict[str, Any]], list[str]]:
    rows = conn.execute(_HISTORY_SQL, (session, history)).fetchall()
    mems = conn.execute(_MEMORIES_SQL, (session, memories)).fetchall()
    _add_message_sync(conn, session, "user", text, now)
    return [dict(r) for r in reversed(rows)], [r["content"] for r in mems]


def _remember_sync(conn: sqlite3.Connection, session: str, upto: int, memories: list[str], now: float) -> None:
    with transaction(conn):
        conn.executemany(
            "INSERT INTO memories (session_id, content, at) VALUES (?, ?, ?)", [(session, m, now) for m in memories]
        )
        conn.execute("UPDATE messages SET extracted = 1 WHERE session_id = ? AND id <= ?", (session, upto))
