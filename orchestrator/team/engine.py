"""Which store a daemon opens, and the parts team mode adds to the job plane: picked once, from `[store] url`.

`""` (the default): the embedded SQLite file in the state dir, nothing else changes. `postgresql://…`: the team's
shared store (`store.postgres`), with the round's heads read off the shared remote (`team.facts`), landings
pushed to it (`team.landing`) and this daemon's lease kept (`team.node`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator import logging as olog
from orchestrator.config import Config
from orchestrator.core.seal import SECRET_ENV
from orchestrator.core.seal import problem as seal_problem
from orchestrator.paths import Paths
from orchestrator.store import Store, StoreUnreachable, StoreUnusable
from orchestrator.store.sqlite import SqliteStore
from orchestrator.team import clones

if TYPE_CHECKING:
    from orchestrator.store.postgres import PgStore

BACKOFF = (1.0, 2.0, 4.0, 8.0, 15.0)
"""Pauses between a starting node's tries to reach its PostgreSQL (the last one repeats) within `team.start_wait`."""


async def open_store(
    cfg: Config, paths: Paths, stop: asyncio.Event | None = None, status: Callable[[str], None] | None = None
) -> Store:
    """The store `cfg` names: StoreUnusable / StoreUnreachable (with what to do) when it cannot be used. A team's
    PostgreSQL that does not answer is asked again with a growing pause for up to `team.start_wait` seconds (or
    until `stop` is set): a node started before its database comes up with it, saying so through `status` (the
    service manager's status line)."""
    if not cfg.store.url:
        return await SqliteStore.open(paths.db)
    try:
        import orchestrator.store.postgres  # noqa: F401 - loads asyncpg: said here, once, what to install
    except ImportError as e:
        raise StoreUnusable(
            f"[store] url names PostgreSQL, and its driver cannot be loaded ({e}): in the orchestrator checkout, "
            "pip install -e '.[team]'"
        ) from None

    secret = os.environ.get(SECRET_ENV, "")
    if why := seal_problem(secret):
        raise StoreUnusable(why)
    # What the node keeps for itself (its processes, its checkouts' journal, its clones) stays in its own file.
    local = await SqliteStore.open(paths.db)
    try:
        store = await _connect(cfg, local, secret.encode(), stop, status)
    except BaseException:
        await local.close()
        raise
    # The clones named in the config are this node's from the start (others join when a job is queued in them).
    for path in cfg.repos:
        try:
            key, url = await asyncio.to_thread(clones.identity_of, path)
        except clones.NotShared as e:
            olog.get(repo=path).warning(olog.Event.TEAM_JOINED, skipped=str(e))
            continue
        await store.team.register_clone(key, path, url)
    return store


async def _connect(
    cfg: Config, local: SqliteStore, secret: bytes, stop: asyncio.Event | None, status: Callable[[str], None] | None
) -> PgStore:
    """The team's store, asked again with a growing pause for up to `team.start_wait` seconds."""
    from orchestrator.store.postgres import PgStore

    deadline = time.monotonic() + cfg.team.start_wait
    attempt = 0
    while True:
        try:
            return await PgStore.connect(
                cfg.store.url,
                node=cfg.team.node_name(),
                remote_of=clones.remote_of,
                local=local,
                secret=secret,
                labels=cfg.team.labels,
                lease=cfg.team.lease,
                hold=max(2, cfg.jobs.max_concurrent),
            )
        except StoreUnreachable as e:
            pause = min(BACKOFF[min(attempt, len(BACKOFF) - 1)], deadline - time.monotonic())
            if pause <= 0 or (stop is not None and stop.is_set()):
                raise
            olog.get().warning(olog.Event.TEAM_STORE_LOST, error=str(e), retry_in=round(pause, 1), starting=True)
            if status is not None:
                status(f"waiting for the team's PostgreSQL (again in {pause:.0f} s)")
            await _pause(pause, stop)
            attempt += 1


async def _pause(seconds: float, stop: asyncio.Event | None) -> None:
    """Sleep, or less when the daemon is asked to stop meanwhile."""
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):  # the pause ran out: try again
        await asyncio.wait_for(stop.wait(), seconds)


def _pg_store() -> type[Store] | None:
    """The PostgreSQL store's class if it was loaded (a store can only be one if it was): asyncpg is optional."""
    module = sys.modules.get("orchestrator.store.postgres")
    return getattr(module, "PgStore", None)


def is_team(store: Store) -> bool:
    cls = _pg_store()
    return cls is not None and isinstance(store, cls)
