"""What a job has really touched: the paths where its workspace's files differ from its base commit.

`actual_paths` is the fact admission reads for a running job (DESIGN.md, "Admit", rule 2): every
path whose file differs from the base, untracked files included, ignored files not, both sides of a
rename. It is read from the files through the workspace's admin dir (`git.workspace`), never from the
job's own index, HEAD or commits. `ChangeWatcher` keeps that set current while an agent works and tells
its owner the moment it changes.

The set is bounded: past `MAX_TRACKED` paths (or when the watch cannot see every directory) it is `WHOLE`,
the repository's root, which overlaps every path: the honest answer when the job touched too much to list,
and the one admission is safe with (another job of the repository waits for it).

Keeping it current costs what changed, not the size of the tree: the watch (`git.inotify`) names the paths
that changed, and only those are compared with the base (`Compare`), in the watch's own thread. The whole
tree is diffed only when the watch starts or restarts, when events were lost, or when ignore rules or
attributes change (`.gitignore`, `.gitattributes`). No patch text is made: the diff's own list of files says
which paths differ.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import stat
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import pygit2
import structlog
from pygit2.filter import FilterList

from orchestrator import beneath
from orchestrator.core.models import ROOT
from orchestrator.git import inotify
from orchestrator.git.workspace import Workspace
from orchestrator.logging import Event

__all__ = ["MAX_TRACKED", "WHOLE", "ChangeWatcher", "Compare", "OnChange", "actual_paths"]

log = structlog.get_logger(__name__)

OnChange = Callable[[frozenset[str]], Awaitable[None]]
MAX_TRACKED = 10_000
"""Paths a job's set lists at most; past that it is `WHOLE` (default of `jobs.max_tracked_paths`)."""
WHOLE: frozenset[str] = frozenset({ROOT})
"""A set that claims the whole repository: the job touched too much to list, or the watch could not see it all."""
READY_MS = 200
"""How long the watch thread waits for events at a time (`stop` ends the wait at once)."""
RESTART_MIN, RESTART_MAX = 0.1, 5.0
"""Seconds before a watch that failed starts again: doubled after each failure in a row, up to the max."""
RESCAN_EVERY = 10.0
"""A whole-tree diff the watch asks for (events lost, ignore rules changed) comes at most once per this many times
what the last one took: a tree that takes 1 s to diff is diffed whole at most every 10 s, whatever the job does."""
RESCAN_NAMES = frozenset({".gitignore", ".gitattributes"})
"""Files whose change can change whether other files count (ignore rules, filters): all is compared again."""


def actual_paths(worktree: Path | str, base: str, *, limit: int | None = None) -> frozenset[str]:
    """Repo-relative POSIX paths whose files in the workspace `worktree` differ from commit `base`.

    Modified, added (untracked, not ignored) and deleted files; renames count both sides. What the job
    committed in its own git dir does not count: its files do. Past `limit` paths: `WHOLE`. Sync: call it
    through `asyncio.to_thread` (libgit2 does the work, mostly without the interpreter's lock).
    """
    try:
        diff = Workspace.at(worktree).changed(base)
    except pygit2.GitError as e:  # a tree libgit2 will not read (nested over 100 deep): what it touched is unknown
        log.warning(
            Event.CHANGES_TOO_MANY, worktree=str(worktree), reason=str(e),
            message="its files cannot be compared with its base: its paths are the whole repository",
        )  # fmt: skip
        return WHOLE
    paths: set[str] = set()
    for delta in diff.deltas:
        paths.add(delta.old_file.path)
        paths.add(delta.new_file.path)
        if limit is not None and len(paths) > limit:
            return WHOLE
    return frozenset(paths)


