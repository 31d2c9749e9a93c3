"""The store on PostgreSQL (asyncpg), shared by a team's nodes: the same Protocols and meanings as the SQLite
store's (`store.base`), implemented side by side.

What is the same: every state change is one compare-and-set (`UPDATE … WHERE id = $1 AND state = ANY($2)
RETURNING *`) checked against `core.lifecycle`, with its event in the same transaction; the job field list is
`core.job.FIELDS`, encoded by the same codecs; the migrations are the one list (`store.schema`) rendered for
PostgreSQL, applied in order, one daemon at a time (a transaction-scoped advisory lock).

What the team adds (this node is `node`):
- reads of jobs by state (`jobs.all`, `jobs.count`) are this node's: the jobs it holds. `jobs.json` (status),
  `jobs.get` and `jobs.states` are the team's. Each job's `repo` reads as this node's clone of its shared repository
  (`repo_key`: remote URL and branch), so the scheduler, the lander and admission work in local paths;
- `team.claim` takes queued jobs from the team's queue (`FOR UPDATE SKIP LOCKED`): those of repositories this node
  has a clone of, whose labels it has, up to `hold` waiting at a time; a job goes back to the team's queue
  (held by nobody) whenever it moves to `queued`;
- a write that expects a state a node works a job in (planning, planned, running, landing, ready) applies only
  while this node holds the job (a node whose lease ended and was taken over backs off); a cancel applies from
  any node;
- `team.elsewhere` reads the other nodes' jobs of this node's repositories, for admission; a move to `running` given
  `beside` (those other nodes' active jobs that admission saw) takes the repository's admission lock
  (`pg_advisory_xact_lock`) and applies only if no other node started a job there since;
- every write notifies the other nodes (`NOTIFY`), which re-read what changed and wake their schedulers;
- a lost connection (PostgreSQL restarted) is retried (`store.pgconn`); a write whose answer was lost is
  recognised by its write id, so nothing is applied twice.

The records beside the jobs are `store.pgrecords`'; what a node keeps of its own is in its own file (`local`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg

from orchestrator import logging as olog
from orchestrator.core import lifecycle
from orchestrator.core.job import FIELDS, Job, encode, fresh_attempt, from_row
from orchestrator.core.models import ACTIVE, OPEN, Code, JobEvent, JobState
from orchestrator.core.seal import SEALED, seal, verifies
from orchestrator.core.urls import shown
from orchestrator.store import guarded
from orchestrator.store.base import DuplicateTicket, RemoteOf, StoreUnreachable, StoreUnusable, TeamQueue, Write
from orchestrator.store.guarded import COLUMNS, Guarded
from orchestrator.store.pgconn import CONNECTION_ERRORS, NOW, PgConnection
from orchestrator.store.pgrecords import PgChat, PgEvents, PgJournal, PgLimits, PgPlans
from orchestrator.store.schema import POSTGRES as MIGRATIONS
from orchestrator.store.sqlite import SqliteStore

CHANNEL = "orchestrator_jobs"
SEALED_FIELDS = frozenset(SEALED) & frozenset(FIELDS)
"""The job fields of a job's sealed order: a write of any of them seals the order again (if it verified)."""
UNVERIFIED = (
    "its order (text, runner, landing, branch, feedback) does not verify with the team's secret: it was changed in "
    "the team's database by no node of the team (or queued by a node with another secret); not run. Queue it again"
)
RENEW = f"UPDATE nodes SET lease_until = {NOW} + $2 WHERE name = $1 RETURNING lease_until"
"""SQL: node $1's lease runs for $2 more seconds, from the server's clock."""
LIVE = f"(n.lease_until > {NOW} OR extract(epoch FROM pg_postmaster_start_time()) + n.lease > {NOW})"
"""SQL: node `n` holds its jobs. Its lease has not ended, or the server has not been up for a whole lease of it
since it (re)started: a database that was down longer than the lease takes no node's jobs away before the nodes
could renew (each renews within a few seconds of the server's return, from a thread of its own)."""
FOREIGN = "team:"
"""How a job of a repository this node has no clone of names it (`team:<repository>`): no path on this machine."""
NODE_HELD = OPEN - {JobState.QUEUED}
"""States a node works a job in: writes expecting them apply only while the writer holds the job."""
ORDERED = frozenset({JobState.RUNNING, JobState.LANDING, JobState.READY})
"""States a job is in once its order ran: a write that keeps it there (or moves it on within them) hands its node the
job as stored, whose order must still be the sealed one (it could have been changed since it started)."""
UNAPPROVED = (
    "its landing was never approved by a node of the team (it waits for review, and no `orchestrator land` sealed "
    "this result): not landed. Its result is kept; `orchestrator retry` it, then land it once reviewed"
)
_MIGRATE_LOCK = 7_300_021


def _q(name: str) -> str:
    return f'"{name}"'


