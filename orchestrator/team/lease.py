"""This node's lease, renewed from a process of its own on a connection of its own.

The lease is the node's hold on every job it has: once it ends, other nodes take those jobs over. So it must not
depend on the daemon's event loop, nor even on its interpreter: a job with a million files keeps the loop busy,
and a C library working on them (libgit2 diffing a workspace) holds the interpreter's lock for seconds, which no
thread of the daemon's could get past. The keeper is a small child process (`python -m orchestrator.team.lease`)
with one PostgreSQL connection of its own; it renews every third of the lease (`store.postgres.RENEW`, on the
server's clock) for as long as the daemon lives: it reads the daemon's end of a pipe and exits when that closes
(the daemon ended, however). It says each renewal's outcome on a line of its output; the daemon reads those in a
thread of its own.

The daemon learns from them how long the renewals have gone through without a break (`steady_for`): a node judges
other nodes' leases (takes their jobs over) only after a whole lease of its own renewals went through, so that
after an outage of the database (or of this node's network) every node has had the time to renew before any is
judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from typing import IO

import asyncpg

from orchestrator import logging as olog
from orchestrator.store.pgconn import CONNECTION_ERRORS
from orchestrator.store.postgres import RENEW

RETRY = (0.2, 0.5, 1.0, 2.0)
"""Pauses between tries while the database does not answer (the last one repeats, never past a renewal's)."""
ENV_URL, ENV_NODE, ENV_LEASE = "ORCHESTRATOR_LEASE_URL", "ORCHESTRATOR_LEASE_NODE", "ORCHESTRATOR_LEASE_SECONDS"
"""How the daemon tells its keeper what to renew (the URL names no password: that comes as PGPASSWORD does)."""
PASSED_ENV = ("PATH", "HOME", "LANG", "TZ")
"""Besides the store's `PG*` variables, what of the daemon's environment the keeper gets."""


class LeaseKeeper:
    """The daemon's side: starts the keeper process, reads its outcomes, ends it."""

    def __init__(self, url: str, node: str, lease: float) -> None:
        self.url = url
        self.node = node
        self.lease = lease
        self.every = lease / 3
        self.renewals = 0
        """How many renewals went through (for tests and benches)."""
        self._steady_since: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k in PASSED_ENV or k.startswith("PG")}
        env |= {ENV_URL: self.url, ENV_NODE: self.node, ENV_LEASE: str(self.lease)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.team.lease"],
            stdin=subprocess.PIPE,  # its end closing (this daemon gone) ends the keeper
            stdout=subprocess.PIPE,
            stderr=None,  # its log lines join the daemon's
            env=env,
        )
        self._reader = threading.Thread(target=self._read, args=(self._proc.stdout,), name="team-lease", daemon=True)
        self._reader.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the renewals (the lease then runs out by itself, unless the next start renews it)."""
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._reader is not None:
            self._reader.join(timeout)
        if proc.stdout is not None:
            proc.stdout.close()

    def steady_for(self) -> float:
        """Seconds the renewals have gone through without a break (0 while the last one failed)."""
        since = self._steady_since
        return 0.0 if since is None else time.monotonic() - since

    def _read(self, out: IO[bytes] | None) -> None:
        assert out is not None
        for line in out:
            if line.startswith(b"ok"):
                self.renewals += 1
                if self._steady_since is None:
                    self._steady_since = time.monotonic()
            else:
                self._steady_since = None
        self._steady_since = None  # the keeper ended: no renewal goes through any more


# -- the keeper process ----------------------------------------------------------------------------------------


async def renew(url: str, node: str, lease: float, out: IO[str], stopping: asyncio.Event) -> None:
    """Renew `node`'s lease every third of `lease` until `stopping`; one line on `out` per outcome."""
    every = lease / 3
    conn: asyncpg.Connection | None = None
    failures = 0
    try:
        while not stopping.is_set():
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(url, timeout=min(10.0, every))
                renewed = await conn.fetchval(RENEW, node, lease, timeout=every)
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, TimeoutError) as e:
                if failures == 0:
                    olog.get().warning(olog.Event.TEAM_STORE_LOST, error=f"{type(e).__name__}: {e}", lease=True)
                out.write(f"lost {type(e).__name__}\n")
                await _drop(conn)
                conn = None
                pause = min(RETRY[min(failures, len(RETRY) - 1)], every)
                failures += 1
            else:
                if renewed is None:
                    olog.get().error(olog.Event.TEAM_STORE_LOST, error=f"node {node!r} has no row to renew")
                    out.write("lost no-row\n")
                else:
                    if failures:
                        olog.get().info(olog.Event.TEAM_JOINED, node=node, renewed=True, after=failures)
                    out.write("ok\n")
                failures = 0
                pause = every
            out.flush()
            with contextlib.suppress(TimeoutError):  # the pause ran out: renew again
                await asyncio.wait_for(stopping.wait(), pause)
    finally:
        await _drop(conn)


async def _drop(conn: asyncpg.Connection | None) -> None:
    """Close a connection that may be broken already."""
    if conn is not None and not conn.is_closed():
        with olog.best_effort("close the lease connection", *CONNECTION_ERRORS, TimeoutError):
            await asyncio.wait_for(conn.close(), 5)


async def _main() -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    # The daemon holds the other end of stdin: end-of-file (the daemon ended, however) ends the renewals.
    loop.add_reader(sys.stdin.fileno(), lambda: stopping.set() if not os.read(sys.stdin.fileno(), 4096) else None)
    await renew(os.environ[ENV_URL], os.environ[ENV_NODE], float(os.environ[ENV_LEASE]), sys.stdout, stopping)


if __name__ == "__main__":
    from orchestrator import hardening

    hardening.harden()  # its environment holds the store's password: no /proc/<pid>/environ for others
    olog.configure(sys.stderr)
    asyncio.run(_main())
