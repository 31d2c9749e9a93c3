"""The store: every job, event and record the daemon keeps, one Protocol per concern (`store.base`) with two
engines side by side: SQLite on one machine (`store.sqlite`), PostgreSQL shared by a team's nodes
(`store.postgres`)."""

from orchestrator.store.base import (
    EX_STATE,
    EX_TEMPFAIL,
    DuplicateTicket,
    NotShared,
    Store,
    StoreFull,
    StoreUnreachable,
    StoreUnusable,
    Write,
)

__all__ = [
    "EX_STATE", "EX_TEMPFAIL", "DuplicateTicket", "NotShared", "Store", "StoreFull", "StoreUnreachable",
    "StoreUnusable", "Write",
]  # fmt: skip
