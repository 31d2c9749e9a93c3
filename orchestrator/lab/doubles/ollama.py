"""A protocol double for Ollama: a real local HTTP server that speaks Ollama's API, with an engine *model*.

It is not a language model and not a replacement for Ollama; it is what tests, the demo and the chat
benchmark talk to where no Ollama runs. Production code talks to it exactly as to Ollama (the official
client, the same paths, the same NDJSON): `/api/chat` and `/api/generate` (streamed or not, with the real
`*_duration` / `*_count` figures on the last line, mid-stream `{"error": ...}` lines on request),
`/api/tags`, `/api/ps`, `/api/version`, and 503 "server busy" when its own queue is full.

The engine model lives in `orchestrator.lab.doubles.engine` (slots with per-slot prefix caches, the server's
FIFO queue, one continuous-batching loop where prefill stalls decoding, a contention profile for parallel
decoding, constrained-sampling cost); this module is its HTTP shell. Replies are scripted: plain text of
the profile's length, or for `format="json"` an object shaped by the instruction (`"intent"` → a guessed
intent, `"memories"` → first-person facts found in the user's messages). The `seed` profile is fitted to
the seed's naive table (`python -m orchestrator.lab.bench.calibrate` shows how closely).

Run it alone for demos: `python -m orchestrator.lab.doubles.ollama --port 11434 --profile seed`.
Test hooks (not Ollama's API): `GET /_double/requests` (prompts seen), `POST /_double/faults`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from orchestrator.lab.doubles.engine import Engine, Faults, Profile, Slot, common

__all__ = ["PROFILES", "Engine", "Faults", "Profile", "Server", "Slot", "common", "start"]

VERSION = "0.6.5"
_BUSY = "server busy, please try again.  maximum pending requests exceeded"


PROFILES: dict[str, Profile] = {
    "fast": Profile(),
    # Fitted to the seed's naive rows (hermes3 8B through Ollama; first-Ollama = the classification's answer)
    # by `python -m orchestrator.lab.bench.calibrate --search`: the real naive pipeline at N=1, 2, 4 in virtual
    # time, on the benches' sessions (each with its own earlier conversation and memories, none of it in
    # the server's cache) and a warm server (the shared system part cached in every slot). Five figures
    # are fitted (`calibrate.NAMED`): N=1 first-Ollama, done, drained; N=4 done-wall, drained.
    # Mechanisms, each a real server's: 3 slots (OLLAMA_NUM_PARALLEL) with per-slot prefix caches (a 4th
    # session waits in the FIFO queue; a call that lands on another session's slot reads its history
    # again); prompts read in arrival order, 191 tokens a step (num_batch) at 1.9 ms a token, stalling every
    # sequence being decoded; a decode step of 30 ms whatever the number of sequences in it (batched
    # decoding is nearly free, as on a GPU: the seed drained 4 sessions in 2.2× one session's time).
    # Fit (`python -m orchestrator.lab.bench.calibrate`), seed vs double:
    #   N=1 first-Ollama 0.9 vs 0.89, done 2.1 vs 2.23, drained 9.5 vs 8.61
    #   N=4 done-wall 10.3 vs 9.48, drained 20.7 vs 22.31                  (the named five: within 10 %)
    #   N=2 first-Ollama 1.1 vs 1.53, done 3.5/4.2/5.0 vs 2.91/3.12/3.32, drained 12.9 vs 10.05
    #   N=4 first-Ollama 1.5 vs 2.79, done min/mean 5.9/7.7 vs 5.60/7.13
    # Each session's first call reads its own history, one after another, so first-Ollama grows with N
    # faster than the seed's; and two sessions run side by side to 2.9-3.3 s where the seed measured a
    # spread of 3.5-5.0 s. The searches run here found no parameter set that fits the N=2 row too without
    # losing the named five.
    "seed": Profile(
        name="seed",
        num_parallel=3,
        overhead_s=0.0064,
        step_s=0.0267,
        prefill_s=0.00188,
        decode_s=0.0031,
        contention=(1.0, 1.0, 1.005, 1.01),
        format_s=0.0009,
        batch=191,
        reply_tokens=42,
        json_tokens=(("intent", 12), ("memories", 188)),
    ),
    # Fitted to the real engine (`calibrate.ENGINE`: llama-server with 2 slots, the random-weight model on 2 CPU
    # cores, naive rows) by `python -m orchestrator.lab.bench.calibrate --profile llama-server --search --from-profile
    # --generations 10 --population 4 --others 1` with the token counts fixed to the shim's (a reply runs to 128
    # tokens, a classification to its 16-token cap, an extraction to 128), one step per prompt (n_batch 2048) and
    # any cached prefix restorable by a free slot (llama-server's host-memory prompt cache). Engine vs double:
    #   N=1 first-Ollama 1.39 vs 0.97, done 7.13 vs 5.22, drained 14.85 vs 10.60
    #   N=4 first-Ollama 2.80 vs 2.48, done 8.11/10.71/13.60 vs 9.56/12.69/15.81, drained 30.59 vs 32.10
    # It is too fast alone and too slow in a crowd: on the engine 4 sessions took 1.9x one session's time, in
    # the model 3.0x; no parameter set found fits both (the engine's N=1 rows were also the noisiest, load 4-9).
    "llama-server": Profile(
        name="llama-server",
        num_parallel=2,
        overhead_s=0.0231,
        step_s=0.0197,
        prefill_s=0.00214,
        decode_s=0.0127,
        contention=(1.0, 1.525, 2.425, 3.325),
        batch=2048,
        share_prefix=True,
        reply_tokens=128,
        json_tokens=(("intent", 16), ("memories", 128)),
    ),
}

_TOKEN = re.compile(r"\w+|[^\w\s]")
_FACT = re.compile(r"[^.!?\n]*\b(?:I am|I'm|my|I like|I love|I live|I work|I have|remember)\b[^.!?\n]*", re.I)
_WORDS = ("the", "model", "answers", "with", "a", "plain", "sentence", "about", "it", "and", "then", "more")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


def render(messages: list[dict[str, Any]]) -> list[str]:
    """The prompt's tokens, as a chat template lays them out (role markers, then content)."""
    out: list[str] = []
    for m in messages:
        out += ["<|im_start|>", str(m.get("role", "user")), *tokenize(str(m.get("content", ""))), "<|im_end|>"]
    return [*out, "<|im_start|>", "assistant"]


