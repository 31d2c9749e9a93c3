"""orchestrator.git.worktrees: one clean worktree per job, outside the user's checkout, from a warm pool."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

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
    """acquire gives a clean worktree at base, on branch orchestrator/<id>, outside the user's checkout."""
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
    assert git(root, "branch", "--list", "orchestrator/*") == ""


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
    """keep=True leaves the worktree, its files and branch; clean() then removes worktree and branch."""
    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    pool = WorktreePool(tmp_path / "wts", warm=2)
    wt = await pool.acquire(root, 5, base)
    write(wt, {"work.txt": "precious\n"})
    await pool.release(root, 5, keep=True)
    assert (wt / "work.txt").read_text() == "precious\n"
    assert git(root, "branch", "--list", "orchestrator/5") != ""
    assert pool.pooled(root) == []
    with pytest.raises(WorktreeError, match="already has a worktree"):
        await pool.acquire(root, 5, base)
    await pool.clean(root, 5)
    assert not wt.exists()
    assert git(root, "branch", "--list", "orchestrator/5") == ""
    assert str(wt) not in git(root, "worktree", "list", "--porcelain")


async def test_release_keeps_branch_unless_asked(make_repo: MakeRepo, tmp_path: Path) -> None:
    """release(keep=False) removes the worktree but leaves the branch (with its commits) for landing to decide."""
    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    pool = WorktreePool(tmp_path / "wts", warm=0)
    wt = await pool.acquire(root, 4, base)
    write(wt, {"f.txt": "f\n"})
    git(wt, "add", "-A")
    git(wt, "commit", "-q", "-m", "job work")
    tip = git(wt, "rev-parse", "HEAD")
    await pool.release(root, 4)
    assert not wt.exists()
    assert git(root, "rev-parse", "orchestrator/4") == tip
    assert str(wt) not in git(root, "worktree", "list", "--porcelain")
    # The same job id can start again; its branch is forced back to the new base.
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
    listed = git(root, "worktree", "list", "--porcelain").count("worktree ")
    assert listed == 2  # the user's checkout and the one pooled worktree


async def test_recover_rebuilds_the_pool_from_disk(make_repo: MakeRepo, tmp_path: Path) -> None:
    """A new pool object (after a daemon crash) prunes stale metadata, adopts pooled worktrees, finds kept jobs."""
    root = make_repo()
    base = git(root, "rev-parse", "HEAD")
    first = WorktreePool(tmp_path / "wts", warm=3)
    await first.fill(root, base)
    kept = await first.acquire(root, 9, base)
    await first.release(root, 9, keep=True)
    gone = await first.acquire(root, 10, base)
    # Simulate a crash mid-removal: the directory vanished, git's metadata did not.
    await asyncio.to_thread(shutil.rmtree, gone)
    (first.path_for(root, 0).parent / "trash-deadbeef").mkdir()

    second = WorktreePool(tmp_path / "wts", warm=2)
    assert await second.recover(root) == {9}
    assert len(second.pooled(root)) == 1
    assert not (first.path_for(root, 0).parent / "trash-deadbeef").exists()
    listed = git(root, "worktree", "list", "--porcelain")
    assert str(gone) not in listed and str(kept) in listed
    wt = await second.acquire(root, 11, base)
    assert second.pooled(root) == [] and status(wt) == ""


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
