"""One git worktree per job, on its own branch, outside the user's checkout; a warm pool makes them cheap.

Layout, per repository, under the pool's root::

    <root>/<repo-key>/job-<id>      a job's worktree, on branch orchestrator/<id>
    <root>/<repo-key>/pool-<token>  a warm worktree, detached at some recent commit, clean
    <root>/<repo-key>/trash-<token> a worktree being deleted (left behind only by a crash)

Speed, as measured by `python -m orchestrator.bench.worktrees` (10k files): a fresh worktree writes
every file, so it is bound by the disk, and libgit2 is no faster there than `git worktree add`. A
warm one is re-pointed with `git read-tree -m -u <old> <base>`, which only looks at and rewrites
the entries that differ (a `git checkout` would first lstat all 10k); pygit2 then points the job
branch and HEAD, and the directory is renamed in-process. Only clean worktrees enter the pool
(release and recover reset them), which is what makes the two-tree merge exact; when it refuses
anyway, a full `checkout -f` + `clean -ffdx` takes over.

Why the per-repo lock: `git worktree add`, the pruning of worktree metadata and branch deletion
(which rewrites packed-refs) take git's repository-wide locks and fail instead of waiting when two run
at once. Re-pointing a warm worktree only touches that worktree's index and one new ref, so it runs
without the lock and several jobs of one repository can start together; only the rename of its
directory takes the lock for an instant, since mid-rename it would look prunable to a concurrent prune.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pygit2
import structlog

from orchestrator.git import repos
from orchestrator.git.repos import canonical
from orchestrator.logging import Event
from orchestrator.paths import private_dir

__all__ = ["WorktreeError", "WorktreePool", "branch_name", "repo_key"]

log = structlog.get_logger(__name__)

GIT_TIMEOUT = 600.0
"""Seconds any one git command may take (a checkout through an LFS smudge filter can be slow)."""



class WorktreeError(RuntimeError):
    """A git operation on a job's worktree failed; the message carries git's own words."""


def branch_name(job_id: int) -> str:
    """The local branch a job works on."""
    return f"orchestrator/{job_id}"


def repo_key(repo: Path) -> str:
    """Directory name for a repository's worktrees: its name plus a short hash of its canonical path."""
    digest = hashlib.sha256(str(repo).encode()).hexdigest()[:10]
    return f"{repo.name}-{digest}"


@dataclass(frozen=True)
class _Warm:
    path: Path
    sha: str  # the commit it is detached at; its index and files are exactly that commit's tree


@dataclass
class _Repo:
    path: Path  # canonical work dir of the main worktree
    home: Path  # <root>/<repo-key>
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pool: list[_Warm] = field(default_factory=list)  # ready to hand out: clean and detached
    pending: int = 0  # pooled worktrees being made or recycled
    out: set[int] = field(default_factory=set)  # jobs holding a worktree handed out here, not yet released


