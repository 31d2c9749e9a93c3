"""The one store: SQLite on a thread of its own, WAL, schema versioned by migrations (`schema`).

Every state change is committed before the daemon acts on it, together with an append-only event in
`job_events`, so a killed daemon restarts where it was. A job's state changes only through `transition`, a
compare-and-set (`UPDATE … WHERE id = ? AND state IN (…) RETURNING *`) checked against the table of allowed
moves (`core.lifecycle`); every other write of a job's fields names the states it expects too, so a writer
that acted on a stale read backs off instead of overwriting what happened meanwhile. The chat plane's
sessions and memories live here too.

Everything SQL stays in this module and `schema` (another engine can replace them behind the same methods:
the writes are compare-and-sets with RETURNING, each transaction is one call, no SQLite type leaks out).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from orchestrator import logging as olog
from orchestrator.core import lifecycle
from orchestrator.core.job import FIELDS, Codec, Job, encode, from_row
from orchestrator.core.models import Claim, Code, JobEvent, JobState
from orchestrator.core.records import Group, Intent
from orchestrator.store.base import DuplicateTicket, StoreFull, StoreUnusable, Write
from orchestrator.store.reserve import Reserve
from orchestrator.store.schema import MIGRATIONS
from orchestrator.store.sqlite_thread import Connection, transaction

__all__ = ["MIGRATIONS", "Store"]


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

_COLUMNS = tuple(FIELDS)
_LIVE = ("reason", "code", "decision")
"""The fields a waiting job's live admission decision overrides (see `Store.jobs_json`)."""


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
    f"SELECT id, state, {_json_object(['id', *(c for c in _COLUMNS if c not in _LIVE)])} AS body, "
    f"{_json_object(_LIVE)} AS live FROM jobs"
)


def _encode(name: str, value: Any) -> Any:
    return encode(FIELDS[name], value)


_EVENT_SQL = "INSERT INTO job_events (job_id, at, kind, data) VALUES (?, ?, ?, ?)"
_HISTORY_SQL = "SELECT id, role, content, at, extracted FROM messages WHERE session_id = ? ORDER BY id DESC LIMIT ?"
_MEMORIES_SQL = "SELECT content FROM memories WHERE session_id = ? ORDER BY id DESC LIMIT ?"

JSON_CACHE_MAX = 20_000
"""Jobs whose rendered JSON `Store.jobs_json` keeps between calls (past that, each call renders them all)."""

def _check_fields(fields: dict[str, Any]) -> None:
    unknown = set(fields) - set(_COLUMNS)
    if unknown:
        raise ValueError(f"unknown job fields: {sorted(unknown)}")
    if "state" in fields:
        raise lifecycle.MoveError("a job's state changes only through `Store.transition`")


def _checked(writes: Sequence[Write]) -> Sequence[Write]:
    """`writes`, each checked: known fields, an allowed move, at least one state expected."""
    for w in writes:
        _check_fields(w.fields)
        if w.to is not None:
            lifecycle.check(w.expect, w.to)
        elif not w.expect:
            raise ValueError("an update must expect at least one state")
    return writes


def _in(values: Collection[Any]) -> str:
    """The placeholders of an `IN (...)` list."""
    return ", ".join("?" * len(values))


