"""The chat plane: per turn classify → reply (streamed) → memory extraction (background, coalesced).

A turn is one owned task. Under the `gate` policy it holds ONE interactive lease from classification
through the reply (the slot's prefix cache stays warm and no other session's call slips in between),
and its extraction is deferred to the `Extractor`. Under the `naive` policy (the seed's behaviour, kept
for benchmarks) every call goes straight to the server and every turn is extracted at once.

Turns of one session run in order; at most one turn per session waits: a message that arrives while
one is waiting merges into it, and both callers read the same reply. When every caller of a turn has
gone away, the turn is cancelled and its slot freed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import logging as olog
from orchestrator.chat import prompts
from orchestrator.chat.memory import Extractor
from orchestrator.config import ChatConfig
from orchestrator.llm.gate import Busy, GateError, Lease, Priority
from orchestrator.llm.ollama import OllamaBackend, OllamaError, parse_json

Event = dict[str, Any]
_END = object()


@dataclass
class Turn:
    session: str
    texts: list[str]
    end: bool = False
    started: bool = False
    outs: list[asyncio.Queue[Any]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    served: Callable[[], None] = lambda: None
    """Called once when the turn holds a slot (it stops counting against the queue bound)."""

    def emit(self, event: Event | object) -> None:
        for q in self.outs:
            q.put_nowait(event)


@dataclass
class PlaneStats:
    turns: int = 0
    merged: int = 0
    failed: int = 0
    cancelled: int = 0
    classify_calls: int = 0
    rule_hits: int = 0
    active: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ChatPlane:
    def __init__(self, store: Any, backend: OllamaBackend, cfg: ChatConfig) -> None:
        self.store = store
        self.backend = backend
        self.gate = backend.gate
        self.cfg = cfg
        self.naive = cfg.policy == "naive"
        self.stats = PlaneStats()
        self._sessions: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, Turn] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._unserved = 0
        """Turns accepted that hold no slot yet: they count against the gate's queue bound from the start."""
        self.extractor = Extractor(
            store, backend, every=cfg.extract_every, idle=cfg.extract_idle, history=cfg.history,
            quiet=self._quiet, coalesce=not self.naive, limit=None if self.naive else self.gate.policy.slots,
            window=self.naive,
        )  # fmt: skip
        self._log = olog.get(plane="chat")
        # Extractions a killed daemon left undone run again (the plane owns the task: `close` ends it).
        self._own(asyncio.get_running_loop().create_task(self._resume(), name="chat:resume"))

    async def _resume(self) -> None:
        try:
            await self.extractor.resume()
        except Exception as e:  # noqa: BLE001 - the plane runs on without it; say so
            self._log.error(olog.Event.CHAT_EXTRACTION_FAILED, code="ResumeFailed", error=repr(e), exc_info=True)

    def _quiet(self) -> bool:
        """May a pending extraction start now? Only on a slot no turn waits for; and while turns are being
        answered, one extraction at a time: its long prompt stalls the replies decoded beside it, but leaving
        every slot but the turns' idle until the last reply ends drains later than the seed's pipeline. On a
        server that answers turns few at a time (`turn_slots`: its batched decoding does not pay), a sequence
        decoded beside a turn slows it as much as it gains: extraction waits until no turn is in flight."""
        if not self.gate.idle_slot():
            return False
        if self.stats.active == 0:
            return True
        return not self.gate.policy.turn_slots and self._unserved == 0 and not self.extractor.running

    def busy(self) -> Busy | None:
        """A refusal to answer at once (before the acknowledgement) when the gate's queue is full."""
        return self.gate.refusal(Priority.INTERACTIVE, max(self.gate.queued_of(Priority.INTERACTIVE), self._unserved))

    def submit(self, session: str, text: str, *, end: bool = False) -> tuple[Turn, asyncio.Queue[Any]]:
        """Queue `text` as a turn of `session` (or merge it into the turn already waiting); read the queue."""
        q: asyncio.Queue[Any] = asyncio.Queue()
        waiting = self._waiting.get(session)
        if waiting is not None and not waiting.started:
            waiting.texts.append(text)
            waiting.end = waiting.end or end
            waiting.outs.append(q)
            self.stats.merged += 1
            q.put_nowait({"event": "merged", "session": session, "messages": len(waiting.texts)})
            return waiting, q
        turn = Turn(session=session, texts=[text], end=end, outs=[q])
        self._unserved += 1
        self._waiting[session] = turn
        turn.task = self._own(asyncio.create_task(self._run(turn), name=f"turn:{session}"))
        return turn, q

    def _own(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def leave(self, turn: Turn, q: asyncio.Queue[Any]) -> None:
        """A caller went away; the last one to leave cancels the turn (freeing its slot)."""
        if q in turn.outs:
            turn.outs.remove(q)
        q.put_nowait(_END)
        if not turn.outs and turn.task is not None and not turn.task.done():
            turn.task.cancel()

    async def events(self, q: asyncio.Queue[Any]) -> AsyncIterator[Event]:
        while True:
            ev = await q.get()
            if ev is _END:
                return
            yield ev

    async def _run(self, turn: Turn) -> None:
        lock = self._sessions.setdefault(turn.session, asyncio.Lock())
        log = self._log.bind(session=turn.session)
        served = False

        def serve() -> None:
            nonlocal served
            if not served:
                served = True
                self._unserved -= 1

        turn.served = serve
        try:
            async with lock:
                turn.started = True
                if self._waiting.get(turn.session) is turn:
                    del self._waiting[turn.session]
                self.stats.active += 1
                try:
                    await self._turn(turn)
                finally:
                    self.stats.active -= 1
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            log.info(olog.Event.CHAT_TURN_CANCELLED, code="ClientGone")
            raise
        except (OllamaError, GateError) as e:
            self.stats.failed += 1
            log.warning(olog.Event.CHAT_TURN_FAILED, code=str(e.code), error=str(e))
            extra = {"retry_after": e.retry_after} if hasattr(e, "retry_after") else {}
            turn.emit({"event": "error", "code": str(e.code), "message": str(e), **extra})
        except Exception as e:
            self.stats.failed += 1
            log.error(olog.Event.CHAT_TURN_FAILED, code="Internal", error=repr(e), exc_info=True)
            turn.emit({"event": "error", "code": "Internal", "message": f"internal error: {e!r} (see the daemon log)"})
        finally:
            serve()
            if self._waiting.get(turn.session) is turn:
                del self._waiting[turn.session]
            turn.emit(_END)
            turn.done.set()
            if not lock.locked() and turn.session not in self._waiting:
                self._sessions.pop(turn.session, None)  # a session's lock lives only while it has turns
            self.extractor.poke()

    async def _turn(self, turn: Turn) -> None:
        session, text = turn.session, "\n".join(turn.texts)
        started = time.monotonic()
        history, known = await self.store.open_turn(session, text, self.cfg.history)
        memories = prompts.relevant(known, text)
        if self.naive:
            turn.served()
            intent, reply = await self._calls(turn, text, history, memories, None)
        else:
            async with self.gate.lease(Priority.INTERACTIVE, session=session) as lease:
                turn.served()
                turn.emit({"event": "slot", "wait_s": round(lease.granted - lease.arrived, 4)})
                intent, reply = await self._calls(turn, text, history, memories, lease)
        await self.store.add_message(session, "assistant", reply.text)
        self.stats.turns += 1
        done = {
            "event": "done", "intent": str(intent), "tokens": reply.tokens,
            "total_s": round(time.monotonic() - started, 4), "memories_used": len(memories),
        }  # fmt: skip
        turn.emit(done)
        # (a key named "tokens" would be masked as a secret by the log)
        self._log.info(olog.Event.CHAT_TURN_DONE, session=session, intent=str(intent), eval_count=reply.tokens,
                       total_s=done["total_s"], memories_used=len(memories))  # fmt: skip
        self.extractor.turn_done(session, end=turn.end)

    async def _calls(
        self, turn: Turn, text: str, history: list[dict[str, Any]], memories: list[str], lease: Lease | None
    ) -> tuple[prompts.Intent, Any]:
        intent = None if self.naive else prompts.rule_intent(text)
        source = "rules"
        if intent is None and not self._classify():
            intent, source = prompts.Intent.chat, "default"
        if intent is None:
            source = "model"
            self.stats.classify_calls += 1
            got = await self.backend.chat(
                prompts.classify_messages(history, text), priority=Priority.INTERACTIVE, session=turn.session,
                lease=lease, format="json", max_tokens=16,
            )  # fmt: skip
            intent = prompts.parse_intent(parse_json(got))
        else:
            self.stats.rule_hits += 1
        turn.emit({"event": "intent", "intent": str(intent), "source": source})

        async def on_token(tok: str) -> None:
            turn.emit({"event": "token", "text": tok})

        reply = await self.backend.chat(
            prompts.reply_messages(history, text, memories, intent), priority=Priority.INTERACTIVE,
            session=turn.session, lease=lease, on_token=on_token,
        )  # fmt: skip
        return intent, reply

    def _classify(self) -> bool:
        """Does the model classify this turn (the rules could not)? Its answer only shapes the reply's
        instruction, and it costs the server a call before the reply; `idle` asks only while no other turn
        waits for a slot, so under load every slot goes to replies."""
        mode = "model" if self.naive else self.cfg.classify
        if mode == "idle":
            return self._unserved == 0 and self.gate.queued_of(Priority.INTERACTIVE) == 0
        return mode == "model"

    def end(self, session: str) -> None:
        self.extractor.end(session)

    def snapshot(self) -> dict[str, Any]:
        return {
            "policy": self.cfg.policy,
            "gate": self.gate.snapshot(),
            "turns": self.stats.to_json(),
            "extraction": {**self.extractor.stats.to_json(), "pending": self.extractor.busy},
        }

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.extractor.close()
        await self.backend.close()
