"""One bounded, prioritised gate per model server: who may talk to it now, who waits, who is refused.

Ollama has no priorities and its own queue does not bound requests for a model that is already loaded,
so the daemon owns the queue. A lease is one slot: a chat *turn* holds one lease from classification
through the reply (the server's prefix cache stays warm, and no other session's call slips in between);
a background call (memory extraction, a pre-plan) holds one for one call.

The decisions are one pure function, `decide(policy, running, waiting, now)`:
- interactive waiters first, in arrival order; background after them, in arrival order;
- with 2+ slots background may hold at most `slots - 1`, so an arriving turn always finds a slot; when no
  turn is running or waiting, a still-preemptible background call may take that last slot too (a turn
  that arrives takes it straight back), so extraction uses the server's parallelism when nobody waits;
- with no free slot, each interactive waiter beyond the free slots preempts one running background
  lease that is still preemptible (its stream is closed, it queues again with its original arrival
  time; after `max_preemptions` it may finish);
- with `turn_slots`, at most that many turns hold slots at once (the others wait in order; background
  still waits behind them, and takes the idle slots only when no turn waits);
- a background waiter older than `aging_s` is ordered with the interactive ones, so it never starves.
The async `Gate` around it only keeps the lists, wakes waiters and counts.

The queue is bounded: at most one queued interactive turn per session (`SessionQueued`: the caller
merges its message into that turn) and `max_queue` waiters *of each class*; past that `acquire` answers
`Busy` with a retry-after at once instead of growing. Each class counts only its own waiters, so
background calls queued after a burst never take the room interactive turns need.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

from orchestrator import logging as olog


class Priority(IntEnum):
    """A caller's class at the gate."""

    INTERACTIVE = 0
    """A user waits on it: a chat turn (classification + reply)."""
    BACKGROUND = 1
    """Nobody waits on it: memory extraction, pre-plan passes."""

    @property
    def label(self) -> str:
        return self.name.lower()


class GateCode(StrEnum):
    """Closed reason codes of the gate's refusals."""

    Busy = "Busy"
    SessionQueued = "SessionQueued"
    QueueTimeout = "QueueTimeout"


class GateError(RuntimeError):
    """The gate refused or gave up; `code` is a `GateCode`, the message says what to do."""

    code: GateCode = GateCode.Busy


class Busy(GateError):
    """The queue is full: retry after `retry_after` seconds."""

    code = GateCode.Busy

    def __init__(self, retry_after: float, queued: int) -> None:
        self.retry_after = retry_after
        self.queued = queued
        super().__init__(f"the model server is busy ({queued} calls queued): retry after {retry_after:.0f} s")


class SessionQueued(GateError):
    """This session already has a turn waiting; merge the new message into it."""

    code = GateCode.SessionQueued


class QueueTimeout(GateError):
    """Waited longer than the caller's bound for a slot."""

    code = GateCode.QueueTimeout


@dataclass(frozen=True)
class GatePolicy:
    slots: int = 1
    max_queue: int = 256
    max_preemptions: int = 2
    aging_s: float = 60.0
    unbounded: bool = False
    """No gate at all (the seed's naive behaviour, for benchmarks): every call goes straight through."""
    turn_slots: int = 0
    """At most this many interactive leases at once (0: all `slots`). On a server whose batched decoding does
    not pay, fewer turns at a time answer each sooner and the last one no later; background work still fills
    every slot after them."""


@dataclass(frozen=True)
class Waiting:
    id: int
    priority: Priority
    arrived: float
    session: str | None = None
    preemptible: bool = True
    """A background waiter that may still be preempted (it has not used up its preemptions)."""


@dataclass(frozen=True)
class Running:
    id: int
    priority: Priority
    preemptible: bool = False


@dataclass(frozen=True)
class Decision:
    grant: tuple[int, ...] = ()
    preempt: tuple[int, ...] = ()


