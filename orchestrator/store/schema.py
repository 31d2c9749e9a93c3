"""The SQLite schema, as the migrations that build it: the store applies those its file has not had yet.

Migrations are history: never edit one that shipped, add the next. The jobs table's columns are those of
`core.job.FIELDS` (a test holds them equal); a new job field is a new migration adding its column.
"""

from __future__ import annotations

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
    # 7: team mode's fields, kept in the embedded file too so both engines hold one field list (always empty here).
    """
    ALTER TABLE jobs ADD COLUMN node TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN labels TEXT NOT NULL DEFAULT '[]';
    """,
    # 8: paths a running job touched outside its claim (its claim grown); rounds of review feedback.
    """
    ALTER TABLE jobs ADD COLUMN grown TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE jobs ADD COLUMN revisions INTEGER NOT NULL DEFAULT 0;
    """,
    # 9: the feedback of a revision under way; the rate limits runners met (until when), kept across a restart.
    """
    ALTER TABLE jobs ADD COLUMN feedback TEXT NOT NULL DEFAULT '';
    CREATE TABLE rate_limits (
        runner TEXT PRIMARY KEY,
        until REAL NOT NULL
    );
    """,
    # 10: a job's place in the queue once a person moved it (`switch`, `move --before`); NULL: its id.
    """
    ALTER TABLE jobs ADD COLUMN place REAL;
    """,
    # 11: team mode: this node's clones of the team's repositories (shared repository → local path), kept on the
    # node beside its process groups and landing journal, never in the shared store (a teammate could forge them).
    """
    CREATE TABLE clones (
        key TEXT PRIMARY KEY,
        path TEXT NOT NULL,
        url TEXT NOT NULL
    );
    """,
    # 12: each repository's record (the planner replayed on its past changes, the calibration fitted on it), so
    # that a restarted daemon does not replay it again; NULL: too short to estimate a risk. In team mode it is
    # kept in the node's own file too: what a node estimates risk from is never read back from the shared store.
    """
    CREATE TABLE plan_record (
        repo TEXT PRIMARY KEY,
        newest TEXT NOT NULL,
        record TEXT,
        at REAL NOT NULL
    );
    """,
    # 13: who queued a job, as git names a person: the author of its commits when the daemon has no identity.
    """
    ALTER TABLE jobs ADD COLUMN author TEXT NOT NULL DEFAULT '';
    """,
    # 14: the base a job stopped on a real conflict kept its worktree at, to go on from the head once it may.
    """
    ALTER TABLE jobs ADD COLUMN moved_from TEXT NOT NULL DEFAULT '';
    """,
)
