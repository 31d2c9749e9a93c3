"""One workspace per job, outside the user's checkout, from a warm pool that makes them cheap.

A workspace (`git.workspace`) is a directory of files with a git dir of the job's own, plus an admin git
dir of the daemon's beside it; it shares no writable git state with the repository. Layout, per
repository, under the pool's root::

    <root>/<repo-key>/job-<id>       a job's workspace (its own .git on branch orchestrator/<id>)
    <root>/<repo-key>/pool-<token>   a warm workspace at some recent commit, verified clean
    <root>/<repo-key>/trash-<token>  a workspace being deleted (left behind only by a crash)
    <root>/<repo-key>/.admin/<name>  the daemon's git dir for each of them

The repository itself only gets the branch `orchestrator/<id>` when the job's result is committed
(`git.commits`): nothing of the job reaches a ref before that, and never by the job's own hand.

Speed (`orchestrator bench worktrees`): a fresh workspace writes every file, bound by the disk like
`git worktree add`. A warm one is re-pointed with git's two-tree merge (`read-tree -m -u <old> <base>`),
which only rewrites the entries that differ, and renamed in-process. Only verified workspaces enter the
pool: one a job used is reset from its admin index and checked by a walk of its own before it goes back.

No repository-wide git lock is taken to make or move a workspace (each has its own admin dir and index);
the per-repo lock only serialises deleting branches of the repository, which rewrites its packed-refs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import pygit2
import structlog

from orchestrator.git import commits, repos
from orchestrator.git.repos import canonical
from orchestrator.git.workspace import ADMIN, Workspace, WorkspaceError, remove_tree
from orchestrator.logging import Event
from orchestrator.paths import private_dir

__all__ = ["WorktreeError", "WorktreePool", "branch_name", "repo_key"]

log = structlog.get_logger(__name__)

WorktreeError = WorkspaceError
"""A workspace operation failed; the message carries git's own words (one error type for the pool and its parts)."""


def branch_name(job_id: int) -> str:
    """The local branch a job's result is committed on."""
    return f"orchestrator/{job_id}"


def repo_key(repo: Path) -> str:
    """Directory name for a repository's workspaces: its name plus a short hash of its canonical path."""
    digest = hashlib.sha256(str(repo).encode()).hexdigest()[:10]
    return f"{repo.name}-{digest}"


@dataclass(frozen=True)
class _Warm:
    path: Path
    sha: str  # the commit it holds; its files are exactly that commit's tree, verified


@dataclass
class _Repo:
    path: Path  # canonical work dir of the main worktree
    home: Path  # <root>/<repo-key>
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pool: list[_Warm] = field(default_factory=list)  # ready to hand out
    pending: int = 0  # pooled workspaces being made or recycled
    out: set[int] = field(default_factory=set)  # jobs holding a workspace handed out here, not yet released


