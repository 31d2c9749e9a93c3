"""The sd_notify protocol by hand: readiness, status, watchdog and stopping, without libsystemd.

systemd passes `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace) to a `Type=notify`
service; each message is one datagram of `KEY=VALUE` lines. Outside systemd every call is a no-op.

Readiness is sent once the API socket listens and recovery is done, so `systemctl --user start
orchestrator && orchestrator enqueue ...` never races. `STATUS=` says what runs and what waits and is
sent only when it changes (the job board announces every change; nothing polls). `WATCHDOG=1` is sent
only while the scheduler loop stamps its heartbeat: a stuck loop stops the pings and systemd restarts
the daemon.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from orchestrator import logging as olog
from orchestrator.core.models import WAITING


def _address(value: str) -> str | bytes:
    """`@name` is an abstract-namespace socket: a leading NUL byte instead of the `@`."""
    return b"\0" + value[1:].encode() if value.startswith("@") else value


def notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send one sd_notify datagram; False when not under systemd or the send failed (logged)."""
    env = os.environ if env is None else env
    target = env.get("NOTIFY_SOCKET", "")
    if not target or target[0] not in "/@":
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(message.encode(), _address(target))
    except OSError as e:
        olog.get().warning(olog.Event.SERVICE_NOTIFY_FAILED, socket=target, error=str(e))
        return False
    return True


def watchdog_interval(env: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds systemd allows between pings (`WatchdogSec=`), or None when no watchdog is asked of us."""
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    owner = env.get("WATCHDOG_PID", "")
    if owner and owner != str(os.getpid() if pid is None else pid):
        return None  # meant for another process (e.g. a wrapper that exec'd us is gone)
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


def healthy(now: float, heartbeat: float, interval: float) -> bool:
    """The scheduler made progress recently enough to vouch for it: within two thirds of the interval."""
    return now - heartbeat < interval * 2 / 3


def status_line(jobs: Iterable[Mapping[str, Any]]) -> str:
    """`2 running, 1 landing, 5 queued (3 Overlap, 2 Concurrency)` from jobs' `state` and `decision`.

    A waiting job counts under its latest admission reason; one not decided yet counts as `Planning`.
    """
    running = landing = 0
    waiting: Counter[str] = Counter()
    for job in jobs:
        state = str(job.get("state"))
        if state == "running":
            running += 1
        elif state == "landing":
            landing += 1
        elif state in WAITING:
            decision = job.get("decision") or {}
            waiting[str(decision.get("reason") or "Planning") if state == "planned" else "Planning"] += 1
    parts = [f"{running} running"]
    if landing:
        parts.append(f"{landing} landing")
    queued = f"{sum(waiting.values())} queued"
    if waiting:
        queued += " (" + ", ".join(f"{n} {reason}" for reason, n in waiting.most_common()) + ")"
    parts.append(queued)
    return ", ".join(parts)


class Notifier:
    """The daemon's side of the protocol: one instance, owned by the daemon, its tasks cancelled on stop."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.enabled = bool(self.env.get("NOTIFY_SOCKET"))
        self.interval = watchdog_interval(self.env) if self.enabled else None
        self._status = ""
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def tick(self) -> float | None:
        """How often the scheduler must stamp its heartbeat (and we ping) for the watchdog to stay fed."""
        return None if self.interval is None else self.interval / 3

    def send(self, message: str) -> bool:
        return self.enabled and notify(message, self.env)

    def status(self, text: str) -> None:
        """Send `STATUS=text` if it differs from the last one sent."""
        if text != self._status and self.send(f"STATUS={text}"):
            self._status = text

    def ready(self, text: str) -> None:
        self.send(f"READY=1\nSTATUS={text}\nMAINPID={os.getpid()}")
        self._status = text

    def stopping(self) -> None:
        self.send("STOPPING=1\nSTATUS=stopping")

    def changed(self) -> None:
        """Something about the jobs changed: the status task recomputes the line (coalesced)."""
        self._dirty.set()

    def start(self, jobs: Callable[[], Any], heartbeat: Callable[[], float]) -> None:
        """Run the status task (`jobs` is an async callable of job dicts) and, if asked, the watchdog."""
        if not self.enabled:
            return
        self._tasks.append(asyncio.create_task(self._status_loop(jobs), name="sd-status"))
        if self.interval is not None:
            self._tasks.append(asyncio.create_task(self._watchdog_loop(heartbeat), name="sd-watchdog"))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _status_loop(self, jobs: Callable[[], Any]) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                self.status(status_line(await jobs()))
            except Exception as e:  # noqa: BLE001 - a status line must never take the daemon down
                olog.get().warning(olog.Event.SERVICE_NOTIFY_FAILED, error=f"{type(e).__name__}: {e}")
            await asyncio.sleep(0.2)  # coalesce bursts of changes into one line

    async def _watchdog_loop(self, heartbeat: Callable[[], float]) -> None:
        assert self.interval is not None and self.tick is not None
        stalled = False
        while True:
            now = time.monotonic()
            if healthy(now, heartbeat(), self.interval):
                self.send("WATCHDOG=1")
                stalled = False
            elif not stalled:
                stalled = True
                olog.get().error(
                    olog.Event.SERVICE_WATCHDOG_STALLED,
                    seconds=round(now - heartbeat(), 1),
                    interval=self.interval,
                    message="the scheduler loop made no progress: watchdog pings stopped, systemd will restart",
                )
            await asyncio.sleep(self.tick)
