"""A throwaway PostgreSQL server in a directory of its own, for the tests and `bench team`.

Debian's `postgresql` package is all it needs (`initdb`, `pg_ctl`, `postgres`, found on PATH or under
`/usr/lib/postgresql/*/bin`); no system service is started or touched. The server listens on a UNIX socket
only (no TCP port), in a socket dir laid out as a distribution installs one (`<root>/run`, mode 755, the server's
own: any local user may reach the socket), asks every role for its password (SCRAM; the passwords live in this
object only, never in a file a job could read), and trades durability for speed (`fsync = off`): it holds test
data. Nodes connect as `NODE_ROLE`, a role with the rights the docs tell a team to give its nodes (no superuser,
the owner of its database); `psql` runs as the superuser. PostgreSQL refuses to run as root, so when root runs
this (CI does) the server runs as the unprivileged `nobody`, with its directory handed to that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

SUPERUSER = "orchestrator"
"""The role `initdb` makes the superuser: `psql` (setting up, checking what a test did) runs as it."""
NODE_ROLE = "orchestrator_node"
"""The role nodes connect as (`url`): what `docs/team.md` tells a team to create, and no more."""

INSTALL_HINT = "install PostgreSQL's server programs (Debian: apt-get install postgresql)"

_SPEED = ("fsync=off", "synchronous_commit=off", "full_page_writes=off", "max_connections=200")


class LocalPostgresError(RuntimeError):
    """The local server could not be made, started or stopped; the message has its log's tail."""


def find_bindir() -> Path | None:
    """The directory holding `initdb` and `pg_ctl`: PATH first, else the newest `/usr/lib/postgresql/N/bin`."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    versions = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "pg_ctl").is_file() and (p / "initdb").is_file()),
        key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.name)] or [0],
    )
    return versions[-1] if versions else None


class LocalPostgres:
    """One server: `start()`, `url(db)`, `create_database(db)`, `stop()` / `kill()`, `restart()`, `remove()`."""

    def __init__(self, root: Path | None = None, *, port: int = 5432, bindir: Path | None = None) -> None:
        found = bindir or find_bindir()
        if found is None:
            raise LocalPostgresError(f"no PostgreSQL server programs found: {INSTALL_HINT}")
        self.bindir = found
        self.root = root or Path(tempfile.mkdtemp(prefix="orch-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "run"
        """The socket dir: mode 755 and the server's, as `/run/postgresql` is on a distribution install."""
        self.log = self.root / "server.log"
        self.port = port
        self._user = _unprivileged() if os.geteuid() == 0 else None
        self._super_password = secrets.token_urlsafe(18)
        self.node_password = secrets.token_urlsafe(18)

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> LocalPostgres:
        """initdb on first use, then start the server and wait until it accepts connections."""
        fresh = not (self.data / "PG_VERSION").is_file()
        if fresh:
            self._init()
        options = " ".join(
            [f"-k {self.sockets}", "-c listen_addresses=''", f"-p {self.port}", *(f"-c {o}" for o in _SPEED)]
        )
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log), "-o", options)
        if fresh:
            self.psql(
                f"CREATE ROLE {NODE_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
                f"PASSWORD '{self.node_password}'"
            )
        return self

    def stop(self) -> None:
        """A fast shutdown: open transactions are rolled back, clients disconnected."""
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.data))

    def kill(self) -> None:
        """An immediate shutdown (the server quits without a checkpoint, as if it crashed)."""
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", "immediate", "-D", str(self.data))

    def restart(self) -> None:
        self.stop()
        self.start()

    def running(self) -> bool:
        done = self._run("pg_ctl", "status", "-D", str(self.data), check=False)
        return done.returncode == 0

    def remove(self) -> None:
        """Stop the server if it runs, and delete its directory."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(LocalPostgresError):  # already down: its pid file is stale
                self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- databases ----------------------------------------------------------------------------------------

    def url(self, database: str = "postgres", *, password: bool = False) -> str:
        """A libpq URL of `database` over the server's UNIX socket, as the node role: without its password (which
        comes from PGPASSWORD, `env()`, as a team's nodes get it), or with it (`password=True`)."""
        secret = f":{self.node_password}" if password else ""
        return f"postgresql://{NODE_ROLE}{secret}@/{database}?host={self.sockets}&port={self.port}"

    def env(self) -> dict[str, str]:
        """The environment a node connecting as the node role needs beside `url()`."""
        return {"PGPASSWORD": self.node_password}

    def create_database(self, name: str) -> str:
        """A new, empty database owned by the node role, as `docs/team.md` says to make one; its URL."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"database name {name!r}: use lower-case letters, digits and _")
        self.psql(f"CREATE DATABASE {name} OWNER {NODE_ROLE}")
        self.psql(f"REVOKE ALL ON DATABASE {name} FROM PUBLIC")
        return self.url(name)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL with the server's own `psql` (as the superuser); its output."""
        argv = [str(self.bindir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
        argv += ["-h", str(self.sockets), "-p", str(self.port), "-U", SUPERUSER, "-d", database, "-c", sql]
        env = {**_env(), "PGPASSWORD": self._super_password}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise LocalPostgresError(f"psql: {done.stderr.strip()}")
        return done.stdout

    # -- internals ----------------------------------------------------------------------------------------

    def _init(self) -> None:
        # The root and socket dir as a distribution lays out /run/postgresql: others may reach the socket (the
        # password is what stands between them and the server); the data dir is the server's alone (initdb).
        self.sockets.mkdir(parents=True, exist_ok=True)
        for d in (self.root, self.sockets):
            if self._user is not None:
                os.chown(d, self._user[0], self._user[1])
            os.chmod(d, 0o755)
        # initdb reads the superuser's password from a file: one the server's user may read, gone right after.
        fd, name = tempfile.mkstemp(prefix="initdb-pw-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self._super_password + "\n")
            if self._user is not None:
                os.chown(name, self._user[0], self._user[1])
            self._run(
                "initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=scram-sha-256", f"--pwfile={name}",
                "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions",
            )  # fmt: skip
        finally:
            os.unlink(name)

    def _run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bindir / program), *args]
        uid, gid = self._user if self._user is not None else (None, None)
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=_env(),
                cwd=self.root,
                timeout=120,
                stdin=subprocess.DEVNULL,
                user=uid,
                group=gid,
                extra_groups=[] if uid is not None else None,
            )
        except subprocess.TimeoutExpired as e:
            raise LocalPostgresError(f"{program} {' '.join(args[:1])} took over 120 s{self._tail()}") from e
        if check and done.returncode != 0:
            raise LocalPostgresError(
                f"{program} {args[0] if args else ''} exited {done.returncode}: {done.stderr.strip()}{self._tail()}"
            )
        return done

    def _tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()[-8:]
        except OSError:
            return ""
        return "\nserver log:\n" + "\n".join(lines) if lines else ""


def _unprivileged() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        raise LocalPostgresError(
            "PostgreSQL will not run as root and this machine has no `nobody` user: run as another user"
        ) from None
    return entry.pw_uid, entry.pw_gid


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C", "LC_ALL": "C", "TZ": "UTC"}
