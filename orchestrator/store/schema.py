"""The store's schema, written once for both engines: each table's columns (`TABLES`), and the one list of
migrations that builds them (`MIGRATIONS`), rendered per dialect (`scripts`).

The jobs table's columns are the job's field list (`core.job.FIELDS`), each column's type and default read from
the field itself (`job_columns`): a new job field is one migration step, `Add("jobs", "name")`, for both engines.
What only one engine has is marked so: the team's columns and tables in PostgreSQL (`node`, `epoch`, `seal`,
`nodes`), what a node keeps in its own file in SQLite (`clones`, `plan_record`, `processes`).

A dialect's schema version is the number of steps it has had: a step with nothing for a dialect is not one of its
versions (so each engine's versions are the steps it shipped, in order). Migrations are history: never edit a
step that shipped; add the next.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import get_type_hints

from orchestrator.core.job import FIELDS, Codec, Job


class Dialect(StrEnum):
    SQLITE = "sqlite"
    POSTGRES = "postgres"


class Type(StrEnum):
    """A column's type, named once; each dialect spells it (`_SPELLED`)."""

    ID = "id"
    """The table's own growing integer key."""
    INT = "int"
    BIG = "big"
    """An integer PostgreSQL keeps in 64 bits (ids, counts, times in ticks)."""
    REAL = "real"
    TEXT = "text"


_SPELLED = {
    Dialect.SQLITE: {Type.ID: "INTEGER PRIMARY KEY AUTOINCREMENT", Type.INT: "INTEGER", Type.BIG: "INTEGER",
                     Type.REAL: "REAL", Type.TEXT: "TEXT"},
    Dialect.POSTGRES: {Type.ID: "BIGSERIAL PRIMARY KEY", Type.INT: "INTEGER", Type.BIG: "BIGINT",
                       Type.REAL: "DOUBLE PRECISION", Type.TEXT: "TEXT"},
}  # fmt: skip
_QUOTED = {Dialect.SQLITE: frozenset(), Dialect.POSTGRES: frozenset({"after"})}
"""Column names a dialect reserves as words: quoted there."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: Type
    null: bool = False
    default: str | None = None
    """The default as SQL (`''`, `0`, `'[]'`), or None."""
    key: bool = False
    """The table's key on its own (a key of several columns is the table's `key`)."""
    references: str | None = None
    """`table (column)` it refers to."""
    only: Dialect | None = None
    """A column one engine has (None: both)."""

    def sql(self, dialect: Dialect) -> str:
        name = f'"{self.name}"' if self.name in _QUOTED[dialect] else self.name
        parts = [name, _SPELLED[dialect][self.type]]
        if self.key:
            parts.append("PRIMARY KEY")
        elif not self.null and self.type is not Type.ID:
            parts.append("NOT NULL")
        if self.default is not None:
            parts.append(f"DEFAULT {self.default}")
        if self.references is not None:
            parts.append(f"REFERENCES {self.references}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    """A key of several columns (a table whose key is one column says so on that column)."""
    only: Dialect | None = None

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")

    def create(self, dialect: Dialect, names: Iterable[str] | None = None) -> str:
        """`CREATE TABLE` with these columns (None: every column it has in `dialect`)."""
        cols = [self.column(n) for n in names] if names is not None else list(self.columns)
        key = [k for k in self.key if self.column(k).only in (None, dialect)]
        if len(key) == 1:  # a key of one column in this dialect is that column's own
            cols = [dataclasses.replace(c, key=True) if c.name == key[0] else c for c in cols]
        lines = [c.sql(dialect) for c in cols if c.only in (None, dialect)]
        if len(key) > 1:
            lines.append(f"PRIMARY KEY ({', '.join(key)})")
        return f"CREATE TABLE {self.name} (\n    " + ",\n    ".join(lines) + "\n);"


def job_column(name: str) -> Column:
    """A job field's column, from the field: its codec, its type and its default (`core.job.Job`)."""
    field = next(f for f in dataclasses.fields(Job) if f.name == name)
    hint = str(get_type_hints(Job)[name])
    optional = field.default is None
    codec = FIELDS[name]
    if codec in (Codec.LIST, Codec.SET):
        return Column(name, Type.TEXT, default="'[]'")
    if codec in (Codec.CLAIM, Codec.OBJECT, Codec.ARGV):
        return Column(name, Type.TEXT, null=True)
    if codec is Codec.STATE:
        return Column(name, Type.TEXT)
    if codec is Codec.TIME:
        return Column(name, Type.REAL, null=optional)
    if "int" in hint and "tuple" not in hint:
        default = None if optional or field.default is dataclasses.MISSING else str(field.default)
        return Column(name, Type.BIG, null=optional, default=default)
    if "float" in hint:
        return Column(name, Type.REAL, null=optional)
    default = None if optional or field.default is dataclasses.MISSING else f"'{field.default}'"
    return Column(name, Type.TEXT, null=optional, default=default)


