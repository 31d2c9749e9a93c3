"""The PostgreSQL store's records beside its jobs: job events, run-time controls and each node's rate limits, the
chat plane's sessions, each node's planning history, and the landing journal of its pushes onto the shared
remote; each implements its Protocol of `store.base`. Rows a node keeps for itself carry its name.

What a node acts on on its own machine (its process groups, the landing journal of its own checkouts, its record
of each repository) is kept in its own file (`local`, a `store.sqlite` part), never here: any node, or anyone
with the database, could have written it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import asyncpg

from orchestrator.core.models import JobEvent
from orchestrator.core.records import Intent
from orchestrator.store.base import LandingJournal, PlanCache
from orchestrator.store.pgconn import PgConnection


class PgEvents:
    """Each job's history, the team's (`store.base.EventLog`)."""

    def __init__(self, db: PgConnection) -> None:
        self._db = db

    async def of_job(self, job_id: int) -> list[dict[str, Any]]:
        rows = await self._db.fetch("SELECT at, kind, data FROM job_events WHERE job_id = $1 ORDER BY id", job_id)
        return [{"at": r["at"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    async def of_kind(self, kind: JobEvent) -> list[tuple[int, dict[str, Any]]]:
        rows = await self._db.fetch("SELECT job_id, data FROM job_events WHERE kind = $1 ORDER BY id", kind)
        return [(int(r["job_id"]), json.loads(r["data"])) for r in rows]


class PgLimits:
    """Run-time controls (the team's) and rate limits (each node's) (`store.base.Limits`)."""

    def __init__(self, db: PgConnection, node: str) -> None:
        self._db = db
        self.node = node

    async def controls(self) -> dict[str, tuple[bool, int | None]]:
        rows = await self._db.fetch("SELECT scope, paused, slots FROM controls")
        return {r["scope"]: (bool(r["paused"]), r["slots"]) for r in rows}

    async def set_control(self, scope: str, *, paused: bool | None = None, slots: int | bool | None = False) -> None:
        async def work(conn: asyncpg.Connection) -> None:
            await conn.execute("INSERT INTO controls (scope) VALUES ($1) ON CONFLICT DO NOTHING", scope)
            if paused is not None:
                await conn.execute("UPDATE controls SET paused = $1 WHERE scope = $2", int(paused), scope)
            if slots is not False:
                await conn.execute("UPDATE controls SET slots = $1 WHERE scope = $2", slots, scope)
            await conn.execute("DELETE FROM controls WHERE paused = 0 AND slots IS NULL")

        await self._db.run(work)

    async def rate_limits(self) -> dict[str, float]:
        rows = await self._db.fetch("SELECT runner, until FROM rate_limits WHERE node = $1", self.node)
        return {r["runner"]: float(r["until"]) for r in rows}

    async def set_rate_limit(self, runner: str, until: float) -> None:
        async def work(conn: asyncpg.Connection) -> None:
            await conn.execute("DELETE FROM rate_limits WHERE node = $1 AND until <= $2", self.node, time.time())
            await conn.execute(
                "INSERT INTO rate_limits (node, runner, until) VALUES ($1, $2, $3) ON CONFLICT (node, runner) "
                "DO UPDATE SET until = greatest(rate_limits.until, excluded.until)",
                self.node, runner, until,
            )  # fmt: skip

        await self._db.run(work)


class PgChat:
    """The chat plane's sessions, messages and memories, the team's (`store.base.ChatLog`)."""

    def __init__(self, db: PgConnection) -> None:
        self._db = db

    async def add_message(self, session: str, role: str, content: str) -> int:
        return await self._db.run(lambda c: _add_message(c, session, role, content, time.time()))

    async def open_turn(
        self, session: str, text: str, history: int, memories: int = 50
    ) -> tuple[list[dict[str, Any]], list[str]]:
        async def work(conn: asyncpg.Connection) -> tuple[list[dict[str, Any]], list[str]]:
            rows = await conn.fetch(_HISTORY, session, history)
            mems = await conn.fetch(_MEMORIES, session, memories)
            await _add_message(conn, session, "user", text, time.time())
            return [dict(r) for r in reversed(rows)], [r["content"] for r in mems]

        return await self._db.run(work)

    async def history(self, session: str, limit: int = 20) -> list[dict[str, Any]]:
        return [dict(r) for r in reversed(await self._db.fetch(_HISTORY, session, limit))]

    async def unextracted(self, session: str) -> list[dict[str, Any]]:
        rows = await self._db.fetch(
            "SELECT id, role, content, at FROM messages WHERE session_id = $1 AND extracted = 0 ORDER BY id", session
        )
        return [dict(r) for r in rows]

    async def unextracted_sessions(self) -> list[str]:
        return [r[0] for r in await self._db.fetch("SELECT DISTINCT session_id FROM messages WHERE extracted = 0")]

    async def remember(self, session: str, upto: int, memories: Sequence[str]) -> None:
        async def work(conn: asyncpg.Connection) -> None:
            now = time.time()
            await conn.executemany(
                "INSERT INTO memories (session_id, content, at) VALUES ($1, $2, $3)",
                [(session, m, now) for m in memories],
            )
            await conn.execute("UPDATE messages SET extracted = 1 WHERE session_id = $1 AND id <= $2", session, upto)

        await self._db.run(work)

    async def memories(self, session: str, limit: int = 50) -> list[str]:
        return [r["content"] for r in await self._db.fetch(_MEMORIES, session, limit)]


class PgPlans:
    """Each node's planning history here; its record in its own file (`store.base.PlanCache`)."""

    def __init__(self, db: PgConnection, node: str, local: PlanCache) -> None:
        self._db = db
        self.node = node
        self._local = local

    async def history(self, repo: str) -> tuple[str, list[list[Any]]] | None:
        row = await self._db.fetchrow(
            "SELECT head, changes FROM plan_history WHERE node = $1 AND repo = $2", self.node, repo
        )
        return (row["head"], json.loads(row["changes"])) if row else None

    async def save_history(self, repo: str, head: str, changes: list[list[Any]]) -> None:
        await self._db.execute(
            "INSERT INTO plan_history (node, repo, head, changes, at) VALUES ($1, $2, $3, $4, $5) "
            "ON CONFLICT (node, repo) "
            "DO UPDATE SET head = excluded.head, changes = excluded.changes, at = excluded.at",
            self.node, repo, head, json.dumps(changes), time.time(),
        )  # fmt: skip

    async def record(self, repo: str) -> tuple[str, dict[str, Any] | None] | None:
        """This node's record of a repository, from its own file: what its planner estimates risk from is never read
        back from the shared store, where another node could have written it."""
        return await self._local.record(repo)

    async def save_record(self, repo: str, newest: str, record: dict[str, Any] | None) -> None:
        await self._local.save_record(repo, newest, record)


