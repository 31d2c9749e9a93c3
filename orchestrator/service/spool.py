"""The spool: where the git hook leaves work when the daemon is down or does not answer.

One JSON file per request in `<state dir>/spool/`, written atomically (a private temp file, fsync,
rename), mode 0600 whatever the umask, in dirs 0700. The daemon drains it at start and watches it
(watchfiles) while it runs. A file is deleted only after its tickets are stored; one that cannot be read,
is not a regular file of the daemon's own user (another user's, a symlink, a FIFO) or is too large, or
whose tickets are refused, moves to `spool/rejected/` with the reason, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from orchestrator import logging as olog
from orchestrator.paths import private_dir

MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""A spooled request larger than this is not read (the hook writes a few KB per commit)."""

Submit = Callable[[dict[str, Any]], Awaitable[list[dict[str, Any]]]]
"""Stores one request's tickets; returns one result per ticket (`status`: queued, duplicate, rejected)."""


def write(folder: Path, request: dict[str, Any]) -> Path:
    """Atomically add one request to the spool; returns its path."""
    private_dir(folder)
    name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(4)}.json"
    tmp = folder / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask took
        with os.fdopen(fd, "w") as f:
            json.dump(request, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)  # the rename itself survives a crash
    finally:
        os.close(dfd)
    return folder / name


def pending(folder: Path) -> list[Path]:
    """Spooled requests, oldest first (temp files and the rejected folder are not requests)."""
    try:
        return sorted(p for p in folder.iterdir() if p.suffix == ".json" and not p.name.startswith("."))
    except FileNotFoundError:
        return []


def read(path: Path) -> bytes:
    """A spooled file's bytes: ValueError unless it is a regular file of this user's, at most
    MAX_REQUEST_BYTES (a symlink is not followed, a FIFO never blocks)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_uid != os.getuid():
            raise ValueError(f"written by another user (uid {st.st_uid}), not by your git hook")
        if st.st_size > MAX_REQUEST_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than a request can be ({MAX_REQUEST_BYTES})")
        return os.read(fd, MAX_REQUEST_BYTES + 1)
    finally:
        os.close(fd)


def _reject(path: Path, reason: str, results: list[dict[str, Any]] | None = None) -> Path:
    dest = private_dir(path.parent / "rejected")
    target = dest / path.name
    request: Any
    unread = False
    try:
        request = json.loads(read(path))
    except (OSError, ValueError):
        try:
            request = {"raw": read(path).decode(errors="replace")}
        except (OSError, ValueError) as e:
            # Not ours or not a file (a symlink, a FIFO, another user's): moved aside as it is, never read.
            request, unread = {"unread": f"{e}; moved as it is to {target.name}.unread"}, True
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"reason": reason, "results": results or [], "request": request}, f, indent=2)
    if unread:
        os.replace(path, dest / f"{path.name}.unread")
    else:
        path.unlink()
    return target


class Spool:
    """The daemon's side: drain once, then drain on every change until stopped."""

    def __init__(self, folder: Path, submit: Submit) -> None:
        self.folder = folder
        self.submit = submit
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def drain(self) -> int:
        """Submit every spooled request; returns how many files were taken."""
        async with self._lock:
            taken = 0
            for path in await asyncio.to_thread(pending, self.folder):
                taken += await self._take(path)
            return taken

    async def _take(self, path: Path) -> int:
        log = olog.get()
        try:
            request = json.loads(await asyncio.to_thread(read, path))
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as e:
            target = await asyncio.to_thread(_reject, path, f"unreadable: {e}")
            log.warning(olog.Event.SPOOL_REJECTED, file=str(target), reason="Unreadable", error=str(e))
            return 1
        try:
            results = await self.submit(request)
        except Exception as e:
            log.error(olog.Event.SPOOL_ERROR, file=str(path), error=f"{type(e).__name__}: {e}", exc_info=True)
            return 0
        refused = [r for r in results if r.get("status") == "rejected"]
        if refused:
            target = await asyncio.to_thread(_reject, path, "some tickets were refused", results)
            log.warning(
                olog.Event.SPOOL_REJECTED,
                file=str(target),
                reason="Refused",
                errors=[r.get("error") for r in refused],
            )
        else:
            await asyncio.to_thread(path.unlink, missing_ok=True)
        log.info(olog.Event.SPOOL_SUBMITTED, file=path.name, results=results)
        return 1

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="spool-watch")

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=5)
            except TimeoutError:
                olog.get().warning(olog.Event.SPOOL_ERROR, error="the spool watcher did not stop in 5 s; cancelled")
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        from watchfiles import awatch

        private_dir(self.folder)
        await self.drain()  # anything written between the start-up drain and the watch
        async for _ in awatch(self.folder, stop_event=self._stop, recursive=False, debounce=50, step=20):
            try:
                await self.drain()
            except Exception as e:  # noqa: BLE001 - the watcher must outlive one bad drain
                olog.get().error(olog.Event.SPOOL_ERROR, error=f"{type(e).__name__}: {e}", exc_info=True)