def _order(policy: GatePolicy, waiting: Iterable[Waiting], now: float) -> list[Waiting]:
    def key(w: Waiting) -> tuple[int, float, int]:
        aged = w.priority is Priority.BACKGROUND and now - w.arrived >= policy.aging_s
        return (0 if aged else int(w.priority), w.arrived, w.id)

    return sorted(waiting, key=key)


def decide(policy: GatePolicy, running: Sequence[Running], waiting: Sequence[Waiting], now: float) -> Decision:
    """Which waiters get a slot now, and which running background leases must give theirs back."""
    if policy.unbounded:
        return Decision(grant=tuple(w.id for w in _order(policy, waiting, now)))
    free = policy.slots - len(running)
    background = sum(1 for r in running if r.priority is Priority.BACKGROUND)
    turn_room = (policy.turn_slots or policy.slots) - (len(running) - background)
    bg_cap = policy.slots if policy.slots == 1 else policy.slots - 1
    # No turn running or waiting: background may also take the reserved slot, but only preemptibly,
    # so a turn that arrives takes it back at once instead of waiting (with one slot this is the only way).
    turns = any(r.priority is Priority.INTERACTIVE for r in running) or any(
        w.priority is Priority.INTERACTIVE for w in waiting
    )
    grant: list[int] = []
    blocked_interactive = 0
    for w in _order(policy, waiting, now):
        if w.priority is Priority.INTERACTIVE:
            if free > 0 and turn_room > 0:
                grant.append(w.id)
                free -= 1
                turn_room -= 1
            else:
                blocked_interactive += 1
        elif free > 0 and blocked_interactive == 0 and (background < bg_cap or (not turns and w.preemptible)):
            grant.append(w.id)
            free -= 1
            background += 1
    victims = [r for r in running if r.priority is Priority.BACKGROUND and r.preemptible]
    # The newest background leases give way first (they have done the least work).
    # Each turn that could start but for a slot takes one back (not those held back by `turn_slots`).
    takers = min(blocked_interactive, max(0, turn_room)) if free <= 0 else 0
    preempt = tuple(r.id for r in sorted(victims, key=lambda r: -r.id)[:takers])
    return Decision(grant=tuple(grant), preempt=preempt)


def retry_after(queued: int, slots: int, mean_service_s: float) -> float:
    """A fair guess at when a slot frees for a refused caller: the queue ahead of it, served by the slots."""
    return max(1.0, round(queued / max(1, slots) * max(mean_service_s, 0.5)))


@dataclass
class ClassStats:
    waits: int = 0
    wait_s: float = 0.0
    wait_max_s: float = 0.0
    served: int = 0
    service_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "waits": self.waits,
            "wait_mean_s": round(self.wait_s / self.waits, 4) if self.waits else 0.0,
            "wait_max_s": round(self.wait_max_s, 4),
            "served": self.served,
            "service_mean_s": round(self.service_s / self.served, 4) if self.served else 0.0,
        }


@dataclass
class Lease:
    """One slot, held by one turn or one background call. Release it with `Gate.release` (or `async with`)."""

    id: int
    priority: Priority
    session: str | None
    arrived: float
    preemptions: int
    gate: Gate
    granted: float = 0.0
    preempted: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[Any] | None = None
    released: bool = False

    @property
    def preemptible(self) -> bool:
        return self.priority is Priority.BACKGROUND and self.preemptions < self.gate.policy.max_preemptions

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.gate.release(self)


@dataclass
class _Waiter:
    info: Waiting
    preemptions: int
    future: asyncio.Future[Lease]


