"""`bench chat --llama-server --shape ... --gpu-layers N`: a model of any shape (an 8B-class one's 128-dim heads and
grouped key/value heads) that the real engine loads, and the GPU offload flag handed to it."""

from __future__ import annotations

import aiohttp
import pytest

from orchestrator.lab.bench.chat import engine_args
from orchestrator.lab.bench.llama_model import SHAPES, Shape, write_model
from orchestrator.lab.bench.llama_server import LlamaServer, SetupMissing, locate


def test_an_8b_class_shape_has_128_dim_heads_shared_by_fewer_key_value_heads() -> None:
    """The `8b` preset is Llama 3 8B's; key=value pairs derive the heads from the head size."""
    eight = Shape.parse("8b")
    assert (eight.n_embd, eight.n_layer, eight.head_dim, eight.n_head, eight.kv_heads) == (4096, 32, 128, 32, 8)
    small = Shape.parse("embd=256,layers=2,head_dim=64,kv_heads=2")
    assert (small.n_head, small.kv_heads, small.head_dim, small.n_layer) == (4, 2, 64, 2)
    assert Shape.parse("small") == Shape() == SHAPES["small"] and Shape().slug == "" and small.slug
    for bad in ("huge", "embd=100,head_dim=64", "embd=256,head_dim=64,kv_heads=3", "layers=0", "embd"):
        with pytest.raises(ValueError, match="shape"):
            Shape.parse(bad)


def test_the_gpu_offload_flag_goes_first_to_the_engine() -> None:
    """`--gpu-layers N` is llama-server's `-ngl N`; `--llama-args` follow as given."""
    assert engine_args(999, ["--cache-ram", "0"]) == ["-ngl", "999", "--cache-ram", "0"]
    assert engine_args(None, []) == []


try:
    locate()
    MISSING = ""
except SetupMissing as e:
    MISSING = str(e)


@pytest.mark.timeout(180)
@pytest.mark.skipif(bool(MISSING), reason=f"needs a built llama-server: {MISSING}")
async def test_the_engine_loads_a_grouped_query_model_and_takes_the_offload_flag(tmp_path) -> None:
    """A shape with fewer key/value heads than heads, written here, served by the real llama-server given `-ngl 0`,
    answers a chat completion."""
    pytest.importorskip("gguf")
    model = write_model(tmp_path / "gqa.gguf", Shape.parse("embd=128,layers=1,head_dim=32,kv_heads=2,ff=256"))
    server = LlamaServer(1, model=model, args=tuple(engine_args(0, [])), predict=4)
    async with server:
        payload = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
        async with aiohttp.ClientSession() as s, s.post(f"{server.upstream}/v1/chat/completions", json=payload) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
    assert body["usage"]["completion_tokens"] >= 1
