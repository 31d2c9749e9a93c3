"""Test kit for the chat plane: the Ollama double as a real subprocess, and an async client of `/chat`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp


class OllamaDouble:
    """`python -m orchestrator.lab.doubles.ollama` on a free port; stopped by `stop()`."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.lab.doubles.ollama", "--port", "0", "--profile", "fast", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the Ollama double did not start"
        self.url = json.loads(line)["url"]

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def requests(self) -> list[dict[str, Any]]:
        return self.get("/_double/requests")["requests"]

    def stop(self) -> None:
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def write_config(home: Path, url: str, *, parallel: int = 1, **chat: Any) -> None:
    (home / "config").mkdir(parents=True, exist_ok=True)
    lines = ["[ollama]", f'host = "{url}"', f"parallel = {parallel}"]
    for key in ("max_queue",):
        if key in chat:
            lines.append(f"{key} = {chat.pop(key)}")
    lines.append("[chat]")
    lines += [f"{k} = {json.dumps(v)}" for k, v in chat.items()]
    (home / "config" / "config.toml").write_text("\n".join(lines) + "\n")


async def turn(
    sock: Path, session: str, text: str, *, end: bool = False, timeout: float = 60
) -> tuple[int, list[dict[str, Any]]]:
    """One chat turn over the daemon's socket: the HTTP status and every NDJSON event."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as http,
        http.post(
            f"http://localhost/chat/{session}",
            json={"text": text, "end": end},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as r,
    ):
        if r.status != 200:
            return r.status, [{**(await r.json()), "retry_after_header": r.headers.get("Retry-After")}]
        return 200, [json.loads(line) async for line in r.content]


async def get(sock: Path, path: str) -> Any:
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as http,
        http.get(f"http://localhost{path}", timeout=aiohttp.ClientTimeout(total=10)) as r,
    ):
        return await r.json()


async def wait_for(sock: Path, check: Any, timeout: float = 30) -> Any:
    """Poll `GET /chat` until `check(stats)` holds; the stats, or an AssertionError with them."""
    import asyncio

    deadline = time.monotonic() + timeout
    stats: Any = None
    while time.monotonic() < deadline:
        stats = await get(sock, "/chat")
        if check(stats):
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not met in {timeout}s: {stats}")
