"""The llama-server backend's Ollama shim, read by the official `ollama` client, with a stand-in engine."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import ollama
import pytest

from orchestrator.lab.bench.llama_server import LlamaServer, SetupMissing, locate

FAKE = Path(__file__).parent / "fakes" / "llama_server.py"


@pytest.fixture
def engine(tmp_path: Path) -> tuple[Path, Path]:
    binary = tmp_path / "llama-server"
    binary.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return binary, model


async def test_chat_streams_as_ollama_with_engine_timings(engine: tuple[Path, Path]) -> None:
    """Ollama's client streams a reply from the shim; the last chunk carries the engine's counts and durations."""
    binary, model = engine
    async with LlamaServer(2, binary=binary, model=model) as url:
        client = ollama.AsyncClient(host=url)
        chunks = [
            c
            async for c in await client.chat(
                model="random-llama",
                messages=[{"role": "user", "content": "one two three"}],
                options={"num_predict": 5},
                stream=True,
            )
        ]
        tags = await client.list()
        await client.close()
    text = "".join(c.message.content for c in chunks)
    assert text == "t0 t1 t2 t3 t4 "
    last = chunks[-1]
    assert last.done and last.eval_count == 5
    assert last.prompt_eval_count == 3 + 1  # processed + cached prompt tokens
    assert last.prompt_eval_duration == 12_500_000 and last.eval_duration == 40_000_000
    assert [m.model for m in tags.models] == ["random-llama"]


async def test_generate_without_stream_returns_one_object(engine: tuple[Path, Path]) -> None:
    """`/api/generate` with stream false answers one JSON object with the whole response."""
    binary, model = engine
    async with LlamaServer(1, binary=binary, model=model) as url:
        client = ollama.AsyncClient(host=url)
        reply = await client.generate(
            model="random-llama", prompt="hello there", options={"num_predict": 3}, stream=False
        )
        await client.close()
    assert reply.response == "t0 t1 t2 " and reply.done


def test_missing_setup_says_how_to_make_it(tmp_path: Path) -> None:
    """Without the binary or model, the error names the setup script."""
    with pytest.raises(SetupMissing, match=r"llama-server-setup\.sh"):
        locate(tmp_path / "nope", tmp_path / "none.gguf")
