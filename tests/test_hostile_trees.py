"""A job's tree is its own, however it is shaped: a directory nested deeper than git reads neither blinds the overlap
watch nor fails the job with a raw error, and the daemon can still remove it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.core.job import Job
from orchestrator.core.models import ROOT, Code, JobState
from orchestrator.git.workspace import remove_tree
from tests.conftest import git
from tests.plane import plane

NEST = "python3 -c \"import os\nfor _ in range({n}):\n    os.mkdir('d'); os.chdir('d')\nopen('f', 'w').write('x')\""
"""A shell command that nests `n` directories `d/d/…` in the job's workspace, a file at the bottom."""


async def test_a_tree_nested_deeper_than_git_reads_holds_the_whole_repository(make_repo, tmp_path: Path) -> None:
    """A job nests 150 directories (libgit2 reads 100), changes its .gitignore (the watch compares the whole tree
    again) and writes outside its claim: its paths are the whole repository (changes.too_many), so a job queued
    meanwhile waits for it instead of running beside it; it ends with code BadNames saying what to do (no raw
    GitError), and the other job then lands."""
    repo = make_repo()
    gate = tmp_path / "gate"
    async with plane(tmp_path, max_concurrent=4) as p:
        first = await p.enqueue(
            repo, f"{NEST.format(n=150)}\necho '*.tmp' >> .gitignore\nsleep 0.5\necho changed > docs/x.md\n"
            f"while [ ! -e {gate} ]; do sleep 0.05; done",
            "src/a.py",
        )  # fmt: skip

        async def whole() -> bool:
            job = await p.store.jobs.get(first)
            return job is not None and ROOT in job.actual

        await p.until("its paths to be the whole repository", whole)
        second = await p.enqueue(repo, "echo y > docs/x.md", "docs/x.md")

        async def decided() -> Job | None:
            job = await p.store.jobs.get(second)
            waits = (JobState.QUEUED, JobState.PLANNING, JobState.PLANNED)
            return job if job is not None and (job.code or job.state not in waits) else None

        waiting = await p.until("admission to decide on it", decided)
        assert waiting.state is JobState.PLANNED and waiting.code == "Overlap", waiting.reason
        gate.touch()
        done = await p.reach(first, JobState.LANDED, JobState.FAILED)
        assert done.code == Code.BAD_NAMES and "nested up to 100 deep" in done.reason, done.reason
        assert "Error:" not in done.reason
        after = await p.reach(second, JobState.LANDED, JobState.FAILED)
        assert after.state is JobState.LANDED, after.reason
    assert git(repo, "show", "main:docs/x.md") == "y"


def test_a_tree_nested_thousands_deep_is_removed(tmp_path: Path) -> None:
    """`remove_tree` (what `clean`, a retry and the pool use) removes a tree 3000 directories deep, one of them
    unreadable, where a recursive removal stops at Python's recursion limit; a link in it is unlinked, not followed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine\n")
    top = tmp_path / "ws"
    top.mkdir()
    try:
        _nest(top, 3000, link_at=1500, to=outside)
        remove_tree(top)
        assert not top.exists()
        assert (outside / "keep").read_text() == "mine\n"
    finally:  # never leave pytest a tree its own cleanup (recursive) cannot remove
        subprocess.run(["rm", "-rf", str(top)], check=False)


def _nest(top: Path, depth: int, *, link_at: int, to: Path) -> None:
    """`d/d/…` `depth` deep under `top` (a link to `to` at `link_at`), a file at the bottom, the last one read-only."""
    here = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(depth):
            os.mkdir("d", dir_fd=here)
            if i == link_at:
                os.symlink(to, "link", dir_fd=here)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=here)
            os.close(here)
            here = nxt
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=here), "w") as f:
            f.write("x")
        os.fchmod(here, 0o500)
    finally:
        os.close(here)
