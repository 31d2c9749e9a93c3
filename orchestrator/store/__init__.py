"""The store: every job, event and record the daemon keeps, behind one set of methods with two engines side by
side: SQLite on one machine (`store.sqlite`), PostgreSQL shared by a team's nodes (`store.postgres`)."""

from orchestrator.store.sqlite import (
    EX_STATE,
    EX_TEMPFAIL,
    MIGRATIONS,
    DuplicateTicket,
    Store,
    StoreUnreachable,
    StoreUnusable,
    Write,
)

__all__ = [
    "EX_STATE", "EX_TEMPFAIL", "MIGRATIONS", "DuplicateTicket", "Store", "StoreUnreachable", "StoreUnusable", "Write"
]  # fmt: skip