def job_columns() -> tuple[Column, ...]:
    """The jobs table's job-field columns, in the field list's order."""
    return tuple(job_column(name) for name in FIELDS)


def _node() -> Column:
    """The node a row of a team's shared table is kept for (PostgreSQL only: one machine has one node)."""
    return Column("node", Type.TEXT, only=Dialect.POSTGRES)


_ID = Column("id", Type.ID)
_PG = Dialect.POSTGRES
_LITE = Dialect.SQLITE

TABLES: dict[str, Table] = {t.name: t for t in (
    Table("jobs", (
        _ID, *job_columns(),
        Column("repo_key", Type.TEXT, default="''", only=_PG),
        Column("remote", Type.TEXT, default="''", only=_PG),
        Column("epoch", Type.BIG, default="0", only=_PG),
        Column("seal", Type.TEXT, default="''", only=_PG),
    )),
    Table("job_events", (
        _ID, Column("job_id", Type.BIG, references="jobs (id)"), Column("at", Type.REAL), Column("kind", Type.TEXT),
        Column("data", Type.TEXT, default="'{}'"), Column("node", Type.TEXT, default="''", only=_PG),
        Column("write_id", Type.TEXT, null=True, only=_PG),
    )),
    Table("sessions", (
        Column("id", Type.TEXT, key=True), Column("created_at", Type.REAL), Column("meta", Type.TEXT, default="'{}'"),
    )),
    Table("messages", (
        _ID, Column("session_id", Type.TEXT, references="sessions (id)"), Column("role", Type.TEXT),
        Column("content", Type.TEXT), Column("at", Type.REAL), Column("extracted", Type.INT, default="0"),
    )),
    Table("memories", (
        _ID, Column("session_id", Type.TEXT, references="sessions (id)"), Column("content", Type.TEXT),
        Column("at", Type.REAL),
    )),
    Table("controls", (
        Column("scope", Type.TEXT, key=True), Column("paused", Type.INT, default="0"),
        Column("slots", Type.INT, null=True),
    )),
    Table("processes", (
        _node(), Column("pgid", Type.BIG), Column("start_time", Type.BIG), Column("boot_id", Type.TEXT),
        Column("job_id", Type.BIG, null=True), Column("what", Type.TEXT, default="''"), Column("started_at", Type.REAL),
    ), key=("node", "pgid", "start_time")),
    Table("landing_journal", (
        _ID, _node(), Column("job_id", Type.BIG, null=True), Column("repo", Type.TEXT), Column("branch", Type.TEXT),
        Column("old", Type.TEXT), Column("new", Type.TEXT), Column("checkouts", Type.TEXT), Column("at", Type.REAL),
    )),
    Table("tickets", (
        Column("key", Type.TEXT, key=True), Column("repo", Type.TEXT), Column("ticket", Type.TEXT, null=True),
        Column("job_id", Type.BIG), Column("at", Type.REAL),
    )),
    Table("plan_history", (
        _node(), Column("repo", Type.TEXT), Column("head", Type.TEXT), Column("changes", Type.TEXT),
        Column("at", Type.REAL),
    ), key=("node", "repo")),
    Table("rate_limits", (_node(), Column("runner", Type.TEXT), Column("until", Type.REAL)), key=("node", "runner")),
    Table("nodes", (
        Column("name", Type.TEXT, key=True), Column("labels", Type.TEXT, default="'[]'"),
        Column("lease_until", Type.REAL), Column("started_at", Type.REAL), Column("host", Type.TEXT, default="''"),
        Column("pid", Type.BIG, default="0"), Column("lease", Type.REAL, default="30"),
    ), only=_PG),
    Table("node_repos", (
        Column("node", Type.TEXT), Column("key", Type.TEXT), Column("path", Type.TEXT), Column("url", Type.TEXT),
    ), key=("node", "key"), only=_PG),
    Table("clones", (
        Column("key", Type.TEXT, key=True), Column("path", Type.TEXT), Column("url", Type.TEXT),
    ), only=_LITE),
    Table("plan_record", (
        Column("repo", Type.TEXT, key=True), Column("newest", Type.TEXT), Column("record", Type.TEXT, null=True),
        Column("at", Type.REAL),
    ), only=_LITE),
)}  # fmt: skip
"""Every table, written once: its columns as they are now, each engine's (`only`) marked."""


