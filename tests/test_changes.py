"""orchestrator.git.changes: a job's actual path set, from its real diff, kept current by a watcher."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from orchestrator.git import changes, inotify
from orchestrator.git.changes import WHOLE, ChangeWatcher, actual_paths
from orchestrator.logging import Event
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


def test_binary_changes_are_not_lost(make_repo: MakeRepo, tmp_path: Path) -> None:
    """New and modified binary files appear."""
    root = make_repo()
    (root / "img.bin").write_bytes(b"\x00\x01\x02binary")
    git(root, "add", "img.bin")
    git(root, "commit", "-q", "-m", "bin")
    new_base = git(root, "rev-parse", "HEAD")
    wt = workspace(root, tmp_path / "wt", new_base)
    (wt / "img.bin").write_bytes(b"\x00\x09\x09changed")
    (wt / "new.bin").write_bytes(b"\x00\xff")
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
    assert actual_paths(wt, base) == expected


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


async def test_stop_ends_the_watch_threads_wait_for_events_at_once(
    job: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stop` wakes the watch thread out of its wait for events, however long that wait would be (a job's end
    waits on it before the job can land), and the thread ends without leaving a descriptor open."""
    wt, base = job
    monkeypatch.setattr(changes, "READY_MS", 600_000)  # each wait ten minutes long, were it not woken
    waiting = threading.Event()
    read = inotify.Tree.read

    def reads(tree: inotify.Tree, timeout: float, *wake: int) -> list[bytes] | None:
        waiting.set()
        return read(tree, timeout, *wake)

    monkeypatch.setattr(inotify.Tree, "read", reads)
    before = _descriptors()
    watcher = ChangeWatcher(wt, base, Recorder(), stop_timeout=3.0)
    await watcher.start()
    thread = watcher._thread
    assert thread is not None
    assert await asyncio.to_thread(waiting.wait, 10), "the watch thread never waited for events"
    opened = {fd: target for fd, target in _descriptors().items() if before.get(fd) != target}
    assert any("inotify" in target for target in opened.values()), opened
    with capture_logs() as logs:
        await watcher.stop()
    assert not thread.is_alive(), "the watch thread was still waiting for events"
    assert not [e for e in logs if e["event"] == Event.CHANGES_WATCH_STOP_TIMEOUT]
    # Only the descriptors the watcher opened are compared: another test's leftover object may be collected, and its
    # descriptor closed, at any moment on this worker.
    after = _descriptors()
    assert not {fd: target for fd, target in opened.items() if after.get(fd) == target}


def _descriptors() -> dict[int, str]:
    """This process's open descriptors and what each refers to."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:
            continue
    return found


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


def test_the_set_is_the_whole_repository_past_its_limit(job: tuple[Path, str]) -> None:
    """More changed paths than the limit: the set is the repository's root (it overlaps every path), not a list."""
    wt, base = job
    write(wt, {f"many/{i}.txt": "x\n" for i in range(6)})
    assert actual_paths(wt, base, limit=5) == WHOLE == {""}
    assert len(actual_paths(wt, base, limit=6)) == 6


async def settled(watcher: ChangeWatcher, rec: Recorder, wt: Path) -> frozenset[str]:
    """The watcher's set once it has seen every write made so far: a marker written last shows up (events are
    handled in order), then goes again."""
    marker = f"marker-{os.urandom(4).hex()}.txt"
    await asyncio.to_thread(write, wt, {marker: "m\n"})
    async with asyncio.timeout(10):
        await rec.wait_for(lambda p: marker in p or p == WHOLE)
    await asyncio.to_thread(os.remove, wt / marker)
    async with asyncio.timeout(10):
        await rec.wait_for(lambda p: marker not in p)
    return watcher.paths