class Compare:
    """Whether single paths of a workspace differ from its base, read from the files (sync, one thread).

    The same answer as `actual_paths` for each path: a file or link whose blob or mode differs from the base's
    entry, one the base has and the workspace has not (deleted, or a directory, FIFO or socket now), one the
    base has not (unless git ignores it). Files are read beneath the workspace, following no link.
    """

    def __init__(self, worktree: Path | str, base: str) -> None:
        self.root = Path(worktree)
        self.repo = Workspace.at(self.root).repo()
        self.base = self.repo.revparse_single(base).peel(pygit2.Tree)

    def expand(self, path: str, tracked: list[str]) -> set[str]:
        """`path` and what its change may have changed: the base's files under it (a directory of the base moved
        or deleted) and the tracked paths under it (`tracked` sorted)."""
        out = {path}
        entry = self._entry(path)
        if isinstance(entry, pygit2.Tree):
            out.update(f"{path}/{sub}" for sub in _blobs(entry))
        prefix = path + "/"
        i = bisect.bisect_left(tracked, prefix)
        while i < len(tracked) and tracked[i].startswith(prefix):
            out.add(tracked[i])
            i += 1
        return out

    def differs(self, path: str, root: beneath.Root) -> bool:
        names = tuple(path.split("/"))
        if any(n.lower() == ".git" for n in names):
            return False  # a job's own git dir, a nested repository's, `.GIT`: git never takes what is in one
        entry = self._entry(path)
        base = entry if isinstance(entry, pygit2.Blob) else None
        mode = self._base_mode(path) if base is not None else None
        now = _read(root, names)
        if now is None:
            return base is not None
        kind, target = now
        if base is None:
            return not self._ignored(path)
        if kind == "link":
            return mode != pygit2.enums.FileMode.LINK or pygit2.hash(target) != base.id
        exe = kind == "exe"
        want = pygit2.enums.FileMode.BLOB_EXECUTABLE if exe else pygit2.enums.FileMode.BLOB
        if mode != want:
            return True
        return self._content_differs(path, root, names, base)

    def _content_differs(self, path: str, root: beneath.Root, names: tuple[str, ...], base: pygit2.Blob) -> bool:
        filters = self._filters(path)
        data = _content(root, names, base.size if filters is None else None)
        if data is None:
            return True  # a size that differs (no filter applies), or gone meanwhile
        if filters is not None:
            data = filters.apply_to_buffer(data)
        return pygit2.hash(data) != base.id

    def _entry(self, path: str) -> pygit2.Object | None:
        try:
            return self.base[path]
        except (KeyError, ValueError, TypeError):
            return None

    def _base_mode(self, path: str) -> int | None:
        head, _, name = path.rpartition("/")
        parent = self.base if not head else self._entry(head)
        if not isinstance(parent, pygit2.Tree):
            return None
        try:
            return int(parent[name].filemode)
        except (KeyError, ValueError, TypeError):
            return None

    def _ignored(self, path: str) -> bool:
        try:
            return bool(self.repo.path_is_ignored(path))
        except (pygit2.GitError, UnicodeError):
            return False  # a name libgit2 cannot take as text: it counts (and is refused when the job ends)

    def _filters(self, path: str) -> FilterList | None:
        try:
            return self.repo.load_filter_list(path, pygit2.enums.FilterMode.CLEAN)
        except (pygit2.GitError, UnicodeError):
            return None


def _blobs(tree: pygit2.Tree, prefix: str = "") -> Iterable[str]:
    for e in tree:
        if isinstance(e, pygit2.Tree):
            yield from _blobs(e, f"{prefix}{e.name}/")
        else:
            yield f"{prefix}{e.name}"