# -- the operations a migration is made of --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Create:
    table: str
    columns: tuple[str, ...] | None = None
    """The columns it is made with (None: all it has); the others come with later `Add`s."""
    only: Dialect | None = None

    def sql(self, dialect: Dialect) -> list[str]:
        return [TABLES[self.table].create(dialect, self.columns)]


@dataclass(frozen=True, slots=True)
class Add:
    table: str
    columns: tuple[str, ...]
    only: Dialect | None = None

    def __init__(self, table: str, *columns: str, only: Dialect | None = None) -> None:
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "only", only)

    def sql(self, dialect: Dialect) -> list[str]:
        table = TABLES[self.table]
        cols = [table.column(n) for n in self.columns]
        return [f"ALTER TABLE {self.table} ADD COLUMN {c.sql(dialect)};" for c in cols if c.only in (None, dialect)]


@dataclass(frozen=True, slots=True)
class Index:
    name: str
    table: str
    columns: tuple[str, ...]
    only: Dialect | None = None

    def sql(self, dialect: Dialect) -> list[str]:
        return [f"CREATE INDEX {self.name} ON {self.table} ({', '.join(self.columns)});"]


@dataclass(frozen=True, slots=True)
class Drop:
    table: str
    only: Dialect | None = None

    def sql(self, dialect: Dialect) -> list[str]:
        return [f"DROP TABLE {self.table};"]


Op = Create | Add | Index | Drop

_JOBS_1 = (
    "id", "repo", "branch", "text", "runner", "state", "priority", "after", "declared", "claim", "actual", "base",
    "result", "attempts", "land_after", "worktree", "created_at", "started_at", "finished_at", "landed_sha", "reason",
    "decision", "exit_code",
)  # fmt: skip
"""The jobs table's columns as the first step made them on one machine."""


def _lite(*ops: Op) -> tuple[Op, ...]:
    return tuple(dataclasses.replace(op, only=_LITE) if not isinstance(op, Add) else Add(op.table, *op.columns,
                 only=_LITE) for op in ops)  # fmt: skip


def _pg(*ops: Op) -> tuple[Op, ...]:
    return tuple(dataclasses.replace(op, only=_PG) if not isinstance(op, Add) else Add(op.table, *op.columns,
                 only=_PG) for op in ops)  # fmt: skip