_INSERT_COLS = ", ".join(_q(c) for c in (*COLUMNS, "repo_key", "remote"))
_INSERT_ARGS = ", ".join(f"${i}" for i in range(1, len(COLUMNS) + 3))


class _Missed(Exception):
    """An all-or-nothing batch found a job outside the states its write expects: its transaction is rolled back."""


class PgClones:
    """This node's clones of the team's repositories: shared repository key (`Remote.identity`) → local path, kept
    in the node's own file (only its config and its own user say so)."""

    def __init__(self, local: TeamQueue) -> None:
        self._local = local
        self.paths: dict[str, str] = {}

    async def load(self) -> None:
        self.paths = await self._local.clones()

    async def register(self, key: str, path: str, url: str) -> None:
        """This node has a clone of shared repository `key` at `path`: it may claim that repository's jobs."""
        if self.paths.get(key) == path:
            return
        await self._local.register_clone(key, path, url)
        self.paths[key] = path

    def keys(self) -> list[str]:
        """The shared repositories this node has clones of (what it claims and takes over)."""
        return sorted(self.paths)


class PgJobs(Guarded):
    """The team's jobs table, as node `node` sees it (`store.base.JobTable`)."""

    def __init__(self, db: PgConnection, node: str, clones: PgClones, remote_of: RemoteOf, secret: bytes) -> None:
        super().__init__()
        self._db = db
        self.node = node
        self.clones = clones
        self.remote_of = remote_of
        self.secret = secret
        """The team's secret (`core.seal`): this node seals the orders it writes and runs only orders that verify."""
        self.epochs: dict[int, int] = {}
        """The lease epoch of each job this node holds, as it took it (a claim, or held at its start). Every write
        that matters for such a job applies only at that epoch: a job taken over (its epoch moved on) and even
        claimed again by this node is never written by the attempt that lost it."""

    def _row_job(self, row: asyncpg.Record) -> Job:
        """A job as this node sees it: its repository is this node's clone of the shared one, or, for a repository
        this node has no clone of, a name that is no path here (`team:<repository>`): another node's path means
        nothing on this machine, and nothing here may act on it."""
        job = from_row(row)
        local = self.clones.paths.get(row["remote"])
        return replace(job, repo=local or f"{FOREIGN}{row['remote']}")

    async def notify(self, conn: asyncpg.Connection, ids: Iterable[int], *, landed: bool = False) -> None:
        """Tell the other nodes these jobs changed (`landed`: one of them landed, so a remote branch moved)."""
        ids = sorted(set(ids))
        for i in range(0, len(ids), 500):
            note = {"n": self.node, "ids": ids[i : i + 500], "landed": landed}
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, json.dumps(note))

    async def _insert(self, job: Job, ticket: tuple[str, str | None] | None) -> int:
        """The new job, its `enqueued` event and its ticket in one transaction, with its shared repository (its
        clone's remote: this node's clone of it is registered)."""
        remote = await asyncio.to_thread(self.remote_of, job.repo, job.branch)
        await self.clones.register(remote.identity, job.repo, shown(remote.url))
        now, repo = job.created_at, job.repo
        values = [encode(FIELDS[c], getattr(job, c)) for c in COLUMNS]

        async def work(conn: asyncpg.Connection) -> int:
            row = await conn.fetchrow(
                f"INSERT INTO jobs ({_INSERT_COLS}) VALUES ({_INSERT_ARGS}) RETURNING *", *values, remote.key,
                remote.identity,
            )  # fmt: skip
            job_id = int(row["id"])
            await conn.execute("UPDATE jobs SET seal = $2 WHERE id = $1", job_id, seal(self.secret, row))
            await conn.execute(
                "INSERT INTO job_events (job_id, at, kind, data, node, write_id) VALUES ($1, $2, $3, $4, $5, $6)",
                job_id, now, JobEvent.ENQUEUED, json.dumps({"state": "queued", "node": self.node}), self.node, wid,
            )  # fmt: skip
            if ticket is not None:
                await conn.execute(
                    "INSERT INTO tickets (key, repo, ticket, job_id, at) VALUES ($1, $2, $3, $4, $5)",
                    ticket[0], repo, ticket[1], job_id, now,
                )  # fmt: skip
            await self.notify(conn, [job_id])
            return job_id

        async def again(conn: asyncpg.Connection) -> int | None:
            found = await conn.fetchval("SELECT job_id FROM job_events WHERE write_id = $1", wid)
            return None if found is None else int(found)

        wid = uuid.uuid4().hex
        try:
            return await self._db.run(work, again=again)
        except asyncpg.UniqueViolationError:
            raise DuplicateTicket(ticket[0] if ticket else "?") from None

    async def ticket_job(self, key: str) -> int | None:
        row = await self._db.fetchrow("SELECT job_id FROM tickets WHERE key = $1", key)
        return int(row[0]) if row else None

    async def ticket_jobs(self, repo: str, ticket: str) -> list[int]:
        return await self._db.ids(
            "SELECT job_id FROM tickets WHERE repo = $1 AND ticket = $2 ORDER BY at, job_id", repo, ticket
        )

    async def get(self, job_id: int) -> Job | None:
        row = await self._db.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
        return self._row_job(row) if row else None

    async def all(self, states: Iterable[JobState] | None = None) -> list[Job]:
        """This node's jobs (in these states): those it holds of the repositories it has clones of (a row naming
        this node in another repository is no job it can act on: nothing of it is on this machine)."""
        names = sorted(str(s) for s in (states if states is not None else JobState))
        rows = await self._db.fetch(
            "SELECT * FROM jobs WHERE node = $1 AND state = ANY($2) AND remote = ANY($3::text[]) ORDER BY id",
            self.node, names, self.clones.keys(),
        )  # fmt: skip
        return [self._row_job(r) for r in rows]

    async def count(self, states: Iterable[JobState]) -> int:
        """How many jobs in these states this node holds, or could take (queued and held by nobody)."""
        names = sorted(str(s) for s in states)
        return int(
            await self._db.run(
                lambda c: c.fetchval(
                    "SELECT count(*) FROM jobs WHERE state = ANY($2) "
                    "AND (node = $1 OR (node = '' AND state = 'queued'))",
                    self.node, names,
                )
            )
        )  # fmt: skip

    async def _render(self, ids: list[int] | None) -> list[tuple[int, str, str, str]]:
        """Every job of the team (or these) as `jobs_json` rows, rendered here from the one field list."""
        if ids is None:
            rows = await self._db.fetch("SELECT * FROM jobs ORDER BY id")
        else:
            rows = await self._db.fetch("SELECT * FROM jobs WHERE id = ANY($1) ORDER BY id", ids)
        out = []
        for row in rows:
            shown_json = self._row_job(row).to_json()
            live = {k: shown_json.pop(k) for k in guarded.LIVE}
            out.append((int(row["id"]), str(row["state"]), json.dumps(shown_json), json.dumps(live)))
        return out

    async def many(self, ids: Iterable[int]) -> list[Job]:
        rows = await self._db.fetch("SELECT * FROM jobs WHERE id = ANY($1) ORDER BY id", sorted(set(ids)))
        return [self._row_job(r) for r in rows]

    async def landed_as(self, shas: Iterable[str]) -> list[Job]:
        """This node's landed jobs (as `all`) whose landing commit is one of `shas`, by id."""
        rows = await self._db.fetch(
            "SELECT * FROM jobs WHERE landed_sha = ANY($1::text[]) AND state = $2 AND node = $3 "
            "AND remote = ANY($4::text[]) ORDER BY id",
            sorted(set(shas)), str(JobState.LANDED), self.node, self.clones.keys(),
        )  # fmt: skip
        return [self._row_job(r) for r in rows]

    async def states(self, ids: Iterable[int]) -> dict[int, JobState]:
        rows = await self._db.fetch("SELECT id, state FROM jobs WHERE id = ANY($1)", sorted(set(ids)))
        return {int(r["id"]): JobState(r["state"]) for r in rows}

    async def _write(
        self, writes: Sequence[Write], *, changed: bool = True, holder: str | None = None, atomic: bool = False
    ) -> list[Any]:
        wid = uuid.uuid4().hex
        now = time.time()

        async def work(conn: asyncpg.Connection) -> list[Any]:
            rows = [await self._write_one(conn, w, now, wid, holder) for w in writes]
            if atomic and any(r is None for r in rows):
                raise _Missed  # rolls the transaction back: all or none
            done = [w for w, r in zip(writes, rows, strict=True) if r is not None]
            await self.notify(conn, [w.job_id for w in done], landed=any(w.to is JobState.LANDED for w in done))
            return rows

        async def again(conn: asyncpg.Connection) -> list[Any] | None:
            if not any(w.event for w in writes):
                return None  # a write of fields alone, applied twice, leaves the same fields
            done = {int(r[0]) for r in await conn.fetch("SELECT job_id FROM job_events WHERE write_id = $1", wid)}
            if not done:
                return None
            return [await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", w.job_id) if w.job_id in done else None
                    for w in writes]  # fmt: skip

        try:
            rows = await self._db.run(work, again=again)
        except _Missed:
            return [None] * len(writes)
        self._written(writes, rows, changed)
        for w, row in zip(writes, rows, strict=True):
            if row is not None and row["node"] != self.node:
                self.epochs.pop(w.job_id, None)  # it left this node (back to the queue): a claim takes it afresh
        return rows

    async def _write_one(
        self, conn: asyncpg.Connection, w: Write, now: float, wid: str, holder: str | None
    ) -> asyncpg.Record | None:
        values = {k: encode(FIELDS[k], v) for k, v in w.fields.items()}
        if w.to is not None:
            values["state"] = str(w.to)
            if w.to is JobState.QUEUED:
                values["node"] = ""  # back to the team's queue: any node may claim it
            elif holder is not None and w.to is JobState.LANDED:
                values["node"] = self.node  # taken over and found landed: this node recorded it
        args: list[Any] = [w.job_id, sorted(str(s) for s in w.expect)]
        where = "id = $1 AND state = ANY($2)"
        owner = holder if holder is not None else self.node
        if (w.expect & NODE_HELD and w.to is not JobState.CANCELLED) or holder is not None:
            args.append(owner)
            where += f" AND node = ${len(args)}"
            if holder is None and w.job_id in self.epochs:
                args.append(self.epochs[w.job_id])
                where += f" AND epoch = ${len(args)}"  # the fence: an attempt that lost the job writes nothing
        resealed = bool(values.keys() & SEALED_FIELDS)
        # The move that starts its order, and every write that hands the node a job whose order ran (a field of a
        # running job, its move to review or landing, an approval): the order must verify, whenever it changed.
        ordered = holder is None and w.expect <= ORDERED and (w.to is None or w.to in ORDERED)
        if resealed or w.to is JobState.RUNNING or ordered:
            before = await conn.fetchrow(f"SELECT * FROM jobs WHERE {where} FOR UPDATE", *args)
            if before is None:
                return None
            verified = verifies(self.secret, before)
            if (w.to is JobState.RUNNING or ordered) and not verified:
                await refuse(conn, before, self.node, now, wid)  # a changed order never runs, nor lands
                return None
            resealed = resealed and verified  # an order that does not verify is never sealed again here
        if w.to is JobState.RUNNING and w.beside is not None and not await self._admissible(conn, w):
            return None
        if values:
            sets = []
            for k, v in values.items():
                args.append(v)
                sets.append(f"{_q(k)} = ${len(args)}")
            if values.get("node") == "" or holder is not None:
                sets.append("epoch = epoch + 1")  # it leaves its holder: whatever that holder still runs is fenced
            row = await conn.fetchrow(f"UPDATE jobs SET {', '.join(sets)} WHERE {where} RETURNING *", *args)
            if row is not None and resealed:
                row = await conn.fetchrow(
                    "UPDATE jobs SET seal = $2 WHERE id = $1 RETURNING *", w.job_id, seal(self.secret, row)
                )
        else:
            row = await conn.fetchrow(f"SELECT * FROM jobs WHERE {where}", *args)
        if row is None:
            return None
        if w.event:
            payload = dict(w.data or {})
            if w.to is not None:
                payload.setdefault("state", str(w.to))
            payload.setdefault("node", self.node)
            await conn.execute(
                "INSERT INTO job_events (job_id, at, kind, data, node, write_id) VALUES ($1, $2, $3, $4, $5, $6)",
                w.job_id, now, w.event, json.dumps(payload, default=str), self.node, wid,
            )  # fmt: skip
        return row

    async def _admissible(self, conn: asyncpg.Connection, w: Write) -> bool:
        """Under the repository's admission lock: no other node started a job there beside what admission saw."""
        key = await conn.fetchval("SELECT repo_key FROM jobs WHERE id = $1", w.job_id)
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", "admit:" + str(key))
        now_active = await conn.fetch(
            "SELECT id FROM jobs WHERE repo_key = $1 AND node <> $2 AND node <> '' AND state = ANY($3)",
            key, self.node, sorted(str(s) for s in ACTIVE),
        )  # fmt: skip
        started = {int(r[0]) for r in now_active} - set(w.beside or ())
        if started:
            olog.get(job_id=w.job_id).info(
                olog.Event.ADMISSION_STALE, reason=f"another node started jobs {sorted(started)} in its repository"
            )
        return not started

    async def take_over(self, steps: Sequence[Write], holder: str) -> Job | None:
        """Writes of a job another node (`holder`, whose lease ended) held, as this node takes it over: the job after
        the last of them, or None if it moved meanwhile (`PgTeam.take_over`)."""
        rows = await self._write(steps, holder=holder)
        return self._row_job(rows[-1]) if rows[-1] is not None else None

    async def delete(self, job_id: int, expect: Collection[JobState]) -> bool:
        async def work(conn: asyncpg.Connection) -> bool:
            row = await conn.fetchrow(
                "SELECT id FROM jobs WHERE id = $1 AND state = ANY($2) FOR UPDATE",
                job_id,
                sorted(str(s) for s in expect),
            )
            if row is None:
                return False
            await conn.execute("DELETE FROM job_events WHERE job_id = $1", job_id)
            await conn.execute("DELETE FROM jobs WHERE id = $1", job_id)
            await self.notify(conn, [job_id])
            return True

        done = await self._db.run(work)
        self.changes.add([job_id])
        return done

    async def recover(self) -> dict[str, list[int]]:
        """After this node's crash: what it ran goes back to the team's queue (a fresh attempt, on any node),
        what it planned too; its landings stay (their result commits are in this node's clone)."""
        running = await self.all([JobState.RUNNING])
        planning = await self.all([JobState.PLANNING])
        why = "the daemon stopped while this job ran; back in the team's queue for a fresh attempt"
        for job in running:
            await self._write(
                [
                    Write(job.id, {"reason": why, "code": Code.INTERRUPTED}, JobEvent.INTERRUPTED, {"node": self.node},
                          frozenset({JobState.RUNNING}), JobState.INTERRUPTED),
                    Write(job.id, {**fresh_attempt(job), "reason": why, "code": Code.INTERRUPTED}, JobEvent.REQUEUED,
                          {"why": "daemon restarted"}, frozenset({JobState.INTERRUPTED}), JobState.QUEUED),
                ]
            )  # fmt: skip
        for job in planning:
            await self.transition(
                job.id, {JobState.PLANNING}, JobState.QUEUED, JobEvent.REQUEUED, data={"why": "daemon restarted"}
            )
        landing = [j.id for j in await self.all([JobState.LANDING])]
        return {"requeued": [j.id for j in (*running, *planning)], "landing": landing}


