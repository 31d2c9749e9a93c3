"""One PostgreSQL connection pool, and every unit of work on it retried across a lost connection.

`PgConnection.run(work)` runs `work(conn)` in one transaction. When the connection is lost (PostgreSQL restarted,
the network cut) it waits and tries again, for up to `RECONNECT_FOR` seconds; `again(conn)`, when given, is asked
first whether the lost attempt committed after all (its answer was lost), so nothing is applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from orchestrator import logging as olog
from orchestrator import testhook
from orchestrator.store.base import StoreFull, StoreUnreachable

T = TypeVar("T")

RECONNECT_FOR = 120.0
"""Seconds an operation keeps retrying a lost connection (PostgreSQL restarting) before it fails."""
CONNECTION_ERRORS = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.InternalClientError,  # a connection broken mid-operation, met again when the pool resets it
    asyncpg.TooManyConnectionsError,  # 53300: the server's connection slots are taken for now
)
NOW = "extract(epoch from clock_timestamp())"
"""SQL for the server's clock: leases are compared on it, never on a node's own clock."""


class PgConnection:
    def __init__(self, pool: asyncpg.Pool, shown_url: str) -> None:
        self.pool = pool
        self.shown = shown_url

    async def run(
        self,
        work: Callable[[asyncpg.Connection], Awaitable[T]],
        *,
        again: Callable[[asyncpg.Connection], Awaitable[T | None]] | None = None,
    ) -> T:
        """`work(conn)` in one transaction; a lost connection is retried (after `again(conn)`, if given, says the
        lost attempt did not commit) until `RECONNECT_FOR`."""

        async def once(lost: bool) -> T:
            async with self.pool.acquire() as conn:
                if lost and again is not None:
                    done = await again(conn)
                    if done is not None:
                        return done
                async with conn.transaction():
                    result = await work(conn)
                await testhook.reach("pg.committed")  # where a test loses the answer of a committed unit
                return result

        return await self._retrying(once)

    async def run_outside(self, work: Callable[[asyncpg.Connection, str], Awaitable[None]], arg: str) -> Any:
        """`work(conn, arg)` outside a transaction on a connection taken from the pool and kept: the caller owns it
        (and gives it back with `pool.release`). A lost connection is retried as `run` does."""

        async def once(_lost: bool) -> Any:
            conn = await self.pool.acquire()
            try:
                await work(conn, arg)
            except CONNECTION_ERRORS:
                with contextlib.suppress(*CONNECTION_ERRORS):  # it is broken: the pool replaces it
                    await self.pool.release(conn)
                raise
            return conn

        return await self._retrying(once)

    async def _retrying(self, attempt: Callable[[bool], Awaitable[T]]) -> T:
        """`attempt(lost)` until it answers; while the connection is lost (`lost`: an earlier attempt was), again
        after a growing pause, until `RECONNECT_FOR`, then `StoreUnreachable`."""
        deadline = time.monotonic() + RECONNECT_FOR
        delay, lost = 0.2, False
        while True:
            try:
                return await attempt(lost)
            except asyncpg.DiskFullError as e:  # 53100: the transaction was rolled back, nothing of it kept
                raise StoreFull(
                    f"the team's PostgreSQL at {self.shown} has no room left on its disk ({e}); nothing of this write "
                    "was kept: free space on the database server (or ask its admin to), then try again"
                ) from None
            except CONNECTION_ERRORS as e:
                why = f"{type(e).__name__}: {e}"
                if time.monotonic() >= deadline:
                    raise StoreUnreachable(
                        f"lost the team's PostgreSQL at {self.shown} for over {RECONNECT_FOR:.0f} s: {why}"
                    ) from None
                if not lost:
                    olog.get().warning(olog.Event.TEAM_STORE_LOST, error=why, retrying=True)
                lost = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        return await self.run(lambda c: c.fetch(sql, *args))

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        return await self.run(lambda c: c.fetchrow(sql, *args))

    async def execute(self, sql: str, *args: Any) -> None:
        await self.run(lambda c: c.execute(sql, *args))

    async def ids(self, sql: str, *args: Any) -> list[int]:
        return [int(r[0]) for r in await self.fetch(sql, *args)]
