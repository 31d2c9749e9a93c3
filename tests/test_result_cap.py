"""A job's result is held to `jobs.max_result_bytes` before anything is written: past it the job fails (TooBig),
its workspace kept, and the repository is as it was."""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.models import Code, JobState
from tests.conftest import git
from tests.plane import plane


def _objects_bytes(repo: Path) -> int:
    return sum(p.stat().st_size for p in (repo / ".git" / "objects").rglob("*") if p.is_file())


async def test_a_result_over_the_cap_is_refused_before_anything_is_written(make_repo, tmp_path: Path) -> None:
    """Three files of 2 MiB under a 4 MiB cap: the job fails with code TooBig naming the sizes and what to do;
    no object reaches the repository; its workspace is kept (nothing is lost)."""
    repo = make_repo()
    before = _objects_bytes(repo)
    async with plane(tmp_path, max_result_bytes=4 * 2**20) as p:
        job = await p.enqueue(repo, "for i in 1 2 3; do head -c 2097152 /dev/urandom > gen$i.bin; done", "gen1.bin")
        failed = await p.reach(job, JobState.FAILED, JobState.LANDED)
        assert failed.code == Code.TOO_BIG, failed.reason
        assert "6 MiB in 3 files, over the 4 MiB" in failed.reason and "jobs.max_result_bytes" in failed.reason
        assert failed.worktree and (Path(failed.worktree) / "gen3.bin").stat().st_size == 2097152
    assert _objects_bytes(repo) == before
    assert git(repo, "branch", "--list", "orchestrator/*") == ""
