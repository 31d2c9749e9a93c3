"""Memory extraction: bounded beside a burst, retried after a failure, resumed after a kill -9."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.chat.memory import Extractor
from orchestrator.config import OllamaConfig
from orchestrator.lab.bench.simulate import EngineBackend, MemStore, run_virtual
from orchestrator.lab.doubles.engine import Engine
from orchestrator.lab.doubles.ollama import PROFILES
from orchestrator.llm import ollama
from orchestrator.llm.gate import Gate, Priority
from tests.chatkit import OllamaDouble, get, turn, wait_for, write_config

pytestmark = pytest.mark.timeout(120)


def _setup(slots: int = 1, **profile: Any) -> tuple[Engine, Gate, MemStore]:
    engine = Engine(replace(PROFILES["seed"], num_parallel=slots, **profile))
    gate = Gate("virtual", ollama.gate_policy(OllamaConfig(parallel=slots, max_queue=2)), clock=engine.now)
    return engine, gate, MemStore()


def test_a_burst_of_due_extractions_keeps_the_gate_queue_for_turns() -> None:
    """Six sessions' extractions fall due while the server is busy: at most `limit` reach the gate, an
    arriving turn is not refused, and every session is extracted in the end."""
    seen: list[int] = []

    async def run() -> None:
        engine, gate, store = _setup()
        for i in range(6):
            await store.add_message(f"s{i}", "user", f"my name is user {i}")
        ex = Extractor(store, EngineBackend(engine, gate), idle=1.0, quiet=lambda: False, limit=1)
        for i in range(6):
            ex.turn_done(f"s{i}")
        await asyncio.sleep(1.5)  # every idle timer has fired
        assert gate.refusal(Priority.INTERACTIVE) is None
        while ex.busy:
            seen.append(gate.queued_of(Priority.BACKGROUND) + gate.running)
            await asyncio.sleep(0.05)
        await ex.close()
        await engine.close()
        assert [await store.unextracted(f"s{i}") for i in range(6)] == [[]] * 6

    run_virtual(run())
    assert seen and max(seen) == 1


class _FailsFirst(EngineBackend):
    """The production backend on the double's engine, whose first `failures` calls fail as a 500 would."""

    def __init__(self, engine: Engine, gate: Gate, failures: int) -> None:
        super().__init__(engine, gate)
        self.failures = failures
        self.calls: list[float] = []

    async def _once(self, *args: Any) -> ollama.ChatResult:
        self.calls.append(self.engine.now())
        if len(self.calls) <= self.failures:
            raise ollama.OllamaError(ollama.OllamaCode.ServerError, "Ollama answered: boom (status 500)")
        return await super()._once(*args)


def test_a_failed_extraction_is_tried_again_later_with_backoff() -> None:
    """An extraction that fails keeps the session pending: tried again after `idle`, then after 2 × idle,
    never in a loop, and its memories are stored once the server answers."""

    async def run() -> tuple[list[float], MemStore]:
        engine, gate, store = _setup()
        await store.add_message("a", "user", "my dog is called Rex")
        backend = _FailsFirst(engine, gate, failures=2)
        ex = Extractor(store, backend, idle=10.0, limit=1)
        ex.turn_done("a", end=True)
        while ex.busy:  # noqa: ASYNC110 - virtual time: the clock jumps to the next timer
            await asyncio.sleep(0.5)
        await ex.close()
        await engine.close()
        return backend.calls, store

    calls, store = run_virtual(run())
    assert len(calls) == 3
    assert calls[1] - calls[0] >= 10.0 and calls[2] - calls[1] >= 20.0
    assert store.mems["a"] and all(m["extracted"] for m in store.messages["a"])


async def test_memories_cut_by_a_kill_are_extracted_after_restart(daemon_factory, tmp_path: Path) -> None:
    """kill -9 of the daemon while a session's extraction is being answered: after a restart the session's
    memories are extracted (nothing the user told the daemon is lost)."""
    slow = OllamaDouble("--decode-s", "0.5", "--reply-tokens", "2")  # an extraction of ~40 tokens: 20 s
    fast = OllamaDouble()
    try:
        home = tmp_path / "home"
        write_config(home, slow.url, extract_every=1)
        d = daemon_factory("home", process=True).start()
        status, events = await turn(d.socket, "ann", "remember that my dog is called Rex")
        assert status == 200 and events[-1]["event"] == "done"
        for _ in range(200):  # the extraction call has reached the server
            if any(r["format"] and "memories" in json.dumps(r["messages"][-1]) for r in slow.requests()):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"no extraction call reached the double: {slow.requests()}")
        d.kill()
        write_config(home, fast.url, extract_every=1, extract_idle=60.0)
        await asyncio.to_thread(d.start)
        await wait_for(d.socket, lambda s: s["extraction"]["calls"] >= 1 and s["extraction"]["pending"] == 0)
        mem = await get(d.socket, "/chat/ann")
        assert any("Rex" in m for m in mem["memories"]), mem
        assert any(e.get("event") == "chat.extraction.resumed" for e in d.events())
    finally:
        slow.stop()
        fast.stop()
