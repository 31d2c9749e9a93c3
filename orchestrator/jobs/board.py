"""The job board: the one door for job writes. Every change is stored first (a guarded write), then announced.

No other module writes a job to the store (`tests/test_layers.py` holds that): queueing, moves, field changes,
a round's deferral reasons, forgetting an ended job and, after a crash, the recovery of interrupted work all come
through here.

Storing before acting is what lets a killed daemon restart where it was; announcing wakes the scheduler
(event-driven, no polling), anyone waiting for particular jobs to end (`orchestrator wait`, a landing
that must follow another), and every subscriber of the event stream (`GET /events`, which `orchestrator
watch` reads). Waiters are woken per job: a state change touches only the waiters of that job, and nobody
re-reads the jobs they wait for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from orchestrator import logging as olog
from orchestrator.core.job import Job
from orchestrator.core.models import JobEvent, JobState
from orchestrator.store import Store, StoreFull, Write

SETTLE_RETRY = (1.0, 30.0)
"""Seconds before a move that waits for room on a full disk is tried again: doubled each time, up to the second."""
SUBSCRIBER_BACKLOG = 4096
"""Announcements a subscriber may fall behind by before it is dropped (it reconnects and re-reads)."""


class Subscription:
    """One reader of the board's announcements: a bounded queue, and whether it fell too far behind."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(SUBSCRIBER_BACKLOG)
        self.overflowed = False

    def put(self, item: dict[str, Any]) -> None:
        if self.overflowed:
            return
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.overflowed = True


def ended(state: JobState) -> bool:
    return state.terminal


class _Waiter:
    """The jobs one caller waits for that have not settled yet, and what settled means to it."""

    __slots__ = ("done", "pending", "settled")

    def __init__(self, ids: set[int], settled: Callable[[JobState], bool]) -> None:
        self.pending = ids
        self.settled = settled
        self.done = asyncio.Event()


