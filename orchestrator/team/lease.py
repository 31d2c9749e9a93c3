"""This node's lease, renewed from a thread of its own on a connection of its own.

The lease is the node's hold on every job it has: once it ends, other nodes take those jobs over. So it must not
depend on the daemon's event loop, which a job with a million files, a slow disk or a long landing can keep busy
for seconds: the keeper runs in a thread with an event loop and one PostgreSQL connection of its own, and renews
every third of the lease (`store.postgres.RENEW`, on the server's clock) for as long as the process lives.

It also says how long its renewals have gone through without a break (`steady_for`): a node judges other nodes'
leases (takes their jobs over) only after a whole lease of its own renewals went through, so that after an
outage of the database (or of this node's network) every node has had the time to renew before any is judged.
"""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg

from orchestrator import logging as olog
from orchestrator.store.pgconn import CONNECTION_ERRORS
from orchestrator.store.postgres import RENEW

RETRY = (0.2, 0.5, 1.0, 2.0)
"""Pauses between tries while the database does not answer (the last one repeats, never past a renewal's)."""


class LeaseKeeper:
    def __init__(self, url: str, node: str, lease: float) -> None:
        self.url = url
        self.node = node
        self.lease = lease
        self.every = lease / 3
        self._steady_since: float | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self.renewals = 0
        """How many renewals went through (for tests and benches)."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="team-lease", daemon=True)
        self._thread.start()
        self._started.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        """End the renewals (the lease then runs out by itself, unless the next start renews it)."""
        self._stopping.set()
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def steady_for(self) -> float:
        """Seconds the renewals have gone through without a break (0 while the last one failed)."""
        since = self._steady_since
        return 0.0 if since is None else time.monotonic() - since

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._started.set()
        conn: asyncpg.Connection | None = None
        failures = 0
        try:
            while not self._stopping.is_set():
                try:
                    if conn is None or conn.is_closed():
                        conn = await asyncpg.connect(self.url, timeout=min(10.0, self.every))
                    renewed = await conn.fetchval(RENEW, self.node, self.lease, timeout=self.every)
                except (*CONNECTION_ERRORS, asyncpg.PostgresError, TimeoutError) as e:
                    if self._steady_since is not None or failures == 0:
                        olog.get().warning(olog.Event.TEAM_STORE_LOST, error=f"{type(e).__name__}: {e}", lease=True)
                    self._steady_since = None
                    await _drop(conn)
                    conn = None
                    pause = min(RETRY[min(failures, len(RETRY) - 1)], self.every)
                    failures += 1
                else:
                    if renewed is None:
                        olog.get().error(olog.Event.TEAM_STORE_LOST, error=f"node {self.node!r} has no row to renew")
                    elif self._steady_since is None:
                        self._steady_since = time.monotonic()
                        if failures:
                            olog.get().info(olog.Event.TEAM_JOINED, node=self.node, renewed=True, after=failures)
                    failures = 0
                    self.renewals += 1
                    pause = self.every
                await self._pause(pause)
        finally:
            await _drop(conn)

    async def _pause(self, seconds: float) -> None:
        assert self._wake is not None
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            return


async def _drop(conn: asyncpg.Connection | None) -> None:
    """Close a connection that may be broken already."""
    if conn is not None and not conn.is_closed():
        with olog.best_effort("close the lease connection", *CONNECTION_ERRORS, TimeoutError):
            await asyncio.wait_for(conn.close(), 5)


__all__ = ["LeaseKeeper"]
