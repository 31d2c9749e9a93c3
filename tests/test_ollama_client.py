"""The Ollama client against the protocol double: the official client, real HTTP, real NDJSON."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from orchestrator.lab.doubles import ollama as double
from orchestrator.llm.gate import Gate, GatePolicy, Priority
from orchestrator.llm.ollama import OllamaBackend, OllamaCode, OllamaError

pytestmark = pytest.mark.timeout(60)
MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "I'm Ann. Tell me about Rome"}]


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, double.Server]]:
    runner, url, srv = await double.start(double.PROFILES["fast"])
    yield url, srv
    await runner.cleanup()


def backend(url: str, slots: int = 1, **kw: object) -> OllamaBackend:
    return OllamaBackend(url, "hermes3", Gate(url, GatePolicy(slots=slots)), backoff_s=0.01, **kw)  # type: ignore[arg-type]


async def test_streams_tokens_and_reports_server_figures(server: tuple[str, double.Server]) -> None:
    """A streamed reply arrives token by token, with Ollama's *_count and *_duration figures."""
    url, _ = server
    b = backend(url)
    seen: list[str] = []

    async def on_token(t: str) -> None:
        seen.append(t)

    r = await b.chat(MSGS, priority=Priority.INTERACTIVE, on_token=on_token)
    assert "".join(seen) == r.text and r.tokens == len(seen) > 5
    assert r.stats["eval_count"] == r.tokens and r.stats["prompt_eval_count"] > 0 and r.stats["total_duration"] > 0
    await b.close()


async def test_503_is_retried_before_any_token(server: tuple[str, double.Server]) -> None:
    """The server's own 503 (busy) is retried with backoff; the call then succeeds."""
    url, srv = server
    srv.engine.faults.status = [503, 503]
    b = backend(url)
    r = await b.chat(MSGS)
    assert r.attempts == 3 and r.tokens > 0
    await b.close()


async def test_error_after_tokens_reached_the_user_is_not_retried(server: tuple[str, double.Server]) -> None:
    """A mid-stream error line fails the call once words reached the user: no repeated words."""
    url, srv = server
    srv.engine.faults.error_after = 3
    b = backend(url)
    got: list[str] = []

    async def on_token(t: str) -> None:
        got.append(t)

    with pytest.raises(OllamaError) as e:
        await b.chat(MSGS, on_token=on_token)
    assert e.value.code is OllamaCode.ServerError and len(got) == 3
    await b.close()


async def test_missing_model_names_the_pull(server: tuple[str, double.Server]) -> None:
    """A model the server lacks says which `ollama pull` to run."""
    url, _ = server
    b = OllamaBackend(url, "qwen9", Gate(url, GatePolicy()))
    with pytest.raises(OllamaError) as e:
        await b.chat(MSGS)
    assert e.value.code is OllamaCode.ModelMissing and "ollama pull qwen9" in str(e.value)
    await b.close()


async def test_down_server_is_a_clear_error_not_a_hang() -> None:
    """Nothing listening: a bounded number of retries, then ServerDown naming the host."""
    b = backend("http://127.0.0.1:9")
    with pytest.raises(OllamaError) as e:
        await asyncio.wait_for(b.chat(MSGS), 20)
    assert e.value.code is OllamaCode.ServerDown and "127.0.0.1:9" in str(e.value)
    assert b.gate.running == 0
    await b.close()


async def test_background_call_is_preempted_by_a_turn_and_restarts(server: tuple[str, double.Server]) -> None:
    """One slot: a running background call gives its slot to a waiting turn, then runs again to the end."""
    url, srv = server
    srv.engine.profile = dataclasses.replace(srv.engine.profile, decode_s=0.02, reply_tokens=20)
    b = backend(url)
    bg = asyncio.create_task(b.chat(MSGS, priority=Priority.BACKGROUND))
    await asyncio.sleep(0.15)
    async with b.gate.lease(Priority.INTERACTIVE, session="s") as lease:
        turn = await b.chat(MSGS, lease=lease)
    result = await asyncio.wait_for(bg, 20)
    assert b.gate.preemptions == 1 and turn.tokens == result.tokens == 20
    assert b.gate.stats[Priority.BACKGROUND].served == 2  # the preempted attempt, then the full one
    await b.close()


async def test_double_serves_queued_requests_in_arrival_order() -> None:
    """With every slot busy the double queues FIFO: a freed slot goes to the oldest waiter, not a newcomer."""
    engine = double.Engine(dataclasses.replace(double.PROFILES["fast"], num_parallel=1))
    held = await engine.take(["a"])
    queued = asyncio.create_task(engine.take(["b"]))
    for _ in range(100):
        if engine.queue == 1:
            break
        await asyncio.sleep(0.01)
    assert engine.queue == 1
    engine.give(held)
    late = asyncio.create_task(engine.take(["c"]))
    slot = await asyncio.wait_for(queued, 5)
    await asyncio.sleep(0.05)
    assert not late.done() and engine.queue == 1
    engine.give(slot)
    engine.give(await asyncio.wait_for(late, 5))
    assert engine.active == 0 and engine.queue == 0


async def test_a_capped_call_asks_the_server_to_stop_at_the_cap(server: tuple[str, double.Server]) -> None:
    """`max_tokens` goes out as `num_predict` (the server ends the call and frees its slot itself); the other
    options are the ones every call sends, so the server never reloads the model."""
    url, srv = server
    b = backend(url)
    capped = await b.chat(MSGS, max_tokens=3)
    plain = await b.chat(MSGS)
    await b.close()
    sent = [r["options"] for r in srv.engine.seen]
    assert sent[0] == {**b.options, "num_predict": 3} and sent[1] == b.options
    assert capped.tokens == 3 and capped.stats["eval_count"] == 3 and plain.tokens > 3
    assert srv.engine.counts["closed_early"] == 0 and srv.engine.active == 0  # ended by the server, slot free