async def refuse(
    conn: asyncpg.Connection, row: asyncpg.Record, node: str, now: float, wid: str, reason: str = UNVERIFIED
) -> None:
    """A job whose order does not verify (changed in the database by no node of the team), or whose landing no node
    approved: failed where it may fail, else marked, with what happened and what to do; never run, never landed."""
    state = JobState(row["state"])
    olog.get(job_id=int(row["id"])).error(olog.Event.TEAM_UNVERIFIED, state=str(state), reason=reason)
    fields: dict[str, Any] = {"code": str(Code.UNVERIFIED), "reason": reason}
    if lifecycle.allowed(state, JobState.FAILED):
        fields |= {"state": str(JobState.FAILED), "finished_at": now}
    sets = ", ".join(f"{_q(k)} = ${i}" for i, k in enumerate(fields, start=2))
    await conn.execute(f"UPDATE jobs SET {sets} WHERE id = $1", int(row["id"]), *fields.values())
    data = {"code": Code.UNVERIFIED, "node": node, "state": fields.get("state", str(state))}
    await conn.execute(
        "INSERT INTO job_events (job_id, at, kind, data, node, write_id) VALUES ($1, $2, $3, $4, $5, $6)",
        int(row["id"]), now, JobEvent.FAILED, json.dumps(data), node, wid,
    )  # fmt: skip


