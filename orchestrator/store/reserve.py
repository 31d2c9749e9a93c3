"""Room kept aside on the database's disk, so that a full disk still lets the daemon settle its jobs.

A job can fill the disk that holds the state dir (its workspace lives there). Then no write can be stored, not
even the one that ends the job and frees its paths and its slot. So a file of `RESERVE_BYTES` is kept beside the
database: a write that settles a job (a move to another state, a deletion) that finds the disk full deletes it
and tries once more, and goes through. The file is made again once the disk has room (four times its size free).

Sync code (file system calls): the store calls it through `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

RESERVE_BYTES = 8 * 1024 * 1024
"""What the reserve holds: a few hundred settling writes (a move writes a few pages to the write-ahead log)."""
ROOM = 4
"""The reserve is made again only when the disk has this many times its size free."""


class Reserve:
    """The reserve file beside the database (`<db>-reserve`)."""

    def __init__(self, path: Path, size: int = RESERVE_BYTES) -> None:
        self.path = path
        self.size = size

    @property
    def present(self) -> bool:
        try:
            return self.path.stat().st_size >= self.size
        except FileNotFoundError:
            return False

    def make(self) -> bool:
        """Make the reserve if it is missing and the disk has room for it; whether it is there now."""
        if self.present:
            return True
        try:
            st = os.statvfs(self.path.parent)
        except OSError:
            return False
        if st.f_bavail * st.f_frsize < ROOM * self.size:
            return False
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, self.size)
            except OSError:  # a file system without fallocate: written out instead (blocks really taken)
                os.ftruncate(fd, 0)
                chunk = b"\0" * (1 << 20)
                for _ in range(self.size // len(chunk)):
                    os.write(fd, chunk)
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # half a reserve would only look like one
            return False
        finally:
            os.close(fd)
        return True

    def spend(self) -> bool:
        """Give the reserve's room back to the disk; whether there was one."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True
