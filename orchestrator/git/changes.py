"""What a job has really touched: the paths where its workspace's files differ from its base commit.

`actual_paths` is the fact admission reads for a running job (DESIGN.md, "Admit", rule 2): every
path whose file differs from the base, untracked files included, ignored files not, both sides of a
rename. It is read from the files through the workspace's admin dir (`git.workspace`), never from the
job's own index, HEAD or commits. `ChangeWatcher` keeps that set current while an agent works and tells
its owner the moment it changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import pygit2
import structlog
import unidiff
import watchfiles

from orchestrator.git.workspace import Workspace
from orchestrator.logging import Event

__all__ = ["ChangeWatcher", "OnChange", "actual_paths", "paths_from_diff", "unified_diff"]

log = structlog.get_logger(__name__)

OnChange = Callable[[frozenset[str]], Awaitable[None]]
READY_MS = 200
"""How long the watch thread's wait for a change lasts before it looks again (the first wait ends once the
watches are in place, at most this long after they are)."""



def unified_diff(worktree: Path | str, base: str) -> str:
    """`git diff <base>` of the workspace's files as they are now, untracked (not ignored) files as additions."""
    return Workspace.at(worktree).changed(base).patch or ""


def actual_paths(worktree: Path | str, base: str) -> frozenset[str]:
    """Repo-relative POSIX paths whose files in the workspace `worktree` differ from commit `base`.

    Modified, added (untracked, not ignored) and deleted files; renames count both sides. What the job
    committed in its own git dir does not count: its files do. Sync: call it through `asyncio.to_thread`.
    """
    diff = Workspace.at(worktree).changed(base)
    paths = set(_delta_paths(diff))
    # The unified diff is the authoritative record of the change; the deltas above are the same
    # diff's own index of it and catch what a text parser could drop (mode-only, binary, empty files).
    try:
        paths |= paths_from_diff(diff.patch or "")
    except unidiff.UnidiffParseError as exc:
        log.warning(Event.CHANGES_UNPARSABLE_DIFF, worktree=str(worktree), error=str(exc))
    return frozenset(paths)


def paths_from_diff(text: str) -> frozenset[str]:
    """Paths a unified (git-style) diff touches: both sides of renames, binary and mode-only changes too.

    Strips git's `a/` `b/` (and mnemonic `c/ i/ w/ o/`) prefixes, unquotes C-quoted names, skips /dev/null.
    """
    paths: set[str] = set()
    for patched in unidiff.PatchSet(text):
        for name in (patched.source_file, patched.target_file):
            path = _strip_prefix(_unquote(name))
            if path is not None:
                paths.add(path)
    return frozenset(paths)


