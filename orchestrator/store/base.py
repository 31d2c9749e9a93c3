"""The store's interface, one Protocol per concern, that both engines implement side by side (`store.sqlite`,
`store.postgres`): the jobs and their guarded moves, the team's queue, events, the landing journal, process
groups, run-time limits, the chat plane's records and the planner's caches. Also the guarded write they take
(`Write`), the errors they raise and the daemon's exit statuses for a store it cannot use."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchestrator.core.job import Job
from orchestrator.core.models import Claim, JobEvent, JobState
from orchestrator.core.records import Group, Intent

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


# -- one Protocol per concern ------------------------------------------------------------------------------------


class JobTable(Protocol):
    """The jobs: read, queued, moved. A job's state changes only through `transition`, a compare-and-set checked
    against `core.lifecycle` with its event in the same transaction; every other write names the states it expects
    too, so a writer that acted on a stale read backs off (None) instead of overwriting what happened meanwhile.
    Only `jobs.board.Board` writes (the one door); everyone may read."""

    async def add(
        self,
        *,
        repo: str,
        branch: str,
        text: str,
        runner: str,
        priority: int = 0,
        after: Sequence[int] = (),
        declared: Sequence[str] = (),
        claim: Claim | None = None,
        ticket: tuple[str, str | None] | None = None,
        argv: Sequence[str] | None = None,
        land: str = "auto",
        labels: Sequence[str] = (),
        place: float | None = None,
        author: str = "",
    ) -> Job:
        """Queue a job; `ticket` (key, ticket id) in the same transaction (DuplicateTicket when its key was)."""
        ...

    async def ticket_job(self, key: str) -> int | None: ...

    async def ticket_jobs(self, repo: str, ticket: str) -> list[int]: ...

    async def get(self, job_id: int) -> Job | None: ...

    async def all(self, states: Iterable[JobState] | None = None) -> list[Job]:
        """This daemon's jobs (in these states), by id (in team mode: those this node holds)."""
        ...

    async def json(self, states: Iterable[JobState] | None = None) -> list[tuple[int, str, str, str]]:
        """Every job's `Job.to_json()` as JSON text: (id, state, body, live), by id (`status`)."""
        ...

    async def count(self, states: Iterable[JobState]) -> int: ...

    async def many(self, ids: Iterable[int]) -> list[Job]: ...

    async def states(self, ids: Iterable[int]) -> dict[int, JobState]: ...

    async def landed_as(self, shas: Iterable[str]) -> list[Job]:
        """The landed jobs (of those `all` reads) whose landing commit is one of `shas`, by id: what landed in a range
        of commits, read without reading every job that ever landed."""
        ...

    def take_changed(self) -> set[int]:
        """Ids of the jobs written since the last call (for one consumer: the scheduler's rounds)."""
        ...

    async def transition(
        self,
        job_id: int,
        expect: Collection[JobState],
        to: JobState,
        event: JobEvent,
        *,
        data: dict[str, Any] | None = None,
        beside: Collection[int] | None = None,
        **fields: Any,
    ) -> Job | None: ...

    async def update(
        self,
        job_id: int,
        expect: Collection[JobState],
        *,
        event: JobEvent | None = None,
        data: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Job | None: ...

    async def update_many(self, writes: Sequence[Write], *, changed: bool = True) -> list[int]: ...

    async def update_all(self, writes: Sequence[Write]) -> list[Job] | None: ...

    async def delete(self, job_id: int, expect: Collection[JobState]) -> bool:
        """Forget an ended job (`orchestrator clean`): its record and its history, if it is in one of `expect`."""
        ...

    async def recover(self) -> dict[str, list[int]]:
        """After a crash: running jobs interrupted, planning ones back to the queue; landing ones stay."""
        ...


class TeamQueue(Protocol):
    """The team's share of the queue: on one machine every job is this daemon's, and there is no other node."""

    @property
    def home(self) -> Path:
        """The daemon's own file: what it keeps for itself (process groups, its checkouts' journal, its clones)."""
        ...

    async def claim(self) -> list[int]:
        """Take queued jobs of the team's queue for this node (one machine: none to take)."""
        ...

    async def everyone(self, states: Iterable[JobState] | None = None) -> list[Job]:
        """Every node's jobs (in these states), for `watch` and `wait` (one machine: this daemon's)."""
        ...

    def mine(self, job: Job) -> bool: ...

    async def elsewhere(self) -> list[Job]:
        """Other nodes' planned and active jobs of this node's repositories (one machine: none)."""
        ...

    def clone_paths(self) -> list[str]: ...

    async def clones(self) -> dict[str, str]:
        """Each shared repository this node has a clone of (`Remote.identity`) → the clone's path."""
        ...

    async def register_clone(self, key: str, path: str, url: str) -> None: ...

    async def take_over(self, job: Job, *, landed: str | None = None) -> Job | None:
        """Take a job of a node whose lease ended: back to the team's queue for a fresh attempt, or `landed` when
        its push is known to have reached the remote; None if it moved meanwhile (one machine: no other node)."""
        ...


class EventLog(Protocol):
    """Each job's history: one event (a `JobEvent`) per write."""

    async def of_job(self, job_id: int) -> list[dict[str, Any]]: ...

    async def of_kind(self, kind: JobEvent) -> list[tuple[int, dict[str, Any]]]:
        """(job id, data) of every event of one kind, oldest first (e.g. `overlap` for calibration)."""
        ...


class LandingJournal(Protocol):
    """Landings' intents, stored before a ref moves while a checkout is on the branch (`git.journal`)."""

    async def begin(self, intent: Intent) -> int: ...

    async def end(self, entry: int) -> None: ...

    async def open(self) -> list[tuple[int, Intent]]:
        """Landings whose checkouts were not level again when the daemon stopped, oldest first."""
        ...


class ProcessTable(Protocol):
    """The process groups the daemon started, recorded before they may run (`proc.process`)."""

    async def own(self, group: Group, job_id: int | None = None) -> None: ...

    async def disown(self, group: Group) -> None: ...

    async def all(self) -> list[tuple[Group, int | None]]: ...


class Limits(Protocol):
    """Run-time controls (pause, per-repository slots) and the rate limits runners met."""

    async def controls(self) -> dict[str, tuple[bool, int | None]]: ...

    async def set_control(
        self, scope: str, *, paused: bool | None = None, slots: int | bool | None = False
    ) -> None: ...

    async def rate_limits(self) -> dict[str, float]: ...

    async def set_rate_limit(self, runner: str, until: float) -> None: ...


class ChatLog(Protocol):
    """The chat plane's sessions, messages and memories (nothing else reads them)."""

    async def add_message(self, session: str, role: str, content: str) -> int: ...

    async def open_turn(
        self, session: str, text: str, history: int, memories: int = 50
    ) -> tuple[list[dict[str, Any]], list[str]]: ...

    async def history(self, session: str, limit: int = 20) -> list[dict[str, Any]]: ...

    async def unextracted(self, session: str) -> list[dict[str, Any]]: ...

    async def unextracted_sessions(self) -> list[str]: ...

    async def remember(self, session: str, upto: int, memories: Sequence[str]) -> None: ...

    async def memories(self, session: str, limit: int = 50) -> list[str]: ...


class PlanCache(Protocol):
    """What the planner keeps of each repository: its mined change history and its record (calibration)."""

    async def history(self, repo: str) -> tuple[str, list[list[Any]]] | None: ...

    async def save_history(self, repo: str, head: str, changes: list[list[Any]]) -> None: ...

    async def record(self, repo: str) -> tuple[str, dict[str, Any] | None] | None: ...

    async def save_record(self, repo: str, newest: str, record: dict[str, Any] | None) -> None: ...


class Store(Protocol):
    """A store: its concerns, and its schema. Open one with `store.sqlite.SqliteStore.open` or (team mode)
    `store.postgres.PgStore.connect`."""

    @property
    def path(self) -> str | Path:
        """Where it is, for messages (a file, or a database URL without its password)."""
        ...

    @property
    def home(self) -> Path:
        """The daemon's own file: the marks of the commands it starts are named after it (`StoreOwner.tag`)."""
        ...

    @property
    def jobs(self) -> JobTable: ...

    @property
    def team(self) -> TeamQueue: ...

    @property
    def events(self) -> EventLog: ...

    @property
    def journal(self) -> LandingJournal: ...

    @property
    def processes(self) -> ProcessTable: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def chat(self) -> ChatLog: ...

    @property
    def plans(self) -> PlanCache: ...

    async def close(self) -> None: ...

    async def schema_version(self) -> int: ...

    async def columns(self) -> list[str]:
        """The jobs table's job-field columns, in order (a test holds them to `core.job.FIELDS`)."""
        ...
