"""The chat bench in virtual time: the real pipeline, gate and Ollama client against the double's engine.

Nothing here models the pipeline: `ChatPlane`, `Extractor`, `Gate` and `OllamaBackend` (its gate
leases, retries and preemption) are the production classes. Only two things are swapped: the store is
kept in memory, and the backend's one HTTP exchange (`_once`) runs the request through the double's
`Engine` directly (the same code the double's HTTP server runs). The event loop's clock jumps to the next
timer whenever nothing is ready, so a 20 s run takes a few milliseconds; that is what makes fitting a
profile to the seed's table (`orchestrator.lab.bench.calibrate`) a search rather than a guess.
"""

from __future__ import annotations

import asyncio
import io
import statistics
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from orchestrator import logging as olog
from orchestrator.chat import prompts
from orchestrator.chat.pipeline import ChatPlane
from orchestrator.config import ChatConfig, OllamaConfig
from orchestrator.lab.bench import turns
from orchestrator.lab.doubles.engine import Engine, Profile
from orchestrator.lab.doubles.ollama import render, script
from orchestrator.llm import ollama
from orchestrator.llm.gate import Gate

T = TypeVar("T")


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer when nothing is ready (no real waiting)."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def _run_once(self) -> None:
        ready: Any = self._ready  # type: ignore[attr-defined]
        scheduled: Any = self._scheduled  # type: ignore[attr-defined]
        if not ready and scheduled:
            self._now = max(self._now, scheduled[0]._when)
        super()._run_once()  # type: ignore[misc]


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


@dataclass
class MemStore:
    """The few store calls the chat plane makes, in memory."""

    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    mems: dict[str, list[str]] = field(default_factory=dict)
    ids: int = 0

    async def add_message(self, session: str, role: str, content: str) -> int:
        self.ids += 1
        self.messages.setdefault(session, []).append({"id": self.ids, "role": role, "content": content, "extracted": 0})
        return self.ids

    async def history(self, session: str, limit: int = 20) -> list[dict[str, Any]]:
        return [dict(m) for m in self.messages.get(session, [])[-limit:]]

    async def open_turn(
        self, session: str, text: str, history: int, memories: int = 50
    ) -> tuple[list[dict[str, Any]], list[str]]:
        before = await self.history(session, history), await self.memories(session, memories)
        await self.add_message(session, "user", text)
        return before

    async def unextracted(self, session: str) -> list[dict[str, Any]]:
        return [dict(m) for m in self.messages.get(session, []) if not m["extracted"]]

    async def unextracted_sessions(self) -> list[str]:
        return [s for s, ms in self.messages.items() if any(not m["extracted"] for m in ms)]

    async def remember(self, session: str, upto: int, memories: Sequence[str]) -> None:
        self.mems.setdefault(session, [])[:0] = list(memories)
        for m in self.messages.get(session, []):
            if m["id"] <= upto:
                m["extracted"] = 1

    async def memories(self, session: str, limit: int = 50) -> list[str]:
        return self.mems.get(session, [])[:limit]


class EngineBackend(ollama.OllamaBackend):
    """The production backend with its one HTTP exchange replaced by a direct run on the double's engine."""

    def __init__(self, engine: Engine, gate: Gate) -> None:
        super().__init__("http://virtual", "hermes3", gate)
        self.engine = engine

    async def _once(
        self, messages: Any, format: Any, max_tokens: int | None, deliver: Any, deadline: float
    ) -> ollama.ChatResult:
        e = self.engine
        sent = e.now()
        prompt = render(list(messages))
        reply = script(e.profile, list(messages), format)[:max_tokens]  # `num_predict`: the server stops there
        slot = await e.take(prompt)
        seq = None
        parts: list[str] = []
        first = None
        try:
            seq = await e.start(slot, prompt, reply, constrained=bool(format))
            while (tok := await seq.out.get()) is not None:
                first = e.now() - sent if first is None else first
                parts.append(tok)
                await deliver(tok)
                if max_tokens is not None and len(parts) >= max_tokens:
                    break
        finally:
            if seq is not None:
                e.stop(seq)
            e.give(slot)
        return ollama.ChatResult("".join(parts), len(parts), 1, first, 0.0)


@dataclass
class SimRow:
    policy: str
    n: int
    slots: int
    first: list[float]
    done: list[float]
    drained: float
    extraction_calls: int
    prompt_tokens: int = 0
    """Prompt tokens the server read, not served from a slot's prefix cache."""

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "n": self.n, "slots": self.slots,
            "first_ollama_mean_s": round(statistics.fmean(self.first), 3) if self.first else None,
            "done_min_s": round(min(self.done), 3), "done_mean_s": round(statistics.fmean(self.done), 3),
            "done_max_s": round(max(self.done), 3), "wall_drained_s": round(self.drained, 3),
        }  # fmt: skip


def warmup_messages() -> list[dict[str, str]]:
    """What a warm server has seen: the pipeline's shared system part (the bench sends it once per slot)."""
    return [{"role": "system", "content": prompts.SYSTEM}]


async def _warm(engine: Engine) -> None:
    async def one() -> None:
        prompt = render(warmup_messages())
        slot = await engine.take(prompt)
        seq = await engine.start(slot, prompt, ["ok"], constrained=False)
        while await seq.out.get() is not None:
            pass
        engine.stop(seq)
        engine.give(slot)

    await asyncio.gather(*(one() for _ in engine.slots))


async def _run(profile: Profile, policy: str, n: int, slots: int, chat: ChatConfig, turn_slots: int) -> SimRow:
    engine = Engine(profile)
    await _warm(engine)
    cfg = OllamaConfig(parallel=slots, max_queue=4096, turn_slots=turn_slots)
    gate = Gate("virtual", ollama.gate_policy(cfg, naive=policy == "naive"), clock=engine.now)
    store = MemStore()
    await turns.seed(store, {f"s{i}": i for i in range(n)})
    plane = ChatPlane(store, EngineBackend(engine, gate), replace(chat, policy=policy))
    t0 = engine.now()

    async def one(i: int) -> tuple[float | None, float]:
        _, q = plane.submit(f"s{i}", turns.prompt(i), end=True)
        first = None
        async for ev in plane.events(q):
            if first is None and (ev["event"] == "token" or (ev["event"] == "intent" and ev.get("source") == "model")):
                first = engine.now() - t0
            if ev["event"] == "error":
                raise RuntimeError(ev["message"])
        return first, engine.now() - t0

    try:
        got = await asyncio.gather(*(one(i) for i in range(n)))
        while gate.running or gate.queued or plane.extractor.busy:  # noqa: ASYNC110 - polls as the bench does
            await asyncio.sleep(0.01)
        drained = engine.now() - t0
    finally:
        await plane.close()
        await engine.close()
    firsts = [f for f, _ in got if f is not None]
    return SimRow(
        policy,
        n,
        slots,
        firsts,
        [d for _, d in got],
        drained,
        plane.extractor.stats.calls,
        engine.counts["prompt_tokens"],
    )


def simulate(
    profile: Profile,
    policy: str,
    n: int,
    slots: int | None = None,
    chat: ChatConfig | None = None,
    turn_slots: int = 0,
) -> SimRow:
    """One bench run (N sessions arriving together) in virtual time."""
    olog.configure(io.StringIO(), level="critical")
    chat = chat or ChatConfig(extract_idle=5.0)
    return run_virtual(_run(profile, policy, n, slots or profile.num_parallel, chat, turn_slots))
