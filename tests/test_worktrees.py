"""orchestrator.git.worktrees: one clean workspace per job, outside the user's checkout, from a warm pool."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.git.commits import commit_worktree
from orchestrator.git.workspace import Workspace
from orchestrator.git.worktrees import WorktreeError, WorktreePool, branch_name
from tests.conftest import git, write

MakeRepo = Callable[..., Path]


def status(wt: Path) -> str:
    """Porcelain status including ignored files: empty means exactly HEAD's tree and nothing else."""
    return git(wt, "status", "--porcelain", "--ignored")


def merging(wt: Path) -> bool:
    """A merge is in progress in the worktree (MERGE_HEAD exists)."""
    out = subprocess.run(["git", "rev-parse", "-q", "--verify", "MERGE_HEAD"], cwd=wt, capture_output=True)
    return out.returncode == 0


def second_commit(root: Path) -> tuple[str, str]:
    """Add a commit on main; return (parent, head) shas."""
    parent = git(root, "rev-parse", "HEAD")
    write(root, {"src/a.py": "a = 2\n", "src/c.py": "c = 1\n"})
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "second")
    return parent, git(root, "rev-parse", "HEAD")


async def test_acquire_fresh_at_base_on_job_branch(make_repo: MakeRepo, tmp_path: Path) -> None:
    """acquire gives a clean workspace at base, its own git on orchestrator/<id>, outside the user's checkout;
    the repository itself gets no branch, no worktree entry and no object (it shares nothing writable)."""
    root = make_repo()
    parent, _head = second_commit(root)
    pool = WorktreePool(tmp_path / "wts", warm=0)
    wt = await pool.acquire(root, 7, parent)
    assert wt == pool.path_for(root, 7) and wt.is_dir()
    assert not wt.is_relative_to(root.resolve())
    assert git(wt, "rev-parse", "HEAD") == parent
    assert git(wt, "symbolic-ref", "--short", "HEAD") == branch_name(7) == "orchestrator/7"
    assert (wt / "src/a.py").read_text() == "a = 1\n" and not (wt / "src/c.py").exists()
    assert status(wt) == ""
    assert git(root, "status", "--porcelain") == ""  # the user's checkout is untouched
    assert git(root, "branch", "--list", "orchestrator/*") == ""
    assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert Path(git(wt, "rev-parse", "--absolute-git-dir")) == wt / ".git"
    assert (wt / ".git/objects/info/alternates").read_text().strip() == str(root / ".git" / "objects")


async def test_acquire_takes_a_branch_name_as_base(make_repo: MakeRepo, tmp_path: Path) -> None:
    """A branch name as base is resolved to its commit; the job branch does not track it."""
    root = make_repo()
    pool = WorktreePool(tmp_path / "wts", warm=0)
    wt = await pool.acquire(root, 1, "main")
    assert git(wt, "rev-parse", "HEAD") == git(root, "rev-parse", "main")
    assert "branch.orchestrator" not in git(wt, "config", "--list")


async def test_concurrent_acquires_do_not_race_on_git_locks(make_repo: MakeRepo, tmp_path: Path) -> None:
    """Several jobs of one repository acquire at once (fresh and pooled mixed) without a git lock error."""
    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    pool = WorktreePool(tmp_path / "wts", warm=2)
    await pool.fill(root, base)
    wts = await asyncio.gather(*(pool.acquire(root, i, base) for i in range(1, 7)))
    assert len(set(wts)) == 6
    for i, wt in enumerate(wts, start=1):
        assert git(wt, "symbolic-ref", "--short", "HEAD") == f"orchestrator/{i}"
        assert git(wt, "rev-parse", "HEAD") == base
        assert status(wt) == ""
    await asyncio.gather(*(pool.release(root, i, delete_branch=True) for i in range(1, 7)))
    assert len(pool.pooled(root)) == 2


