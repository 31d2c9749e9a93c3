"""The gate on real compute: the daemon's chat plane against a real llama.cpp engine (llama-server).

The engine is built once by `bash bench/llama-server-setup.sh` and cached (`~/.cache/orchestrator/llama-server`);
where it is not there the test is skipped and says how to build it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchestrator.lab.bench.llama_server import MODEL_NAME, LlamaServer, SetupMissing, engine_summary, locate
from tests.chatkit import turn, wait_for

pytestmark = pytest.mark.timeout(180)

try:
    locate()
    MISSING = ""
except SetupMissing as e:
    MISSING = str(e)


def _overlap(calls: list[dict[str, object]]) -> int:
    """The most calls the engine held at once."""
    edges = sorted([(c["received"], 1) for c in calls] + [(c["ended"], -1) for c in calls])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.mark.skipif(bool(MISSING), reason=f"needs a built llama-server: {MISSING}")
async def test_gate_orders_and_bounds_the_calls_of_a_real_engine(daemon_factory, tmp_path: Path) -> None:
    """Three sessions at once on a 1-slot real engine: the engine never holds more calls than the gate's slot,
    every turn's calls come before any extraction, each reply finds its classification's prefix in the cache,
    every extraction runs in the end, and after the first the engine serves each one's instruction from its cache."""
    server = LlamaServer(1, predict=12)
    async with server as url:
        home = tmp_path / "home"
        (home / "config").mkdir(parents=True)
        (home / "config" / "config.toml").write_text(
            f'[ollama]\nhost = "{url}"\nparallel = 1\nmodel = "{MODEL_NAME}"\n[chat]\nclassify = "model"\n'
        )
        d = await asyncio.to_thread(daemon_factory("home").start)
        texts = [f"I'm Ann number {i} and my dog is called Rex. What breed suits a flat?" for i in range(3)]
        results = await asyncio.gather(
            *(turn(d.socket, f"s{i}", t, end=True, timeout=120) for i, t in enumerate(texts))
        )
        assert all(s == 200 and e[-1]["event"] == "done" for s, e in results), results
        stats = await wait_for(d.socket, lambda s: s["extraction"]["pending"] == 0 and s["gate"]["running"] == 0,
                               timeout=120)  # fmt: skip
    assert stats["extraction"]["calls"] == 3 and stats["extraction"]["failed"] == 0
    calls = [c for c in server.trace if "ended" in c]
    kinds = ["extract" if "memories" in c["last"] else "turn" for c in calls]
    assert kinds == ["turn"] * 6 + ["extract"] * 3, kinds
    assert _overlap(calls) == 1
    assert all(c["prompt_n"] + c["cache_n"] > 0 for c in calls)  # the engine's own figures reached the client
    # Each turn's reply follows its classification on the slot and finds its prefix there (system, the
    # session's messages): it reads only its own instruction (~19 tokens), not the conversation again.
    replies = [c for c, kind in zip(calls, kinds, strict=True) if kind == "turn" and not c["format"]]
    assert len(replies) == 3 and all(c["prompt_n"] < 30 < c["cache_n"] for c in replies), replies
    extractions = [c for c, kind in zip(calls, kinds, strict=True) if kind == "extract"]
    assert all(c["cache_n"] > 200 for c in extractions[1:]), extractions  # the shared instruction, ~290 tokens
    work = engine_summary(server.trace, calls[0]["received"], calls[-1]["ended"])
    assert 0 < work["cpu_replies_s"] < work["cpu_s"]
