"""A stand-in for llama.cpp's `llama-server` binary: its flags, `/health` and the OpenAI-style SSE stream.

Used to test the Ollama shim in front of the real engine without building it in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from aiohttp import web


async def health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    n = int(body.get("max_tokens", 4))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(n):
        event = {"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
        await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await asyncio.sleep(0.001)
    prompt = sum(len(m["content"].split()) for m in body["messages"])
    timings = {"cache_n": 1, "prompt_n": prompt, "prompt_ms": 12.5, "predicted_n": n, "predicted_ms": 40.0}
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "timings": timings}
    await resp.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
    return resp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    for flag in ("-np", "-c", "-t", "--chat-template", "-a"):
        parser.add_argument(flag)
    parser.add_argument("--no-webui", action="store_true")
    parser.add_argument("--cache-ram")
    args = parser.parse_args()
    if os.environ.get("FAKE_LLAMA_ARGV"):  # where a test reads the flags it was started with
        with open(os.environ["FAKE_LLAMA_ARGV"], "a") as f:
            f.write(json.dumps(sys.argv[1:]) + "\n")
    app = web.Application()
    app.add_routes([web.get("/health", health), web.post("/v1/chat/completions", completions)])
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