async def test_pooled_worktree_with_junk_is_clean_at_new_base(make_repo: MakeRepo, tmp_path: Path) -> None:
    """A recycled worktree that held modified, untracked, ignored files and a half merge comes back clean."""
    root = make_repo(files={"a.txt": "a\n", ".gitignore": "*.log\n", "keep/k.txt": "k\n"})
    parent, head = second_commit(root)
    pool = WorktreePool(tmp_path / "wts", warm=1)
    wt1 = await pool.acquire(root, 1, parent)
    write(wt1, {"a.txt": "dirty\n", "junk/untracked.txt": "u\n", "debug.log": "ignored\n"})
    git(wt1, "add", "a.txt")
    write(wt1, {"staged-then-edited.txt": "x\n"})
    (wt1 / "keep/k.txt").unlink()
    # A merge left half done: the next job must not inherit it.
    git(wt1, "update-ref", "MERGE_HEAD", head)
    assert merging(wt1)
    await pool.release(root, 1, delete_branch=True)
    assert len(pool.pooled(root)) == 1 and not wt1.exists()
    wt2 = await pool.acquire(root, 2, head)
    assert pool.pooled(root) == []
    assert git(wt2, "rev-parse", "HEAD") == head
    assert git(wt2, "symbolic-ref", "--short", "HEAD") == "orchestrator/2"
    assert status(wt2) == ""
    assert (wt2 / "a.txt").read_text() == "a\n" and (wt2 / "keep/k.txt").exists()
    assert (wt2 / "src/c.py").read_text() == "c = 1\n"
    assert not merging(wt2)


async def test_recover_resets_a_pooled_worktree_left_dirty(make_repo: MakeRepo, tmp_path: Path) -> None:
    """A pooled worktree left dirty by a crash mid-recycle is reset by recover() and handed out clean."""
    root = make_repo(files={"a.txt": "a\n", ".gitignore": "*.log\n"})
    parent, head = second_commit(root)
    first = WorktreePool(tmp_path / "wts", warm=1)
    await first.fill(root, parent)
    (warm,) = first.pooled(root)
    write(warm, {"a.txt": "dirty\n", "src/c.py": "in the way\n", "stray/file.txt": "s\n", "x.log": "l\n"})
    git(warm, "add", "a.txt")
    second = WorktreePool(tmp_path / "wts", warm=1)
    await second.recover(root)
    assert second.pooled(root) == [warm]
    wt = await second.acquire(root, 3, head)
    assert status(wt) == "" and git(wt, "rev-parse", "HEAD") == head
    assert (wt / "src/c.py").read_text() == "c = 1\n"


async def test_repoint_falls_back_to_a_full_reset(make_repo: MakeRepo, tmp_path: Path) -> None:
    """A pooled worktree changed behind the pool's back, where the new base differs, is still handed out clean."""
    root = make_repo()
    parent, head = second_commit(root)
    pool = WorktreePool(tmp_path / "wts", warm=1)
    await pool.fill(root, parent)
    (warm,) = pool.pooled(root)
    write(warm, {"src/a.py": "changed in the pool\n", "src/c.py": "untracked in the way\n"})
    wt = await pool.acquire(root, 3, head)
    assert status(wt) == "" and git(wt, "rev-parse", "HEAD") == head
    assert git(wt, "symbolic-ref", "--short", "HEAD") == "orchestrator/3"


async def test_keep_true_keeps_files_and_branch_then_clean_removes(make_repo: MakeRepo, tmp_path: Path) -> None:
    """keep=True leaves the workspace and the job's branch; clean() then removes both."""
    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    pool = WorktreePool(tmp_path / "wts", warm=2)
    wt = await pool.acquire(root, 5, base)
    write(wt, {"work.txt": "precious\n"})
    commit_worktree(wt, message="m", job_id=5, base=base, repo_path=root)
    await pool.release(root, 5, keep=True)
    assert (wt / "work.txt").read_text() == "precious\n"
    assert git(root, "branch", "--list", "orchestrator/5") != ""
    assert pool.pooled(root) == []
    with pytest.raises(WorktreeError, match="already has a workspace"):
        await pool.acquire(root, 5, base)
    await pool.clean(root, 5)
    assert not wt.exists() and not Workspace(wt).admin.exists()
    assert git(root, "branch", "--list", "orchestrator/5") == ""