class WorktreePool:
    """Hands out clean worktrees at a base commit and takes them back.

    Not thread-safe: use it from one event loop. Keeps no state that `recover` cannot rebuild from disk.
    """

    def __init__(self, root: Path, warm: int = 2) -> None:
        self.root = Path(root).expanduser().resolve()
        self.warm = warm
        self._repos: dict[Path, _Repo] = {}
        self._canon: dict[Path, Path] = {}  # as the caller names a repository -> its canonical path

    # -- public API ---------------------------------------------------------------------------------

    def path_for(self, repo: Path, job_id: int) -> Path:
        """Where job `job_id`'s worktree lives (whether or not it exists)."""
        return self._home(self._canonical(repo)) / f"job-{job_id}"

    async def acquire(self, repo: Path, job_id: int, base: str) -> Path:
        """A clean worktree with exactly `base`'s tree, on branch orchestrator/<job_id> forced to `base`."""
        st = await self._state(repo)
        dest = st.home / f"job-{job_id}"
        if dest.exists():
            raise WorktreeError(
                f"job {job_id} already has a worktree at {dest}: release or clean it before acquiring another"
            )
        sha = await asyncio.to_thread(_resolve, st.path, base)
        branch = branch_name(job_id)
        while st.pool:
            # One already at base needs no file written; otherwise the newest, likely nearest to base.
            warm = next((w for w in st.pool if w.sha == sha), st.pool[-1])
            st.pool.remove(warm)
            try:
                async with st.lock:  # mid-move it looks prunable: a concurrent prune must not see it
                    await asyncio.to_thread(_move, warm.path, dest)
            except OSError as exc:
                log.warning(Event.WORKTREE_POOLED_FAILED, repo=str(st.path), job_id=job_id, error=str(exc))
                await self._remove(st, warm.path)
                await self._remove(st, dest)
                continue
            try:
                await _repoint(dest, warm.sha, sha, branch)
            except (WorktreeError, pygit2.GitError, repos.RepoError) as exc:
                log.warning(
                    Event.WORKTREE_POOLED_FAILED, repo=str(st.path), job_id=job_id, fallback="reset", error=str(exc)
                )
                try:
                    await _reset(dest, sha, branch)
                except WorktreeError as exc2:
                    log.warning(Event.WORKTREE_POOLED_FAILED, repo=str(st.path), job_id=job_id, error=str(exc2))
                    await self._remove(st, dest)
                    continue
            log.info(Event.WORKTREE_ACQUIRED, repo=str(st.path), job_id=job_id, base=sha, pooled=True, path=str(dest))
            st.out.add(job_id)
            return dest
        async with st.lock:
            await _git(st.path, "worktree", "add", "-q", "-B", branch, str(dest), sha)
        log.info(Event.WORKTREE_ACQUIRED, repo=str(st.path), job_id=job_id, base=sha, pooled=False, path=str(dest))
        st.out.add(job_id)
        return dest

    async def release(self, repo: Path, job_id: int, *, keep: bool = False, delete_branch: bool = False) -> None:
        """Give a job's worktree back.

        keep=True leaves worktree and branch exactly as they are (a failed or conflicted job loses
        nothing). Otherwise the worktree is reset and recycled into the warm pool while the pool is
        below `warm`, else removed. Branch orchestrator/<job_id> is deleted only with delete_branch=True.
        """
        st = await self._state(repo)
        st.out.discard(job_id)
        path = st.home / f"job-{job_id}"
        if keep:
            log.info(Event.WORKTREE_KEPT, repo=str(st.path), job_id=job_id, path=str(path))
            return
        if path.exists():
            if len(st.pool) + st.pending < self.warm:
                await self._recycle(st, path)
            else:
                await self._remove(st, path)
        if delete_branch:
            await self._delete_branch(st, branch_name(job_id))

    async def clean(self, repo: Path, job_id: int) -> None:
        """Remove a kept worktree and its branch."""
        st = await self._state(repo)
        path = st.home / f"job-{job_id}"
        if path.exists():
            await self._remove(st, path)
        await self._delete_branch(st, branch_name(job_id))

    async def fill(self, repo: Path, at: str) -> None:
        """Top the warm pool up to `warm` worktrees detached at `at` (meant to run in the background).

        Worktrees still out with running jobs count as coming back: they are recycled when released, so
        a fresh checkout made now would only be removed again when they return (measured: of 150 trivial
        jobs on 4 slots, 138 worktrees removed and refilled by fresh checkouts, 12 recycled).
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
                path = st.home / f"pool-{secrets.token_hex(4)}"
                async with st.lock:
                    await _git(st.path, "worktree", "add", "-q", "--detach", str(path), sha)
                # Valid and clean at once: hand it out now rather than after the settle below.
                warm = _Warm(path, sha)
                made.append(warm)
                st.pool.append(warm)
                st.pending -= 1
                want -= 1
        finally:
            st.pending -= want
        log.info(Event.WORKTREE_POOL_FILLED, repo=str(st.path), at=sha, added=len(made), size=len(st.pool))
        await self._settle_pooled(st, made)

    async def _settle_pooled(self, st: _Repo, made: list[_Warm]) -> None:
        """Settle those of `made` still in the pool, taking each out while git refreshes its index."""
        await _sleep_past_second()
        for warm in made:
            if warm not in st.pool:
                continue  # a job took it meanwhile: unsettled only means a slower first status
            st.pool.remove(warm)
            try:
                await _refresh(warm.path)
            finally:
                st.pool.append(warm)

    async def recover(self, repo: Path) -> frozenset[int]:
        """Rebuild the pool from disk after a restart; returns the ids of jobs whose worktrees exist.

        Prunes metadata of our worktrees whose directories are gone, deletes half-deleted ones, adopts
        pooled worktrees (up to `warm`, the rest are removed) and leaves job worktrees alone.
        """
        st = await self._state(repo)
        async with st.lock:
            live = await asyncio.to_thread(_prune_ours, st.path, st.home, recovering=True)
        jobs: set[int] = set()
        adopted: list[_Warm] = []
        st.pool.clear()
        for entry in sorted(st.home.iterdir()) if st.home.is_dir() else []:
            name = entry.name
            if name.startswith("trash-"):
                await asyncio.to_thread(shutil.rmtree, entry, True)
            elif name.startswith("pool-"):
                if entry in live and len(adopted) < self.warm:
                    # Its state is unknown (the crash may have hit a recycle half-way): reset it fully.
                    with contextlib.suppress(WorktreeError, pygit2.GitError, repos.RepoError):
                        adopted.append(_Warm(entry, await _detach_clean(entry)))
                        continue
                await self._remove(st, entry)
            elif name.startswith("job-") and name[4:].isdigit():
                jobs.add(int(name[4:]))
        if adopted:
            await _settle([w.path for w in adopted])
        st.pool.extend(adopted)
        log.info(Event.WORKTREE_RECOVERED, repo=str(st.path), pooled=len(adopted), jobs=sorted(jobs))
        return frozenset(jobs)

    def pooled(self, repo: Path) -> list[Path]:
        """The warm worktrees ready for `repo` (a copy; for tests and status)."""
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

    async def _recycle(self, st: _Repo, path: Path) -> None:
        st.pending += 1
        try:
            dest = st.home / f"pool-{secrets.token_hex(4)}"
            try:
                sha = await _detach_clean(path)
                async with st.lock:  # mid-move it looks prunable: a concurrent prune must not see it
                    await asyncio.to_thread(_move, path, dest)
            except (WorktreeError, pygit2.GitError, repos.RepoError, OSError) as exc:
                log.warning(Event.WORKTREE_RECYCLE_FAILED, repo=str(st.path), path=str(path), error=str(exc))
                await self._remove(st, path)
                await self._remove(st, dest)
                return
            # No _settle here: only the files the job touched were rewritten, so few entries are racy.
        finally:
            st.pending -= 1
        st.pool.append(_Warm(dest, sha))
        log.info(Event.WORKTREE_RECYCLED, repo=str(st.path), path=str(dest), size=len(st.pool))

    async def _remove(self, st: _Repo, path: Path) -> None:
        # Rename first (instant), unregister under the lock, delete the files outside it: the lock is
        # held for milliseconds even when the tree has 10k files.
        trash = st.home / f"trash-{secrets.token_hex(4)}"
        async with st.lock:
            moved = await asyncio.to_thread(_unregister, st.path, st.home, path, trash)
        if moved:
            await asyncio.to_thread(shutil.rmtree, trash, True)
            log.info(Event.WORKTREE_REMOVED, repo=str(st.path), path=str(path))

    async def _delete_branch(self, st: _Repo, branch: str) -> None:
        async with st.lock:
            await asyncio.to_thread(_drop_branch, st.path, branch)


# -- helpers (sync ones run in threads) ------------------------------------------------------------


def _git_env(cwd: Path) -> dict[str, str]:
    # Never above `cwd`: git in a worktree that lost its `.git` must fail, not act on an enclosing repo.
    return repos.git_env(cwd)


async def _git(cwd: Path, *args: str) -> str:
    # Hooks off: these are the orchestrator's own bookkeeping checkouts, not the user's, and a
    # post-checkout or reference-transaction hook would run on every acquire.
    argv = ("git", "-c", "core.hooksPath=/dev/null", "-C", str(cwd), *args)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_git_env(cwd),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), GIT_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise WorktreeError(f"`git {' '.join(args)}` in {cwd} took longer than {GIT_TIMEOUT:.0f} s") from None
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        raise WorktreeError(f"`git {' '.join(args)}` in {cwd} failed: {err.decode(errors='replace').strip()}")
    return out.decode(errors="replace").strip()


async def _repoint(wt: Path, old: str, new: str, branch: str) -> None:
    # The pool holds only clean worktrees whose index and files are exactly `old`, so a two-tree
    # merge is exact, and it only looks at and rewrites the entries that differ (a checkout would
    # first lstat all of them). It refuses rather than overwrite anything unexpected; then we reset.
    await _git(wt, "read-tree", "-m", "-u", old, new)
    await asyncio.to_thread(_point_head, wt, branch, new)


async def _reset(wt: Path, sha: str, branch: str) -> None:
    """The slow, unconditional way to `sha` on `branch`: tracked files forced, untracked and ignored ones gone."""
    await _git(wt, "checkout", "-q", "-f", "-B", branch, sha)
    await _git(wt, "clean", "-q", "-ffdx")


async def _detach_clean(wt: Path) -> str:
    """Detach a worktree at its HEAD commit, drop every change and git operation in progress; its sha."""
    await _git(wt, "checkout", "-q", "-f", "--detach")
    await _git(wt, "clean", "-q", "-ffdx")
    return await asyncio.to_thread(_tidy, wt)


async def _settle(paths: list[Path]) -> None:
    # Files written in the same second as the index are "racily clean" to git: it re-reads every one
    # of them on the next status or checkout (~5x slower on a 10k-file tree). Refreshing the index
    # once the clock has moved past that second records them as clean for good.
    await _sleep_past_second()
    for path in paths:
        await _refresh(path)


async def _sleep_past_second() -> None:
    await asyncio.sleep(1.02 - time.time() % 1.0)


async def _refresh(path: Path) -> None:
    # Exit 1 only means some entries need updating; the next checkout fixes them.
    with contextlib.suppress(WorktreeError):
        await _git(path, "update-index", "-q", "--refresh")


def _resolve(repo: Path, rev: str) -> str:
    r = repos.open_repo(repo)
    try:
        return str(r.revparse_single(rev).peel(pygit2.Commit).id)
    except (KeyError, ValueError, pygit2.GitError) as exc:
        raise WorktreeError(f"{rev!r} is not a commit in {repo}: pass a branch name or a commit sha") from exc


def _point_head(wt: Path, branch: str, sha: str) -> None:
    r = repos.open_repo(wt)
    r.branches.local.create(branch, r[sha].peel(pygit2.Commit), force=True)
    r.set_head(f"refs/heads/{branch}")


def _tidy(wt: Path) -> str:
    # A job may leave a merge, rebase or cherry-pick half done; the next job must not inherit it.
    r = repos.open_repo(wt)
    r.state_cleanup()
    return str(r.head.target)


def _move(src: Path, dest: Path) -> None:
    """Rename a linked worktree and tell git where it went (what `git worktree move` does, without a process)."""
    pointer = (src / ".git").read_text().strip().removeprefix("gitdir:").strip()
    admin = Path(pointer) if os.path.isabs(pointer) else (src / pointer).resolve()
    src.rename(dest)
    (admin / "gitdir").write_text(f"{dest / '.git'}\n")


def _drop_branch(repo: Path, branch: str) -> None:
    """`git branch -D` in-process (libgit2 also refuses a branch checked out somewhere, and drops its reflog)."""
    ref = repos.open_repo(repo).branches.local.get(branch)
    if ref is None:
        return
    try:
        ref.delete()
    except pygit2.GitError as exc:
        raise WorktreeError(f"could not delete branch {branch} in {repo}: {exc}") from exc


def _unregister(repo: Path, home: Path, path: Path, trash: Path) -> bool:
    moved = path.exists()
    if moved:
        path.rename(trash)
    _prune_ours(repo, home)
    return moved


def _prune_ours(repo: Path, home: Path, *, recovering: bool = False) -> set[Path]:
    """Drop git's metadata for our worktrees whose directories are gone; return the live ones under home.

    Per worktree, not `git worktree prune`: that would also drop the user's own worktrees on a
    drive that is merely unmounted. Ours are pruned even when locked: a `git worktree add` killed
    with the daemon leaves its "initializing" lock behind, and then git refuses to delete the branch
    of a worktree whose directory is long gone. On recovery the live ones are unlocked for the same reason.
    """
    r = repos.open_repo(repo)
    live: set[Path] = set()
    for name in r.list_worktrees():
        wt = r.lookup_worktree(name)
        path = Path(wt.path)
        if not path.is_relative_to(home):
            continue
        if not path.exists():
            wt.prune(True)
            continue
        if recovering:
            (Path(r.path) / "worktrees" / name / "locked").unlink(missing_ok=True)
        live.add(path)
    return live
