"""Memory extraction, coalesced per session and kept out of the users' way.

One pending extraction per session; each finished turn merges into it. It runs (as one BACKGROUND call
through the gate) when the plane says the server can take it (`quiet`): a slot is idle and no turn waits
for one; while turns are being answered, one extraction at a time (its long prompt stalls the replies
decoded beside it); with no turn in flight, as many as the gate lets background use. At the latest it runs
`idle` seconds after the session's last turn; a session that ends or reaches `every` unextracted turns
asks for it at once, but it still waits for `quiet` (or the timer) — up to `2 × every` turns, when it
runs whatever the server is doing. Turns with nothing to remember (no first-person statement) are marked
done without a call.

At most `limit` extraction calls are out at once (default: the gate's slots, all that could run): the
rest stay pending here, in the order they fell due, so a burst's extractions never fill the gate's queue.
A failed extraction stays pending and is tried again after `idle` seconds, doubling up to an hour. A
session's messages are marked extracted only with the memories found in them (one transaction), so after
a kill the daemon's `resume` finds every session with messages not yet extracted and extracts them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import logging as olog
from orchestrator.chat import prompts
from orchestrator.llm.gate import GateError, Priority
from orchestrator.llm.ollama import OllamaBackend, OllamaError, parse_json
from orchestrator.store.base import ChatLog


@dataclass
class Pending:
    turns: int = 0
    timer: asyncio.TimerHandle | None = None
    due: bool = False
    """Runs as soon as a place is free, quiet or not (asked for, or its `idle` timer fired)."""
    not_before: float = 0.0
    """After a failure: not before this (loop time), so a server that is down is not asked in a loop."""
    failures: int = 0


MAX_RETRY_S = 3600.0


@dataclass
class ExtractionStats:
    calls: int = 0
    skipped: int = 0
    failed: int = 0
    memories: int = 0
    turns: int = 0
    last_done: float = 0.0
    running: int = 0
    per_session: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "per_session"}


class Extractor:
    """Owns every extraction task; `close()` cancels and awaits them."""

    def __init__(
        self,
        store: ChatLog,
        backend: OllamaBackend,
        *,
        every: int = 3,
        idle: float = 30.0,
        history: int = 12,
        quiet: Callable[[], bool] = lambda: True,
        coalesce: bool = True,
        limit: int | None = None,
        window: bool = False,
    ) -> None:
        self.store = store
        self.backend = backend
        self.every = every
        self.idle = idle
        self.history = history
        self.quiet = quiet
        self.coalesce = coalesce
        self.limit = limit
        """Extraction calls out at once; None: no bound (the seed's pipeline)."""
        self.window = window
        """The seed's prompt: the session's whole history window. Else only the messages not yet extracted,
        with the memories they may touch (`prompts.extract_new_messages`)."""
        self.pending: dict[str, Pending] = {}
        self.running: dict[str, asyncio.Task[None]] = {}
        self.stats = ExtractionStats()
        self._closed = False
        self._log = olog.get(plane="chat")

    def turn_done(self, session: str, *, end: bool = False) -> None:
        """A turn of `session` ended: merge it into the session's pending extraction, flush when due."""
        p = self.pending.setdefault(session, Pending())
        p.turns += 1
        self.stats.turns += 1
        if p.timer is not None:
            p.timer.cancel()
        if not self.coalesce:
            self._flush(session)  # the seed's behaviour: every turn extracted at once
            return
        # Due (session ended, or `every` turns) or not, it runs when nothing else wants the model server
        # (`poke`, called as each turn ends), and after `idle` seconds at the latest: an extraction's long
        # prompt would otherwise stall the replies being decoded beside it.
        if p.turns >= 2 * self.every:
            self._flush(session)  # never let a busy server grow one extraction's prompt without bound
            return
        p.timer = asyncio.get_running_loop().call_later(self.idle, self._flush, session)
        if end or p.turns >= self.every:
            self.poke()

    def end(self, session: str) -> None:
        if session in self.pending:
            self._flush(session)

    async def resume(self) -> int:
        """After a start: every session with messages not yet extracted (a kill cut its extraction, or it had
        not run yet) gets a pending extraction, run as any other: on a quiet slot, at the latest after `idle`."""
        sessions = await self.store.unextracted_sessions()
        for session in sessions:
            if session not in self.pending and session not in self.running:
                self.pending[session] = Pending(turns=1)
                self._arm(session, self.idle)
        if sessions:
            self._log.info(olog.Event.CHAT_EXTRACTION_RESUMED, sessions=len(sessions))
            self.poke()
        return len(sessions)

    def poke(self) -> None:
        """Start what may start: due extractions while a place is free, then pending ones while nothing else
        wants the model server (called when a turn or an extraction ends)."""
        now = asyncio.get_running_loop().time()
        for session, p in list(self.pending.items()):
            if p.due and p.not_before <= now:
                self._flush(session)
        for session, p in list(self.pending.items()):
            if not self._room() or not self.quiet():
                return
            if session not in self.running and p.not_before <= now:
                self._flush(session)

    def _room(self) -> bool:
        return self.limit is None or len(self.running) < self.limit

    def _arm(self, session: str, delay: float) -> None:
        p = self.pending[session]
        if p.timer is not None:
            p.timer.cancel()
        p.timer = asyncio.get_running_loop().call_later(delay, self._flush, session)

    def _flush(self, session: str) -> None:
        p = self.pending.get(session)
        if p is None:
            return
        if session in self.running or not self._room():
            p.due = True  # runs once the current one ends, or a place frees
            return
        del self.pending[session]
        if p.timer is not None:
            p.timer.cancel()
        self.running[session] = asyncio.create_task(self._run(session, p.failures), name=f"extract:{session}")

    @property
    def busy(self) -> int:
        return len(self.running) + len(self.pending)

    async def _run(self, session: str, failures: int) -> None:
        self.stats.running += 1
        failed = False
        try:
            await self._extract(session)
        except (OllamaError, GateError) as e:
            failed = True
            self._log.warning(olog.Event.CHAT_EXTRACTION_FAILED, session=session, code=str(e.code), error=str(e),
                              retry_s=self._retry_s(failures))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - an extraction must never take the daemon down; log it
            failed = True
            self._log.error(olog.Event.CHAT_EXTRACTION_FAILED, session=session, code="Internal", error=repr(e),
                            retry_s=self._retry_s(failures), exc_info=True)  # fmt: skip
        finally:
            self.stats.running -= 1
            self.stats.last_done = time.monotonic()
            del self.running[session]
            if failed:
                self.stats.failed += 1
                self._again(session, failures)
            self.poke()  # this session's next extraction, or the next session's, may go now

    def _retry_s(self, failures: int) -> float:
        return min(self.idle * 2**failures, MAX_RETRY_S)

    def _again(self, session: str, failures: int) -> None:
        """A failed extraction's messages are still unextracted in the store: keep the session pending, and
        try again later (not at once: the server may be down)."""
        if self._closed:
            return
        p = self.pending.setdefault(session, Pending())
        p.turns += 1
        p.failures = failures + 1
        delay = self._retry_s(failures)
        p.not_before = asyncio.get_running_loop().time() + delay
        self._arm(session, delay)

    async def _extract(self, session: str) -> None:
        todo = await self.store.unextracted(session)
        if not todo:
            return
        upto = max(m["id"] for m in todo)
        if self.coalesce and not prompts.worth_remembering(m["content"] for m in todo if m["role"] == "user"):
            await self.store.remember(session, upto, [])
            self.stats.skipped += 1
            return
        if self.window:
            messages = prompts.extract_messages(await self.store.history(session, max(self.history, len(todo))))
        else:
            said = " ".join(m["content"] for m in todo if m["role"] == "user")
            messages = prompts.extract_new_messages(todo, prompts.relevant(await self.store.memories(session), said))
        self.stats.calls += 1
        self.stats.per_session[session] = self.stats.per_session.get(session, 0) + 1
        result = await self.backend.chat(messages, priority=Priority.BACKGROUND, session=session, format="json")
        found = prompts.parse_memories(parse_json(result))
        await self.store.remember(session, upto, found)
        self.stats.memories += len(found)
        self._log.info(olog.Event.CHAT_EXTRACTION_DONE, session=session, messages=len(todo), memories=len(found),
                       total_s=round(result.total_s, 3))  # fmt: skip

    async def close(self) -> None:
        self._closed = True
        for p in self.pending.values():
            if p.timer is not None:
                p.timer.cancel()
        self.pending.clear()  # a cancelled extraction's `poke` must not start the next one
        tasks = list(self.running.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