async def test_release_keeps_branch_unless_asked(make_repo: MakeRepo, tmp_path: Path) -> None:
    """release(keep=False) removes the workspace but leaves the job's branch for landing to decide."""
    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    pool = WorktreePool(tmp_path / "wts", warm=0)
    wt = await pool.acquire(root, 4, base)
    write(wt, {"f.txt": "f\n"})
    tip = commit_worktree(wt, message="m", job_id=4, base=base, repo_path=root)
    await pool.release(root, 4)
    assert not wt.exists()
    assert git(root, "rev-parse", "orchestrator/4") == tip
    # The same job id can start again, at the new base.
    wt = await pool.acquire(root, 4, base)
    assert git(wt, "rev-parse", "HEAD") == base


async def test_pool_beyond_warm_is_removed(make_repo: MakeRepo, tmp_path: Path) -> None:
    """Released worktrees are recycled only up to `warm`; the rest are removed and their metadata pruned."""
    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    pool = WorktreePool(tmp_path / "wts", warm=1)
    wts = [await pool.acquire(root, i, base) for i in (1, 2)]
    for i in (1, 2):
        await pool.release(root, i)
    assert len(pool.pooled(root)) == 1
    assert not any(w.exists() for w in wts)
    home = wts[0].parent
    assert sorted(p.name for p in home.iterdir() if p.name != ".admin") == [pool.pooled(root)[0].name]
    assert sorted(p.name for p in (home / ".admin").iterdir()) == [pool.pooled(root)[0].name]


async def test_recover_rebuilds_the_pool_from_disk(make_repo: MakeRepo, tmp_path: Path) -> None:
    """A new pool object (after a daemon crash) drops half-removed workspaces, adopts pooled ones, finds kept jobs."""
    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    first = WorktreePool(tmp_path / "wts", warm=3)
    await first.fill(root, base)
    kept = await first.acquire(root, 9, base)
    await first.release(root, 9, keep=True)
    gone = await first.acquire(root, 10, base)
    # Simulate a crash mid-removal: the files vanished, the admin dir did not.
    await asyncio.to_thread(shutil.rmtree, gone)
    (first.path_for(root, 0).parent / "trash-deadbeef").mkdir()

    second = WorktreePool(tmp_path / "wts", warm=2)
    assert await second.recover(root) == {9}
    assert len(second.pooled(root)) == 1
    assert not (first.path_for(root, 0).parent / "trash-deadbeef").exists()
    assert not Workspace(gone).admin.exists() and kept.exists()
    wt = await second.acquire(root, 11, base)
    assert second.pooled(root) == [] and status(wt) == ""


async def test_recover_forgets_linked_worktrees_of_older_versions(make_repo: MakeRepo, tmp_path: Path) -> None:
    """Linked worktrees an older pool registered under its root are unregistered; their files stay."""
    root = make_repo()
    pool = WorktreePool(tmp_path / "wts", warm=1)
    old = pool.path_for(root, 3)
    old.parent.mkdir(parents=True)
    git(root, "worktree", "add", "-q", "-b", "orchestrator/3", str(old), "main")
    user = tmp_path / "users-own"
    git(root, "worktree", "add", "-q", "-b", "mine", str(user), "main")
    write(old, {"work.txt": "w\n"})
    assert await pool.recover(root) == {3}
    listed = git(root, "worktree", "list", "--porcelain")
    assert str(old) not in listed and str(user) in listed
    assert (old / "work.txt").read_text() == "w\n"
    git(root, "branch", "-D", "orchestrator/3")  # no longer "checked out" anywhere


async def test_root_inside_the_checkout_is_refused(make_repo: MakeRepo) -> None:
    """Worktrees never go inside the user's checkout: such a root is refused with the fix."""
    root = make_repo()
    pool = WorktreePool(root / ".wts")
    with pytest.raises(WorktreeError, match="choose a root outside it"):
        await pool.acquire(root, 1, "main")


async def test_unknown_base_is_a_clear_error(make_repo: MakeRepo, tmp_path: Path) -> None:
    """A base that is not a commit raises WorktreeError naming it, and leaves nothing behind."""
    root = make_repo()
    pool = WorktreePool(tmp_path / "wts")
    with pytest.raises(WorktreeError, match="'nope' is not a commit"):
        await pool.acquire(root, 1, "nope")
    assert not pool.path_for(root, 1).exists()


