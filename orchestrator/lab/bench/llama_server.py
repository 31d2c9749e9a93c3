"""The chat benchmark's real-compute backend: llama.cpp's `llama-server` behind a thin Ollama shim.

Ollama runs llama.cpp; `llama-server` is that engine on its own, with the same slots (`-np`, Ollama's
`OLLAMA_NUM_PARALLEL`), continuous batching and per-slot prompt cache. The shim serves Ollama's API
(`/api/chat` and `/api/generate` as NDJSON, `/api/tags`, `/api/ps`, `/api/version`) from the server's
OpenAI-style streaming endpoint, so the daemon's production Ollama client talks to it unchanged, and
reports the engine's own timings in Ollama's `*_duration` / `*_count` fields. Closing a stream closes the
upstream request, which frees the engine's slot, as with Ollama.

`bench/llama-server-setup.sh` builds the binary (from the `llama-cpp-python` sdist, which vendors
llama.cpp) and writes a random-weight model (`orchestrator.lab.bench.llama_model`); no weights are downloaded.
The model's text is noise: replies run to `num_predict` tokens (`ignore_eos`), and a JSON `format`
is honoured only as far as a random model can (the pipeline must cope with unusable output anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from aiohttp import web

from orchestrator.lab.bench.llama_model import VERSION, Shape, write_model

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "orchestrator" / "llama-server"
"""Where the setup script leaves the binary (`bin/llama-server`) and the model (`MODEL_FILE`)."""
MODEL_FILE = f"random-llama-v{VERSION}.gguf"
MODEL_NAME = "random-llama"
DEFAULT_PREDICT = 128


class SetupMissing(RuntimeError):
    """The binary or the model is not there; the message says how to make them."""


def model_for(shape: Shape) -> Path:
    """The cached random-weight model of `shape`, written first when it is not there yet (the default shape's is the
    one `bench/llama-server-setup.sh` writes)."""
    path = CACHE / (MODEL_FILE if not shape.slug else f"random-llama-v{VERSION}-{shape.slug}.gguf")
    if not path.exists():
        size = 2 * shape.n_layer * (2 * shape.n_embd**2 + 2 * shape.n_embd * shape.kv_heads * shape.head_dim
                                    + 3 * shape.n_embd * shape.n_ff) / 1e9  # fmt: skip
        print(f"orchestrator: writing a random-weight model of that shape (about {size:.1f} GB) to {path}",
              file=sys.stderr)  # fmt: skip
        tmp = path.with_name(path.name + ".part")
        write_model(tmp, shape)
        tmp.replace(path)
    return path


def locate(binary: Path | None = None, model: Path | None = None) -> tuple[Path, Path]:
    """The llama-server binary and model to use: given, `$ORCHESTRATOR_LLAMA_SERVER`, on PATH, or the cache."""
    found = binary or (Path(p) if (p := os.environ.get("ORCHESTRATOR_LLAMA_SERVER")) else None)
    if found is None:
        on_path = shutil.which("llama-server")
        found = Path(on_path) if on_path else CACHE / "bin" / "llama-server"
    model = model or CACHE / MODEL_FILE
    missing = [str(p) for p in (found, model) if not p.exists()]
    if missing:
        raise SetupMissing(
            f"not found: {', '.join(missing)}; run `bash bench/llama-server-setup.sh` first "
            "(builds llama-server from the llama-cpp-python sdist, about 7 minutes on 2 cores, and writes a model)"
        )
    return found, model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class LlamaServer:
    """`async with LlamaServer(slots=2) as url:` — an Ollama-compatible URL backed by a real llama-server."""

    def __init__(
        self,
        slots: int = 1,
        *,
        binary: Path | None = None,
        model: Path | None = None,
        ctx_per_slot: int = 4096,
        threads: int | None = None,
        args: tuple[str, ...] = (),
        predict: int = DEFAULT_PREDICT,
    ) -> None:
        self.binary, self.model = locate(binary, model)
        self.slots = slots
        self.ctx = ctx_per_slot * slots
        # Half the cores: the daemon and the sessions need the rest, and ggml's spinning threads slow to a
        # crawl when they outnumber free cores (measured: 3 tok/s with 2 threads on a busy 2-core box, 85 with 1).
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)
        self.args = args
        self.predict = predict
        """Tokens a call without `num_predict` generates (a random model never ends a reply by itself)."""
        """More llama-server flags (after the ones set here)."""
        self._proc: asyncio.subprocess.Process | None = None
        self._ps: psutil.Process | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.upstream = ""
        self.url = ""
        self.trace: list[dict[str, Any]] = []
        """One entry per request, in the engine's own terms (see `Call`): what the bench reports as engine time."""

    async def __aenter__(self) -> str:
        port = _free_port()
        self.upstream = f"http://127.0.0.1:{port}"
        self._proc = await asyncio.create_subprocess_exec(
            str(self.binary),
            *("-m", str(self.model), "--host", "127.0.0.1", "--port", str(port)),
            *("-np", str(self.slots), "-c", str(self.ctx), "-t", str(self.threads)),
            *("--chat-template", "chatml", "--no-webui", "-a", MODEL_NAME, *self.args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        self._ps = psutil.Process(self._proc.pid)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
        try:
            await self._wait_healthy(60.0)
            self.url = await self._serve_shim()
        except BaseException:
            await self.__aexit__()
            raise
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), 10)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()

    def cpu_s(self) -> float:
        """CPU seconds the engine's process has used so far: its work, which a loaded machine stretches in
        wall time but hardly changes (the engine's own `*_ms` timings are wall time)."""
        if self._ps is None:
            return 0.0
        t = self._ps.cpu_times()
        return float(t.user + t.system)

    async def _wait_healthy(self, timeout: float) -> None:
        assert self._session is not None and self._proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                raise RuntimeError(f"llama-server exited {self._proc.returncode} while loading {self.model}")
            try:
                async with self._session.get(f"{self.upstream}/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass  # not listening yet
            await asyncio.sleep(0.2)
        raise TimeoutError(f"llama-server did not become healthy within {timeout:g}s")

    async def _serve_shim(self) -> str:
        app = web.Application()
        app.add_routes(
            [
                web.post("/api/chat", self._chat),
                web.post("/api/generate", self._generate),
                web.get("/api/tags", self._tags),
                web.get("/api/ps", self._tags),
                web.get("/api/version", self._version),
                web.get("/", self._root),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = _free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}"

    # -- Ollama's API ---------------------------------------------------------------------------

    async def _root(self, _: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": "0.0.0-llama-server-shim"})

    async def _tags(self, _: web.Request) -> web.Response:
        size = self.model.stat().st_size
        entry = {
            "name": MODEL_NAME,
            "model": MODEL_NAME,
            "modified_at": _now(),
            "size": size,
            "digest": "0" * 64,
            "details": {"format": "gguf", "family": "llama", "parameter_size": "random", "quantization_level": "F16"},
        }
        return web.json_response({"models": [entry]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return await self._relay(request, body, body.get("messages") or [], chat=True)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        messages = [{"role": "system", "content": body["system"]}] if body.get("system") else []
        messages.append({"role": "user", "content": body.get("prompt", "")})
        return await self._relay(request, body, messages, chat=False)

    async def _relay(
        self, request: web.Request, body: dict[str, Any], messages: list[dict[str, Any]], *, chat: bool
    ) -> web.StreamResponse:
        options = body.get("options") or {}
        upstream = {
            "model": MODEL_NAME,
            "messages": [{"role": m.get("role", "user"), "content": m.get("content", "")} for m in messages],
            "stream": True,
            "max_tokens": int(options.get("num_predict") or self.predict),
            "temperature": float(options.get("temperature", 0.8)),
            "ignore_eos": True,
            "cache_prompt": True,
        }
        started = time.monotonic_ns()
        last = str(messages[-1].get("content", ""))[:200] if messages else ""
        call: dict[str, Any] = {
            "received": time.monotonic(), "format": bool(body.get("format")), "closed_early": True, "last": last,
            "cpu_in": self.cpu_s(),
        }  # fmt: skip
        self.trace.append(call)
        stream = body.get("stream", True)
        model = body.get("model") or MODEL_NAME
        resp: web.StreamResponse | None = None
        text: list[str] = []
        timings: dict[str, Any] = {}
        try:
            # aclosing: leaving early (the client went away) closes the upstream request, freeing the slot.
            async with contextlib.aclosing(self._upstream(upstream)) as pieces:
                async for kind, value in pieces:
                    if kind == "error":
                        if resp is None:
                            return web.json_response({"error": value}, status=500)
                        await resp.write((json.dumps({"error": value}) + "\n").encode())
                        return resp
                    if kind == "timings":
                        timings = value
                        continue
                    call.setdefault("first", time.monotonic())
                    text.append(value)
                    if stream:
                        if resp is None:
                            resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
                            await resp.prepare(request)
                        await resp.write((json.dumps(_chunk(model, value, chat)) + "\n").encode())
            call.update(closed_early=False, **_engine_figures(timings))
            final = _chunk(model, "" if stream else "".join(text), chat)
            final.update(_final_fields(timings, time.monotonic_ns() - started))
            if not stream:
                return web.json_response(final)
            if resp is None:
                resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
                await resp.prepare(request)
            await resp.write((json.dumps(final) + "\n").encode())
            await resp.write_eof()
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one: the client closed its stream
            pass
        finally:
            call["ended"] = time.monotonic()
            call["cpu_out"] = self.cpu_s()
            call["pieces"] = len(text)
        return resp or web.Response(status=499)

    async def _upstream(self, payload: dict[str, Any]) -> AsyncGenerator[tuple[str, Any], None]:
        """("text", piece) per streamed piece, then ("timings", {...}); ("error", msg) if the engine fails."""
        assert self._session is not None
        try:
            async with self._session.post(f"{self.upstream}/v1/chat/completions", json=payload) as r:
                if r.status != 200:
                    yield "error", f"llama-server answered {r.status}: {(await r.text())[:200]}"
                    return
                async for raw in r.content:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    for choice in event.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            yield "text", piece
                    if event.get("timings"):
                        yield "timings", event["timings"]
        except aiohttp.ClientError as e:
            yield "error", f"llama-server unreachable: {e}"


def _chunk(model: str, piece: str, chat: bool) -> dict[str, Any]:
    base: dict[str, Any] = {"model": model, "created_at": _now(), "done": False}
    if chat:
        base["message"] = {"role": "assistant", "content": piece}
    else:
        base["response"] = piece
    return base


def _engine_figures(timings: dict[str, Any]) -> dict[str, Any]:
    """The engine's own account of one request: tokens read, served from cache, generated, and the times."""
    return {
        "prompt_n": int(timings.get("prompt_n", 0)),
        "cache_n": int(timings.get("cache_n", 0)),
        "prompt_s": float(timings.get("prompt_ms", 0.0)) / 1000,
        "predicted_n": int(timings.get("predicted_n", 0)),
        "predicted_s": float(timings.get("predicted_ms", 0.0)) / 1000,
    }


def engine_summary(trace: list[dict[str, Any]], t0: float, end: float) -> dict[str, Any]:
    """What the engine did between `t0` and `end` (monotonic): calls, tokens read and served from its cache,
    how long no request was in it (`idle_s`: every slot empty while the bench still ran), and the CPU seconds
    it spent on the run (`cpu_s`) and until the last reply (a call without `format`) ended (`cpu_replies_s`)."""
    calls = [c for c in trace if c["received"] >= t0 and "ended" in c]
    spans = sorted((c["received"], c["ended"]) for c in calls)
    busy, last = 0.0, t0
    for a, b in spans:
        a, b = max(a, last), min(b, end)
        if b > a:
            busy += b - a
            last = b
    done = [c for c in calls if not c["closed_early"]]
    return {
        "calls": len(calls),
        "closed_early": len(calls) - len(done),
        "prompt_tokens": sum(c["prompt_n"] for c in done),
        "cached_tokens": sum(c["cache_n"] for c in done),
        "prompt_s": round(sum(c["prompt_s"] for c in done), 3),
        "generated": sum(c["predicted_n"] for c in done),
        "decode_s": round(sum(c["predicted_s"] for c in done), 3),
        "idle_s": round(max(0.0, end - t0 - busy), 3),
        "cpu_s": _span([c["cpu_in"] for c in calls], [c["cpu_out"] for c in calls]),
        "cpu_replies_s": _span([c["cpu_in"] for c in calls], [c["cpu_out"] for c in calls if not c["format"]]),
    }


def _span(starts: list[float], ends: list[float]) -> float | None:
    """From the first start to the last end; None when no call gave one (a figure no sample gave)."""
    return round(max(ends) - min(starts), 3) if starts and ends else None


def _final_fields(timings: dict[str, Any], total_ns: int) -> dict[str, Any]:
    ms = 1_000_000
    prompt_ns = int(float(timings.get("prompt_ms", 0.0)) * ms)
    eval_ns = int(float(timings.get("predicted_ms", 0.0)) * ms)
    return {
        "done": True,
        "done_reason": "length",
        "total_duration": total_ns,
        "load_duration": 0,
        "prompt_eval_count": int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0)),
        "prompt_eval_duration": prompt_ns,
        "eval_count": int(timings.get("predicted_n", 0)),
        "eval_duration": eval_ns,
    }


async def _demo(slots: int) -> None:  # pragma: no cover - manual check: python -m orchestrator.lab.bench.llama_server
    async with LlamaServer(slots) as url:
        print(f"Ollama-compatible shim on {url}; Ctrl-C stops it")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(_demo(int(sys.argv[1]) if len(sys.argv) > 1 else 1))
