"""What both engines' job tables share, engine-free: the checks of a guarded write, building one, what changed
since a reader last asked, and the rendered JSON of every job kept between calls. An engine's job table subclasses
`Guarded` and gives it the four things only an engine can do (`_insert`, `_write`, `_row_job`, `_render`)."""

from __future__ import annotations

import asyncio
import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from orchestrator.core import lifecycle
from orchestrator.core.job import FIELDS, Job
from orchestrator.core.models import Claim, JobEvent, JobState
from orchestrator.store.base import Write

COLUMNS: tuple[str, ...] = tuple(FIELDS)
"""A job's columns, from the one field list (`core.job.FIELDS`): both engines' jobs tables hold these."""
LIVE: tuple[str, ...] = ("reason", "code", "decision")
"""The fields a waiting job's live admission decision overrides (see `Guarded.json`)."""
JSON_CACHE_MAX = 20_000
"""Jobs whose rendered JSON `Guarded.json` keeps between calls (past that, each call renders them all)."""

T = TypeVar("T")


def check_fields(fields: dict[str, Any]) -> None:
    unknown = set(fields) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown job fields: {sorted(unknown)}")
    if "state" in fields:
        raise lifecycle.MoveError("a job's state changes only through `transition`")


def checked(writes: Sequence[Write]) -> Sequence[Write]:
    """`writes`, each checked: known fields, an allowed move, at least one state expected."""
    for w in writes:
        check_fields(w.fields)
        if w.to is not None:
            lifecycle.check(w.expect, w.to)
        elif not w.expect:
            raise ValueError("an update must expect at least one state")
    return writes


class Changes:
    """Which jobs were written since a reader last asked: the scheduler (`take`), and the JSON cache (`stale`)."""

    def __init__(self) -> None:
        self.ids: set[int] = set()
        """Written since the scheduler last asked (`take`): its rounds re-read only those."""
        self.stale: set[int] = set()
        """Written since `Guarded.json` last rendered: rendered again on its next call."""

    def add(self, ids: Iterable[int], *, changed: bool = True) -> None:
        ids = set(ids)
        self.stale |= ids
        if changed:
            self.ids |= ids

    def take(self) -> set[int]:
        taken, self.ids = self.ids, set()
        return taken