class WorktreePool:
    """Hands out clean workspaces at a base commit and takes them back.

    Not thread-safe: use it from one event loop. Keeps no state that `recover` cannot rebuild from disk.
    """

    def __init__(self, root: Path, warm: int = 2) -> None:
        self.root = Path(root).expanduser().resolve()
        self.warm = warm
        self._repos: dict[Path, _Repo] = {}
        self._canon: dict[Path, Path] = {}  # as the caller names a repository -> its canonical path
        self._stopping = asyncio.Event()

    # -- public API ---------------------------------------------------------------------------------

    def path_for(self, repo: Path, job_id: int) -> Path:
        """Where job `job_id`'s workspace lives (whether or not it exists)."""
        return self._home(self._canonical(repo)) / f"job-{job_id}"

    async def acquire(self, repo: Path, job_id: int, base: str) -> Path:
        """A clean workspace with exactly `base`'s tree, its own git dir on orchestrator/<job_id> at `base`."""
        st = await self._state(repo)
        dest = Workspace(st.home / f"job-{job_id}")
        if dest.root.exists() or dest.admin.exists():
            raise WorktreeError(
                f"job {job_id} already has a workspace at {dest.root}: release or clean it before acquiring another"
            )
        sha = await asyncio.to_thread(_resolve, st.path, base)
        branch = branch_name(job_id)
        while st.pool:
            # One already at base needs no file written; otherwise the newest, likely nearest to base.
            warm = next((w for w in st.pool if w.sha == sha), st.pool[-1])
            st.pool.remove(warm)
            try:
                await asyncio.to_thread(Workspace(warm.path).move, dest)
            except OSError as exc:
                log.warning(Event.WORKTREE_POOLED_FAILED, repo=str(st.path), job_id=job_id, error=str(exc))
                await self._remove(st, Workspace(warm.path))
                await self._remove(st, dest)
                continue
            try:
                await asyncio.to_thread(dest.repoint, warm.sha, sha, branch)
            except (WorkspaceError, pygit2.GitError, OSError) as exc:
                log.warning(
                    Event.WORKTREE_POOLED_FAILED, repo=str(st.path), job_id=job_id, fallback="reset", error=str(exc)
                )
                try:
                    await asyncio.to_thread(dest.reset, sha, branch)
                except (WorkspaceError, pygit2.GitError, OSError) as exc2:
                    log.warning(Event.WORKTREE_POOLED_FAILED, repo=str(st.path), job_id=job_id, error=str(exc2))
                    await self._remove(st, dest)
                    continue
            log.info(
                Event.WORKTREE_ACQUIRED, repo=str(st.path), job_id=job_id, base=sha, pooled=True, path=str(dest.root)
            )
            st.out.add(job_id)
            return dest.root
        await self._checkout(st, dest, sha, branch)
        log.info(Event.WORKTREE_ACQUIRED, repo=str(st.path), job_id=job_id, base=sha, pooled=False, path=str(dest.root))
        st.out.add(job_id)
        return dest.root

    async def release(self, repo: Path, job_id: int, *, keep: bool = False, delete_branch: bool = False) -> None:
        """Give a job's workspace back.

        keep=True leaves it exactly as it is (a failed or conflicted job loses nothing). Otherwise it is
        reset and verified into the warm pool while the pool is below `warm`, else removed. Branch
        orchestrator/<job_id> of the repository is deleted only with delete_branch=True.
        """
        st = await self._state(repo)
        st.out.discard(job_id)
        ws = Workspace(st.home / f"job-{job_id}")
        if keep:
            log.info(Event.WORKTREE_KEPT, repo=str(st.path), job_id=job_id, path=str(ws.root))
            return
        if ws.root.exists() or ws.admin.exists():
            if len(st.pool) + st.pending < self.warm and ws.exists():
                await self._recycle(st, ws)
            else:
                await self._remove(st, ws)
        if delete_branch:
            await self._delete_branch(st, branch_name(job_id))

    async def clean(self, repo: Path, job_id: int) -> None:
        """Remove a kept workspace and its branch."""
        st = await self._state(repo)
        ws = Workspace(st.home / f"job-{job_id}")
        if ws.root.exists() or ws.admin.exists():
            await self._remove(st, ws)
        await self._delete_branch(st, branch_name(job_id))

    def workspace(self, repo: Path, job_id: int) -> Workspace:
        """Job `job_id`'s workspace (whether or not it exists)."""
        return Workspace(self.path_for(repo, job_id))

    async def fill(self, repo: Path, at: str) -> None:
        """Top the warm pool up to `warm` workspaces at `at` (meant to run in the background).

        Workspaces still out with running jobs count as coming back: they are recycled when released, so
        a fresh checkout made now would only be removed again when they return (measured: of 150 trivial
        jobs on 4 slots, 138 workspaces removed and refilled by fresh checkouts, 12 recycled).
        """
        st = await self._state(repo)
        want = self.warm - len(st.pool) - st.pending - len(st.out)
        if want <= 0:
            return
        st.pending += want
        made: list[_Warm] = []
        try:
            sha = await asyncio.to_thread(_resolve, st.path, at)
            for _ in range(want):
                if self._stopping.is_set():
                    break
                ws = Workspace(st.home / f"pool-{secrets.token_hex(4)}")
                await self._checkout(st, ws, sha, None)
                # Valid and clean at once: hand it out now rather than after the settle below.
                warm = _Warm(ws.root, sha)
                made.append(warm)
                st.pool.append(warm)
                st.pending -= 1
                want -= 1
        finally:
            st.pending -= want
        log.info(Event.WORKTREE_POOL_FILLED, repo=str(st.path), at=sha, added=len(made), size=len(st.pool))
        await self._settle_pooled(st, made)

    def stop_tidying(self) -> None:
        """The daemon is stopping: a fill under way makes no more warm workspaces, and those it made are left for
        `recover` to settle on the next start (a stop does not wait up to a second for either: both only save a
        later job time)."""
        self._stopping.set()

    async def _settle_pooled(self, st: _Repo, made: list[_Warm]) -> None:
        """Settle those of `made` still in the pool, taking each out while git refreshes its index."""
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({stopping}, timeout=_past_second())
        finally:
            stopping.cancel()
        if self._stopping.is_set():
            return
        for warm in made:
            if warm not in st.pool:
                continue  # a job took it meanwhile: unsettled only means a slower first status
            st.pool.remove(warm)
            try:
                await asyncio.to_thread(_refresh, Workspace(warm.path), warm.sha)
            finally:
                st.pool.append(warm)

    async def recover(self, repo: Path) -> frozenset[int]:
        """Rebuild the pool from disk after a restart; returns the ids of jobs whose workspaces exist.

        Deletes half-deleted workspaces, resets and adopts pooled ones (up to `warm`, the rest are
        removed), leaves job workspaces alone, and drops git's metadata for the linked worktrees older
        versions of this pool made (their directories stay: they are plain files now).
        """
        st = await self._state(repo)
        async with st.lock:
            await asyncio.to_thread(_forget_linked, st.path, st.home)
        jobs: set[int] = set()
        adopted: list[_Warm] = []
        st.pool.clear()
        for entry in sorted(st.home.iterdir()) if st.home.is_dir() else []:
            name = entry.name
            ws = Workspace(entry)
            if name.startswith("trash-"):
                await asyncio.to_thread(ws.remove)
            elif name.startswith("pool-"):
                if ws.exists() and len(adopted) < self.warm:
                    # Its state is unknown (the crash may have hit a recycle half-way): reset it fully.
                    try:
                        sha = await asyncio.to_thread(ws.head)
                        await asyncio.to_thread(ws.reset, sha, None)
                    except (WorkspaceError, pygit2.GitError, OSError) as exc:
                        log.warning(Event.WORKTREE_RECYCLE_FAILED, repo=str(st.path), path=str(entry), error=str(exc))
                    else:
                        adopted.append(_Warm(entry, sha))
                        continue
                await self._remove(st, ws)
            elif name.startswith("job-") and name[4:].isdigit():
                jobs.add(int(name[4:]))
        admin = st.home / ADMIN
        for entry in sorted(admin.iterdir()) if admin.is_dir() else []:
            if not (st.home / entry.name).exists():  # files gone, admin dir left by a crash mid-remove
                await asyncio.to_thread(remove_tree, entry)
        if adopted:
            await _sleep_past_second()
            for w in adopted:
                await asyncio.to_thread(_refresh, Workspace(w.path), w.sha)
        st.pool.extend(adopted)
        log.info(Event.WORKTREE_RECOVERED, repo=str(st.path), pooled=len(adopted), jobs=sorted(jobs))
        return frozenset(jobs)

    def pooled(self, repo: Path) -> list[Path]:
        """The warm workspaces ready for `repo` (a copy; for tests and status)."""
        st = self._repos.get(self._canonical(repo))
        return [w.path for w in st.pool] if st else []

    # -- internals ----------------------------------------------------------------------------------

    def _home(self, repo: Path) -> Path:
        return self.root / repo_key(repo)

    def _canonical(self, repo: Path) -> Path:
        path = self._canon.get(repo)
        if path is None:
            path = self._canon[repo] = canonical(repo)
        return path

    async def _state(self, repo: Path) -> _Repo:
        path = self._canon.get(repo)
        if path is None:
            path = await asyncio.to_thread(self._canonical, repo)
        st = self._repos.get(path)
        if st is None:
            home = self._home(path)
            if home.is_relative_to(path):
                raise WorktreeError(
                    f"worktree root {self.root} is inside the repository {path}: choose a root outside it "
                    "so jobs never write into your checkout"
                )
            private_dir(home)  # 0700 whatever the umask
            st = self._repos.setdefault(path, _Repo(path=path, home=home))
        return st

    async def _recycle(self, st: _Repo, ws: Workspace) -> None:
        st.pending += 1
        try:
            dest = Workspace(st.home / f"pool-{secrets.token_hex(4)}")
            try:
                sha = await asyncio.to_thread(ws.head)
                await asyncio.to_thread(ws.move, dest)
                # Out of the job's name first: a job of that id acquiring meanwhile gets a fresh one.
                await asyncio.to_thread(dest.reset, sha, None)
            except (WorkspaceError, pygit2.GitError, OSError) as exc:
                log.warning(Event.WORKTREE_RECYCLE_FAILED, repo=str(st.path), path=str(ws.root), error=str(exc))
                await self._remove(st, ws)
                await self._remove(st, dest)
                return
        finally:
            st.pending -= 1
        st.pool.append(_Warm(dest.root, sha))
        log.info(Event.WORKTREE_RECYCLED, repo=str(st.path), path=str(dest.root), size=len(st.pool))

    async def _checkout(self, st: _Repo, ws: Workspace, sha: str, branch: str | None) -> None:
        """Write a fresh workspace; if that fails or is cut (a stop), remove what it wrote. A thread cannot be
        stopped: the removal waits for the checkout's thread to be done, or it would delete files as they are
        written (and fail on a directory that is not empty, leaving both behind)."""
        writing = asyncio.ensure_future(asyncio.to_thread(ws.create, st.path, sha, branch))
        try:
            await asyncio.shield(writing)
        except BaseException:
            await asyncio.shield(self._remove_once_done(st, ws, writing))
            raise

    async def _remove_once_done(self, st: _Repo, ws: Workspace, writing: asyncio.Future[None]) -> None:
        await asyncio.wait({writing})
        await self._remove(st, ws)

    async def _remove(self, st: _Repo, ws: Workspace) -> None:
        # Rename first (instant), delete the files after: a crash in between leaves a trash-* for recover.
        trash = Workspace(st.home / f"trash-{secrets.token_hex(4)}")
        moved = await asyncio.to_thread(_to_trash, ws, trash)
        await asyncio.to_thread(trash.remove)
        await asyncio.to_thread(ws.remove)  # whatever could not be moved
        if moved:
            log.info(Event.WORKTREE_REMOVED, repo=str(st.path), path=str(ws.root))

    async def _delete_branch(self, st: _Repo, branch: str) -> None:
        async with st.lock:
            await asyncio.to_thread(_drop_branch, st.path, branch)


