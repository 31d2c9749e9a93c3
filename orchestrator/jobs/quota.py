"""A running job's disk use, held to `jobs.max_bytes`, and the room left on its disk, held above `jobs.min_free_bytes`.

What a job writes goes to its workspace and its private dir (scratch HOME, TMPDIR), both under the state dir,
whose disk it shares with the daemon's database. `guard` measures both every few seconds (`du`, a process of
its own: a tree of a million files costs the daemon's event loop nothing) and says when the job is over its
quota, or when the disk has less room left than `min_free` (then every job writing there is stopped, whoever
filled it: a disk that fills up stops them all anyway, and the daemon's own writes with them).

A measure, not a kernel limit: between two looks a fast job can write a few more GiB, and what `du` cannot read
(a directory the job made unreadable, a file it deleted but holds open) is not counted; the free-space floor
and the store's reserve (`store.reserve`) are there for that.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.models import Code

EVERY = 5.0
"""Seconds between two looks at least; a look that took long waits ten times as long before the next."""


@dataclass(frozen=True, slots=True)
class Over:
    """Why a job must stop: its code (TooBig, NoSpace) and a reason a person can act on."""

    code: Code
    reason: str


def size(n: int) -> str:
    """Bytes for a person: `1.5 GiB`, `300 MiB`, `12 KiB`."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


async def usage(paths: Sequence[Path]) -> int | None:
    """Bytes of disk the trees at `paths` take (blocks, not apparent sizes: a sparse file costs what it holds), one
    file system each, links not followed; None when `du` is missing or measured nothing."""
    there = [str(p) for p in paths if p.exists()]
    du = shutil.which("du", path="/usr/bin:/bin")
    if not there or du is None:
        return None
    proc = await asyncio.create_subprocess_exec(
        du, "-s", "-x", "-B1", "--", *there,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out, _ = await proc.communicate()
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    # Exit 1 only says some entry could not be read (a job's chmod 000): what it could read still counts.
    total = 0
    for line in out.decode(errors="replace").splitlines():
        head = line.split("\t", 1)[0]
        if head.isdigit():
            total += int(head)
    return total if out else None


def free(path: Path) -> int | None:
    """Bytes free on `path`'s file system for an unprivileged writer (None if it cannot be asked)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def judge(used: int | None, room: int | None, max_bytes: int, min_free: int, where: Path) -> Over | None:
    """Whether a job that uses `used` bytes, on a disk with `room` free, must stop (pure)."""
    if max_bytes and used is not None and used > max_bytes:
        return Over(
            Code.TOO_BIG,
            f"its workspace and scratch dirs grew to {size(used)}, past jobs.max_bytes ({size(max_bytes)}): it was "
            "stopped; raise the limit or keep its output smaller",
        )
    if min_free and room is not None and room < min_free:
        return Over(
            Code.NO_SPACE,
            f"the disk that holds {where} has {size(room)} free, less than jobs.min_free_bytes ({size(min_free)}): "
            "it was stopped before the disk fills up; free space there (`orchestrator clean ID` removes an ended "
            "job's workspace), then revise or retry it",
        )
    return None


async def guard(paths: Sequence[Path], max_bytes: int, min_free: int, *, every: float | None = None) -> Over:
    """Look at the job's disk use and its disk's free room until one of them is over its limit; why."""
    where = paths[0]
    while True:
        started = time.monotonic()
        used = await usage(paths) if max_bytes else None
        room = await asyncio.to_thread(free, where) if min_free else None
        over = judge(used, room, max_bytes, min_free, where.parent)
        if over is not None:
            return over
        took = time.monotonic() - started
        await asyncio.sleep(max(EVERY if every is None else every, 10 * took))
