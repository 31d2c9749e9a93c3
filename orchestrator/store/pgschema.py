"""The PostgreSQL schema of a team's shared store, as the migrations that build it (`store.postgres` applies those a
database has not had yet, one daemon at a time under an advisory lock).

Migrations are history: never edit one that shipped, add the next. The jobs table holds the same columns as the
embedded SQLite file's (`core.job.FIELDS`, a test holds them equal), stored the same way (JSON as text, times as
UNIX seconds), plus `repo_key`, the team's name of the job's repository and branch (`git.remote.Remote.key`),
and `remote`, the repository's alone (`Remote.identity`: what each node's clones are named by, in its own file).
Tables a node keeps for itself here (its pushes' journal, its planning history, its rate limits) carry the
node's name; the rest is the team's. What a node acts on on its own machine (its process groups, its checkouts'
journal, its clones) is never kept here.
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: the team's jobs, events, tickets, controls and chat; each node's processes, journal and history; the
    # nodes themselves (their leases) and the clone each node has of each shared repository.
    """
    CREATE TABLE jobs (
        id BIGSERIAL PRIMARY KEY,
        repo TEXT NOT NULL,
        branch TEXT NOT NULL,
        text TEXT NOT NULL,
        runner TEXT NOT NULL,
        state TEXT NOT NULL,
        priority BIGINT NOT NULL DEFAULT 0,
        "after" TEXT NOT NULL DEFAULT '[]',
        declared TEXT NOT NULL DEFAULT '[]',
        claim TEXT,
        actual TEXT NOT NULL DEFAULT '[]',
        base TEXT,
        result TEXT,
        attempts BIGINT NOT NULL DEFAULT 0,
        land_after TEXT NOT NULL DEFAULT '[]',
        worktree TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION,
        finished_at DOUBLE PRECISION,
        landed_sha TEXT,
        reason TEXT NOT NULL DEFAULT '',
        decision TEXT,
        exit_code BIGINT,
        argv TEXT,
        code TEXT NOT NULL DEFAULT '',
        plan_text TEXT NOT NULL DEFAULT '',
        evidence TEXT NOT NULL DEFAULT '[]',
        usage TEXT,
        land TEXT NOT NULL DEFAULT 'auto',
        node TEXT NOT NULL DEFAULT '',
        labels TEXT NOT NULL DEFAULT '[]',
        repo_key TEXT NOT NULL DEFAULT '',
        remote TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX jobs_state ON jobs (state);
    CREATE INDEX jobs_node_state ON jobs (node, state);
    CREATE INDEX jobs_key_state ON jobs (repo_key, state);
    CREATE TABLE job_events (
        id BIGSERIAL PRIMARY KEY,
        job_id BIGINT NOT NULL REFERENCES jobs (id),
        at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}',
        node TEXT NOT NULL DEFAULT '',
        write_id TEXT
    );
    CREATE INDEX job_events_job ON job_events (job_id);
    CREATE INDEX job_events_kind ON job_events (kind);
    CREATE TABLE sessions (id TEXT PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL, meta TEXT NOT NULL DEFAULT '{}');
    CREATE TABLE messages (
        id BIGSERIAL PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (id),
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        extracted INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE memories (
        id BIGSERIAL PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (id),
        content TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE controls (scope TEXT PRIMARY KEY, paused INTEGER NOT NULL DEFAULT 0, slots INTEGER);
    CREATE TABLE processes (
        node TEXT NOT NULL,
        pgid BIGINT NOT NULL,
        start_time BIGINT NOT NULL,
        boot_id TEXT NOT NULL,
        job_id BIGINT,
        what TEXT NOT NULL DEFAULT '',
        started_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (node, pgid, start_time)
    );
    CREATE TABLE landing_journal (
        id BIGSERIAL PRIMARY KEY,
        node TEXT NOT NULL,
        job_id BIGINT,
        repo TEXT NOT NULL,
        branch TEXT NOT NULL,
        old TEXT NOT NULL,
        new TEXT NOT NULL,
        checkouts TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE tickets (
        key TEXT PRIMARY KEY,
        repo TEXT NOT NULL,
        ticket TEXT,
        job_id BIGINT NOT NULL,
        at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX tickets_repo_ticket ON tickets (repo, ticket);
    CREATE TABLE plan_history (
        node TEXT NOT NULL,
        repo TEXT NOT NULL,
        head TEXT NOT NULL,
        changes TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (node, repo)
    );
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        labels TEXT NOT NULL DEFAULT '[]',
        lease_until DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        host TEXT NOT NULL DEFAULT '',
        pid BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE node_repos (
        node TEXT NOT NULL,
        key TEXT NOT NULL,
        path TEXT NOT NULL,
        url TEXT NOT NULL,
        PRIMARY KEY (node, key)
    );
    """,
    # 2: paths a running job touched outside its claim (its claim grown); rounds of review feedback.
    """
    ALTER TABLE jobs ADD COLUMN grown TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE jobs ADD COLUMN revisions BIGINT NOT NULL DEFAULT 0;
    """,
    # 3: the feedback of a revision under way; the rate limits each node's runners met (until when).
    """
    ALTER TABLE jobs ADD COLUMN feedback TEXT NOT NULL DEFAULT '';
    CREATE TABLE rate_limits (
        node TEXT NOT NULL,
        runner TEXT NOT NULL,
        until DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (node, runner)
    );
    """,
    # 4: a job's place in the queue once a person moved it (`switch`, `move --before`); NULL: its id.
    """
    ALTER TABLE jobs ADD COLUMN place DOUBLE PRECISION;
    """,
    # 5: a node's process groups and its clones are kept in its own file, never here (a row of them here, which
    # any node or anyone with the database could write, made a node signal a process group or work in a path).
    # The landing journal keeps only pushes onto the shared remote; a node's checkouts are journaled at home.
    """
    DROP TABLE processes;
    DROP TABLE node_repos;
    """,
    # 6: who queued a job, as git names a person: the author of its commits when the daemon has no identity.
    """
    ALTER TABLE jobs ADD COLUMN author TEXT NOT NULL DEFAULT '';
    """,
    # 7: the base a job stopped on a real conflict kept its worktree at, to go on from the head once it may.
    """
    ALTER TABLE jobs ADD COLUMN moved_from TEXT NOT NULL DEFAULT '';
    """,
    # 8: leases: each node's length of it (after a restart of the server no lease ends before a whole one has
    # passed), and each job's epoch, moved on whenever the job changes holder: a write that matters (a state move,
    # the landing's push) applies only at the epoch its writer took the job at.
    """
    ALTER TABLE nodes ADD COLUMN lease DOUBLE PRECISION NOT NULL DEFAULT 30;
    ALTER TABLE jobs ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
    """,
)
