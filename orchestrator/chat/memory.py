"""Memory extraction, coalesced per session and kept out of the users' way.

One pending extraction per session; each finished turn merges into it. It runs (as one BACKGROUND call
through the gate) when the plane says the server can take it (`quiet`): a slot is idle and no turn waits
for one; while turns are being answered, one extraction at a time (its long prompt stalls the replies
decoded beside it); with no turn in flight, as many as the gate lets background use. At the latest it runs
`idle` seconds after the session's last turn; a session that ends or reaches `every` unextracted turns
asks for it at once, but it still waits for `quiet` (or the timer) — up to `2 × every` turns, when it
runs whatever the server is doing. Turns with nothing to remember (no first-person statement) are marked
done without a call.
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
from orchestrator.store import Store


@dataclass
class Pending:
    turns: int = 0
    timer: asyncio.TimerHandle | None = None
    due: bool = False


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
        store: Store,
        backend: OllamaBackend,
        *,
        every: int = 3,
        idle: float = 30.0,
        history: int = 12,
        quiet: Callable[[], bool] = lambda: True,
        coalesce: bool = True,
    ) -> None:
        self.store = store
        self.backend = backend
        self.every = every
        self.idle = idle
        self.history = history
        self.quiet = quiet
        self.coalesce = coalesce
        self.pending: dict[str, Pending] = {}
        self.running: dict[str, asyncio.Task[None]] = {}
        self.stats = ExtractionStats()
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

    def poke(self) -> None:
        """Run pending extractions now if nothing else wants the model server (called when a turn ends)."""
        for session in list(self.pending):
            if not self.quiet():
                return
            if session not in self.running:
                self._flush(session)

    def _flush(self, session: str) -> None:
        if session in self.running:
            self.pending.setdefault(session, Pending()).due = True  # runs again once the current one ends
            return
        p = self.pending.pop(session, None)
        if p is None:
            return
        if p.timer is not None:
            p.timer.cancel()
        self.running[session] = asyncio.create_task(self._run(session), name=f"extract:{session}")

    @property
    def busy(self) -> int:
        return len(self.running) + len(self.pending)

    async def _run(self, session: str) -> None:
        self.stats.running += 1
        try:
            await self._extract(session)
        except (OllamaError, GateError) as e:
            self.stats.failed += 1
            self._log.warning(olog.Event.CHAT_EXTRACTION_FAILED, session=session, code=str(e.code), error=str(e))
        except Exception as e:  # noqa: BLE001 - an extraction must never take the daemon down; log it
            self.stats.failed += 1
            self._log.error(olog.Event.CHAT_EXTRACTION_FAILED, session=session, code="Internal", error=repr(e),
                            exc_info=True)  # fmt: skip
        finally:
            self.stats.running -= 1
            self.stats.last_done = time.monotonic()
            del self.running[session]
            again = self.pending.get(session)
            if again is not None and again.due:
                self._flush(session)
            self.poke()  # the next session's pending extraction may go now

    async def _extract(self, session: str) -> None:
        todo = await self.store.unextracted(session)
        if not todo:
            return
        upto = max(m["id"] for m in todo)
        if self.coalesce and not prompts.worth_remembering(m["content"] for m in todo if m["role"] == "user"):
            await self.store.remember(session, upto, [])
            self.stats.skipped += 1
            return
        history = await self.store.history(session, max(self.history, len(todo)))
        self.stats.calls += 1
        self.stats.per_session[session] = self.stats.per_session.get(session, 0) + 1
        result = await self.backend.chat(
            prompts.extract_messages(history), priority=Priority.BACKGROUND, session=session, format="json"
        )
        found = prompts.parse_memories(parse_json(result))
        await self.store.remember(session, upto, found)
        self.stats.memories += len(found)
        self._log.info(olog.Event.CHAT_EXTRACTION_DONE, session=session, messages=len(todo), memories=len(found),
                       total_s=round(result.total_s, 3))  # fmt: skip

    async def close(self) -> None:
        for p in self.pending.values():
            if p.timer is not None:
                p.timer.cancel()
        self.pending.clear()  # a cancelled extraction's `poke` must not start the next one
        tasks = list(self.running.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