class PgJournal:
    """A landing's intent: into this node's checkouts in its own file, a push onto the shared remote here, for the
    node that takes the job over to find (`remote`) (`store.base.LandingJournal`)."""

    def __init__(self, db: PgConnection, node: str, local: LandingJournal) -> None:
        self._db = db
        self.node = node
        self._local = local

    async def begin(self, intent: Intent) -> int:
        """The intent's entry: a local one (negative: in the node's own file) when it names checkouts, a shared one
        when it is a push onto the shared remote."""
        if intent.checkouts:
            return -await self._local.begin(intent)
        row = await self._db.fetchrow(
            "INSERT INTO landing_journal (node, job_id, repo, branch, old, new, checkouts, at) "
            "VALUES ($1, $2, $3, $4, $5, $6, '[]', $7) RETURNING id",
            self.node, intent.job_id, intent.repo, intent.branch, intent.old, intent.new, intent.at,
        )  # fmt: skip
        assert row is not None
        return int(row[0])

    async def end(self, entry: int) -> None:
        if entry < 0:
            await self._local.end(-entry)
            return
        await self._db.execute("DELETE FROM landing_journal WHERE id = $1 AND node = $2", entry, self.node)

    async def open(self) -> list[tuple[int, Intent]]:
        """This node's landings into its own checkouts that were not level when it stopped (from its own file)."""
        return [(-entry, intent) for entry, intent in await self._local.open()]

    async def remote(self, job_id: int) -> list[Intent]:
        """A job's open landing intents on the shared remote (a push whose answer its node never recorded)."""
        rows = await self._db.fetch(
            "SELECT * FROM landing_journal WHERE job_id = $1 AND checkouts = '[]' ORDER BY id", job_id
        )
        return [intent_of(r) for r in rows]


_HISTORY = "SELECT id, role, content, at, extracted FROM messages WHERE session_id = $1 ORDER BY id DESC LIMIT $2"
_MEMORIES = "SELECT content FROM memories WHERE session_id = $1 ORDER BY id DESC LIMIT $2"


async def _add_message(conn: asyncpg.Connection, session: str, role: str, content: str, now: float) -> int:
    await conn.execute("INSERT INTO sessions (id, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING", session, now)
    return int(
        await conn.fetchval(
            "INSERT INTO messages (session_id, role, content, at) VALUES ($1, $2, $3, $4) RETURNING id",
            session, role, content, now,
        )
    )  # fmt: skip


def intent_of(r: asyncpg.Record) -> Intent:
    return Intent(r["repo"], r["branch"], r["old"], r["new"], tuple(json.loads(r["checkouts"])), r["job_id"], r["at"])