def _read(root: beneath.Root, names: tuple[str, ...]) -> tuple[str, bytes] | None:
    """("link", its target) or ("file" / "exe", b"") for what is at `names` now; None when there is no file or link
    there (absent, a directory, a FIFO, a socket, or a link on the way)."""
    try:
        parent = root.open(names[:-1], os.O_RDONLY | os.O_DIRECTORY) if len(names) > 1 else os.dup(root.fd)
    except (beneath.Escape, OSError):
        return None
    try:
        st = os.stat(names[-1], dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            return "link", os.fsencode(os.readlink(names[-1], dir_fd=parent))
        if stat.S_ISREG(st.st_mode):
            return ("exe" if st.st_mode & stat.S_IXUSR else "file"), b""
        return None
    except OSError:
        return None
    finally:
        os.close(parent)


def _content(root: beneath.Root, names: tuple[str, ...], size: int | None) -> bytes | None:
    """The file's bytes (opened beneath the root, no link followed); None if it is gone or, with `size`, if its
    size is not that (no need to read it: it differs)."""
    try:
        fd = root.open(names, os.O_RDONLY | os.O_NONBLOCK)
    except (beneath.Escape, OSError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class ChangeWatcher:
    """Watches one workspace and reports its actual path set each time that set changes.

    A thread of its own watches the tree (`git.inotify`), compares the paths that changed with the base
    (`Compare`), and hands each new set to the event loop, where `on_change` runs, one call at a time, with the
    latest set (sets that came meanwhile are skipped: each is whole). Writes inside `.git` and to git-ignored
    files cost a check but never a report. An owner hears of a new path well within a second of the write.

    The watch does not stop on an error: it logs it (`changes.watch_restarted`) and starts again after a short
    back-off, comparing everything again then, so nothing written meanwhile is missed. When the set passes
    `limit` paths, or the tree has more directories than can be watched, the set is `WHOLE` and the watch ends
    (nothing it could see would change that): the job claims the whole repository until it ends.
    """

    def __init__(
        self,
        worktree: Path,
        base: str,
        on_change: OnChange,
        *,
        limit: int = MAX_TRACKED,
        debounce_ms: int = 50,
        stop_timeout: float = 5.0,
        max_watches: int = inotify.MAX_WATCHES,
    ) -> None:
        self.worktree = Path(worktree).resolve()
        self.base = base
        self.on_change = on_change
        self.limit = limit
        self.paths: frozenset[str] = frozenset()
        """The last set reported (empty before `start`)."""
        self.restarts = 0
        """How often the watch failed and started again."""
        self._debounce = debounce_ms / 1000
        self._stop_timeout = stop_timeout
        self._max_watches = max_watches
        self._stop = threading.Event()
        self._state = threading.Lock()
        """Guards `_tracked` between the watch thread and `refresh`."""
        self._tracked: frozenset[str] = frozenset()
        self._seq = 0
        """Counts the sets computed (under `_state`): a set older than the one reported last is never reported."""
        self._reported = -1
        self._thread: threading.Thread | None = None
        self._wake = -1
        """The write end of the pipe whose read end the watch thread waits on beside its events: `stop` closes it,
        which ends the thread's wait at once (the thread closes the read end when it ends)."""
        self._task: asyncio.Task[None] | None = None
        self._latest: tuple[int, frozenset[str]] | None = None
        self._ready = asyncio.Event()
        self._publish = asyncio.Lock()
        self._root = str(self.worktree)

    async def start(self) -> frozenset[str]:
        """Start watching, then compute (and report, if non-empty) the initial set; returns it.

        The watch thread compares everything again once its watches are in place: a write made before that
        (after this first diff) is seen by that second one, and every later write by the watch.
        """
        if self._task is not None:
            raise RuntimeError(f"watcher for {self.worktree} already started")
        loop = asyncio.get_running_loop()
        self._stop.clear()
        self._task = asyncio.create_task(self._consume(), name=f"watch {self._root}")
        wake, self._wake = os.pipe()
        self._thread = threading.Thread(target=self._watch, args=(loop, wake), name=f"watch {self._root}", daemon=True)
        self._thread.start()
        return await self.refresh()

    async def stop(self) -> None:
        """Stop watching; waits a bounded time for the watch thread to finish, then cancels."""
        task, self._task = self._task, None
        self._stop.set()
        if task is None:
            return
        wake, self._wake = self._wake, -1
        if wake >= 0:
            os.close(wake)  # the thread's end reads EOF: it stops waiting for events now, not after READY_MS
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join, self._stop_timeout)
            if thread.is_alive():
                log.warning(Event.CHANGES_WATCH_STOP_TIMEOUT, worktree=self._root, timeout=self._stop_timeout)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def refresh(self) -> frozenset[str]:
        """Compare everything now (e.g. when the job ends); reports the set if it changed; returns it."""
        seq, paths = await asyncio.to_thread(self._full)
        await self._report(seq, paths)
        return self.paths

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- on the loop -----------------------------------------------------------------------------

    def _offer(self, seq: int, paths: frozenset[str]) -> None:
        if self._latest is None or seq > self._latest[0]:
            self._latest = (seq, paths)
        self._ready.set()

    async def _consume(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            latest, self._latest = self._latest, None
            if latest is None:
                continue
            try:
                await self._report(*latest)
            except Exception:
                # A failing callback must not end the watch: the next set is reported as usual.
                log.exception(Event.WORKTREE_ERROR, worktree=self._root, stage="change report")

    async def _report(self, seq: int, paths: frozenset[str]) -> None:
        async with self._publish:
            if seq <= self._reported:
                return  # a newer set was reported meanwhile
            self._reported = seq
            if paths != self.paths:
                self.paths = paths
                await self.on_change(paths)

    # -- in the watch thread ---------------------------------------------------------------------

    def _send(self, loop: asyncio.AbstractEventLoop, seq_paths: tuple[int, frozenset[str]] | None) -> None:
        if seq_paths is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            loop.call_soon_threadsafe(self._offer, *seq_paths)

    def _track(self, paths: frozenset[str]) -> tuple[int, frozenset[str]]:
        """`paths` is the tracked set from now on (under `_state`); numbered for `_report`."""
        self._tracked = paths
        self._seq += 1
        return self._seq, paths

    def _full(self) -> tuple[int, frozenset[str]]:
        """Compare the whole tree (any thread); the set it gives is the tracked one from now on."""
        with self._state:
            return self._track(actual_paths(self.worktree, self.base, limit=self.limit))

    def _watch(self, loop: asyncio.AbstractEventLoop, wake: int) -> None:
        try:
            self._watch_until_stopped(loop, wake)
        finally:
            os.close(wake)

    def _watch_until_stopped(self, loop: asyncio.AbstractEventLoop, wake: int) -> None:
        delay = RESTART_MIN
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._watch_once(loop, wake)
                return
            except inotify.WatchLimit as e:
                log.warning(
                    Event.CHANGES_TOO_MANY,
                    worktree=self._root,
                    reason=str(e),
                    message="the watch cannot see every directory: the job's paths are the whole repository",
                )
                with self._state:
                    whole = self._track(WHOLE)
                self._send(loop, whole)
                return
            except Exception as e:  # logged; the watch starts again and compares everything
                if time.monotonic() - started > 10 * RESTART_MAX:
                    delay = RESTART_MIN  # it ran a good while: not a failure in a row
                self.restarts += 1
                log.warning(
                    Event.CHANGES_WATCH_RESTARTED,
                    worktree=self._root,
                    error=f"{type(e).__name__}: {e}",
                    restarts=self.restarts,
                    delay=delay,
                    exc_info=True,
                )
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, RESTART_MAX)

    def _watch_once(self, loop: asyncio.AbstractEventLoop, wake: int) -> None:
        with inotify.Tree(self.worktree, max_watches=self._max_watches) as tree:
            # The watches are in place: what was written before them is found by comparing it all.
            took = time.monotonic()
            self._send(loop, self._full())
            due = time.monotonic() + RESCAN_EVERY * (time.monotonic() - took)
            compare = Compare(self.worktree, self.base)
            pending = False
            while not self._stop.is_set():
                if self._tracked == WHOLE:
                    return  # nothing the watch could see would change it
                batch = self._gather(tree, wake)
                if batch is None:
                    log.info(Event.CHANGES_EVENTS_LOST, worktree=self._root)
                pending = pending or batch is None or self._rescan(batch)
                # A job that rewrites its .gitignore in a loop asks for whole-tree diffs: at most one per RESCAN_EVERY
                # times what the last one took; meanwhile its other paths are compared as usual.
                if pending and time.monotonic() >= due:
                    pending = False
                    took = time.monotonic()
                    self._send(loop, self._full())
                    due = time.monotonic() + RESCAN_EVERY * (time.monotonic() - took)
                    compare = Compare(self.worktree, self.base)  # attributes and ignore rules read anew
                elif batch:
                    self._send(loop, self._apply(compare, batch))

    def _gather(self, tree: inotify.Tree, wake: int) -> list[bytes] | None:
        """The paths that changed, gathered for the debounce time once one did ([] if none did for a while, or the
        watch is stopping); None when events were lost."""
        batch = tree.read(READY_MS / 1000, wake)
        if batch and self._debounce:
            deadline = time.monotonic() + self._debounce
            while batch is not None and not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
                more = tree.read(left, wake)
                batch = None if more is None else batch + more
        return batch

    @staticmethod
    def _rescan(batch: list[bytes]) -> bool:
        return any(os.fsdecode(p).rpartition("/")[2] in RESCAN_NAMES for p in batch)

    def _apply(self, compare: Compare, batch: list[bytes]) -> tuple[int, frozenset[str]] | None:
        """The tracked set after `batch` (None if it did not change)."""
        with self._state:
            before = self._tracked
            tracked = set(before)
            ordered = sorted(before)
            todo: set[str] = set()
            for raw in set(batch):
                todo |= compare.expand(os.fsdecode(raw), ordered)
            with beneath.Root(self.worktree) as root:
                for path in todo:
                    if compare.differs(path, root):
                        tracked.add(path)
                        if len(tracked) > self.limit:
                            log.warning(
                                Event.CHANGES_TOO_MANY,
                                worktree=self._root,
                                limit=self.limit,
                                message=f"it touched more than {self.limit} paths: its paths are the whole repository",
                            )
                            return self._track(WHOLE)
                    else:
                        tracked.discard(path)
            if tracked == before:
                return None
            return self._track(frozenset(tracked))