class Board:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._changed = asyncio.Condition()
        self._listeners: list[Callable[[], None]] = []
        self._waiters: dict[int, set[_Waiter]] = {}
        self._subscribers: set[Subscription] = set()
        self._ended: list[Callable[[Job], None]] = []

    def on_change(self, wake: Callable[[], None]) -> None:
        """Call `wake` (cheap, synchronous) after every change: the scheduler, the service status line."""
        self._listeners.append(wake)

    def on_end(self, ended: Callable[[Job], None]) -> None:
        """Call `ended(job)` (cheap, synchronous) once a job reaches an end state (`on_end` notifications)."""
        self._ended.append(ended)

    def subscribe(self) -> Subscription:
        sub = Subscription()
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    @property
    def subscribed(self) -> bool:
        """True if anyone reads the announcements (else building them is wasted work)."""
        return bool(self._subscribers)

    def publish(self, item: dict[str, Any]) -> None:
        for sub in self._subscribers:
            sub.put(item)

    async def add(self, **request: Any) -> Job:
        """`JobTable.add` (a new queued job, its ticket in the same transaction), then announced: the scheduler
        plans it; DuplicateTicket when its ticket key was queued already."""
        job = await self.store.jobs.add(**request)
        await self._announce_job(job, moved=False)
        return job

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
        """`JobTable.transition`, then announced: None (nothing written, nobody told) when the job had moved on."""
        job = await self.store.jobs.transition(job_id, expect, to, event, data=data, beside=beside, **fields)
        if job is not None:
            await self._announce_job(job, moved=True)
        return job

    async def settle(
        self,
        job_id: int,
        expect: Collection[JobState],
        to: JobState,
        event: JobEvent,
        *,
        data: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Job | None:
        """`transition` for a move that must be stored sooner or later (a run's or a landing's end): on a full disk
        (after the store's reserve, `store.reserve`) it waits for room and tries again, saying so in the log, instead
        of leaving the job where it was with nobody to move it on."""
        delay = SETTLE_RETRY[0]
        while True:
            try:
                return await self.transition(job_id, expect, to, event, data=data, **fields)
            except StoreFull as e:
                olog.get(job_id=job_id).warning(
                    olog.Event.STORE_FULL, to=str(to), retry_in=delay, message=f"its move to {to} waits for room: {e}"
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, SETTLE_RETRY[1])

    async def update(
        self,
        job_id: int,
        expect: Collection[JobState],
        *,
        event: JobEvent | None = None,
        data: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Job | None:
        """`JobTable.update` (fields, never the state), then announced; None when the job is in none of `expect`."""
        job = await self.store.jobs.update(job_id, expect, event=event, data=data, **fields)
        if job is not None:
            await self._announce_job(job, moved=False)
        return job

    async def note_reasons(self, writes: Sequence[Write], shown: Callable[[int], Job] | None = None) -> list[int]:
        """A scheduler round's deferral reasons, in one transaction (each only while its job is still where the
        round read it): the ids written. Nobody is woken (a deferral changes no decision); subscribers of the event
        stream see each written job as `shown(id)` shows it (the round's live decision), when given."""
        written = await self.store.jobs.update_many(writes, changed=False)
        if shown is not None and self._subscribers:
            for job_id in written:
                self.publish({"type": "job", "job": shown(job_id).to_json()})
        return written

    async def forget(self, job_id: int, expect: Collection[JobState]) -> bool:
        """`JobTable.delete` (an ended job's record and history, if it is in one of `expect`), then announced as
        removed; False (nothing written, nobody told) when it was not."""
        if not await self.store.jobs.delete(job_id, expect):
            return False
        self.publish({"type": "removed", "id": job_id})
        await self.announce()
        return True

    async def claim(self) -> list[int]:
        """Team mode: take this node's share of the team's queue (`TeamQueue.claim`; one machine: every job is its
        own, nothing to take)."""
        return await self.store.team.claim()

    async def take_over(self, job: Job, *, landed: str | None = None) -> Job | None:
        """Team mode: a job of a node whose lease ended, taken over by this one (`TeamQueue.take_over`), then
        announced; None when it moved meanwhile."""
        taken = await self.store.team.take_over(job, landed=landed)
        if taken is not None:
            await self._announce_job(taken, moved=True)
        return taken

    async def recover(self) -> dict[str, list[int]]:
        """After a crash, before anything runs: running jobs interrupted, planning ones back to the queue
        (`JobTable.recover`); nobody listens yet."""
        return await self.store.jobs.recover()

    async def update_all(self, writes: Sequence[Write]) -> list[Job] | None:
        """`JobTable.update_all` (fields of several jobs, all or none), then announced; None when any had moved on."""
        jobs = await self.store.jobs.update_all(writes)
        for job in jobs or ():
            self._tell(job)
        if jobs:
            await self.announce()
        return jobs

    async def _announce_job(self, job: Job, *, moved: bool) -> None:
        self._tell(job)
        if moved and job.state.terminal:
            for ended in self._ended:
                ended(job)
        await self.announce()

    async def foreign(self, ids: set[int]) -> None:
        """Other nodes of a team changed these jobs (none: unknown which): tell waiters, watchers, the scheduler."""
        for job in await self.store.jobs.many(ids) if ids else ():
            self._tell(job)
        await self.announce()

    def _tell(self, job: Job) -> None:
        """The job's waiters whose wait it settles, and the event stream."""
        for w in list(self._waiters.get(job.id, ())):
            if w.settled(job.state):
                w.pending.discard(job.id)
                if not w.pending:
                    w.done.set()
        if self._subscribers:
            self.publish({"type": "job", "job": job.to_json()})

    async def announce(self) -> None:
        for wake in self._listeners:
            wake()
        self.publish({"type": "changed"})
        async with self._changed:
            self._changed.notify_all()

    async def wait_ended(
        self, ids: Iterable[int], timeout: float | None, settled: Callable[[JobState], bool] = ended
    ) -> bool:
        """Wait until every one of these jobs has ended (or is unknown); True if they did within `timeout`.

        `settled` says what counts as done for this caller (default: a terminal state).
        """
        w = _Waiter(set(ids), settled)
        watched = tuple(w.pending)
        for i in watched:
            self._waiters.setdefault(i, set()).add(w)
        try:
            # Registered first, read once after: an end stored meanwhile is seen by one or the other.
            states = await self.store.jobs.states(list(w.pending))
            w.pending.intersection_update(i for i, st in states.items() if not settled(st))
            if not w.pending:
                return True
            try:
                await asyncio.wait_for(w.done.wait(), timeout)
            except TimeoutError:
                return False
            return True
        finally:
            for i in watched:
                ws = self._waiters.get(i)
                if ws is not None:
                    ws.discard(w)
                    if not ws:
                        del self._waiters[i]

    async def wait_until(self, predicate: Callable[[], Any], timeout: float | None) -> bool:
        """Wait until `await predicate()` is truthy or the timeout passes; True if it came true."""

        async def _loop() -> None:
            async with self._changed:
                while not await predicate():
                    await self._changed.wait()

        try:
            await asyncio.wait_for(_loop(), timeout)
        except TimeoutError:
            return False
        return True
