"""Which store a daemon opens, and the parts team mode adds to the job plane: picked once, from `[store] url`.

`""` (the default): the embedded SQLite file in the state dir, nothing else changes. `postgresql://…`: the team's
shared store (`store.postgres`), with the round's heads read off the shared remote (`team.facts`), landings
pushed to it (`team.landing`) and this daemon's lease kept (`team.node`).
"""

from __future__ import annotations

import asyncio
import sys

from orchestrator import logging as olog
from orchestrator.config import Config
from orchestrator.paths import Paths
from orchestrator.store import Store, StoreUnusable
from orchestrator.team import clones


async def open_store(cfg: Config, paths: Paths) -> Store:
    """The store `cfg` names: StoreUnusable / StoreUnreachable (with what to do) when it cannot be used."""
    if not cfg.store.url:
        return await Store.open(paths.db)
    try:
        from orchestrator.store.postgres import PgStore
    except ImportError as e:
        raise StoreUnusable(
            f"[store] url names PostgreSQL, and its driver cannot be loaded ({e}): pip install 'orchestrator[team]'"
        ) from None

    store = await PgStore.connect(
        cfg.store.url,
        node=cfg.team.node_name(),
        labels=cfg.team.labels,
        lease=cfg.team.lease,
        hold=max(2, cfg.jobs.max_concurrent),
    )
    # The clones named in the config are this node's from the start (others join when a job is queued in them).
    for path in cfg.repos:
        try:
            key, url = await asyncio.to_thread(clones.identity_of, path)
        except clones.NotShared as e:
            olog.get(repo=path).warning(olog.Event.TEAM_JOINED, skipped=str(e))
            continue
        await store.register_clone(key, path, url)
    return store


def _pg_store() -> type[Store] | None:
    """The PostgreSQL store's class if it was loaded (a store can only be one if it was): asyncpg is optional."""
    module = sys.modules.get("orchestrator.store.postgres")
    return getattr(module, "PgStore", None)


def is_team(store: Store) -> bool:
    cls = _pg_store()
    return cls is not None and isinstance(store, cls)

