"""orchestrator.git.changes: a job's actual path set, from its real diff, kept current by a watcher."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.git.changes import ChangeWatcher, actual_paths, paths_from_diff, unified_diff
from tests.conftest import git, workspace, write

MakeRepo = Callable[..., Path]


@pytest.fixture
def job(make_repo: MakeRepo, tmp_path: Path) -> tuple[Path, str]:
    """A workspace (its own git dir on orchestrator/1) at the repository's first commit, as a job gets it."""
    root = make_repo(
        files={"README.md": "hi\n", "src/a.py": "a = 1\n", "src/b.py": "b = 1\n", ".gitignore": "*.log\nbuild/\n"}
    )
    base = git(root, "rev-parse", "HEAD")
    return workspace(root, tmp_path / "wt", base, "orchestrator/1"), base


def test_clean_worktree_has_no_paths(job: tuple[Path, str]) -> None:
    """A worktree exactly at its base has touched nothing."""
    wt, base = job
    assert actual_paths(wt, base) == frozenset()
    assert unified_diff(wt, base) == ""


def test_modified_added_deleted_nested(job: tuple[Path, str]) -> None:
    """Unstaged edits, untracked files in new nested dirs, and deletions all count."""
    wt, base = job
    write(wt, {"src/a.py": "a = 2\n", "pkg/deep/er/new.py": "x\n"})
    os.remove(wt / "src/b.py")
    assert actual_paths(wt, base) == {"src/a.py", "pkg/deep/er/new.py", "src/b.py"}


def test_the_files_count_not_the_jobs_own_git_state(job: tuple[Path, str]) -> None:
    """Files committed or staged in the job's own git dir count as files; one it committed, then deleted,
    does not (it would not land: the daemon commits the files), nor does a HEAD the job points elsewhere."""
    wt, base = job
    write(wt, {"committed.txt": "c\n"})
    git(wt, "add", "committed.txt")
    git(wt, "commit", "-q", "-m", "job commit")
    write(wt, {"staged.txt": "s\n"})
    git(wt, "add", "staged.txt")
    assert actual_paths(wt, base) == {"committed.txt", "staged.txt"}
    os.remove(wt / "committed.txt")
    (wt / ".git" / "index").write_bytes(b"garbage")
    (wt / ".git" / "HEAD").write_text("ref: refs/heads/nowhere\n")
    assert actual_paths(wt, base) == {"staged.txt"}


def test_rename_counts_both_sides(job: tuple[Path, str]) -> None:
    """A rename (staged, or as a delete plus an untracked add) reports the old and the new path."""
    wt, base = job
    os.rename(wt / "src/a.py", wt / "src/moved.py")
    os.rename(wt / "src/b.py", wt / "lib_b.py")
    assert actual_paths(wt, base) == {"src/a.py", "src/moved.py", "src/b.py", "lib_b.py"}
    assert {"src/a.py", "src/moved.py"} <= paths_from_diff(unified_diff(wt, base))


def test_binary_changes_are_not_lost(make_repo: MakeRepo, tmp_path: Path) -> None:
    """New and modified binary files appear, both in the diff text parse and in the result."""
    root = make_repo()
    (root / "img.bin").write_bytes(b"\x00\x01\x02binary")
    git(root, "add", "img.bin")
    git(root, "commit", "-q", "-m", "bin")
    new_base = git(root, "rev-parse", "HEAD")
    wt = workspace(root, tmp_path / "wt", new_base)
    (wt / "img.bin").write_bytes(b"\x00\x09\x09changed")
    (wt / "new.bin").write_bytes(b"\x00\xff")
    text = unified_diff(wt, new_base)
    assert "Binary files" in text
    assert paths_from_diff(text) == {"img.bin", "new.bin"}
    assert actual_paths(wt, new_base) == {"img.bin", "new.bin"}


def test_ignored_files_do_not_count(job: tuple[Path, str]) -> None:
    """Git-ignored files (by pattern or in an ignored dir) are not part of the job's paths."""
    wt, base = job
    write(wt, {"debug.log": "x\n", "build/out/a.o": "o\n", "src/real.py": "r\n"})
    assert actual_paths(wt, base) == {"src/real.py"}


def test_odd_file_names_and_mode_changes(job: tuple[Path, str]) -> None:
    """Names git quotes (spaces, non-ASCII, tabs), empty files and mode-only changes are read right."""
    wt, base = job
    write(wt, {"sp ace ñ.txt": "x\n", 'tab\tq".txt': "y\n", "empty.txt": ""})
    os.chmod(wt / "src/a.py", 0o755)
    expected = {"sp ace ñ.txt", 'tab\tq".txt', "empty.txt", "src/a.py"}
    assert paths_from_diff(unified_diff(wt, base)) == expected
    assert actual_paths(wt, base) == expected