async def test_a_name_that_is_not_utf8_is_seen_and_the_watch_goes_on(job: tuple[Path, str]) -> None:
    """`p\\377` (no UTF-8) is reported like any name (surrogate escapes, as git's library reads it), and writes
    after it are still seen: the watch never stops on a file name."""
    wt, base = job
    rec = Recorder()
    watcher = ChangeWatcher(wt, base, rec)
    await watcher.start()
    try:
        odd = os.path.join(os.fsencode(wt), b"p\xff")
        await asyncio.to_thread(lambda: open(odd, "wb").close())
        async with asyncio.timeout(5):
            await rec.wait_for(lambda p: "p\udcff" in p)
        nl = os.path.join(os.fsencode(wt), b"dir\xfe/new\nline")
        os.mkdir(os.path.dirname(nl))
        await asyncio.to_thread(lambda: open(nl, "wb").close())
        await asyncio.to_thread(write, wt, {"docs/after.md": "later\n"})
        async with asyncio.timeout(5):
            await rec.wait_for(lambda p: "docs/after.md" in p and "dir\udcfe/new\nline" in p)
        assert watcher.running and watcher.restarts == 0
    finally:
        await watcher.stop()


async def test_the_watch_restarts_after_an_error_and_misses_nothing(
    job: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watch whose comparison fails logs the error, starts again and compares everything: a write made while it
    was down is reported, and so is every later one."""
    wt, base = job
    failed = threading.Event()
    real = changes.Compare.differs

    def once(self: changes.Compare, path: str, root: object) -> bool:
        if not failed.is_set():
            failed.set()
            write(wt, {"while/down.txt": "d\n"})  # written after the failure, before the restart's watches
            raise OSError(5, "an injected failure")
        return real(self, path, root)  # type: ignore[arg-type]

    monkeypatch.setattr(changes.Compare, "differs", once)
    rec = Recorder()
    watcher = ChangeWatcher(wt, base, rec)
    with capture_logs() as logs:
        await watcher.start()
        try:
            await asyncio.to_thread(write, wt, {"first.txt": "1\n"})
            async with asyncio.timeout(10):
                await rec.wait_for(lambda p: {"first.txt", "while/down.txt"} <= p)
            await asyncio.to_thread(write, wt, {"src/later.py": "l\n"})
            async with asyncio.timeout(5):
                await rec.wait_for(lambda p: "src/later.py" in p)
        finally:
            await watcher.stop()
    assert watcher.restarts == 1
    restarted = [e for e in logs if e["event"] == Event.CHANGES_WATCH_RESTARTED]
    assert len(restarted) == 1 and "an injected failure" in restarted[0]["error"]


async def test_past_its_limit_the_watch_claims_the_whole_repository_and_ends(job: tuple[Path, str]) -> None:
    """A job that touches more paths than the limit: its set is the repository's root, said in the log, and the
    watch stops there (nothing it could see would narrow it)."""
    wt, base = job
    rec = Recorder()
    watcher = ChangeWatcher(wt, base, rec, limit=20)
    await watcher.start()
    try:
        with capture_logs() as logs:
            await asyncio.to_thread(write, wt, {f"gen/{i}.txt": "g\n" for i in range(50)})
            async with asyncio.timeout(10):
                await rec.wait_for(lambda p: p == WHOLE)
            assert watcher._thread is not None
            await asyncio.to_thread(watcher._thread.join, 5)
            assert not watcher.running
        assert any(e["event"] == Event.CHANGES_TOO_MANY for e in logs)
    finally:
        await watcher.stop()


async def test_more_directories_than_can_be_watched_claim_the_whole_repository(job: tuple[Path, str]) -> None:
    """A tree with more directories than the watch may hold cannot be seen whole: its set is the root, at once."""
    wt, base = job
    rec = Recorder()
    watcher = ChangeWatcher(wt, base, rec, max_watches=6)
    await watcher.start()
    try:
        for i in range(8):
            await asyncio.to_thread(os.makedirs, wt / f"d{i}" / "sub")
        async with asyncio.timeout(10):
            await rec.wait_for(lambda p: p == WHOLE)
    finally:
        await watcher.stop()


async def test_a_directory_moved_out_is_no_longer_watched(job: tuple[Path, str], tmp_path: Path) -> None:
    """A directory moved out of the workspace takes its files out of the set (the base's as deletions), and what is
    written in it afterwards, outside, is never reported as the job's."""
    wt, base = job
    rec = Recorder()
    watcher = ChangeWatcher(wt, base, rec)
    await watcher.start()
    try:
        await asyncio.to_thread(write, wt, {"src/new.py": "n\n"})
        async with asyncio.timeout(5):
            await rec.wait_for(lambda p: "src/new.py" in p)
        away = tmp_path / "away"
        await asyncio.to_thread(os.rename, wt / "src", away)
        async with asyncio.timeout(5):
            await rec.wait_for(lambda p: p == {"src/a.py", "src/b.py"})
        await asyncio.to_thread(write, away, {"outside.py": "o\n"})
        assert await settled(watcher, rec, wt) == {"src/a.py", "src/b.py"}
    finally:
        await watcher.stop()


def _operations(rng: random.Random, wt: Path) -> None:
    """One random change of a workspace: files written, rewritten with their own content, deleted, made
    executable, replaced by links or directories; directories made, moved and deleted; ignored files."""
    files = [p for p in wt.rglob("*") if ".git" not in p.relative_to(wt).parts and p.is_file() and not p.is_symlink()]
    dirs = [p for p in wt.rglob("*") if ".git" not in p.relative_to(wt).parts and p.is_dir() and not p.is_symlink()]
    op = rng.choice(["new", "new", "edit", "same", "rm", "chmod", "link", "mkdir", "mvdir", "rmdir", "ignored", "swap"])
    name = f"n{rng.randint(0, 30)}"
    where = rng.choice([wt, *dirs]) if dirs else wt
    if op == "new":
        (where / f"{name}.txt").write_text(name)
    elif op == "edit" and files:
        rng.choice(files).write_text(f"edited {rng.random()}")
    elif op == "same" and files:
        f = rng.choice(files)
        f.write_bytes(f.read_bytes())  # touched, not changed
    elif op == "rm" and files:
        rng.choice(files).unlink()
    elif op == "chmod" and files:
        f = rng.choice(files)
        f.chmod(f.stat().st_mode ^ 0o100)
    elif op == "link":
        link = where / f"{name}.lnk"
        if not link.exists() and not link.is_symlink():
            link.symlink_to(rng.choice(["README.md", "../nowhere", "/etc"]))
    elif op == "mkdir":
        (where / name / "deep").mkdir(parents=True, exist_ok=True)
        (where / name / "deep" / "f.txt").write_text("deep")
    elif op == "mvdir" and dirs:
        src = rng.choice(dirs)
        dst = wt / f"moved{rng.randint(0, 99)}"
        if not dst.exists() and not dst.is_relative_to(src):
            src.rename(dst)
    elif op == "rmdir" and dirs:
        shutil.rmtree(rng.choice(dirs))
    elif op == "ignored":
        (wt / "build").mkdir(exist_ok=True)
        (wt / "build" / f"{name}.o").write_text("o")
        (where / f"{name}.log").write_text("log")
    elif op == "swap" and files:
        f = rng.choice(files)
        f.unlink()
        f.mkdir()
        (f / "inside.txt").write_text("i")


@pytest.mark.parametrize("seed", range(4))
async def test_what_the_watch_tracks_is_what_a_full_diff_says(job: tuple[Path, str], seed: int) -> None:
    """After any mix of writes, deletions, mode changes, links, directory moves and ignored files, the set kept
    from the watch's events alone (no whole-tree diff after the start) is the set a full diff gives."""
    wt, base = job
    rng = random.Random(seed)
    rec = Recorder()
    watcher = ChangeWatcher(wt, base, rec)
    await watcher.start()
    try:
        for _round in range(6):
            for _ in range(rng.randint(1, 12)):
                await asyncio.to_thread(_operations, rng, wt)
            seen = await settled(watcher, rec, wt)
            assert seen == actual_paths(wt, base)
    finally:
        await watcher.stop()


async def test_a_changed_gitignore_is_read_again(job: tuple[Path, str]) -> None:
    """Files git ignored count once `.gitignore` stops ignoring them (the watch compares everything again, at most
    once per RESCAN_EVERY times its last whole diff), and stop counting when it ignores them again."""
    wt, base = job
    rec = Recorder()
    watcher = ChangeWatcher(wt, base, rec)
    await watcher.start()
    try:
        await asyncio.to_thread(write, wt, {"debug.log": "x\n"})
        assert "debug.log" not in await settled(watcher, rec, wt)
        await asyncio.to_thread(write, wt, {".gitignore": "build/\n"})
        async with asyncio.timeout(10):
            await rec.wait_for(lambda p: {"debug.log", ".gitignore"} <= p)
        await asyncio.to_thread(write, wt, {".gitignore": "*.log\nbuild/\n"})
        async with asyncio.timeout(10):
            await rec.wait_for(lambda p: not p)
    finally:
        await watcher.stop()