class ChangeWatcher:
    """Watches one worktree and reports its actual path set each time that set changes.

    Events come from watchfiles' notify backend with a short debounce, so an owner hears of a new
    path well within a second of the write. Writes inside `.git` and to git-ignored files cost a
    check but never a report. `on_change` runs on the event loop, one call at a time, in order.

    Why a thread of its own rather than `watchfiles.awatch`: awatch registers its inotify watches
    on the event loop (75 ms for a 10k-file tree, blocking every other task), gives no signal when
    they are in place, and parks its waits on shared worker threads. Here the watcher is built,
    and waits, in one dedicated thread per worktree. `start` does not wait for the watches to be in place (on a
    big tree that takes a while): once they are, the set is computed again, so no write is missed either way.
    """

    def __init__(
        self,
        worktree: Path,
        base: str,
        on_change: OnChange,
        *,
        debounce_ms: int = 50,
        step_ms: int = 25,
        stop_timeout: float = 5.0,
    ) -> None:
        self.worktree = Path(worktree).resolve()
        self.base = base
        self.on_change = on_change
        self.paths: frozenset[str] = frozenset()
        """The last set computed (empty before `start`)."""
        self._debounce_ms = debounce_ms
        self._step_ms = step_ms
        self._stop_timeout = stop_timeout
        self._stop = threading.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._root = str(self.worktree)
        self._gitfile = str(self.worktree / ".git")

    async def start(self) -> frozenset[str]:
        """Start watching, then compute (and report, if non-empty) the initial set; returns it.

        The watch thread says when its watches are in place, and the set is computed again then: a write made
        before that (after this first diff) is seen by that second one, and every later write by the watch.
        """
        if self._task is not None:
            raise RuntimeError(f"watcher for {self.worktree} already started")
        loop = asyncio.get_running_loop()
        batches: asyncio.Queue[list[str] | None] = asyncio.Queue()
        self._stop.clear()
        thread = threading.Thread(target=self._watch, args=(loop, batches), name=f"watch {self._root}", daemon=True)
        thread.start()
        self._task = asyncio.create_task(self._consume(batches), name=f"watch {self._root}")
        return await self.refresh()

    async def stop(self) -> None:
        """Stop watching; waits a bounded time for the watch thread to finish, then cancels."""
        task, self._task = self._task, None
        self._stop.set()
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), self._stop_timeout)
        except TimeoutError:
            log.warning(Event.CHANGES_WATCH_STOP_TIMEOUT, worktree=self._root, timeout=self._stop_timeout)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def refresh(self) -> frozenset[str]:
        """Recompute the set now (e.g. when the job ends); reports it if it changed; returns it."""
        async with self._lock:
            paths = await asyncio.to_thread(actual_paths, self.worktree, self.base)
            await self._publish(paths)
            return paths

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def _watch(self, loop: asyncio.AbstractEventLoop, batches: asyncio.Queue[list[str] | None]) -> None:
        """The watch thread: registers the watches, says so (an empty batch: compute it all again), then hands
        each filtered batch to the loop."""

        def send(item: list[str] | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
                loop.call_soon_threadsafe(batches.put_nowait, item)

        watching = False
        try:
            # watchfiles' public generator: it registers the watches, then yields each debounced batch, and (with
            # `yield_on_timeout`) an empty one every READY_MS while nothing changes — the first yield of either
            # kind says the watches are in place.
            for raw in watchfiles.watch(
                self._root,
                watch_filter=None,
                debounce=self._debounce_ms,
                step=self._step_ms,
                stop_event=self._stop,
                rust_timeout=READY_MS,
                yield_on_timeout=True,
                raise_interrupt=False,
                ignore_permission_denied=True,
            ):
                if not watching:
                    watching = True
                    send([])
                changed = [path for _, path in raw if self._outside_git(path)]
                if changed:
                    send(changed)
        except Exception:
            log.exception(Event.WORKTREE_ERROR, worktree=self._root, stage="watch", watching=watching)
        finally:
            send(None)

    async def _consume(self, batches: asyncio.Queue[list[str] | None]) -> None:
        while (changed := await batches.get()) is not None:
            # Batches that queued up while the last diff ran are answered by one diff.
            more: list[str] | None = []
            while not batches.empty() and (more := batches.get_nowait()) is not None:
                changed += more
            try:
                async with self._lock:
                    paths = await asyncio.to_thread(self._recompute, changed)
                    if paths is not None:
                        await self._publish(paths)
            except Exception:
                # One bad batch (a file vanishing mid-diff, a failing callback) must not end the watch.
                log.exception(Event.WORKTREE_ERROR, worktree=self._root, stage="change batch")
            if more is None:
                break

    async def _publish(self, paths: frozenset[str]) -> None:
        if paths != self.paths:
            self.paths = paths
            await self.on_change(paths)

    def _outside_git(self, path: str) -> bool:
        # `.git` is a file in a linked worktree; a nested repository has a `.git` directory.
        return path != self._gitfile and "/.git/" not in path[len(self._root) :] and not path.endswith("/.git")

    def _recompute(self, changed: list[str]) -> frozenset[str] | None:
        """Runs in a thread: the new set, or None when every changed path is git-ignored (none named: the watch
        just started, compute it all)."""
        repo = Workspace.at(self._root).repo()
        prefix = len(self._root) + 1
        if changed and all(_ignored(repo, p[prefix:]) for p in changed):
            return None
        return actual_paths(self.worktree, self.base)


# -- helpers ---------------------------------------------------------------------------------------


def _delta_paths(diff: pygit2.Diff) -> Iterable[str]:
    for delta in diff.deltas:
        yield delta.old_file.path
        yield delta.new_file.path


def _ignored(repo: pygit2.Repository, rel: str) -> bool:
    try:
        return bool(rel) and repo.path_is_ignored(rel)
    except pygit2.GitError:
        return False


_PREFIX = re.compile(r"^[abciwo]/")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _strip_prefix(name: str) -> str | None:
    if name == "/dev/null":
        return None
    return _PREFIX.sub("", name, count=1)


def _unquote(name: str) -> str:
    """Undo git's C-style quoting of unusual file names ("a/sp\\303\\251cial.txt")."""
    if len(name) < 2 or not (name.startswith('"') and name.endswith('"')):
        return name
    body = name[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\" or i + 1 == len(body):
            out += ch.encode()
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in "0123" and re.fullmatch(r"[0-7]{3}", body[i + 1 : i + 4]):
            out.append(int(body[i + 1 : i + 4], 8))
            i += 4
        elif nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out += ch.encode()
            i += 1
    return out.decode("utf-8", "surrogateescape")