def _write_one(conn: sqlite3.Connection, w: Write, now: float) -> sqlite3.Row | None:
    """One guarded write on the database thread: the job's row after it, or None if it was not in `expect`."""
    values = dict(w.fields)
    if w.to is not None:
        values["state"] = w.to
    expect = sorted(str(s) for s in w.expect)
    if values:
        sets = ", ".join(f"{k} = ?" for k in values)
        sql = f"UPDATE jobs SET {sets} WHERE id = ? AND state IN ({_in(expect)}) RETURNING *"
        row: sqlite3.Row | None = conn.execute(
            sql, [*(_encode(k, v) for k, v in values.items()), w.job_id, *expect]
        ).fetchone()
    else:
        row = conn.execute(
            f"SELECT * FROM jobs WHERE id = ? AND state IN ({_in(expect)})", [w.job_id, *expect]
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


class Store:
    """Async access to the SQLite file: one connection on its own thread; each transaction is one call to it."""

    def __init__(self, conn: Connection, path: Path | None = None) -> None:
        self._db = conn
        self.path = path or "the database"
        # Ids of jobs written since the scheduler last asked (`take_changed`): its rounds re-read only those.
        self._changed: set[int] = set()
        # `jobs_json`'s rendered rows by id (None: not read yet), and the ids written since it last read.
        self._json: dict[int, tuple[str, str, str]] | None = None
        self._stale_json: set[int] = set()
        self._json_lock = asyncio.Lock()
        self.reserve = Reserve(Path(f"{path}-reserve")) if path is not None else None
        """Room kept on the database's disk for the writes that settle jobs when it is full (`store.reserve`)."""
        self._reserve_looked = 0.0

    @classmethod
    async def open(cls, path: Path) -> Store:
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

    def _job(self, row: Any) -> Job:
        """A job from its row, as this engine reads it (the guarded writes return what `_write` gave back)."""
        return from_row(row)

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

    # -- jobs: reads --------------------------------------------------------------------------------

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
        labels: Sequence[str] = (),
        place: float | None = None,
        author: str = "",
    ) -> Job:
        """Queue a job; `ticket` (key, ticket id) is recorded in the same transaction (a duplicate key raises).
        `labels`: the nodes of a team it may run on (kept, and shown, on one machine too). `place`: its place in
        the queue (None: its id, after every job queued before it; `core.queue`)."""
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
            labels=tuple(sorted(set(labels))),
            place=place,
            author=author,
        )
        job_id = await self._insert(job, ticket)
        self._changed.add(job_id)
        self._stale_json.add(job_id)
        return replace(job, id=job_id)

    async def _insert(self, job: Job, ticket: tuple[str, str | None] | None) -> int:
        """Store a new job, its `enqueued` event and its ticket in one transaction; its id."""
        values = [_encode(c, getattr(job, c)) for c in _COLUMNS]
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

    async def jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        if states is None:
            rows = await self._db.fetchall("SELECT * FROM jobs ORDER BY id")
        else:
            names = tuple(sorted(str(s) for s in states))
            rows = await self._db.fetchall(f"SELECT * FROM jobs WHERE state IN ({_in(names)}) ORDER BY id", names)
        return [from_row(r) for r in rows]

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
            rendered = {row[0]: row[1:] for row in await self._render_json(None)}
            self._json = rendered if len(rendered) <= JSON_CACHE_MAX else None
        elif stale:
            fresh = {row[0]: row[1:] for row in await self._render_json(sorted(stale))}
            for job_id in stale:
                if job_id in fresh:
                    self._json[job_id] = fresh[job_id]
                else:
                    self._json.pop(job_id, None)  # deleted
            if any(a > b for a, b in itertools.pairwise(self._json)):  # ids are new at the end; keep id order
                self._json = dict(sorted(self._json.items()))
        names = None if states is None else {str(s) for s in states}
        rows = self._json if self._json is not None else rendered
        return [(i, *row) for i, row in rows.items() if names is None or row[0] in names]

    async def _render_json(self, ids: list[int] | None) -> list[tuple[int, str, str, str]]:
        rows = await self._db.call(_render_json_sync, ids)
        return [(int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in sorted(rows, key=lambda r: int(r[0]))]

    async def count(self, states: Iterable[JobState]) -> int:
        """How many jobs are in these states (without reading them)."""
        names = tuple(sorted(str(s) for s in states))
        row = await self._db.fetchone(f"SELECT count(*) FROM jobs WHERE state IN ({_in(names)})", names)
        return int(row[0]) if row else 0

    def take_changed(self) -> set[int]:
        """Ids of the jobs written since the last call (for one consumer: the scheduler's rounds)."""
        changed, self._changed = self._changed, set()
        return changed

    async def get_many(self, ids: Iterable[int]) -> list[Job]:
        """These jobs (missing ids are left out), by id."""
        return [from_row(r) for r in await self._db.call(_get_many_sync, sorted(set(ids)))]

    async def states(self, ids: Iterable[int]) -> dict[int, JobState]:
        """The current state of each of these jobs (missing ids are left out)."""
        rows = await self._db.call(_states_sync, sorted(set(ids)))
        return {int(r["id"]): JobState(r["state"]) for r in rows}

    # -- jobs: guarded writes -------------------------------------------------------------------------

    async def transition(
        self,
        job_id: int,
        expect: Collection[JobState],
        to: JobState,
        event: JobEvent,
        *,
        data: dict[str, Any] | None = None,
        beside: Collection[int] | None = None,
        **fields: Any,
    ) -> Job | None:
        """Move a job from one of `expect` to `to`, with `fields` and one event, in one transaction: the only
        writer of a job's state. None (nothing written) when the job is no longer in `expect`: the caller acted
        on a read that is stale, and backs off. `beside`: see `Write.beside`."""
        sources = lifecycle.check(expect, to)
        _check_fields(fields)
        fence = None if beside is None else frozenset(beside)
        write = Write(job_id, fields, event, data, sources, to, fence)
        rows = await self._settling(lambda: self._write([write]))
        return self._job(rows[0]) if rows[0] is not None else None

    async def update(
        self,
        job_id: int,
        expect: Collection[JobState],
        *,
        event: JobEvent | None = None,
        data: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Job | None:
        """Change fields of a job (never its state) and append one event, in one transaction, while the job is
        in one of `expect`; None (nothing written) when it is not."""
        if not expect:
            raise ValueError("an update must expect at least one state")
        _check_fields(fields)
        rows = await self._write([Write(job_id, fields, event, data, frozenset(expect))])
        return self._job(rows[0]) if rows[0] is not None else None

    async def update_many(self, writes: Sequence[Write], *, changed: bool = True) -> list[int]:
        """Several jobs' guarded writes in one transaction (a scheduler round's batch): the ids written.

        `changed=False`: the writer needs not see these jobs again in `take_changed` (a round's own
        deferral reasons, which it keeps in memory; re-reading thousands of them made the next round slow).
        """
        rows = await self._write(_checked(writes), changed=changed)
        return [w.job_id for w, row in zip(writes, rows, strict=True) if row is not None]

    async def update_all(self, writes: Sequence[Write]) -> list[Job] | None:
        """Several jobs' guarded writes, all or none, in one transaction (two jobs switching places): the jobs
        after them, or None (nothing written) when any job is no longer in what its write expects."""
        rows = await self._write(_checked(writes), atomic=True)
        return None if any(r is None for r in rows) else [self._job(r) for r in rows]

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

    def _written(self, writes: Sequence[Write], rows: Sequence[Any], changed: bool) -> None:
        """Note the jobs these writes changed (a row back): `jobs_json` renders them again, and (when `changed`
        or a state moved) the scheduler's next round re-reads them (`take_changed`)."""
        for w, row in zip(writes, rows, strict=True):
            if row is not None:
                self._stale_json.add(w.job_id)
                if changed or w.to is not None:
                    self._changed.add(w.job_id)

    # -- the team's queue (team mode: `store.postgres`; one machine has no other node) ------------------

    async def claim(self) -> list[int]:
        """Take queued jobs from a team's queue for this node: on one machine every job is this node's."""
        return []

    async def team_jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        """Every node's jobs (in these states): on one machine, `jobs`."""
        return await self.jobs(states)

    @property
    def home(self) -> Path:
        """The file this daemon keeps its own records in (its process groups, its checkouts' journal): the marks
        of the commands it starts are named after it (`StoreOwner.tag`), so a restart ends its own leftovers
        and nobody else's."""
        return Path(self.path)

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

    async def register_clone(self, key: str, path: str, url: str) -> None:
        """Team mode: this node has a clone of shared repository `key` at `path` (see `clones`)."""
        await self._db.execute(
            "INSERT INTO clones (key, path, url) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET path = excluded.path, url = excluded.url",
            (key, path, url),
        )

    async def delete_job(self, job_id: int, expect: Collection[JobState]) -> bool:
        """Forget an ended job (`orchestrator clean`): its record and its history, if it is in one of `expect`."""
        states = sorted(str(s) for s in expect)
        done = await self._settling(lambda: self._db.call(_delete_sync, job_id, states))
        self._changed.add(job_id)
        self._stale_json.add(job_id)
        return done

    async def recover(self) -> dict[str, list[int]]:
        """After a crash: running jobs become interrupted, planning ones go back to the queue.

        Landing jobs stay landing: their result commit is stored and landing again is safe (an already
        landed commit is a no-op), so nothing is lost and nothing runs twice.
        """
        running = [j.id for j in await self.jobs([JobState.RUNNING])]
        planning = [j.id for j in await self.jobs([JobState.PLANNING])]
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
        landing = [j.id for j in await self.jobs([JobState.LANDING])]
        return {"interrupted": running, "requeued": planning, "landing": landing}

    # -- run-time controls (pause, per-repo slot limits) ---------------------------------------

    async def controls(self) -> dict[str, tuple[bool, int | None]]:
        """Every control scope (a repo path, or `*` for all) → (paused, slot limit or None)."""
        rows = await self._db.fetchall("SELECT scope, paused, slots FROM controls")
        return {r["scope"]: (bool(r["paused"]), r["slots"]) for r in rows}

    async def set_control(self, scope: str, *, paused: bool | None = None, slots: int | bool | None = False) -> None:
        """Set a scope's pause flag and/or slot limit (`slots=None` clears the limit; False leaves it)."""
        await self._db.call(_set_control_sync, scope, paused, slots)

    # -- rate limits the runners met (`jobs.limits`) --------------------------------------------------

    async def rate_limits(self) -> dict[str, float]:
        """Every stored rate limit: runner → the UNIX time it ends (ended ones too, until the next is stored)."""
        rows = await self._db.fetchall("SELECT runner, until FROM rate_limits")
        return {r["runner"]: float(r["until"]) for r in rows}

    async def set_rate_limit(self, runner: str, until: float) -> None:
        """Store that `runner` is limited until `until` (a later end stored already stands); forget ended ones."""
        await self._db.call(_set_rate_limit_sync, runner, until, time.time())

    async def events(self, job_id: int) -> list[dict[str, Any]]:
        rows = await self._db.fetchall("SELECT at, kind, data FROM job_events WHERE job_id = ? ORDER BY id", (job_id,))
        return [{"at": r["at"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    async def event_jobs(self, kind: JobEvent) -> list[tuple[int, dict[str, Any]]]:
        """(job id, data) of every event of one kind, oldest first (e.g. `overlap` for calibration)."""
        rows = await self._db.fetchall("SELECT job_id, data FROM job_events WHERE kind = ? ORDER BY id", (kind,))
        return [(int(r["job_id"]), json.loads(r["data"])) for r in rows]

    # -- planning evidence ------------------------------------------------------------------------

    async def plan_history(self, repo: str) -> tuple[str, list[list[Any]]] | None:
        """A repository's cached change history: (the head it was mined to, its changes), or None."""
        row = await self._db.fetchone("SELECT head, changes FROM plan_history WHERE repo = ?", (repo,))
        return (row["head"], json.loads(row["changes"])) if row else None

    async def save_plan_history(self, repo: str, head: str, changes: list[list[Any]]) -> None:
        await self._db.execute(
            "INSERT INTO plan_history (repo, head, changes, at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(repo) DO UPDATE SET head = excluded.head, changes = excluded.changes, at = excluded.at",
            (repo, head, json.dumps(changes), time.time()),
        )

    async def plan_record(self, repo: str) -> tuple[str, dict[str, Any] | None] | None:
        """A repository's kept record: (the newest change it was built on, its calibration's `dump` or None: too
        short to estimate a risk), or None when none is kept."""
        row = await self._db.fetchone("SELECT newest, record FROM plan_record WHERE repo = ?", (repo,))
        return (row["newest"], json.loads(row["record"]) if row["record"] else None) if row else None

    async def save_plan_record(self, repo: str, newest: str, record: dict[str, Any] | None) -> None:
        await self._db.execute(
            "INSERT INTO plan_record (repo, newest, record, at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(repo) DO UPDATE SET newest = excluded.newest, record = excluded.record, at = excluded.at",
            (repo, newest, json.dumps(record) if record is not None else None, time.time()),
        )

    # -- process groups ---------------------------------------------------------------------------

    async def own_process(self, group: Group, job_id: int | None = None) -> None:
        """Record a process group before it may run (see `proc.process`)."""
        await self._db.execute(
            "INSERT OR REPLACE INTO processes (pgid, start_time, boot_id, job_id, what, started_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (group.pgid, group.start_time, group.boot_id, job_id, group.what, time.time()),
        )

    async def disown_process(self, group: Group) -> None:
        await self._db.execute(
            "DELETE FROM processes WHERE pgid = ? AND start_time = ?", (group.pgid, group.start_time)
        )

    async def processes(self) -> list[tuple[Group, int | None]]:
        """Every recorded process group, with the job it ran for."""
        rows = await self._db.fetchall("SELECT * FROM processes ORDER BY started_at")
        return [(Group(r["pgid"], r["start_time"], r["boot_id"], r["what"]), r["job_id"]) for r in rows]

    # -- landing journal --------------------------------------------------------------------------

    async def journal_begin(self, intent: Intent) -> int:
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

    async def journal_end(self, entry: int) -> None:
        await self._db.execute("DELETE FROM landing_journal WHERE id = ?", (entry,))

    async def journal_open(self) -> list[tuple[int, Intent]]:
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

    # -- chat: sessions, messages, memories (the chat plane's; nothing else reads them) --------------

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
        cur = conn.execute(f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES ({_in(_COLUMNS)})", values)
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
        out += conn.execute(f"SELECT * FROM jobs WHERE id IN ({_in(chunk)}) ORDER BY id", chunk).fetchall()
    return out


def _states_sync(conn: sqlite3.Connection, wanted: list[int]) -> list[sqlite3.Row]:
    out: list[sqlite3.Row] = []
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        out += conn.execute(f"SELECT id, state FROM jobs WHERE id IN ({_in(chunk)})", chunk).fetchall()
    return out


def _render_json_sync(conn: sqlite3.Connection, ids: list[int] | None) -> list[sqlite3.Row]:
    if ids is None:
        return conn.execute(_JOB_JSON).fetchall()
    out: list[sqlite3.Row] = []
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i : i + _CHUNK]
        out += conn.execute(f"{_JOB_JSON} WHERE id IN ({_in(chunk)})", chunk).fetchall()
    return out


def _delete_sync(conn: sqlite3.Connection, job_id: int, expect: list[str]) -> bool:
    with transaction(conn):
        row = conn.execute(
            f"SELECT id FROM jobs WHERE id = ? AND state IN ({_in(expect)})", [job_id, *expect]
        ).fetchone()
        if row is None:
            return False
        conn.execute("DELETE FROM job_events WHERE job_id = ?", (job_id,))
        conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
    return True


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
