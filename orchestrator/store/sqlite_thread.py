"""One SQLite connection, owned by one thread of its own; the event loop hands it whole units of work.

`Connection.call(fn, *args)` runs `fn(conn, *args)` on that thread: a transaction of several statements is
one hand-off, not one per statement. Only the standard library's public APIs (`sqlite3`, a one-worker
`ThreadPoolExecutor`). A call whose caller is cancelled still finishes on the database thread (a statement
cannot be taken back half way), and the caller sees its cancellation only once it has: whoever handles the
cancellation reads the database as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.store.base import StoreFull

T = TypeVar("T")


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """On the database thread: BEGIN IMMEDIATE, then COMMIT; ROLLBACK on any error, the COMMIT's own included (a
    full disk fails the COMMIT, and SQLite may or may not have rolled back already: the connection must never be
    left inside a transaction, or every later write fails)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def is_full(e: BaseException) -> bool:
    """Whether a SQLite error says the disk (or the database's size limit) is full."""
    return isinstance(e, sqlite3.Error) and getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


class Connection:
    """A `sqlite3.Connection` (autocommit: transactions are explicit) living on its own thread."""

    def __init__(self, pool: ThreadPoolExecutor, conn: sqlite3.Connection, path: Path | None = None) -> None:
        self._pool = pool
        self._conn = conn
        self.path = path

    @classmethod
    async def open(cls, path: Path) -> Connection:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(path, isolation_level=None)
            conn.row_factory = sqlite3.Row
            return conn

        try:
            conn = await asyncio.get_running_loop().run_in_executor(pool, connect)
        except BaseException:
            pool.shutdown(wait=False)
            raise
        return cls(pool, conn, Path(path))

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(connection, *args)` on the database thread. A full disk is `StoreFull` (nothing of it was kept)."""
        fut = asyncio.get_running_loop().run_in_executor(self._pool, fn, self._conn, *args)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not fut.done():
                await asyncio.wait({fut})
            raise
        except sqlite3.Error as e:
            if is_full(e):
                raise StoreFull(_full_message(self.path)) from e
            raise

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        """One statement; the id of the row it inserted (0 if none)."""
        return await self.call(_execute, sql, tuple(args))

    async def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return await self.call(_fetchall, sql, tuple(args))

    async def fetchone(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Row | None:
        return await self.call(_fetchone, sql, tuple(args))

    async def script(self, sql: str) -> None:
        await self.call(_script, sql)

    async def close(self) -> None:
        """Close the connection, then end its thread (nothing may be called after)."""
        try:
            await self.call(_close)
        finally:
            self._pool.shutdown(wait=False)


def _full_message(path: Path | None) -> str:
    where = path.parent if path is not None else "the daemon's state dir"
    return (
        f"the disk that holds {where} is full, so nothing more can be stored: free space there (a failed job's "
        "workspace goes with `orchestrator clean ID`; `df -h` says how full it is), then try again"
    )


def _execute(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> int:
    return conn.execute(sql, args).lastrowid or 0


def _fetchall(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> list[sqlite3.Row]:
    return conn.execute(sql, args).fetchall()


def _fetchone(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> sqlite3.Row | None:
    row: sqlite3.Row | None = conn.execute(sql, args).fetchone()
    return row


def _script(conn: sqlite3.Connection, sql: str) -> None:
    conn.executescript(sql)


def _close(conn: sqlite3.Connection) -> None:
    conn.close()
