"""A running job's own door to the daemon: what its agent CLI's MCP server (`orchestrator mcp`) asks through.

One UNIX socket per job, in the job's private dir (mode 0600; the sandbox shows that dir, read-only, to that job
alone), made when its runner starts and gone when it ends, with a random token of its own that every request
carries. It answers two questions, for that job only: which paths the other active jobs of its repository hold
(`held`), and may these paths join its claim before it writes them (`claim`: the decision claim growth makes,
asked ahead, `OverlapWatch.reserve`). Nothing else of the daemon is reachable through it: no other job, no verb,
no state.

Wire: one JSON object a line each way, one request a connection: `{"token", "op": "held"}` or
`{"token", "op": "claim", "paths": [...]}`; the answer has `"ok"` and, when false, `"error"`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
from pathlib import Path
from typing import Any

from orchestrator import logging as olog
from orchestrator.core import claims
from orchestrator.core.admission_index import plist
from orchestrator.jobs.watch import OverlapWatch
from orchestrator.paths import private_dir
from orchestrator.runners import mcp

SOCKET = "door.sock"
"""The socket's name in the job's private dir."""
READ_TIMEOUT = 30.0
"""Seconds a connection has to send its request."""
SHOWN = 200
"""Paths of one job an answer lists at most."""


class Door:
    """One job's door: its socket server, open while its runner runs."""

    def __init__(self, job_id: int, path: Path, watch: OverlapWatch) -> None:
        self.job_id = job_id
        self.path = path
        self.watch = watch
        self.token = secrets.token_hex(16)
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> mcp.Door:
        """What the job's MCP server is told: the socket and the token."""
        return mcp.Door(self.path, self.token)

    async def open(self) -> None:
        await asyncio.to_thread(private_dir, self.path.parent)
        sock = await asyncio.to_thread(mcp.bind, self.path)
        self._server = await asyncio.start_unix_server(self._serve, sock=sock, limit=mcp.MAX_LINE)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None
        with olog.best_effort("remove the job's door", OSError, job_id=self.job_id):
            await asyncio.to_thread(self.path.unlink, missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT)
            answer = await self.answer(line)
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (TimeoutError, ValueError, ConnectionError) as e:  # a slow, long or gone client: nothing to answer
            olog.get(job_id=self.job_id).info(olog.Event.DOOR_REFUSED, error=f"{type(e).__name__}: {e}")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def answer(self, line: bytes) -> dict[str, Any]:
        """The answer to one request line (the job's text is hostile: every field checked)."""
        try:
            request = json.loads(line)
        except ValueError:
            return _no("the request is not JSON")
        if not isinstance(request, dict) or not isinstance(request.get("token"), str):
            return _no("the request names no token")
        if not hmac.compare_digest(request["token"].encode(), self.token.encode()):
            olog.get(job_id=self.job_id).warning(olog.Event.DOOR_REFUSED, error="wrong token")
            return _no("wrong token")
        op = request.get("op")
        if op == "held":
            return await self._held()
        if op == "claim":
            paths = request.get("paths")
            if not isinstance(paths, list) or not paths or len(paths) > mcp.MAX_PATHS:
                return _no(f"claim: paths must be a list of 1 to {mcp.MAX_PATHS} paths")
            if not all(isinstance(p, str) and p and len(p) <= 4096 for p in paths):
                return _no("claim: every path must be a non-empty string")
            return await self._claim(paths)
        return _no(f"unknown op {op!r}: this door answers held and claim only")

    async def _held(self) -> dict[str, Any]:
        seen = await self.watch.holding(self.job_id)
        if seen is None:
            return _no("this job is not running")
        mine, others = seen
        held = [
            {"job": job.id, "state": str(job.state), "paths": sorted(paths)[:SHOWN]}
            for job, paths in sorted(others, key=lambda o: o[0].id)
        ]
        return {"ok": True, "claim": sorted(mine)[:SHOWN], "held": held}

    async def _claim(self, asked: list[str]) -> dict[str, Any]:
        wanted: set[str] = set()
        bad: list[str] = []
        for p in asked:
            try:
                wanted.add(claims.normalize(p))
            except claims.ClaimError:
                bad.append(p)
        if bad:
            return _no(f"claim: not a repository path: {plist(bad)}")
        try:
            grant = await self.watch.reserve(self.job_id, frozenset(wanted))
        except claims.ClaimError as e:
            return _no(f"claim: {e}")
        if grant is None:
            return _no("this job is not running")
        if grant.decision is None or grant.grows:
            return {"ok": True, "granted": sorted(grant.paths), "refused": []}
        d = grant.decision
        refused = sorted(grant.paths)
        return {"ok": True, "granted": [], "refused": refused, "why": d.message, "held_by": list(d.blocking)}


class Doors:
    """Makes each job's door, next to the overlap watch that answers it (handed to the executor)."""

    def __init__(self, watch: OverlapWatch) -> None:
        self.watch = watch

    async def open(self, job_id: int, private: Path) -> Door:
        door = Door(job_id, private / SOCKET, self.watch)
        await door.open()
        return door


def _no(why: str) -> dict[str, Any]:
    return {"ok": False, "error": why}