def script(profile: Profile, messages: list[dict[str, Any]], fmt: Any) -> list[str]:
    """The reply's tokens: deterministic text shaped by the instruction (this is a model of a model)."""
    last = str(messages[-1].get("content", "")) if messages else ""
    users = " ".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
    if fmt:
        if '"intent"' in last or "intent" in last:
            intent = "question" if "?" in users.rsplit("\n", 1)[-1] else "chat"
            return _json_tokens({"intent": intent})
        facts = [f.strip() for f in _FACT.findall(users)]
        target = dict(profile.json_tokens).get("memories", 40)
        body: dict[str, Any] = {"memories": facts[:8]}
        body["notes"] = ""
        while len(_json_tokens(body)) < target:
            body["notes"] = " ".join(_WORDS[i % len(_WORDS)] for i in range(len(tokenize(body["notes"])) + 8))
        return _json_tokens(body)
    topic = tokenize(last)[:6]
    words = ["You", "asked", "about", *topic, "."]
    i = 0
    while len(words) < profile.reply_tokens:
        words.append(_WORDS[i % len(_WORDS)])
        i += 1
    return [w if i == 0 or w in ".,!?" else f" {w}" for i, w in enumerate(words[: profile.reply_tokens])]


def _json_tokens(obj: Any) -> list[str]:
    # Chunks that concatenate back to valid JSON: a token is a run of word characters or one other char.
    return re.findall(r"\w+|\W", json.dumps(obj))


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class Server:
    def __init__(self, profile: Profile) -> None:
        self.engine = Engine(profile)
        self.started = time.time()

    def app(self) -> web.Application:
        app = web.Application()
        app.on_cleanup.append(self._close)
        app.add_routes(
            [
                web.post("/api/chat", self.chat),
                web.post("/api/generate", self.generate),
                web.get("/api/tags", self.tags),
                web.get("/api/ps", self.ps),
                web.get("/api/version", self.version),
                web.get("/", self.root),
                web.get("/_double/requests", self.requests),
                web.post("/_double/faults", self.set_faults),
                web.get("/_double/stats", self.stats),
            ]
        )
        return app

    async def _close(self, app: web.Application) -> None:
        await self.engine.close()  # the batch loop is the engine's task: it ends with the server

    async def root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    def _model_info(self, name: str) -> dict[str, Any]:
        full = name if ":" in name else f"{name}:latest"
        return {
            "name": full, "model": full, "modified_at": _now(), "size": 4_661_224_676,
            "digest": "4f6b83f30b62" + "0" * 52,
            "details": {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
                        "parameter_size": "8.0B", "quantization_level": "Q4_0"},
        }  # fmt: skip

    async def tags(self, request: web.Request) -> web.Response:
        return web.json_response({"models": [self._model_info(m) for m in self.engine.profile.models]})

    async def ps(self, request: web.Request) -> web.Response:
        models = [
            {**self._model_info(m), "expires_at": _now(), "size_vram": 4_661_224_676, "context_length": 4096}
            for m in self.engine.profile.models
        ]
        return web.json_response({"models": models})

    async def requests(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": list(self.engine.seen)})

    async def stats(self, request: web.Request) -> web.Response:
        e = self.engine
        return web.json_response({**e.counts, "active": e.active, "queue": e.queue, "profile": asdict(e.profile)})

    async def set_faults(self, request: web.Request) -> web.Response:
        data = await request.json()
        self.engine.faults = Faults(status=list(data.get("status", [])), error_after=data.get("error_after"))
        return web.json_response({"ok": True})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        received = self.engine.now()
        e = self.engine
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": "invalid JSON body"}, status=400)
        model = str(body.get("model", ""))
        if model.removesuffix(":latest") not in {m.removesuffix(":latest") for m in e.profile.models}:
            return web.json_response({"error": f'model "{model}" not found, try pulling it first'}, status=404)
        if e.faults.status:
            status = e.faults.status.pop(0)
            message = _BUSY if status == 503 else f"injected status {status}"
            return web.json_response({"error": message}, status=status)
        if e.queue >= e.profile.max_queue:
            e.counts["busy"] += 1
            return web.json_response({"error": _BUSY}, status=503)
        if chat:
            messages = list(body.get("messages") or [])
        else:
            messages = [{"role": "system", "content": body.get("system", "")}] if body.get("system") else []
            messages.append({"role": "user", "content": str(body.get("prompt", ""))})
        stream = body.get("stream", True) is not False
        fmt = body.get("format")
        e.counts["calls"] += 1
        e.seen.append({"at": time.time(), "path": request.path, "messages": messages, "format": fmt,
                       "options": body.get("options") or {}})  # fmt: skip
        prompt = render(messages)
        reply = script(e.profile, messages, fmt)
        if (cap := int((body.get("options") or {}).get("num_predict") or 0)) > 0:
            reply = reply[:cap]  # the server ends the call at the cap (its slot is free when the last line goes)
        resp: web.StreamResponse | None = None
        seq = None
        slot = await e.take(prompt)
        try:
            seq = await e.start(slot, prompt, reply, constrained=bool(fmt))
            out: list[str] = []
            while (tok := await seq.out.get()) is not None:
                if e.faults.error_after is not None and len(out) >= e.faults.error_after:
                    e.faults.error_after = None
                    if resp is not None:
                        await resp.write(
                            json.dumps({"error": "an error was encountered while running the model"}).encode() + b"\n"
                        )
                        return resp
                out.append(tok)
                if stream:
                    if resp is None:
                        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
                        await resp.prepare(request)
                    await resp.write(self._chunk(model, chat, tok) + b"\n")
            stats = e.stats(seq, received)
            if resp is None:
                full = json.loads(self._chunk(model, chat, "".join(out)))
                return web.json_response({**full, "done": True, "done_reason": "stop", **stats})
            last = json.loads(self._chunk(model, chat, ""))
            await resp.write(json.dumps({**last, "done": True, "done_reason": "stop", **stats}).encode() + b"\n")
            await resp.write_eof()
            return resp
        except (ConnectionResetError, asyncio.CancelledError):
            e.counts["closed_early"] += 1  # the client closed the stream: the slot is free again at once
            raise
        finally:
            if seq is not None:
                e.stop(seq)
            e.give(slot)

    @staticmethod
    def _chunk(model: str, chat: bool, text: str) -> bytes:
        body: dict[str, Any] = {"model": model, "created_at": _now()}
        if chat:
            body["message"] = {"role": "assistant", "content": text}
        else:
            body["response"] = text
        body["done"] = False
        return json.dumps(body).encode()


async def start(profile: Profile, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str, Server]:
    """Start the double on `host:port` (0: any free port); returns its runner, its URL and the server."""
    server = Server(profile)
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    return runner, f"http://{host}:{sock.getsockname()[1]}", server


def profile_named(name: str, **overrides: Any) -> Profile:
    if name not in PROFILES:
        raise SystemExit(f"unknown profile {name!r}: use one of {', '.join(PROFILES)}")
    return replace(PROFILES[name], **{k: v for k, v in overrides.items() if v is not None})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.lab.doubles.ollama", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=11434)
    ap.add_argument("--profile", default="seed", help=f"one of {', '.join(PROFILES)}")
    ap.add_argument("--parallel", type=int, help="override the profile's num_parallel")
    ap.add_argument("--decode-s", type=float, help="override the profile's decode time per token")
    ap.add_argument("--reply-tokens", type=int, help="override the profile's reply length")
    ap.add_argument("--max-queue", type=int, help="override the profile's queue bound (503 past it)")
    args = ap.parse_args(argv)
    profile = profile_named(
        args.profile, num_parallel=args.parallel, decode_s=args.decode_s, reply_tokens=args.reply_tokens,
        max_queue=args.max_queue,
    )  # fmt: skip

    async def serve() -> None:
        runner, url, _ = await start(profile, args.host, args.port)
        print(json.dumps({"url": url, "profile": profile.name, "num_parallel": profile.num_parallel}), flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a demo server is meant to stop
        asyncio.run(serve())


if __name__ == "__main__":
    main()