class Guarded(ABC):
    """A job table's engine-free part: guarded writes built and checked, changes noted, JSON kept rendered."""

    def __init__(self) -> None:
        self.changes = Changes()
        self._json: dict[int, tuple[str, str, str]] | None = None
        """`json`'s rendered rows by id (None: not read yet, or every row must be rendered again)."""
        self._forgotten = 0
        """How many times `forget_rendered` ran: rows rendered across one are not kept."""
        self._json_lock = asyncio.Lock()

    # -- what only an engine can do ------------------------------------------------------------------------------

    @abstractmethod
    async def _insert(self, job: Job, ticket: tuple[str, str | None] | None) -> int:
        """Store a new job, its `enqueued` event and its ticket in one transaction; its id."""

    @abstractmethod
    async def _write(self, writes: Sequence[Write], *, changed: bool = True, atomic: bool = False) -> list[Any]:
        """The writes in one transaction (`atomic`: every one or none): each job's row after it, or None where the
        job was not in what its write expects. Notes what changed (`_written`)."""

    @abstractmethod
    def _row_job(self, row: Any) -> Job:
        """A job from its row, as this engine reads it."""

    @abstractmethod
    async def _render(self, ids: list[int] | None) -> list[tuple[int, str, str, str]]:
        """Every job (or these) as `json` rows, by id."""

    async def _settling(self, write: Callable[[], Awaitable[T]]) -> T:
        """`write()`, a write that settles a job (a move of its state, a deletion); an engine may keep room for
        it on a full disk."""
        return await write()

    def _written(self, writes: Sequence[Write], rows: Sequence[Any], changed: bool) -> None:
        """Note the jobs these writes changed (a row back): `json` renders them again, and (when `changed` or a
        state moved) the scheduler's next round re-reads them (`take_changed`)."""
        for w, row in zip(writes, rows, strict=True):
            if row is not None:
                self.changes.add([w.job_id], changed=changed or w.to is not None)

    # -- shared -----------------------------------------------------------------------------------------------

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
        """Queue a job; `ticket` (key, ticket id) is recorded in the same transaction (a duplicate key raises).
        `labels`: the nodes of a team it may run on (kept, and shown, on one machine too). `place`: its place in
        the queue (None: its id, after every job queued before it; `core.queue`)."""
        job = Job(
            id=0,
            repo=repo,
            branch=branch,
            text=text,
            runner=runner,
            state=JobState.QUEUED,
            priority=priority,
            after=tuple(after),
            declared=tuple(declared),
            claim=claim or Claim(),
            created_at=time.time(),
            argv=None if argv is None else tuple(argv),
            land=land,
            labels=tuple(sorted(set(labels))),
            place=place,
            author=author,
        )
        job_id = await self._insert(job, ticket)
        self.changes.add([job_id])
        return replace(job, id=job_id)

    def take_changed(self) -> set[int]:
        """Ids of the jobs written since the last call (for one consumer: the scheduler's rounds)."""
        return self.changes.take()

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
    ) -> Job | None:
        """Move a job from one of `expect` to `to`, with `fields` and one event, in one transaction: the only
        writer of a job's state. None (nothing written) when the job is no longer in `expect`: the caller acted
        on a read that is stale, and backs off. `beside`: see `Write.beside`."""
        sources = lifecycle.check(expect, to)
        check_fields(fields)
        fence = None if beside is None else frozenset(beside)
        write = Write(job_id, fields, event, data, sources, to, fence)
        rows = await self._settling(lambda: self._write([write]))
        return self._row_job(rows[0]) if rows[0] is not None else None

    async def update(
        self,
        job_id: int,
        expect: Collection[JobState],
        *,
        event: JobEvent | None = None,
        data: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Job | None:
        """Change fields of a job (never its state) and append one event, in one transaction, while the job is
        in one of `expect`; None (nothing written) when it is not."""
        if not expect:
            raise ValueError("an update must expect at least one state")
        check_fields(fields)
        rows = await self._write([Write(job_id, fields, event, data, frozenset(expect))])
        return self._row_job(rows[0]) if rows[0] is not None else None

    async def update_many(self, writes: Sequence[Write], *, changed: bool = True) -> list[int]:
        """Several jobs' guarded writes in one transaction (a scheduler round's batch): the ids written.

        `changed=False`: the writer needs not see these jobs again in `take_changed` (a round's own
        deferral reasons, which it keeps in memory; re-reading thousands of them made the next round slow).
        """
        rows = await self._write(checked(writes), changed=changed)
        return [w.job_id for w, row in zip(writes, rows, strict=True) if row is not None]

    async def update_all(self, writes: Sequence[Write]) -> list[Job] | None:
        """Several jobs' guarded writes, all or none, in one transaction (two jobs switching places): the jobs
        after them, or None (nothing written) when any job is no longer in what its write expects."""
        rows = await self._write(checked(writes), atomic=True)
        return None if any(r is None for r in rows) else [self._row_job(r) for r in rows]

    async def json(self, states: Iterable[JobState] | None = None) -> list[tuple[int, str, str, str]]:
        """Each job's `Job.to_json()` as JSON text: (id, state, body, live), by id.

        `body` is every field but `LIVE` (reason, code, decision), which are in `live`, so a caller can
        splice in a waiting job's in-memory decision without parsing anything.
        """
        # Rendered rows are kept, and only the jobs written since are rendered again: a long queue's ended
        # jobs never change, and `status` is asked often while it drains. Taken before reading, like
        # `take_changed`: a write during the read is rendered next time.
        async with self._json_lock:  # two callers at once: the second waits for the first's refresh
            return await self._rendered(states)

    def forget_rendered(self) -> None:
        """Render every job again on the next `json` (what changed meanwhile is unknown)."""
        self._json = None
        self._forgotten += 1

    async def _rendered(self, states: Iterable[JobState] | None) -> list[tuple[int, str, str, str]]:
        stale, self.changes.stale = self.changes.stale, set()
        rows, era = self._json, self._forgotten
        if rows is None:
            rows = {row[0]: row[1:] for row in await self._render(None)}
        elif stale:
            fresh = {row[0]: row[1:] for row in await self._render(sorted(stale))}
            for job_id in stale:
                if job_id in fresh:
                    rows[job_id] = fresh[job_id]
                else:
                    rows.pop(job_id, None)  # deleted
            if any(a > b for a, b in itertools.pairwise(rows)):  # ids are new at the end; keep id order
                rows = dict(sorted(rows.items()))
        # Forgotten while rendering (a reconnection to the team's database): this answer stands, the next renders all.
        self._json = rows if era == self._forgotten and len(rows) <= JSON_CACHE_MAX else None
        names = None if states is None else {str(s) for s in states}
        return [(i, *row) for i, row in rows.items() if names is None or row[0] in names]