# -- helpers (sync ones run in threads) ------------------------------------------------------------


async def _sleep_past_second() -> None:
    await asyncio.sleep(_past_second())


def _past_second() -> float:
    """Seconds until the clock is just past the current second."""
    return 1.02 - time.time() % 1.0


def _refresh(ws: Workspace, sha: str) -> None:
    """Files written in the same second as the index are "racily clean" to git: it re-reads every one of
    them on the next status (~5x slower on a 10k-file tree). Refreshing the admin index once the clock
    has moved past that second records them as clean for good; the job's own index gets the same."""
    with contextlib.suppress(WorkspaceError):  # exit 1 only means some entries need updating
        ws.git("update-index", "-q", "--refresh")
    ws.private(ws.objects().parent, sha, None)


def _to_trash(ws: Workspace, trash: Workspace) -> bool:
    moved = False
    for src, dst in ((ws.root, trash.root), (ws.admin, trash.admin)):
        try:
            src.rename(dst)
            moved = True
        except FileNotFoundError:
            pass
    return moved


def _resolve(repo: Path, rev: str) -> str:
    r = repos.open_repo(repo)
    try:
        return str(r.revparse_single(rev).peel(pygit2.Commit).id)
    except (KeyError, ValueError, pygit2.GitError) as exc:
        raise WorktreeError(f"{rev!r} is not a commit in {repo}: pass a branch name or a commit sha") from exc


