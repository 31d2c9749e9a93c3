"""The Ollama double's engine model, run in virtual time (deterministic: no wall-clock assertions)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

import pytest

from orchestrator.bench.simulate import run_virtual, simulate
from orchestrator.doubles.engine import Engine, Profile
from orchestrator.doubles.ollama import PROFILES

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


def test_gate_beats_naive_on_the_seed_profile() -> None:
    """The real pipeline in virtual time, 4 sessions at once on `seed`: the gate (2 slots) bounds done-max to
    3.6× one session and finishes sooner than naive, without draining much later."""
    seed = PROFILES["seed"]
    one = simulate(seed, "gate", 1, 2).to_json()
    gate = simulate(seed, "gate", 4, 2).to_json()
    naive = simulate(seed, "naive", 4).to_json()
    assert gate["done_max_s"] <= 3.6 * one["done_mean_s"]
    assert gate["done_max_s"] <= 0.8 * naive["done_max_s"]
    assert gate["done_mean_s"] < naive["done_mean_s"]
    assert gate["wall_drained_s"] <= 1.1 * naive["wall_drained_s"]
