"""Landing is all or nothing, and the job's state says what is on the branch: a full disk, an unwritable ref, a
branch rewritten under a running job."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator import testhook
from orchestrator.core.models import Code, JobState
from tests.conftest import git, write
from tests.plane import plane
from tests.smallfs import fill
from tests.test_e2e_jobs import wait_for_file

BIG = "head -c 1572864 /dev/zero | tr '\\0' 0"  # 1.5 MB in a checkout, almost nothing in git


def _status(repo: Path) -> list[str]:
    out = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def _user_repo(root: Path) -> Path:
    """A repository whose checkout is on `main` with the user's own uncommitted edit in notes/."""
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.name", "Repo User")
    git(root, "config", "user.email", "user@example.com")
    write(root, {"README.md": "hello\n", "docs/x.md": "x\n", "notes/mine.txt": "committed\n"})
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    write(root, {"notes/mine.txt": "the user's own edit\n"})
    return root


async def test_a_branch_rewritten_under_a_job_never_gets_its_dropped_history_back(make_repo, tmp_path):
    """The target branch is reset and rewritten while a job runs: the job is not merged (that would bring the
    dropped commit back), it is planned and run again on the new head, and lands there."""
    repo = make_repo()
    git(repo, "commit", "-q", "--allow-empty", "-m", "dropped")
    dropped = git(repo, "rev-parse", "main")
    gate = tmp_path / "gate"
    async with plane(tmp_path) as p:
        job = await p.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo job > job.txt", "job.txt")
        first = await p.reach(job, JobState.RUNNING)
        assert first.base == dropped
        git(repo, "reset", "-q", "--hard", "HEAD~1")
        git(repo, "commit", "-q", "--allow-empty", "-m", "rewritten")
        gate.touch()
        done = await p.reach(job, JobState.LANDED, timeout=60)
        assert done.attempts == 1 and done.base != dropped
        events = await p.store.events.of_job(job)
        assert any(e["kind"] == "requeued" and e.get("code") == Code.REWRITTEN for e in events), events
    with pytest.raises(subprocess.CalledProcessError):
        git(repo, "merge-base", "--is-ancestor", dropped, "main")
    assert git(repo, "show", "main:job.txt") == "job"


async def test_an_unwritable_ref_fails_the_landing_and_a_retry_lands_it_once(make_repo, tmp_path):
    """The branch ref cannot be written: the job fails saying it did not land and nothing moved; once the ref is
    writable, a retry lands it exactly once."""
    repo = make_repo()
    lock = repo / ".git" / "refs" / "heads" / "main.lock"
    lock.write_text("stale\n")
    head = git(repo, "rev-parse", "main")
    async with plane(tmp_path) as p:
        job = await p.enqueue(repo, "echo job >> src/a.py", "src/a.py")
        failed = await p.reach(job, JobState.FAILED, JobState.LANDED, timeout=60)
        assert failed.state is JobState.FAILED and failed.code == Code.LANDING_FAILED, failed.reason
        assert "not moved" in failed.reason and git(repo, "rev-parse", "main") == head
        lock.unlink()
        await p.jobs.retry(job)
        await p.reach(job, JobState.LANDED, timeout=60)
    assert git(repo, "show", "main:src/a.py").count("job") == 1


async def test_a_full_checkout_disk_waits_then_lands_once(small_fs, tmp_path):
    """The checkout's disk has no room for a landing: it waits (code NoSpace, nothing moved, the user's checkout
    as it was), and lands once there is room."""
    fs = small_fs("4m")
    repo = _user_repo(fs / "repo")
    filler = fill(fs, leave=1024 * 1024)
    async with plane(tmp_path) as p:
        job = await p.enqueue(repo, f"{BIG} > big.txt", "big.txt")

        async def waiting() -> bool:
            j = await p.store.jobs.get(job)
            return j is not None and j.code == Code.NO_SPACE

        await p.until("the landing to wait for room", waiting, timeout=60)
        assert await p.state(job) is JobState.LANDING
        assert _status(repo) == [" M notes/mine.txt"] and not (repo / "big.txt").exists()
        filler.unlink()
        await p.reach(job, JobState.LANDED, timeout=90)
    assert _status(repo) == [" M notes/mine.txt"] and (repo / "big.txt").stat().st_size == 1572864


async def test_a_disk_that_fills_during_the_landing_leaves_no_half_landing(small_fs, tmp_path):
    """The checkout's disk fills after the landing's checks: nothing lands (the branch, the index, the files as
    they were: no staged deletes, no truncated files), the job says so, and a retry later lands it once."""
    fs = small_fs("8m")
    repo = _user_repo(fs / "repo")
    head = git(repo, "rev-parse", "main")
    fillers: list[Path] = []

    async def fill_now(name: str, job_id: int | None) -> None:
        fillers.append(fill(fs, leave=256 * 1024))  # room for the ref, not for the files

    async with plane(tmp_path) as p:
        testhook.install("landing.move", fill_now)
        text = f"{BIG} > big.txt; {BIG} > docs/x.md; rm README.md"
        job = await p.enqueue(repo, text, "big.txt", "docs/", "README.md")
        failed = await p.reach(job, JobState.FAILED, JobState.LANDED, timeout=60)
        testhook.clear()
        assert failed.state is JobState.FAILED and failed.code == Code.LANDING_FAILED, failed.reason
        assert "nothing changed" in failed.reason
        assert git(repo, "rev-parse", "main") == head
        assert _status(repo) == [" M notes/mine.txt"]
        assert (repo / "docs/x.md").read_text() == "x\n" and (repo / "README.md").read_text() == "hello\n"
        fillers[0].unlink()
        await p.jobs.retry(job)
        await p.reach(job, JobState.LANDED, timeout=90)
    assert _status(repo) == [" M notes/mine.txt"] and not (repo / "README.md").exists()
    assert len(git(repo, "log", "--format=%H", f"{head}..main").split()) == 1, "landed once"
