"""A job's file names are its own: the overlap watch survives any of them, and names git cannot store fail the job
with a message that names them (never a raw UnicodeEncodeError or GitError)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.job import Job
from orchestrator.core.models import Code, JobState
from tests.conftest import git
from tests.plane import plane

ODD = "\"$(printf 'p\\377')\""
"""A shell word for a file name that is not UTF-8."""


async def test_a_name_that_is_not_utf8_does_not_blind_the_overlap_watch(make_repo, tmp_path: Path) -> None:
    """A job makes `p\\377`, then writes a file outside its claim and puts it back: the write is still seen (its
    claim grows, event claim_grown), so a job claiming that file, queued meanwhile, waits for it instead of running
    beside it."""
    repo = make_repo()
    gate = tmp_path / "gate"
    async with plane(tmp_path, max_concurrent=4) as p:
        first = await p.enqueue(
            repo,
            f"echo odd > {ODD}; sleep 0.5; echo changed > docs/x.md; "
            f"while [ ! -e {gate} ]; do sleep 0.05; done; echo x > docs/x.md; rm -f {ODD}; echo a2 > src/a.py",
            "src/a.py",
        )

        async def grown() -> bool:
            return any(
                e["kind"] == "claim_grown" and "docs/x.md" in e["paths"] for e in await p.store.events.of_job(first)
            )

        await p.until("the write outside the claim to be seen", grown)
        second = await p.enqueue(repo, "echo y > docs/x.md", "docs/x.md")

        async def decided() -> Job | None:
            job = await p.store.jobs.get(second)
            waits = (JobState.QUEUED, JobState.PLANNING, JobState.PLANNED)
            return job if job is not None and (job.code or job.state not in waits) else None

        waiting = await p.until("admission to decide on it", decided)
        assert waiting.state is JobState.PLANNED and waiting.code == "Overlap", waiting.reason
        gate.touch()
        done = await p.reach(first, JobState.LANDED, JobState.FAILED)
        assert done.state is JobState.LANDED, done.reason
        after = await p.reach(second, JobState.LANDED, JobState.FAILED)
        assert after.state is JobState.LANDED, after.reason
        assert (after.started_at or 0) >= (done.finished_at or 0), "it ran only once the first was done"
    assert git(repo, "show", "main:docs/x.md") == "y"


async def test_names_git_cannot_store_fail_the_job_naming_them(make_repo, tmp_path: Path) -> None:
    """A job that leaves `git~1`, `.GIT/config` and `p\\377` fails with code BadNames and a reason that names each
    (escaped) and says what to do; nothing reaches the repository, and its workspace is kept to fix and revise."""
    repo = make_repo()
    async with plane(tmp_path) as p:
        job = await p.enqueue(
            repo, f"echo a > git~1; mkdir .GIT; echo b > .GIT/config; echo c > {ODD}; echo ok > src/a.py", "src/a.py"
        )
        failed = await p.reach(job, JobState.FAILED, JobState.LANDED)
        assert failed.state is JobState.FAILED and failed.code == Code.BAD_NAMES, failed.reason
        for shown in ("'git~1'", "'.GIT/'", "'p\\xff' (not UTF-8)", "rename or delete them"):
            assert shown in failed.reason
        assert "Error" not in failed.reason, "no raw exception"
        assert failed.worktree and (Path(failed.worktree) / "git~1").exists()
    assert git(repo, "branch", "--list", "orchestrator/*") == ""