def test_paths_from_diff_reads_a_git_cli_diff(job: tuple[Path, str]) -> None:
    """A diff from the git CLI (renames, deletions, /dev/null sides) parses to the same paths."""
    wt, base = job
    git(wt, "mv", "src/a.py", "src/z.py")
    git(wt, "rm", "-q", "README.md")
    write(wt, {"n.txt": "n\n"})
    git(wt, "add", "-A")
    text = git(wt, "diff", "--cached", "-M", base) + "\n"
    assert paths_from_diff(text) == {"src/a.py", "src/z.py", "README.md", "n.txt"}


class Recorder:
    """An on_change callback that records each reported set and lets a test wait for a condition."""

    def __init__(self) -> None:
        self.calls: list[frozenset[str]] = []
        self.changed = asyncio.Event()

    async def __call__(self, paths: frozenset[str]) -> None:
        self.calls.append(paths)
        self.changed.set()

    async def wait_for(self, predicate: Callable[[frozenset[str]], bool]) -> None:
        while not (self.calls and predicate(self.calls[-1])):
            self.changed.clear()
            await self.changed.wait()


async def test_watcher_reports_a_write_within_one_second(job: tuple[Path, str]) -> None:
    """A write in the worktree reaches on_change within 1 s, and deletions shrink the set again."""
    wt, base = job
    rec = Recorder()
    watcher = ChangeWatcher(wt, base, rec)
    assert await watcher.start() == frozenset()
    try:
        assert rec.calls == []  # nothing changed yet, nothing reported
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.to_thread(write, wt, {"src/new.py": "n\n"})
        async with asyncio.timeout(1.0):
            await rec.wait_for(lambda p: "src/new.py" in p)
        assert loop.time() - t0 < 1.0
        assert rec.calls[-1] == {"src/new.py"}
        await asyncio.to_thread(os.remove, wt / "src/new.py")
        async with asyncio.timeout(1.0):
            await rec.wait_for(lambda p: not p)
    finally:
        await watcher.stop()
    assert not watcher.running


async def test_watcher_ignores_ignored_and_git_writes(job: tuple[Path, str]) -> None:
    """Writes to git-ignored files and git's own bookkeeping never produce a report."""
    wt, base = job
    rec = Recorder()
    watcher = ChangeWatcher(wt, base, rec)
    await watcher.start()
    try:
        await asyncio.to_thread(write, wt, {"debug.log": "x\n", "build/a/b.o": "o\n"})
        await asyncio.to_thread(git, wt, "update-index", "--refresh")
        await asyncio.sleep(0.5)
        assert rec.calls == []
        # And the watch is still alive afterwards.
        await asyncio.to_thread(write, wt, {"README.md": "changed\n"})
        async with asyncio.timeout(1.0):
            await rec.wait_for(lambda p: p == {"README.md"})
        assert rec.calls == [frozenset({"README.md"})]
    finally:
        await watcher.stop()


async def test_watcher_start_reports_existing_changes_and_refresh(job: tuple[Path, str]) -> None:
    """start() reports what the worktree already holds; refresh() recomputes on demand, reporting only changes."""
    wt, base = job
    write(wt, {"pre.txt": "p\n"})
    rec = Recorder()
    watcher = ChangeWatcher(wt, base, rec)
    assert await watcher.start() == {"pre.txt"}
    try:
        assert rec.calls == [frozenset({"pre.txt"})]
        assert await watcher.refresh() == {"pre.txt"}
        assert len(rec.calls) == 1  # same set: no second report
    finally:
        await watcher.stop()


async def test_watcher_survives_a_failing_callback(job: tuple[Path, str]) -> None:
    """An exception in on_change is logged and the watch goes on reporting later changes."""
    wt, base = job
    seen: list[frozenset[str]] = []
    first, done = asyncio.Event(), asyncio.Event()

    async def flaky(paths: frozenset[str]) -> None:
        seen.append(paths)
        if len(seen) == 1:
            first.set()
            raise RuntimeError("callback bug")
        done.set()

    watcher = ChangeWatcher(wt, base, flaky)
    await watcher.start()
    try:
        await asyncio.to_thread(write, wt, {"one.txt": "1\n"})
        await asyncio.wait_for(first.wait(), 2)
        await asyncio.to_thread(write, wt, {"two.txt": "2\n"})
        await asyncio.wait_for(done.wait(), 2)
        assert "two.txt" in seen[-1]
    finally:
        await watcher.stop()