MIGRATIONS: tuple[tuple[Op, ...], ...] = (
    # One machine, 1: jobs and their history; chat sessions, messages and memories.
    _lite(
        Create("jobs", _JOBS_1),
        Index("jobs_state", "jobs", ("state",)),
        Create("job_events"),
        Index("job_events_job", "job_events", ("job_id",)),
        Create("sessions"),
        Create("messages"),
        Create("memories"),
    ),
    # A team, 1: the team's jobs, events, tickets, controls and chat; each node's processes, journal and history;
    # the nodes themselves (their leases) and the clone each node has of each shared repository.
    _pg(
        Create(
            "jobs",
            (
                *_JOBS_1,
                "argv",
                "code",
                "plan_text",
                "evidence",
                "usage",
                "land",
                "node",
                "labels",
                "repo_key",
                "remote",
            ),
        ),
        Index("jobs_state", "jobs", ("state",)),
        Index("jobs_node_state", "jobs", ("node", "state")),
        Index("jobs_key_state", "jobs", ("repo_key", "state")),
        Create("job_events"),
        Index("job_events_job", "job_events", ("job_id",)),
        Index("job_events_kind", "job_events", ("kind",)),
        Create("sessions"),
        Create("messages"),
        Create("memories"),
        Create("controls"),
        Create("processes"),
        Create("landing_journal"),
        Create("tickets"),
        Index("tickets_repo_ticket", "tickets", ("repo", "ticket")),
        Create("plan_history"),
        Create("nodes", ("name", "labels", "lease_until", "started_at", "host", "pid")),
        Create("node_repos"),
    ),
    # One machine, 2: argv jobs, reason codes on jobs, run-time controls (pause, per-repo slot limits).
    _lite(Add("jobs", "argv", "code"), Create("controls")),
    # One machine, 3: process groups the daemon started (runners, landing checks), so a restarted daemon ends
    # survivors; the landing journal (a landing's intent, stored before the ref moves while a checkout is on the
    # branch).
    _lite(Create("processes"), Create("landing_journal")),
    # One machine, 4: tickets a git hook queued: one job per idempotency key; the ticket id lets a newer one
    # supersede.
    _lite(Create("tickets"), Index("tickets_repo_ticket", "tickets", ("repo", "ticket"))),
    # One machine, 5: the planner's output kept on the job (the model's plan text, the evidence for each claimed
    # path), and each repository's mined change history (co-change evidence), extended incrementally.
    _lite(Add("jobs", "plan_text", "evidence"), Create("plan_history")),
    # One machine, 6: model usage and cost of a job's runner; its landing mode (auto, or review before landing).
    _lite(Add("jobs", "usage", "land")),
    # One machine, 7: team mode's fields, kept in the embedded file too so both engines hold one field list.
    _lite(Add("jobs", "node", "labels")),
    # Both from here on, one step each, unless marked.
    # paths a running job touched outside its claim (its claim grown); rounds of review feedback.
    (Add("jobs", "grown", "revisions"),),
    # the feedback of a revision under way; the rate limits runners met (until when), kept across a restart.
    (Add("jobs", "feedback"), Create("rate_limits")),
    # a job's place in the queue once a person moved it (`switch`, `move --before`); NULL: its id.
    (Add("jobs", "place"),),
    # One machine: a node's clones of the team's repositories (shared repository → local path), kept on the node
    # beside its process groups and landing journal, never in the shared store (a teammate could forge them).
    _lite(Create("clones")),
    # A team: a node's process groups and its clones are kept in its own file, never here (a row of them here,
    # which any node or anyone with the database could write, made a node signal a process group or work in a
    # path). The landing journal keeps only pushes onto the shared remote; a node's checkouts are journaled at home.
    _pg(Drop("processes"), Drop("node_repos")),
    # One machine: each repository's record (the planner replayed on its past changes, the calibration fitted on
    # it), so that a restarted daemon does not replay it again; NULL: too short to estimate a risk. In team mode it
    # is kept in the node's own file too: what a node estimates risk from is never read back from the shared store.
    _lite(Create("plan_record")),
    # who queued a job, as git names a person: the author of its commits when the daemon has no identity.
    (Add("jobs", "author"),),
    # the base a job stopped on a real conflict kept its worktree at, to go on from the head once it may.
    (Add("jobs", "moved_from"),),
    # A team: leases: each node's length of it (after a restart of the server no lease ends before a whole one
    # has passed), and each job's epoch, moved on whenever the job changes holder: a write that matters (a state
    # move, the landing's push) applies only at the epoch its writer took the job at.
    _pg(Add("nodes", "lease"), Add("jobs", "epoch")),
    # A team: each job's order sealed under the team's secret (`core.seal`), which this database never holds: a node
    # runs only an order a node of the team sealed. Jobs queued before have none: no node runs them (queue them again).
    _pg(Add("jobs", "seal")),
    # the result a person approved for landing: in team mode sealed with the order, so a review job whose state
    # alone was moved to `landing` in the database never lands.
    (Add("jobs", "approved"),),
    # the jobs that landed as a given commit, read by it: what a job's base lacks of the earlier-queued jobs.
    (Index("jobs_landed_sha", "jobs", ("landed_sha",)),),
)
"""Every migration, in order, for both engines: each a tuple of operations (each for both dialects unless marked
`only`). Add the next at the end."""


def scripts(dialect: Dialect) -> tuple[str, ...]:
    """The dialect's migrations as SQL, one script per version (a step with nothing for it is no version of it)."""
    out = []
    for step in MIGRATIONS:
        sql = [line for op in step if op.only in (None, dialect) for line in op.sql(dialect)]
        if sql:
            out.append("\n".join(sql))
    return tuple(out)


def tables(dialect: Dialect) -> set[str]:
    """The tables a dialect's migrations leave."""
    out: set[str] = set()
    for step in MIGRATIONS:
        for op in step:
            if op.only in (None, dialect):
                if isinstance(op, Create):
                    out.add(op.table)
                elif isinstance(op, Drop):
                    out.discard(op.table)
    return out


SQLITE = scripts(Dialect.SQLITE)
"""The SQLite file's migrations, one script per schema version (`PRAGMA user_version`)."""
POSTGRES = scripts(Dialect.POSTGRES)
"""The team's PostgreSQL migrations, one script per schema version (`schema_version`)."""