class Gate:
    """The async shell around `decide`: one per model server (host)."""

    def __init__(self, name: str, policy: GatePolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.policy = policy
        self.clock = clock
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Waiter] = {}
        self._queued = dict.fromkeys(Priority, 0)
        self._running: dict[int, Lease] = {}
        self._aging: asyncio.TimerHandle | None = None
        self.stats = {p: ClassStats() for p in Priority}
        self.preemptions = 0
        self.busy = 0
        self.server_queue_s = 0.0
        self.server_calls = 0
        self.max_running = 0
        self._log = olog.get(gate=name)

    # -- queries -------------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def queued_of(self, priority: Priority) -> int:
        """Waiters of one class (each class has its own `max_queue`)."""
        return self._queued[priority]

    def idle_slot(self) -> bool:
        """True when a background call would start at once (the extraction scheduler asks this)."""
        probe = Waiting(id=-1, priority=Priority.BACKGROUND, arrived=self.clock())
        d = decide(self.policy, self._snapshot(), [w.info for w in self._waiting.values()] + [probe], self.clock())
        return -1 in d.grant

    def refusal(self, priority: Priority = Priority.INTERACTIVE, queued: int | None = None) -> Busy | None:
        """`Busy` with a retry-after when `queued` (default: this class's waiters) may not grow, else None."""
        queued = self._queued[priority] if queued is None else queued
        if self.policy.unbounded or queued < self.policy.max_queue:
            return None
        self.busy += 1
        s = self.stats[Priority.INTERACTIVE]
        return Busy(retry_after(queued, self.policy.slots, s.service_s / s.served if s.served else 2.0), queued)

    def snapshot(self) -> dict[str, Any]:
        return {
            "gate": self.name,
            "slots": self.policy.slots,
            "unbounded": self.policy.unbounded,
            "running": self.running,
            "max_running": self.max_running,
            "queued": self.queued,
            "preemptions": self.preemptions,
            "busy": self.busy,
            "server_queue_s": round(self.server_queue_s, 4),
            "server_calls": self.server_calls,
            "classes": {p.label: self.stats[p].to_json() for p in Priority},
        }

    # -- acquiring and releasing ---------------------------------------------------------------------

    def lease(self, priority: Priority, *, session: str | None = None, timeout: float | None = 300.0) -> _LeaseContext:
        """`async with gate.lease(Priority.INTERACTIVE, session="s1") as lease:` holds one slot."""
        return _LeaseContext(self, priority, session, timeout)

    async def acquire(
        self,
        priority: Priority,
        *,
        session: str | None = None,
        timeout: float | None = 300.0,
        arrived: float | None = None,
        preemptions: int = 0,
    ) -> Lease:
        """Wait for a slot; `Busy` / `SessionQueued` at once when the queue may not grow."""
        if not self.policy.unbounded:
            refused = self.refusal(priority)
            if refused is not None:
                self._log.warning(
                    olog.Event.OLLAMA_GATE_BUSY,
                    code=str(refused.code),
                    queued=refused.queued,
                    retry_after=refused.retry_after,
                    priority=priority.label,
                )
                raise refused
            if (
                session is not None
                and priority is Priority.INTERACTIVE
                and any(
                    w.info.session == session and w.info.priority is Priority.INTERACTIVE
                    for w in self._waiting.values()
                )
            ):
                raise SessionQueued(f"session {session!r} already has a turn waiting for the model server")
        now = self.clock()
        info = Waiting(
            id=next(self._ids), priority=priority, arrived=now if arrived is None else arrived, session=session
        )
        waiter = _Waiter(info, preemptions, asyncio.get_running_loop().create_future())
        self._enter(waiter)
        self._pump()
        try:
            async with asyncio.timeout(timeout):
                lease = await asyncio.shield(waiter.future)
        except BaseException as e:
            self._leave(info.id)
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(waiter.future.result())  # granted just as we gave up: hand it on
            else:
                waiter.future.cancel()
                self._pump()
            if isinstance(e, TimeoutError):
                raise QueueTimeout(
                    f"no model-server slot within {timeout:.0f} s ({self.queued} queued, {self.running} running)"
                ) from None
            raise
        stats = self.stats[priority]
        waited = lease.granted - now
        stats.waits += 1
        stats.wait_s += waited
        stats.wait_max_s = max(stats.wait_max_s, waited)
        lease.task = asyncio.current_task()
        return lease

    def release(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        if self._running.pop(lease.id, None) is not None:
            stats = self.stats[lease.priority]
            stats.served += 1
            stats.service_s += self.clock() - lease.granted
        self._pump()

    def record_server(self, queue_s: float) -> None:
        """Ollama's own queue time for one call (`total - load - prompt_eval - eval`)."""
        self.server_calls += 1
        self.server_queue_s += max(0.0, queue_s)

    # -- the shell around `decide` -------------------------------------------------------------------

    def _enter(self, waiter: _Waiter) -> None:
        self._waiting[waiter.info.id] = waiter
        self._queued[waiter.info.priority] += 1

    def _leave(self, wid: int) -> _Waiter | None:
        w = self._waiting.pop(wid, None)
        if w is not None:
            self._queued[w.info.priority] -= 1
        return w

    def _snapshot(self) -> list[Running]:
        return [
            Running(id=lease.id, priority=lease.priority, preemptible=lease.preemptible)
            for lease in self._running.values()
        ]

    def _pump(self) -> None:
        now = self.clock()
        if (
            not self.policy.unbounded
            and len(self._running) >= self.policy.slots
            and not any(lease.preemptible for lease in self._running.values())
        ):
            # Every slot is held and none may be taken back: `decide` could grant and preempt nothing, so a
            # burst of arrivals costs each one O(1) here instead of sorting the whole queue again.
            self._arm_aging(now)
            return
        waiting = [w.info for w in self._waiting.values()]
        d = decide(self.policy, self._snapshot(), waiting, now)
        for wid in d.grant:
            w = self._leave(wid)
            assert w is not None  # `decide` grants only waiters
            lease = Lease(
                id=wid, priority=w.info.priority, session=w.info.session, arrived=w.info.arrived,
                preemptions=w.preemptions, gate=self, granted=now,
            )  # fmt: skip
            self._running[wid] = lease
            w.future.set_result(lease)
        self.max_running = max(self.max_running, len(self._running))
        for rid in d.preempt:
            lease = self._running[rid]
            if not lease.preempted.is_set():
                self.preemptions += 1
                lease.preempted.set()
                self._log.info(olog.Event.OLLAMA_GATE_PREEMPTED, lease=rid, preemptions=lease.preemptions + 1)
                if lease.task is not None and not lease.task.done():
                    lease.task.cancel(msg=_PREEMPTED)
        self._arm_aging(now)

    def _arm_aging(self, now: float) -> None:
        if self._aging is not None:
            self._aging.cancel()
            self._aging = None
        if self.policy.unbounded or not self._queued[Priority.BACKGROUND]:
            return
        pending = [w.info.arrived for w in self._waiting.values() if w.info.priority is Priority.BACKGROUND]
        if pending:
            due = max(0.0, min(pending) + self.policy.aging_s - now)
            self._aging = asyncio.get_running_loop().call_later(due + 0.001, self._pump)


_PREEMPTED = "orchestrator.gate.preempted"


def is_preemption(lease: Lease | None, error: BaseException) -> bool:
    """True when `error` is the gate taking this background lease's slot back (not a real cancel)."""
    return (
        lease is not None
        and lease.preempted.is_set()
        and isinstance(error, asyncio.CancelledError)
        and (task := asyncio.current_task()) is not None
        and task.cancelling() == 1
    )


class _LeaseContext:
    def __init__(self, gate: Gate, priority: Priority, session: str | None, timeout: float | None) -> None:
        self._args = (gate, priority, session, timeout)
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        gate, priority, session, timeout = self._args
        self._lease = await gate.acquire(priority, session=session, timeout=timeout)
        return self._lease

    async def __aexit__(self, *exc: object) -> None:
        if self._lease is not None:
            self._lease.gate.release(self._lease)