class PgTeam:
    """The team's queue and this node's lease in it (`store.base.TeamQueue`, and what team mode adds)."""

    def __init__(
        self,
        db: PgConnection,
        jobs: PgJobs,
        clones: PgClones,
        *,
        url: str,
        node: str,
        labels: Sequence[str],
        lease: float,
        hold: int,
        home: Path,
    ) -> None:
        self._db = db
        self._jobs = jobs
        self.clones_of = clones
        self.url = url
        self.node = node
        self.labels = tuple(labels)
        self.lease = lease
        self.hold = hold
        self._home = home
        self._listener: asyncpg.Connection | None = None
        self._foreign: list[Callable[[set[int]], None]] = []
        self.remote_moved = True
        """Another node landed a job since this was last cleared (a shared branch moved): ask the remote again."""

    @property
    def home(self) -> Path:
        """The node's own file, not the shared database: nodes of one team on one machine are told apart."""
        return self._home

    async def clones(self) -> dict[str, str]:
        return dict(self.clones_of.paths)

    async def register_clone(self, key: str, path: str, url: str) -> None:
        """This node has a clone of shared repository `key` (`Remote.identity`) at `path` (see `PgClones`)."""
        await self.clones_of.register(key, path, url)

    def clone_paths(self) -> list[str]:
        """This node's clones of the team's repositories."""
        return sorted(set(self.clones_of.paths.values()))

    async def everyone(self, states: Iterable[JobState] | None = None) -> list[Job]:
        """Every node's jobs (in these states), for `watch` and `wait`."""
        if states is None:
            rows = await self._db.fetch("SELECT * FROM jobs ORDER BY id")
        else:
            names = sorted(str(s) for s in states)
            rows = await self._db.fetch("SELECT * FROM jobs WHERE state = ANY($1) ORDER BY id", names)
        return [self._jobs._row_job(r) for r in rows]

    async def claim(self) -> list[int]:
        """Take queued jobs from the team's queue for this node: those of its repositories and labels, held by
        nobody (or by a node whose lease ended), first in priority order, up to `hold` waiting here."""

        async def work(conn: asyncpg.Connection) -> list[int]:
            picked = await conn.fetch(
                f"""
                SELECT j.* FROM jobs j
                WHERE j.state = 'queued' AND j.code <> '{Code.UNVERIFIED}'
                  AND (j.node = '' OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.name = j.node AND {LIVE}))
                  AND j.remote = ANY($4::text[])
                  AND j.labels::jsonb <@ $2::jsonb
                ORDER BY j.priority DESC, COALESCE(j.place, j.id), j.id
                LIMIT greatest($3 - (SELECT count(*) FROM jobs
                                     WHERE node = $1 AND state IN ('queued', 'planning', 'planned')), 0)
                FOR UPDATE OF j SKIP LOCKED
                """,
                self.node, json.dumps(sorted(self.labels)), self.hold, self.clones_of.keys(),
            )  # fmt: skip
            for row in picked:
                if not verifies(self._jobs.secret, row):
                    await refuse(conn, row, self.node, time.time(), uuid.uuid4().hex)  # stays queued, marked
            good = [int(r["id"]) for r in picked if verifies(self._jobs.secret, r)]
            rows = await conn.fetch(
                "UPDATE jobs SET node = $1, epoch = epoch + 1 WHERE id = ANY($2) RETURNING id, epoch", self.node, good
            )
            ids = sorted(int(r[0]) for r in rows)
            epochs.update({int(r[0]): int(r[1]) for r in rows})
            if ids:
                await conn.executemany(
                    "INSERT INTO job_events (job_id, at, kind, data, node) VALUES ($1, $2, $3, $4, $5)",
                    [(i, time.time(), JobEvent.CLAIMED, json.dumps({"node": self.node}), self.node) for i in ids],
                )
                await self._jobs.notify(conn, ids)
            return ids

        epochs: dict[int, int] = {}
        ids = await self._db.run(work)
        self._jobs.epochs.update({i: epochs[i] for i in ids})
        self._jobs.changes.add(ids)
        return ids

    def mine(self, job: Job) -> bool:
        return job.node == self.node

    async def elsewhere(self) -> list[Job]:
        """Other nodes' planned and active jobs of the repositories this node has clones of (in local paths)."""
        names = sorted(str(s) for s in (*ACTIVE, JobState.PLANNED))
        rows = await self._db.fetch(
            "SELECT * FROM jobs WHERE node <> $1 AND node <> '' AND state = ANY($2) "
            "AND remote = ANY($3::text[]) ORDER BY id",
            self.node, names, self.clones_of.keys(),
        )  # fmt: skip
        return [self._jobs._row_job(r) for r in rows]

    async def renew(self) -> None:
        """Extend this node's hold on its jobs by `lease` seconds (from the server's clock). A daemon renews from a
        thread of its own (`team.lease`), so that a busy event loop never lets its lease lapse."""
        await self._db.execute(RENEW, self.node, self.lease)

    async def lapsed(self) -> list[Job]:
        """Jobs of this node's repositories held by nodes whose lease ended, in states another node can take over."""
        names = sorted(str(s) for s in (*NODE_HELD - {JobState.READY}, JobState.QUEUED))
        rows = await self._db.fetch(
            f"SELECT * FROM jobs j WHERE j.node <> '' AND j.node <> $1 AND j.state = ANY($2) AND NOT EXISTS "
            f"(SELECT 1 FROM nodes n WHERE n.name = j.node AND {LIVE}) "
            "AND j.remote = ANY($3::text[]) ORDER BY j.id",
            self.node, names, self.clones_of.keys(),
        )  # fmt: skip
        return [self._jobs._row_job(r) for r in rows]

    async def take_over(self, job: Job, *, landed: str | None = None) -> Job | None:
        """Take a job of a node whose lease ended: back to the team's queue for a fresh attempt (its runner lived on
        that node), or `landed` when its push is known to have reached the remote. None if it moved meanwhile."""
        why = f"node {job.node} stopped renewing its lease; taken over by {self.node}"
        steps: list[Write] = []
        base = {"node": job.node, "by": self.node}
        if landed is not None:
            found = f"landed at {landed[:12]} (found on the remote after {why})"
            steps.append(Write(job.id, {"landed_sha": landed, "finished_at": time.time(), "reason": found,
                               "code": Code.LANDED}, JobEvent.LANDED, {**base, "sha": landed},
                               frozenset({JobState.LANDING}), JobState.LANDED))  # fmt: skip
        elif job.state is JobState.QUEUED:
            steps.append(Write(job.id, {}, JobEvent.RELEASED, base, frozenset({JobState.QUEUED}), JobState.QUEUED))
        else:
            if job.state is JobState.RUNNING:
                steps.append(Write(job.id, {"reason": why, "code": Code.INTERRUPTED}, JobEvent.INTERRUPTED, base,
                                   frozenset({JobState.RUNNING}), JobState.INTERRUPTED))  # fmt: skip
                source = JobState.INTERRUPTED
            else:
                source = job.state
            steps.append(Write(job.id, {**fresh_attempt(job), "reason": why, "code": Code.INTERRUPTED},
                               JobEvent.REQUEUED, {**base, "why": "taken over"}, frozenset({source}),
                               JobState.QUEUED))  # fmt: skip
        return await self._jobs.take_over(steps, job.node)

    async def holds(self, job_id: int, state: JobState = JobState.LANDING) -> bool:
        """Whether this node still holds the job in `state` (the fence a push asks right before it)."""
        row = await self._db.fetchrow(
            "SELECT epoch FROM jobs WHERE id = $1 AND node = $2 AND state = $3", job_id, self.node, str(state)
        )
        return row is not None and self._jobs.epochs.get(job_id, int(row[0])) == int(row[0])

    async def landable(self, job_id: int) -> Job | None:
        """The job as this node may land it now, or None: it no longer holds it in `landing` (at its epoch), or its
        order does not verify, or it waits for review and no node sealed an approval of this result (its state alone
        moved to `landing` in the database): then it is failed with the reason, never landed."""
        epoch = self._jobs.epochs.get(job_id)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record | None:
            row = await conn.fetchrow(
                "SELECT * FROM jobs WHERE id = $1 AND node = $2 AND state = $3 FOR UPDATE",
                job_id, self.node, str(JobState.LANDING),
            )  # fmt: skip
            if row is None or (epoch is not None and int(row["epoch"]) != epoch):
                return None
            why = None
            if not verifies(self._jobs.secret, row):
                why = UNVERIFIED
            elif row["land"] != "auto" and (not row["result"] or row["approved"] != row["result"]):
                why = UNAPPROVED
            if why is None:
                return row
            await refuse(conn, row, self.node, time.time(), uuid.uuid4().hex, why)
            await self._jobs.notify(conn, [job_id])
            return None

        row = await self._db.run(work)
        if row is None:
            self._jobs.changes.add([job_id])
            return None
        return self._jobs._row_job(row)

    async def lost(self, ids: Iterable[int]) -> dict[int, Job]:
        """Of these jobs (which this node runs or lands), those it no longer holds at the epoch it took them at:
        taken over, or cancelled, or gone (None). The node stops their runners at once; nothing of theirs is
        written again (every write of theirs is fenced by the epoch)."""
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        rows = {int(r["id"]): r for r in await self._db.fetch("SELECT * FROM jobs WHERE id = ANY($1)", wanted)}
        out: dict[int, Job] = {}
        for i in wanted:
            row = rows.get(i)
            if row is None:
                continue
            mine = row["node"] == self.node and self._jobs.epochs.get(i, int(row["epoch"])) == int(row["epoch"])
            if not mine or JobState(row["state"]) is JobState.CANCELLED:
                out[i] = self._jobs._row_job(row)
        return out

    @contextlib.asynccontextmanager
    async def landing_lock(self, key: str) -> AsyncIterator[None]:
        """One landing at a time per shared (remote, branch) across the team: a session advisory lock on a
        connection of its own, released when the landing ends or the node's connection dies. Taking it rides out a
        lost connection like every other unit of work; losing it part way (PostgreSQL restarted) lets another
        node's landing begin beside this one, which the push's lease still orders (the loser fetches again)."""
        conn = await self._db.run_outside(_locked, "land:" + key)
        try:
            yield
        finally:
            with olog.best_effort("release the landing lock", *CONNECTION_ERRORS):
                try:
                    await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", "land:" + key)
                finally:
                    await self._db.pool.release(conn)

    async def listen(self, on_foreign: Callable[[set[int]], None]) -> None:
        """Call `on_foreign(ids)` when other nodes change jobs (and once with no ids after a reconnection, when
        what changed meanwhile is unknown: every cache is read again)."""
        self._foreign.append(on_foreign)
        await self.relisten()

    async def relisten(self) -> bool:
        """(Re)open the notification connection if it is closed; True if it had to (nodes' changes were missed)."""
        if self._listener is not None and not self._listener.is_closed():
            return False
        self._listener = await asyncpg.connect(self.url, timeout=10)
        await self._listener.add_listener(CHANNEL, self._notified)
        self._jobs.forget_rendered()  # what other nodes changed meanwhile is unknown: render everything again
        self.remote_moved = True
        self._jobs.changes.add(await self._db.ids("SELECT id FROM jobs WHERE node = $1", self.node))
        for cb in self._foreign:
            cb(set())
        return True

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            note = json.loads(payload)
        except ValueError:
            olog.get().warning(olog.Event.SCHEDULER_ERROR, error=f"unreadable notification {payload[:80]!r}")
            return
        if note.get("n") == self.node:
            return
        ids = {int(i) for i in note.get("ids", ())}
        self.remote_moved = self.remote_moved or bool(note.get("landed"))
        self._jobs.changes.add(ids)
        for cb in self._foreign:
            cb(ids)

    async def close(self) -> None:
        """The notification connection closed."""
        if self._listener is not None and not self._listener.is_closed():
            with olog.best_effort("close the notification connection", *CONNECTION_ERRORS):
                await self._listener.close()


