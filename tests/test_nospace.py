"""Full disks settle: a store write on a full disk is StoreFull (nothing kept, the connection usable), a move that
settles a job goes through on the reserve; a job past its quota or on a disk under its floor is stopped with a clear
code, its paths and slot freed; the API answers 503 with what to do, never 500."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.core.models import Code, JobState
from orchestrator.jobs import quota
from orchestrator.store import Store, StoreFull
from orchestrator.store import sqlite as store_sqlite
from orchestrator.store.reserve import RESERVE_BYTES
from orchestrator.store.sqlite import SqliteStore
from tests.harness import until
from tests.plane import plane
from tests.smallfs import fill


async def _full_store(small_fs) -> tuple[Store, Path]:
    """A store on a 64 MiB file system that is then filled up, its write-ahead log emptied first (so the next write
    must grow it); the filler, to remove for room again."""
    fs = small_fs("64m")
    store = await SqliteStore.open(fs / "orchestrator.db")
    assert store.reserve is not None and store.reserve.present
    await store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return store, fill(fs)


async def test_a_write_on_a_full_disk_is_store_full_and_a_settling_move_spends_the_reserve(small_fs) -> None:
    """A new job or a field change on a full disk raises StoreFull, saying what to do (no raw `database or disk is
    full`); a move of a job's state then goes through on the reserve; the connection is never left inside a failed
    transaction, so once there is room again every write works and the reserve is made again."""
    store, filler = await _full_store(small_fs)
    try:
        with pytest.raises(StoreFull, match=r"is full.*free space there.*orchestrator clean"):
            await store.jobs.add(repo="/r", branch="main", text="t", runner="shell")
        assert await store.jobs.all() == [], "nothing half-stored"
    finally:
        filler.unlink()
    first = await store.jobs.add(repo="/r", branch="main", text="t", runner="shell")
    await store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    filler = fill(filler.parent)
    try:
        with pytest.raises(StoreFull):
            await store.jobs.update(first.id, {JobState.QUEUED}, reason="a field change")
        assert (await store.jobs.get(first.id)).reason == ""  # type: ignore[union-attr]
        moved = await store.jobs.transition(first.id, {JobState.QUEUED}, JobState.CANCELLED, "cancelled", reason="x")
        assert moved is not None and moved.state is JobState.CANCELLED
        assert store.reserve is not None and not store.reserve.present, "the reserve was spent on it"
    finally:
        filler.unlink()
    store_sqlite.RESERVE_LOOK = 0.0
    try:
        again = await store.jobs.add(repo="/r", branch="main", text="t2", runner="shell")
        await store.jobs.transition(again.id, {JobState.QUEUED}, JobState.CANCELLED, "cancelled")
        assert store.reserve.present, "made again once there was room"
        assert (store.reserve.path.stat().st_size) == RESERVE_BYTES
    finally:
        store_sqlite.RESERVE_LOOK = 30.0
        await store.close()


def test_the_quota_and_the_floor_say_what_to_do() -> None:
    """Over `max_bytes`: TooBig naming both sizes; under `min_free`: NoSpace naming the disk; else nothing."""
    over = quota.judge(3 * 2**30, 10 * 2**30, 2 * 2**30, 2**20, Path("/state"))
    assert over is not None and over.code is Code.TOO_BIG and "3 GiB, past jobs.max_bytes (2 GiB)" in over.reason
    low = quota.judge(2**20, 2**20, 2 * 2**30, 256 * 2**20, Path("/state"))
    assert low is not None and low.code is Code.NO_SPACE and "/state has 1 MiB free" in low.reason
    assert quota.judge(2**20, 2**40, 2 * 2**30, 256 * 2**20, Path("/state")) is None
    assert quota.judge(2**40, 0, 0, 0, Path("/state")) is None, "0 turns both off"


async def test_a_job_past_its_quota_is_stopped_and_frees_its_paths(make_repo, tmp_path, monkeypatch) -> None:
    """A job that writes more than `jobs.max_bytes` is stopped (failed, code TooBig, its processes ended), its
    workspace kept; a job waiting for its paths then runs."""
    monkeypatch.setattr(quota, "EVERY", 0.2)
    repo = make_repo()
    async with plane(tmp_path, max_bytes=4 * 2**20, min_free_bytes=0) as p:
        big = await p.enqueue(repo, "head -c 16000000 /dev/urandom > big.bin; echo x > src/a.py; sleep 60", "src/a.py")
        after = await p.enqueue(repo, "echo y > src/a.py", "src/a.py")
        stopped = await p.reach(big, JobState.FAILED, JobState.LANDED, timeout=60)
        assert stopped.code == Code.TOO_BIG and "past jobs.max_bytes (4 MiB)" in stopped.reason, stopped.reason
        assert stopped.worktree and (Path(stopped.worktree) / "big.bin").exists(), "its workspace is kept"
        landed = await p.reach(after, JobState.LANDED, JobState.FAILED, timeout=60)
        assert landed.state is JobState.LANDED, landed.reason


def test_a_job_that_fills_the_state_disk_settles_and_the_api_says_503(
    make_repo, daemon_factory, small_fs, tmp_path
) -> None:
    """The state dir on a small disk; a job fills it. The job is stopped with code NoSpace (its paths and slot free),
    `enqueue` and `cancel` answer 503 saying the disk is full and what to do (never 500, nothing half-stored); once
    the job is cleaned, the queued job that waited for its paths runs and lands."""
    repo = make_repo(files={"README.md": "r\n", "src/a.py": "a = 1\n", ".gitignore": "*.bin\n"})
    d = daemon_factory()
    fs = small_fs("64m", at=d.home / "state")
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text("[jobs]\nmin_free_bytes = 16777216\n")
    d.start()
    gate = tmp_path / "gate"
    fills = f"while [ ! -e {gate} ]; do sleep 0.05; done; head -c 100000000 /dev/zero > big.bin; sleep 120"
    filler = d.enqueue(repo, fills, "--path", "src/a.py")
    waiting = d.enqueue(repo, "echo y > src/a.py", "--path", "src/a.py")
    until("the waiting job to wait", lambda: d.cli_json("show", str(waiting))["state"] == "planned")
    gate.touch()

    def show(job: int) -> dict:
        return d.cli_json("show", str(job))

    stopped = until("the filling job to stop", lambda: (j := show(filler))["state"] == "failed" and j, 90)
    assert stopped["code"] == "NoSpace", stopped["reason"]
    assert "free space there" in stopped["reason"]
    free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
    assert free < 16 * 2**20, "the disk is still full: the job's workspace is kept"
    held = until("the waiting job to wait for room", lambda: (j := show(waiting))["code"] == "NoSpace" and j, 30)
    assert held["state"] == "planned" and "jobs.min_free_bytes" in held["reason"], held
    # The write-ahead log may still have room of its own for a small write: a 503 saying so, or stored whole.
    late = d.cli("enqueue", "--repo", str(repo), "--path", "docs/z.md", "--", "echo z > docs/z.md")
    assert late.returncode == 0 or ("is full" in late.stderr and "free space there" in late.stderr), late.stderr
    if late.returncode == 0:
        cancel = d.cli("cancel", late.stderr.split()[1])
        assert cancel.returncode == 0 or "is full" in cancel.stderr, cancel.stderr
    cleaned = d.cli("clean", str(filler))
    assert cleaned.returncode == 0, cleaned.stderr
    landed = until("the waiting job to land", lambda: (j := show(waiting))["state"] in ("landed", "failed") and j, 90)
    assert landed["state"] == "landed", landed["reason"]
    codes = [json.loads(line).get("status") for line in d.log_path.read_text().splitlines() if '"api.error"' in line]
    assert 500 not in codes
    assert not [e for e in d.events() if e.get("event") == "api.error" and e.get("level") == "error"]

