"""A throwaway PostgreSQL server in a directory of its own, for the tests and `bench team`.

Debian's `postgresql` package is all it needs (`initdb`, `pg_ctl`, `postgres`, found on PATH or under
`/usr/lib/postgresql/*/bin`); no system service is started or touched. The server listens on a UNIX socket
in its own directory only (no TCP port), trusts local connections, and trades durability for speed
(`fsync = off`): it holds test data. PostgreSQL refuses to run as root, so when root runs this (CI does) the
server runs as the unprivileged `nobody`, with its directory handed to that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

SUPERUSER = "orchestrator"
"""The role `initdb` makes the superuser; tests and benches connect as it."""

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
        self.log = self.root / "server.log"
        self.port = port
        self._user = _unprivileged() if os.geteuid() == 0 else None

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> LocalPostgres:
        """initdb on first use, then start the server and wait until it accepts connections."""
        if not (self.data / "PG_VERSION").is_file():
            self._init()
        options = " ".join(
            [f"-k {self.root}", "-c listen_addresses=''", f"-p {self.port}", *(f"-c {o}" for o in _SPEED)]
        )
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log), "-o", options)
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

    def url(self, database: str = "postgres") -> str:
        """A libpq URL of `database` over the server's UNIX socket."""
        return f"postgresql://{SUPERUSER}@/{database}?host={self.root}&port={self.port}"

    def create_database(self, name: str) -> str:
        """A new, empty database; its URL."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"database name {name!r}: use lower-case letters, digits and _")
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL with the server's own `psql` (as the superuser); its output."""
        argv = [str(self.bindir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
        argv += ["-h", str(self.root), "-p", str(self.port), "-U", SUPERUSER, "-d", database, "-c", sql]
        done = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=60, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise LocalPostgresError(f"psql: {done.stderr.strip()}")
        return done.stdout

    # -- internals ----------------------------------------------------------------------------------------

    def _init(self) -> None:
        if self._user is not None:
            os.chown(self.root, self._user[0], self._user[1])
        os.chmod(self.root, 0o700)
        self._run(
            "initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C",
            "--no-sync", "--no-instructions",
        )  # fmt: skip

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
