"""Every change under a directory tree, from Linux inotify, names kept as the bytes the kernel gives.

A job names its files as it likes: `p\\377` is no UTF-8, `a\\nb` holds a newline. The watch must see every one
of them and never fail on one (watchfiles' Rust core decodes each path to text and raises on such a name,
ending the whole watch). Here names stay bytes until `os.fsdecode` (surrogate escapes, as pygit2 reads them).

`Tree` watches a directory and every directory under it: each is opened without following a link (a
directory swapped for a link is never entered, so nothing outside the tree is watched), and its watch is set
on that open handle. A directory that appears later is watched and then listed, so files made in it before its
watch was in place are reported too. Directories named in `skip` (a job's `.git`) are not watched.

What the kernel cannot keep is said, never hidden: a queue overflow reads as None (compute everything again),
and a tree with more directories than `max_watches` (or than the kernel lets this user watch) raises
`WatchLimit` (the caller can no longer see every change, and must act as if everything changed).

Sync code, for one thread of its own (`read` blocks up to its timeout).
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import struct
from collections.abc import Iterable
from pathlib import Path

__all__ = ["MAX_WATCHES", "Tree", "WatchLimit"]

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

MASK = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK
)  # fmt: skip
_HEADER = struct.Struct("iIII")
READS = 64
"""Reads of the queue (64 KiB each) one `read` makes at most: a batch stays bounded, the rest comes next time."""
MAX_WATCHES = 100_000
"""Directories one tree may watch (each costs the kernel about 1 KiB); past that the tree raises `WatchLimit`."""


class WatchLimit(OSError):
    """The tree has more directories than can be watched (ours, or the kernel's `max_user_watches`)."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


def _errno_raise(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


class Tree:
    """A watch on `root` and every directory under it (but those named in `skip`)."""

    def __init__(self, root: Path | str, *, skip: Iterable[bytes] = (b".git",), max_watches: int = MAX_WATCHES) -> None:
        self.root = os.fsencode(root)
        self.skip = frozenset(skip)
        self.max_watches = max_watches
        self._fd = -1
        self._dirs: dict[int, bytes] = {}
        """wd -> the directory's path relative to the root (b"" for the root)."""
        self._wds: dict[bytes, int] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Watch the root and every directory under it (WatchLimit past `max_watches`)."""
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            _errno_raise("inotify_init1")
        self._fd = fd
        try:
            self._add_tree(b"", report=None)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._dirs.clear()
        self._wds.clear()

    def __enter__(self) -> Tree:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def watched(self) -> int:
        """How many directories are watched now."""
        return len(self._dirs)

    # -- reading ---------------------------------------------------------------------------------

    def read(self, timeout: float, wake: int = -1) -> list[bytes] | None:
        """The paths (relative to the root, bytes) that changed, once any did (at most `timeout` seconds of
        waiting: [] if none); None if the kernel dropped events (everything may have changed). A new directory is
        watched and its entries reported; a directory moved or deleted stops being watched (its path is reported).
        `wake`: a descriptor that ends the wait at once when it can be read (its owner is stopping the reader)."""
        ready, _, _ = select.select([self._fd] if wake < 0 else [self._fd, wake], [], [], timeout)
        if self._fd not in ready:
            return []
        changed: list[bytes] = []
        for _ in range(READS):
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            if self._parse(data, changed):
                return None
        return changed

    def _parse(self, data: bytes, changed: list[bytes]) -> bool:
        """Append what `data` says changed; True if the queue overflowed."""
        pos = 0
        while pos + _HEADER.size <= len(data):
            wd, mask, _cookie, size = _HEADER.unpack_from(data, pos)
            name = data[pos + _HEADER.size : pos + _HEADER.size + size].rstrip(b"\0")
            pos += _HEADER.size + size
            if mask & IN_Q_OVERFLOW:
                return True
            parent = self._dirs.get(wd)
            if parent is None:
                continue  # a watch removed meanwhile (its IN_IGNORED, or events queued before the removal)
            if mask & IN_IGNORED:
                self._forget_wd(wd)
                continue
            if not name:  # the directory itself: deleted or moved (its parent reports the name as well)
                if mask & (IN_DELETE_SELF | IN_MOVE_SELF) and parent:
                    self._forget(parent)
                    changed.append(parent)
                continue
            path = parent + b"/" + name if parent else name
            changed.append(path)
            if mask & IN_ISDIR:
                if mask & (IN_MOVED_FROM | IN_DELETE):
                    self._forget(path)
                elif mask & (IN_CREATE | IN_MOVED_TO) and name not in self.skip:
                    self._add_tree(path, report=changed)
        return False

    # -- watches ---------------------------------------------------------------------------------

    def _add_tree(self, top: bytes, report: list[bytes] | None) -> None:
        """Watch `top` and the directories under it, each opened with no link followed; with `report`, every
        entry found is appended to it (they may have been made before their directory was watched)."""
        todo = [top]
        while todo:
            rel = todo.pop()
            try:
                fd = self._open_dir(rel)
            except OSError:
                continue  # gone, or a link or a file now: nothing to watch there
            try:
                self._watch(fd, rel)
                with os.scandir(fd) as entries:
                    for entry in entries:
                        name = os.fsencode(entry.name)
                        path = rel + b"/" + name if rel else name
                        if report is not None:
                            report.append(path)
                        try:
                            is_dir = entry.is_dir(follow_symlinks=False)
                        except OSError:
                            continue
                        if is_dir and name not in self.skip:
                            todo.append(path)
            finally:
                os.close(fd)

    def _open_dir(self, rel: bytes) -> int:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.root, flags)
        for name in rel.split(b"/") if rel else ():
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            finally:
                os.close(fd)
            fd = nfd
        return fd

    def _watch(self, fd: int, rel: bytes) -> None:
        if rel in self._wds:
            return
        if len(self._dirs) >= self.max_watches:
            raise WatchLimit(errno.ENOSPC, f"more than {self.max_watches} directories to watch")
        # The watch goes on the directory this handle opened (its /proc link), not on a path a job could swap.
        target = f"/proc/self/fd/{fd}".encode()
        wd = _libc.inotify_add_watch(self._fd, target, MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if err == errno.ENOSPC:
                raise WatchLimit(err, "the kernel's watches for this user are all taken (fs.inotify.max_user_watches)")
            if err in (errno.ENOENT, errno.ENOTDIR):
                return
            raise OSError(err, f"inotify_add_watch {os.fsdecode(rel) or '.'}: {os.strerror(err)}")
        old = self._dirs.get(wd)
        if old is not None and old != rel:  # the same directory under a new name (moved): one name is true
            self._wds.pop(old, None)
        self._dirs[wd] = rel
        self._wds[rel] = wd

    def _forget(self, rel: bytes) -> None:
        """Stop watching `rel` and every directory under it (moved away or deleted: their paths are stale)."""
        prefix = rel + b"/"
        for path in [p for p in self._wds if p == rel or p.startswith(prefix)]:
            wd = self._wds.pop(path)
            self._dirs.pop(wd, None)
            _libc.inotify_rm_watch(self._fd, wd)  # fails harmlessly for a deleted directory's watch

    def _forget_wd(self, wd: int) -> None:
        rel = self._dirs.pop(wd, None)
        if rel is not None and self._wds.get(rel) == wd:
            del self._wds[rel]
