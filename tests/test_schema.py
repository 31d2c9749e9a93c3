"""The store's schema is written once (`store.schema`): each table's columns, and one list of migrations rendered for
SQLite and for PostgreSQL; the jobs table's columns come from the job's field list."""

from __future__ import annotations

import sqlite3

from orchestrator.core.job import FIELDS
from orchestrator.store import schema
from orchestrator.store.schema import TABLES, Add, Dialect

LITE_TYPES = {"id": "INTEGER", "int": "INTEGER", "big": "INTEGER", "real": "REAL", "text": "TEXT"}


def _migrated() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    for script in schema.SQLITE:
        conn.executescript(script)
    return conn


def test_sqlite_migrations_leave_each_table_as_it_is_written():
    """Every table the SQLite migrations leave has exactly the columns its one definition gives SQLite: names,
    types, NOT NULL and defaults."""
    conn = _migrated()
    left = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} - {"sqlite_sequence"}
    assert left == schema.tables(Dialect.SQLITE)
    for name in left:
        declared = [c for c in TABLES[name].columns if c.only in (None, Dialect.SQLITE)]
        found = conn.execute(f"PRAGMA table_info({name})").fetchall()
        assert [r[1] for r in found] == [c.name for c in declared], name
        for row, col in zip(found, declared, strict=True):
            assert row[2] == LITE_TYPES[col.type], (name, col.name)
            assert row[4] == col.default, (name, col.name)


def test_the_jobs_table_is_the_field_list():
    """The jobs table's columns are `core.job.FIELDS`, in order, whatever the engine (the team's own columns aside)."""
    for dialect in Dialect:
        cols = [c.name for c in TABLES["jobs"].columns if c.only in (None, dialect) and c.name != "id"]
        assert [c for c in cols if c in FIELDS] == list(FIELDS)
    conn = _migrated()
    assert [r[1] for r in conn.execute("PRAGMA table_info(jobs)")] == ["id", *FIELDS]


def test_a_step_for_both_engines_is_written_once():
    """One step renders for both engines, each in its own words; a step with nothing for an engine is no version
    of it (so each engine's versions stay the ones it shipped)."""
    step = Add("jobs", "priority", "place")
    assert step.sql(Dialect.SQLITE) == [
        "ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;",
        "ALTER TABLE jobs ADD COLUMN place REAL;",
    ]
    assert step.sql(Dialect.POSTGRES) == [
        "ALTER TABLE jobs ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;",
        "ALTER TABLE jobs ADD COLUMN place DOUBLE PRECISION;",
    ]
    both = sum(all(op.only is None for op in step) for step in schema.MIGRATIONS)
    lite = sum(any(op.only in (None, Dialect.SQLITE) for op in step) for step in schema.MIGRATIONS)
    pg = sum(any(op.only in (None, Dialect.POSTGRES) for op in step) for step in schema.MIGRATIONS)
    assert (len(schema.SQLITE), len(schema.POSTGRES)) == (lite, pg) and both >= 5
