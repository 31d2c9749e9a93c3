"""A daemon with no git identity authors a job's commits as the person who queued it (the CLI's git identity, or
the author of the commit whose ticket it is), never as `orchestrator@localhost`; the merge of its landing too."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

from orchestrator.commands.jobs import git_person
from orchestrator.core.models import JobState
from orchestrator.requests import Enqueue
from orchestrator.service import hookrun
from tests.conftest import git, write
from tests.plane import plane
from tests.test_commits import no_identity  # noqa: F401 - the fixture

ANN = "Ann Example <ann@example.org>"


def _anonymous(repo: Path) -> None:
    git(repo, "config", "--unset", "user.name")
    git(repo, "config", "--unset", "user.email")


def test_the_cli_sends_your_git_identity(make_repo, monkeypatch) -> None:
    """`enqueue` names you as git would author your commit in that repository; nobody when git cannot say."""
    repo = make_repo()
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Ann Example")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "ann@example.org")
    assert git_person(repo) == ANN
    assert git_person(repo / "no-such-dir") == ""


def test_a_tickets_author_is_its_commits(make_repo) -> None:
    """The hook's request names the commit's author: who queued its tickets."""
    repo = make_repo()
    write(repo, {"x.txt": "x\n"})
    git(repo, "add", "x.txt")
    env = {**os.environ, "GIT_AUTHOR_NAME": "Ann Example", "GIT_AUTHOR_EMAIL": "ann@example.org"}
    subprocess.run(["git", "commit", "-qm", "x\n\nOrchestrator: true"], cwd=repo, env=env, check=True)
    sha = git(repo, "rev-parse", "HEAD")
    assert hookrun.request(repo, sha, []).author == ANN


async def test_jobs_are_authored_by_who_queued_them_when_the_daemon_has_no_identity(
    make_repo, tmp_path, no_identity  # noqa: F811 - the fixture
) -> None:
    """Two jobs side by side land (a fast-forward and a merge): every new commit on main is Ann's, committed by the
    daemon as itself; a job queued by nobody in particular falls back to `orchestrator`."""
    repo = make_repo()
    _anonymous(repo)
    before = git(repo, "rev-parse", "main")
    async with plane(tmp_path) as p:
        gate = tmp_path / "gate"
        wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
        a = (await p.jobs.submit(Enqueue(repo=str(repo), text=f"{wait}; echo a > src/a.py", paths=("src/a.py",),
                                         author=ANN))).id  # fmt: skip
        b = (await p.jobs.submit(Enqueue(repo=str(repo), text=f"{wait}; echo b > src/b.py", paths=("src/b.py",),
                                         author=ANN))).id  # fmt: skip
        await p.reach(a, JobState.RUNNING)
        await p.reach(b, JobState.RUNNING)
        gate.touch()
        await asyncio.gather(p.reach(a, JobState.LANDED), p.reach(b, JobState.LANDED))
        nobody = await p.enqueue(repo, "echo c > docs/x.md", "docs/x.md")
        await p.reach(nobody, JobState.LANDED)
    lines = git(repo, "log", "--format=%an <%ae>|%cn <%ce>|%s", f"{before}..main").splitlines()
    ours = [ln for ln in lines if "echo c" not in ln]
    assert len(ours) == 3 and any("Merge orchestrator job" in ln for ln in ours), lines
    assert all(ln.startswith(f"{ANN}|orchestrator <orchestrator@localhost>|") for ln in ours), lines
    (theirs,) = [ln for ln in lines if "echo c" in ln]
    assert theirs.startswith("orchestrator <orchestrator@localhost>|"), lines
