"""What both store engines share: the guarded write they take (`Write`), the errors they raise, the daemon's exit
statuses for a store it cannot use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.core.models import JobEvent, JobState

EX_STATE = 65
"""Exit status of a daemon whose database cannot be used (corrupt, truncated, newer schema): EX_DATAERR.
Restarting cannot fix it, so the systemd unit lists it in RestartPreventExitStatus."""


class DuplicateTicket(ValueError):
    """A job was queued under this ticket key already (idempotent intake: the earlier job stands)."""


class NotShared(ValueError):
    """Team mode: a job's repository has no remote to share; the message says how to give it one."""


class StoreUnusable(RuntimeError):
    """The database file cannot be used as it is; the message names the file and what to do."""


class StoreUnreachable(RuntimeError):
    """Team mode: PostgreSQL cannot be reached (down, wrong URL, refused); the message says which server and what
    to do. Unlike an unusable store, trying again later may work."""


class StoreFull(RuntimeError):
    """A write could not be stored: the disk that holds the database is full. Nothing of that write was kept; the
    message names the place and what to do (the API answers 503 with it)."""


EX_TEMPFAIL = 75
"""Exit status of a daemon whose PostgreSQL cannot be reached at start (EX_TEMPFAIL: try again later)."""


@dataclass(frozen=True, slots=True)
class Write:
    """One job's field changes and event, written only while the job is in one of `expect`.

    With `to`, the write moves the job to that state (a transition, checked against `core.lifecycle`);
    without, it changes fields only and the job stays where it is.
    """

    job_id: int
    fields: dict[str, Any]
    event: JobEvent | None = None
    data: dict[str, Any] | None = None
    expect: frozenset[JobState] = frozenset()
    to: JobState | None = None
    beside: frozenset[int] | None = None
    """A move to `running` in team mode: the other nodes' active jobs of its repository that admission saw (the
    move applies only if no other node started one there since). The embedded store has no other nodes."""


class SharedRemote(Protocol):
    """Team mode: the shared repository and branch a clone's job lands on (`git.remote.Remote`)."""

    @property
    def url(self) -> str: ...

    @property
    def identity(self) -> str:
        """The remote's name for the team: the same repository however a node spells its URL."""
        ...

    @property
    def key(self) -> str:
        """The remote and the branch: what the team's claims and admission lock are per."""
        ...


RemoteOf = Callable[[str, str], SharedRemote]
"""Team mode: (a clone's path, a branch) → the shared repository a job queued there lands on; NotShared when the
clone has no remote to share. Handed to the PostgreSQL store by whoever opens it (`team.engine`): the store reads
no repository itself."""
