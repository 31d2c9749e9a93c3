"""The Ollama double's engine model, run in virtual time (deterministic: no wall-clock assertions)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

import pytest

from orchestrator.lab.bench.simulate import run_virtual, simulate
from orchestrator.lab.doubles.engine import Engine, Profile
from orchestrator.lab.doubles.ollama import PROFILES

pytestmark = pytest.mark.timeout(60)

P = Profile(num_parallel=2, prefill_s=0.01, decode_s=0.1, contention=(1.0, 1.5), batch=8)


async def _request(e: Engine, prompt: list[str], n: int) -> list[float]:
    """Token arrival times of one request."""
    slot = await e.take(prompt)
    seq = await e.start(slot, prompt, [f"t{i}" for i in range(n)], constrained=False)
    times = []
    while await seq.out.get() is not None:
        times.append(e.now())
    e.stop(seq)
    e.give(slot)
    return times


def test_a_long_prompt_stalls_the_sequences_decoding_beside_it() -> None:
    """While another request's 80-token prompt is prefilled (8 per step), a decoding sequence's steps carry it."""

    async def run() -> tuple[list[float], list[float]]:
        e = Engine(P)
        a = asyncio.create_task(_request(e, ["a"], 12))
        await asyncio.sleep(0.35)
        b = asyncio.create_task(_request(e, [f"p{i}" for i in range(80)], 1))
        return await a, await b

    a, b = run_virtual(run())
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert min(gaps) == pytest.approx(0.1)  # alone: one decode step
    assert max(gaps) == pytest.approx(0.1 * 1.0 + 8 * 0.01)  # with 8 prompt tokens of the other in the step
    assert b[0] >= 0.35 + 10 * 0.08


def test_a_slot_reuses_its_cached_prefix() -> None:
    """The second request sharing a prompt prefix pays prefill only for the new tokens."""

    async def run() -> tuple[float, float]:
        e = Engine(replace(P, num_parallel=1))
        prompt = [f"p{i}" for i in range(40)]
        t0 = e.now()
        first = (await _request(e, prompt, 1))[0] - t0
        t1 = e.now()
        second = (await _request(e, [*prompt, "t0", "more"], 1))[0] - t1
        return first, second

    first, second = run_virtual(run())
    assert first == pytest.approx(40 * 0.01)
    assert second == pytest.approx(0.01)  # "t0" is cached with the reply; only "more" is new


def test_gate_meets_the_chat_floors_on_the_seed_profile() -> None:
    """The real pipeline in virtual time, 4 sessions at once on `seed`, the gate with the server's slots:
    done-max within 3.6× and done-mean within 2.2× one session's done, drained no later than naive's; and
    a turn's calls share its slot's cache, where naive's interleaved calls read sessions' histories again."""
    seed = PROFILES["seed"]
    one = simulate(seed, "gate", 1)
    gate = simulate(seed, "gate", 4)
    naive = simulate(seed, "naive", 4)
    assert max(gate.done) <= 3.6 * max(one.done)
    assert sum(gate.done) / 4 <= 2.2 * max(one.done)
    assert gate.drained <= naive.drained
    assert max(gate.done) < max(naive.done) and sum(gate.done) < sum(naive.done)
    assert gate.prompt_tokens < naive.prompt_tokens


def test_seed_profile_fits_the_named_seed_figures() -> None:
    """The shipped `seed` profile, naive pipeline: N=1 first-Ollama, done, drained and N=4 done-wall, drained
    within 12 % of the seed's table."""
    from orchestrator.lab.bench import calibrate

    errs = calibrate.errors(calibrate.rows(PROFILES["seed"]))
    off = {k: round(errs[k], 3) for k in calibrate.NAMED if abs(errs[k]) > 0.12}
    assert not off


def test_bench_sessions_differ_in_content_not_in_shape() -> None:
    """The chat benches' sessions: distinct messages and histories of one shape, history stored as extracted."""
    from orchestrator.lab.bench import turns
    from orchestrator.lab.bench.simulate import MemStore

    msgs = [turns.prompt(i) for i in range(64)]
    assert len(set(msgs)) == 64 and len({len(m.split()) for m in msgs}) == 1
    assert turns.history(0) != turns.history(1) and len(turns.history(5)) == 2 * turns.EXCHANGES
    store = MemStore()
    run_virtual(turns.seed(store, {"a": 0, "b": 1}))
    assert [m["content"] for m in store.messages["a"]] == [t for _, t in turns.history(0)]
    assert all(m["extracted"] for m in store.messages["b"]) and store.mems["b"] == turns.memories(1)


