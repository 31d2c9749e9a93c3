"""What a node's PostgreSQL role may do, and whether the team's schema is this orchestrator's: `doctor`'s check.

A node needs to log in, to own the team's database (its migrations create and alter the tables) and nothing
more. A role that may do more turns a stolen password into more than the team's queue: a superuser, or a member
of `pg_execute_server_program`, runs a program as the server's OS user (`COPY … TO PROGRAM`); the server-file
roles read and write the server's files; CREATEROLE makes itself such a role. `inspect` reads the facts
(`asyncpg`, once); `verdict` (pure) says what is wrong and the SQL that fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVER_ROLES: tuple[str, ...] = ("pg_execute_server_program", "pg_read_server_files", "pg_write_server_files")
"""Predefined roles that reach the server's machine (its programs, its files) beyond the database."""

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True, slots=True)
class RoleFacts:
    """What the server says of the role a node logs in as, and of the team's database."""

    role: str
    database: str
    superuser: bool
    createrole: bool
    createdb: bool
    replication: bool
    bypassrls: bool
    server_roles: tuple[str, ...]
    """The `SERVER_ROLES` it is a member of (directly or through another role)."""
    owns_database: bool
    schema: int | None
    """The team's schema version (None: no table yet, the first daemon makes them)."""
    abstract: tuple[str, ...] = ()
    """The server's abstract UNIX sockets (`@name` in `unix_socket_directories`): every job reaches those."""


async def inspect(url: str, *, password: str | None = None, timeout: float = 5.0) -> RoleFacts:
    """Connect once as the node would and read the facts; asyncpg's errors (unreachable, refused) propagate."""
    import asyncpg

    conn = await asyncpg.connect(url, password=password, timeout=timeout)
    try:
        row = await conn.fetchrow(
            "SELECT r.rolname, current_database() AS db, r.rolsuper, r.rolcreaterole, r.rolcreatedb, "
            "r.rolreplication, r.rolbypassrls, "
            "(SELECT d.datdba = r.oid FROM pg_database d WHERE d.datname = current_database()) AS owns "
            "FROM pg_roles r WHERE r.rolname = current_user"
        )
        assert row is not None
        members = [
            name
            for name in SERVER_ROLES
            if await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1) AND pg_has_role(current_user, $1, 'MEMBER')",
                name,
            )
        ]
        dirs = str(await conn.fetchval("SELECT setting FROM pg_settings WHERE name = 'unix_socket_directories'") or "")
        has_table = await conn.fetchval("SELECT to_regclass('schema_version') IS NOT NULL")
        schema = await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_version") if has_table else None
    finally:
        await conn.close()
    return RoleFacts(
        role=row["rolname"],
        database=row["db"],
        superuser=row["rolsuper"],
        createrole=row["rolcreaterole"],
        createdb=row["rolcreatedb"],
        replication=row["rolreplication"],
        bypassrls=row["rolbypassrls"],
        server_roles=tuple(members),
        owns_database=bool(row["owns"]),
        schema=None if schema is None else int(schema),
        abstract=tuple(d.strip() for d in dirs.split(",") if d.strip().startswith("@")),
    )


def verdict(facts: RoleFacts, known: int) -> list[tuple[str, str, str]]:
    """(check name, level, what to do) for the role's rights and the schema (`known`: this orchestrator's newest
    schema version)."""
    role = facts.role
    too_much = [
        *(["SUPERUSER"] if facts.superuser else []),
        *(["CREATEROLE"] if facts.createrole else []),
        *(f"member of {name}" for name in facts.server_roles),
    ]
    out: list[tuple[str, str, str]] = []
    if too_much:
        fix = [f"ALTER ROLE {role} NOSUPERUSER NOCREATEROLE;"] if facts.superuser or facts.createrole else []
        fix += [f"REVOKE {name} FROM {role};" for name in facts.server_roles]
        out.append((
            "postgresql role",
            FAIL,
            f"{role} may do more than a node needs ({', '.join(too_much)}): a job or teammate with its password could "
            f"run programs or read files as the server's user. As a superuser: {' '.join(fix)} "
            f"(and ALTER DATABASE {facts.database} OWNER TO {role}; if it owned nothing else)",
        ))  # fmt: skip
    elif not facts.owns_database:
        out.append((
            "postgresql role",
            WARN,
            f"{role} does not own the database {facts.database}: its migrations need to create and alter tables; "
            f"as a superuser: ALTER DATABASE {facts.database} OWNER TO {role};",
        ))  # fmt: skip
    else:
        extra = [n for n, on in (("CREATEDB", facts.createdb), ("REPLICATION", facts.replication),
                                 ("BYPASSRLS", facts.bypassrls)) if on]  # fmt: skip
        tail = f" (it also has {', '.join(extra)}, which no node needs: ALTER ROLE {role} NO{' NO'.join(extra)};)"
        out.append((
            "postgresql role",
            WARN if extra else OK,
            f"{role}: no superuser, no server programs or files, owner of {facts.database}{tail if extra else ''}",
        ))  # fmt: skip
    if facts.abstract:
        out.append((
            "postgresql sockets",
            FAIL,
            f"the server listens on the abstract UNIX socket {', '.join(facts.abstract)}: every job on its machine "
            "reaches it (it shares the machine's network; no sandbox can hide it) and may log in without a password "
            "(`peer`); take it out of unix_socket_directories and keep socket dirs only",
        ))  # fmt: skip
    if facts.schema is None:
        out.append(("postgresql schema", OK, f"{facts.database} is empty: the first daemon started makes the tables"))
    elif facts.schema > known:
        out.append((
            "postgresql schema",
            FAIL,
            f"version {facts.schema}, newer than this orchestrator knows ({known}): upgrade orchestrator on this node",
        ))  # fmt: skip
    elif facts.schema < known:
        out.append(("postgresql schema", OK, f"version {facts.schema}: the next daemon start migrates it to {known}"))
    else:
        out.append(("postgresql schema", OK, f"version {facts.schema} (this orchestrator's)"))
    return out