def _snapshot(path: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every entry under `path` (not following links) with its mode and content or link target."""
    out: dict[str, tuple[int, bytes | str]] = {}
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            if p.is_symlink():
                out[str(p.relative_to(path))] = (st.st_mode, os.readlink(p))
            elif p.is_file():
                out[str(p.relative_to(path))] = (st.st_mode, p.read_bytes())
            else:
                out[str(p.relative_to(path))] = (st.st_mode, b"")
    return out


async def test_a_hostile_jobs_leftovers_never_reach_outside_on_recycle(make_repo: MakeRepo, tmp_path: Path) -> None:
    """A job that swaps its dirs for links out, points its .git at the user's checkout, plants fsmonitor and
    hooks, leaves a FIFO, a nested repository, an unreadable dir and odd names: recycling its workspace
    touches nothing outside it, runs none of it, and hands back a verified clean workspace."""
    root = make_repo(files={"README.md": "hello\n", "src/a.py": "a = 1\n", ".gitignore": ".env\n"})
    write(root, {"notes.txt": "the user's untracked work\n", ".env": "SECRET=1\n", "src/a.py": "user's edit\n"})
    outside = tmp_path / "outside"
    write(outside, {"a.py": "precious\n", "keep/k.txt": "k\n"})
    base = git(root, "rev-parse", "HEAD")
    pool = WorktreePool(tmp_path / "wts", warm=1)
    wt = await pool.acquire(root, 1, base)
    ran = tmp_path / "payload-ran"
    payload = tmp_path / "payload.sh"
    payload.write_text(f"#!/bin/sh\ntouch {ran}\n")
    payload.chmod(0o755)
    # The job's own git dir rewritten to drive any git the daemon might run there at the user's checkout.
    git(wt, "config", "core.worktree", str(root))
    git(wt, "config", "core.fsmonitor", str(payload))
    (wt / ".git/hooks").mkdir(exist_ok=True)
    for hook in ("post-checkout", "reference-transaction", "pre-commit"):
        (wt / ".git/hooks" / hook).write_text(f"#!/bin/sh\ntouch {ran}\n")
        (wt / ".git/hooks" / hook).chmod(0o755)
    shutil.rmtree(wt / "src")
    os.symlink(outside, wt / "src")  # a tracked directory replaced by a link out
    os.symlink(outside / "keep", wt / "untracked-link")
    os.mkfifo(wt / "pipe")
    (wt / "nested").mkdir()
    git(wt / "nested", "init", "-q")
    (wt / "locked").mkdir()
    write(wt, {"locked/inside.txt": "x\n"})
    (wt / "locked").chmod(0o000)
    (wt / os.fsdecode(b"odd\xff name")).write_text("x\n")
    user_before, outside_before = _snapshot(root), _snapshot(outside)

    await pool.release(root, 1, delete_branch=True)

    assert not ran.exists(), "no hook or fsmonitor of the job's ran"
    assert _snapshot(root) == user_before and _snapshot(outside) == outside_before
    (warm,) = pool.pooled(root)
    assert status(warm) == "" and sorted(os.listdir(warm)) == [".git", ".gitignore", "README.md", "src"]
    assert not (warm / "src").is_symlink() and (warm / "src/a.py").read_text() == "a = 1\n"
    assert "worktree" not in (warm / ".git/config").read_text()
    wt2 = await pool.acquire(root, 2, base)
    assert status(wt2) == "" and not ran.exists()


async def test_a_private_git_dir_that_is_a_link_is_unlinked_not_followed(make_repo: MakeRepo, tmp_path: Path) -> None:
    """A job that replaces its .git with a link to the repository's git dir: recycling unlinks the link and
    leaves the repository's git dir (objects, refs, config) exactly as it was."""
    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    pool = WorktreePool(tmp_path / "wts", warm=1)
    wt = await pool.acquire(root, 1, base)
    shutil.rmtree(wt / ".git")
    os.symlink(root / ".git", wt / ".git")
    before = _snapshot(root / ".git")
    await pool.release(root, 1)
    assert _snapshot(root / ".git") == before
    (warm,) = pool.pooled(root)
    assert (warm / ".git").is_dir() and not (warm / ".git").is_symlink() and status(warm) == ""


@pytest.mark.parametrize("making", ["acquire", "fill"])
async def test_a_checkout_cut_by_a_stop_is_removed_once_its_thread_is_done(
    making: str, make_repo: MakeRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop (cancel) while a checkout is being written in its thread, which cannot be stopped: the half-made
    workspace is removed after the thread is done writing it, not under its feet (then `rmtree` meets files still
    coming: "Directory not empty", and the cut job failed instead of interrupted), and nothing is left behind."""
    import threading

    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    pool = WorktreePool(tmp_path / "wts", warm=1)
    inside, go_on, written = threading.Event(), threading.Event(), threading.Event()
    create = Workspace.create

    def held_create(self: Workspace, *args: object) -> None:
        inside.set()
        assert go_on.wait(30)
        try:
            create(self, *args)  # type: ignore[arg-type]
        finally:
            written.set()

    monkeypatch.setattr(Workspace, "create", held_create)
    made = asyncio.ensure_future(pool.acquire(root, 1, base) if making == "acquire" else pool.fill(root, base))
    assert await asyncio.to_thread(inside.wait, 30)
    made.cancel()
    await asyncio.sleep(0.05)  # the cut task's own clean-up would run now, were it not waiting for the thread
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await made
    assert written.is_set(), "the stop returned while its checkout was still being written"
    home = pool.path_for(root, 1).parent
    assert sorted(p.name for p in home.iterdir()) == [".admin"] and not any((home / ".admin").iterdir())
    assert pool.pooled(root) == []


async def test_a_stopping_pool_makes_no_more_warm_workspaces_and_leaves_settling_them_to_recover(
    make_repo: MakeRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the daemon stops, a fill under way settles nothing more (no wait for the clock's next second) and a
    fill makes nothing; the workspace it made is handed out clean, and `recover` settles it on the next start."""
    from orchestrator.git import worktrees

    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    refreshed: list[Path] = []
    refresh = worktrees._refresh
    monkeypatch.setattr(worktrees, "_refresh", lambda ws, sha: (refreshed.append(ws.root), refresh(ws, sha)))
    settling = asyncio.Event()

    def a_minute() -> float:  # the settle would wait a minute for the clock's next second: a stop cuts it
        settling.set()
        return 60.0

    monkeypatch.setattr(worktrees, "_past_second", a_minute)
    pool = WorktreePool(tmp_path / "wts", warm=1)
    filling = asyncio.ensure_future(pool.fill(root, base))
    await settling.wait()  # made and handed out at once, then settled
    pool.stop_tidying()
    await filling
    (made,) = pool.pooled(root)
    assert refreshed == [] and status(made) == ""
    again = WorktreePool(tmp_path / "wts", warm=2)
    again.stop_tidying()
    await again.fill(root, base)
    assert refreshed == [] and len(again.pooled(root)) == 0
    monkeypatch.setattr(worktrees, "_past_second", lambda: 0.0)
    after = WorktreePool(tmp_path / "wts", warm=1)
    await after.recover(root)
    assert after.pooled(root) == [made] and refreshed == [made]


def test_a_branch_lock_left_by_a_killed_daemon_is_removed_and_one_held_now_is_a_clear_error(
    make_repo: MakeRepo,
) -> None:
    """A daemon killed while it wrote a job's branch leaves `orchestrator/N.lock`; the next daemon's clean removed
    nothing and failed `internal error: OSError` (bench crash, a kill 200 ms into a landing). A lock older than
    this process is removed and the branch deleted; one made since (a git command at work) is an error naming the
    file to remove."""
    from orchestrator.git import commits
    from orchestrator.git import worktrees as wt

    repo = make_repo()
    git(repo, "branch", "orchestrator/4")
    lock = repo / ".git" / "refs" / "heads" / "orchestrator" / "4.lock"
    lock.write_text("")
    os.utime(lock, (commits._LOADED - 60, commits._LOADED - 60))
    wt._drop_branch(repo, "orchestrator/4")
    assert not lock.exists() and "orchestrator/4" not in git(repo, "branch", "--list", "orchestrator/*")
    git(repo, "branch", "orchestrator/5")
    held = lock.with_name("5.lock")
    held.write_text("")
    with pytest.raises(wt.WorktreeError, match=r"orchestrator/5 .* remove .*5\.lock and clean the job again"):
        wt._drop_branch(repo, "orchestrator/5")
    assert held.exists() and "orchestrator/5" in git(repo, "branch", "--list", "orchestrator/*")