def test_extraction_runs_one_at_a_time_beside_turns_and_in_parallel_after() -> None:
    """4 sessions on `seed` (3 slots): while turns are being answered at most one extraction runs, and only
    once no turn waits for a slot; with every turn answered, the pending ones share the slots."""
    from orchestrator.chat.pipeline import ChatPlane
    from orchestrator.config import ChatConfig, OllamaConfig
    from orchestrator.lab.bench import turns
    from orchestrator.lab.bench.simulate import EngineBackend, MemStore, _warm
    from orchestrator.llm import ollama
    from orchestrator.llm.gate import Gate

    seen: list[tuple[int, int, int]] = []

    async def run() -> None:
        engine = Engine(PROFILES["seed"])
        await _warm(engine)
        gate = Gate("virtual", ollama.gate_policy(OllamaConfig(parallel=3)), clock=engine.now)
        store = MemStore()
        await turns.seed(store, {f"s{i}": i for i in range(4)})
        plane = ChatPlane(store, EngineBackend(engine, gate), ChatConfig(extract_idle=60.0))
        qs = [plane.submit(f"s{i}", turns.prompt(i), end=True)[1] for i in range(4)]

        async def drain(q: asyncio.Queue) -> None:
            async for _ in plane.events(q):
                pass

        waiting = asyncio.gather(*(drain(q) for q in qs))
        while not waiting.done() or plane.extractor.busy:
            seen.append((plane.stats.active, plane._unserved, len(plane.extractor.running)))
            await asyncio.sleep(0.01)
        await waiting
        await plane.close()
        await engine.close()

    run_virtual(run())
    beside = [x for a, u, x in seen if a]
    assert max(beside) == 1  # one extraction did run beside the last turns
    assert all(x == 0 for a, u, x in seen if u)  # never while a turn waited for a slot
    assert max(x for a, _, x in seen if not a) >= 2  # the rest shared the slots once the turns were done


def test_closing_the_extractor_starts_no_further_extraction() -> None:
    """An extraction cancelled by `close` pokes the next session's pending one: after close, none runs."""
    from orchestrator.chat.memory import Extractor
    from orchestrator.config import OllamaConfig
    from orchestrator.lab.bench.simulate import EngineBackend, MemStore
    from orchestrator.llm import ollama
    from orchestrator.llm.gate import Gate

    async def run() -> None:
        engine = Engine(replace(PROFILES["seed"], decode_s=10.0))  # an extraction that would take minutes
        gate = Gate("virtual", ollama.gate_policy(OllamaConfig(parallel=3)), clock=engine.now)
        store = MemStore()
        for s in ("a", "b"):
            await store.add_message(s, "user", "my name is Ann")
        quiet = [True]
        ex = Extractor(store, EngineBackend(engine, gate), quiet=lambda: quiet[0])
        ex.turn_done("a", end=True)  # runs at once
        quiet[0] = False
        ex.turn_done("b", end=True)  # waits for quiet
        await asyncio.sleep(1.0)
        assert set(ex.running) == {"a"} and "b" in ex.pending
        quiet[0] = True
        await ex.close()
        assert not ex.running
        await engine.close()

    run_virtual(run())


def test_classify_modes_decide_when_the_model_classifies_a_turn() -> None:
    """Two turns at once on one slot that the rules cannot classify: `rules` sends only the replies, `idle` lets
    the model classify only the turn nobody waits behind, `model` classifies both before their replies."""
    from orchestrator.chat.pipeline import ChatPlane
    from orchestrator.config import ChatConfig, OllamaConfig
    from orchestrator.lab.bench import turns
    from orchestrator.lab.bench.simulate import EngineBackend, MemStore, _warm
    from orchestrator.llm import ollama
    from orchestrator.llm.gate import Gate

    class Recording(EngineBackend):
        def __init__(self, engine: Engine, gate: Gate) -> None:
            super().__init__(engine, gate)
            self.calls: list[str] = []

        async def _once(self, messages, format, *rest):  # type: ignore[no-untyped-def, override]
            if "intent" in messages[-1]["content"]:
                self.calls.append("classify")
            elif not format:
                self.calls.append("reply")  # (extraction calls are not counted)
            return await super()._once(messages, format, *rest)

    async def run(mode: str) -> tuple[list[str], list[str]]:
        engine = Engine(replace(PROFILES["seed"], num_parallel=1))
        await _warm(engine)
        gate = Gate("virtual", ollama.gate_policy(OllamaConfig(parallel=1)), clock=engine.now)
        store = MemStore()
        await turns.seed(store, {"a": 0, "b": 1})
        backend = Recording(engine, gate)
        plane = ChatPlane(store, backend, ChatConfig(extract_idle=600.0, classify=mode))
        qs = [plane.submit(s, turns.prompt(i))[1] for i, s in enumerate(("a", "b"))]
        sources = [ev["source"] for q in qs async for ev in plane.events(q) if ev["event"] == "intent"]
        await plane.close()
        await engine.close()
        return backend.calls, sources

    assert run_virtual(run("rules")) == (["reply", "reply"], ["default", "default"])
    assert run_virtual(run("idle")) == (["reply", "classify", "reply"], ["default", "model"])
    assert run_virtual(run("model")) == (["classify", "reply", "classify", "reply"], ["model", "model"])