def _drop_branch(repo: Path, branch: str) -> None:
    """`git branch -D` in-process (libgit2 also drops its reflog). A lock on the branch left by a killed daemon
    (older than this process) is removed first; one held now is an error that says what to do."""
    r = repos.open_repo(repo)
    ref = r.branches.local.get(branch)
    if ref is None:
        return
    commits.drop_stale_lock(r, branch)
    lock = Path(r.path) / "refs" / "heads" / f"{branch}.lock"
    try:
        ref.delete()
    except (pygit2.GitError, OSError) as exc:
        raise WorktreeError(
            f"could not delete branch {branch} in {repo}: {exc}; if no git command is running there, remove "
            f"{lock} and clean the job again"
        ) from exc


def _forget_linked(repo: Path, home: Path) -> None:
    """Drop git's metadata for linked worktrees under `home` (made by older versions of this pool).

    Their admin dirs (`<common>/worktrees/<name>`) are deleted, so git stops counting their branches as
    checked out; their directories are left as they are, plain files. Only ours (under `home`), never a
    user's worktree on a drive that is merely unmounted.
    """
    r = repos.open_repo(repo)
    for name in r.list_worktrees():
        try:
            path = Path(r.lookup_worktree(name).path)
        except pygit2.GitError:
            continue
        if path.is_relative_to(home):
            remove_tree(repos.common_dir(r) / "worktrees" / name)
