"""The store: every job, event and record the daemon keeps, behind one set of methods with two engines side by
side: SQLite on one machine (`store.sqlite`), PostgreSQL shared by a team's nodes (`store.postgres`)."""

from orchestrator.store.base import (
    EX_STATE,
    EX_TEMPFAIL,
    DuplicateTicket,
    NotShared,
    StoreFull,
    StoreUnreachable,
    StoreUnusable,
    Write,
)
from orchestrator.store.sqlite import MIGRATIONS, Store

__all__ = [
    "EX_STATE", "EX_TEMPFAIL", "MIGRATIONS", "DuplicateTicket", "NotShared", "Store", "StoreFull", "StoreUnreachable",
    "StoreUnusable", "Write",
]  # fmt: skip