async def _locked(conn: asyncpg.Connection, name: str) -> None:
    await conn.execute("SELECT pg_advisory_lock(hashtext($1))", name)


class PgStore:
    """A team's shared store, as node `node` sees it (`store.base.Store`); what the node keeps for itself is in its
    own file, `local`."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        url: str,
        node: str,
        labels: Sequence[str],
        lease: float,
        hold: int,
        remote_of: RemoteOf,
        local: SqliteStore,
        secret: bytes,
    ) -> None:
        self._db = PgConnection(pool, shown(url))
        self.path = shown(url)  # for messages
        self.local = local
        """The node's own file (the embedded store in its state dir): what it keeps for itself and acts on on its
        own machine (its process groups, the landing journal of its checkouts, its clones, its records) is read
        from there only, never from the shared store, where any node (or anyone with the database) could have
        written it."""
        clones = PgClones(local.team)
        self.jobs = PgJobs(self._db, node, clones, remote_of, secret)
        self.team = PgTeam(
            self._db, self.jobs, clones, url=url, node=node, labels=labels, lease=lease, hold=hold, home=local.home
        )
        self.events = PgEvents(self._db)
        self.journal = PgJournal(self._db, node, local.journal)
        self.processes = local.processes
        self.limits = PgLimits(self._db, node)
        self.chat = PgChat(self._db)
        self.plans = PgPlans(self._db, node, local.plans)

    @property
    def node(self) -> str:
        return self.team.node

    @property
    def url(self) -> str:
        """The team's database, password and all (for the lease keeper's own connection)."""
        return self.team.url

    @property
    def home(self) -> Path:
        return self.team.home

    # -- opening ------------------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        node: str,
        remote_of: RemoteOf,
        local: SqliteStore,
        secret: bytes,
        labels: Sequence[str] = (),
        lease: float = 30.0,
        hold: int = 4,
    ) -> PgStore:
        """Connect, migrate, register this node; StoreUnreachable when the server cannot be reached (try again
        later), StoreUnusable when it refuses this node's login or has no such database (no retry fixes those).
        `remote_of` names the shared repository of a clone a job is queued in; `local` is the node's own file
        (which `close` closes too)."""
        pool = await asyncpg.create_pool(url, min_size=0, max_size=8, timeout=10, command_timeout=60)
        try:
            await pool.fetchval("SELECT 1")  # min_size 0 connects on first use: ask now, for a clear error
        except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidCatalogNameError) as e:
            await pool.close()
            raise StoreUnusable(
                f"the team's PostgreSQL at {shown(url)} refuses this node: {type(e).__name__}: {e}. Check the role "
                "and database exist (docs/team.md) and PGPASSWORD in the service's env file"
            ) from None
        except (*CONNECTION_ERRORS, asyncpg.PostgresError, TimeoutError) as e:
            await pool.close()
            raise StoreUnreachable(
                f"cannot reach the team's PostgreSQL at {shown(url)}: {type(e).__name__}: {e}. Start it (or fix "
                "[store] url), then start the daemon again"
            ) from None
        store = cls(pool, url, node, labels, lease, hold, remote_of, local, secret)
        try:
            await store._migrate()
            await store._register()
        except BaseException:
            await pool.close()
            raise
        return store

    async def _migrate(self) -> None:
        async with self._db.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATE_LOCK)
            await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            version = await conn.fetchval("SELECT max(version) FROM schema_version") or 0
            if version > len(MIGRATIONS):
                raise StoreUnusable(
                    f"the team's database {self.path} has schema version {version}, newer than this orchestrator "
                    f"knows ({len(MIGRATIONS)}): a newer orchestrator wrote it. Upgrade orchestrator on this node"
                )
            for n, script in enumerate(MIGRATIONS[version:], start=version + 1):
                await conn.execute(script)
                await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", n)

    async def _register(self) -> None:
        import os
        import socket

        t = self.team
        await self._db.run(
            lambda c: c.execute(
                f"INSERT INTO nodes (name, labels, lease_until, started_at, host, pid, lease) VALUES ($1, $2, "
                f"{NOW} + $3, {NOW}, $4, $5, $3) ON CONFLICT (name) DO UPDATE SET labels = excluded.labels, "
                "lease_until = excluded.lease_until, started_at = excluded.started_at, host = excluded.host, "
                "pid = excluded.pid, lease = excluded.lease",
                t.node, json.dumps(sorted(t.labels)), t.lease, socket.gethostname(), os.getpid(),
            )
        )  # fmt: skip
        await self.team.clones_of.load()
        rows = await self._db.fetch("SELECT id, epoch FROM jobs WHERE node = $1", t.node)
        self.jobs.epochs = {int(r["id"]): int(r["epoch"]) for r in rows}

    async def close(self) -> None:
        await self.team.close()
        await self._db.pool.close()
        await self.local.close()

    async def schema_version(self) -> int:
        return int(await self._db.run(lambda c: c.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")))

    async def columns(self) -> list[str]:
        """The jobs table's job-field columns, in order (`repo_key`, `remote`, `epoch` and `seal` are the team's, not
        job fields)."""
        rows = await self._db.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs' ORDER BY ordinal_position"
        )
        return [str(r[0]) for r in rows if r[0] not in ("repo_key", "remote", "epoch", "seal")]


__all__ = ["PgStore"]
