"""Landing styles: merge (merge commits), rebase (the job's commits replayed: linear), squash (one commit)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.git.landing import LandOutcome, land
from tests.conftest import FOUR_SLOTS, git, write


def job_branch(repo: Path, base: str, commits: list[tuple[str, dict[str, str]]]) -> str:
    """Commits on a job branch from `base`, each with its own subject and author; returns the tip."""
    git(repo, "checkout", "-q", "-b", "orchestrator/7", base)
    for n, (subject, files) in enumerate(commits):
        write(repo, files)
        git(repo, "add", "-A")
        git(repo, "-c", f"user.name=Agent {n}", "commit", "-q", "--author", f"Agent {n} <a{n}@x>", "-m", subject)
    tip = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return tip


@pytest.fixture
def moved(make_repo: Callable[..., Path]) -> tuple[Path, str, str]:
    """A repo whose main moved (docs) after a job branched off with two commits (src/a.py, src/b.py)."""
    repo = make_repo()
    base = git(repo, "rev-parse", "main")
    tip = job_branch(
        repo,
        base,
        [
            ("Fix a\n\nOrchestrator-Job: 7", {"src/a.py": "a = 2\n"}),
            ("Fix b\n\nOrchestrator-Job: 7", {"src/b.py": "b = 2\n"}),
        ],
    )
    write(repo, {"docs/x.md": "moved\n"})
    git(repo, "commit", "-qam", "user moves main")
    return repo, git(repo, "rev-parse", "main"), tip


def parents(repo: Path, rev: str) -> int:
    return len(git(repo, "rev-list", "--parents", "-n1", rev).split()) - 1


@pytest.mark.parametrize("style", ["merge", "rebase", "squash"])
async def test_each_style_gives_the_history_it_promises(moved, style: str) -> None:
    """merge: one merge commit; rebase: both commits replayed, linear; squash: one linear commit. Same tree."""
    repo, head, tip = moved
    result = await land(repo, "main", tip, job_id=7, message="Fix a and b\n\nOrchestrator-Job: 7\n", style=style)  # type: ignore[arg-type]
    assert result.outcome is LandOutcome.LANDED, result.message
    new = git(repo, "log", "--format=%s", f"{head}..main").splitlines()
    merges = git(repo, "rev-list", "--merges", f"{head}..main")
    if style == "merge":
        assert parents(repo, "main") == 2 and new[0] == "Fix a and b"
    elif style == "rebase":
        assert merges == "" and new == ["Fix b", "Fix a"], "linear: the job's commits, in order, on the head"
        assert git(repo, "log", "--format=%an", f"{head}..main").splitlines() == ["Agent 1", "Agent 0"]
        assert git(repo, "rev-parse", "main~2") == head
    else:
        assert merges == "" and new == ["Fix a and b"] and git(repo, "rev-parse", "main~1") == head
    assert "Orchestrator-Job: 7" in git(repo, "log", "-1", "--format=%B", "main"), "the trailer is kept"
    assert [git(repo, "show", f"main:{p}") for p in ("src/a.py", "src/b.py", "docs/x.md")] == [
        "a = 2",
        "b = 2",
        "moved",
    ]
    assert (repo / "src" / "a.py").read_text() == "a = 2\n", "the checkout follows, as with every style"


@pytest.mark.parametrize("style", ["rebase", "squash"])
async def test_a_conflict_never_lands_in_any_style(make_repo: Callable[..., Path], style: str) -> None:
    """A replayed or squashed change that conflicts with the head is a conflict; the branch stays."""
    repo = make_repo()
    base = git(repo, "rev-parse", "main")
    tip = job_branch(repo, base, [("Job edit", {"src/a.py": "a = 'job'\n"})])
    write(repo, {"src/a.py": "a = 'user'\n"})
    git(repo, "commit", "-qam", "user edit")
    head = git(repo, "rev-parse", "main")
    result = await land(repo, "main", tip, job_id=7, message="Job edit", style=style)  # type: ignore[arg-type]
    assert result.outcome is LandOutcome.CONFLICT and result.conflicts == ("src/a.py",)
    assert git(repo, "rev-parse", "main") == head


def test_daemon_lands_jobs_with_a_repos_rebase_style_in_a_linear_history(make_repo, daemon_factory):
    """`land_style = "rebase"` in a repo's config: every landing is linear, subjects from each ticket."""
    repo = make_repo()
    home = repo.parent / "home-style"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text(f'[repos."{repo}"]\nland_style = "rebase"\n')
    d = daemon_factory("home-style", env=FOUR_SLOTS).start()
    jobs = [d.enqueue(repo, f"echo {n} > f{n}.txt\n# details of ticket {n}", "--path", f"f{n}.txt") for n in range(3)]
    assert d.cli("wait", *map(str, jobs), "--timeout", "90").returncode == 0
    assert git(repo, "rev-list", "--merges", "main") == "", "no merge commits: linear"
    subjects = git(repo, "log", "--format=%s", "main").splitlines()
    assert sorted(subjects[:3]) == [f"Run `echo {n} > f{n}.txt`" for n in range(3)]
    assert all("Orchestrator-Job:" in git(repo, "log", "-1", "--format=%B", f"main~{i}") for i in range(3))


async def test_jobs_land_style_rebase_makes_every_repository_linear(make_repo, tmp_path) -> None:
    """`[jobs] land_style = "rebase"`: jobs that ran side by side land with no merge commit in any repository."""
    from orchestrator.core.models import JobState
    from tests.plane import plane

    repo = make_repo()
    gate = tmp_path / "gate"
    async with plane(tmp_path, land_style="rebase", max_concurrent=3) as p:
        wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
        jobs = [await p.enqueue(repo, f"{wait}; echo {n} > f{n}.txt", f"f{n}.txt") for n in range(3)]
        for job in jobs:
            await p.reach(job, JobState.RUNNING)
        gate.touch()
        for job in jobs:
            await p.reach(job, JobState.LANDED)
    assert git(repo, "rev-list", "--merges", "main") == "", "no merge commits: linear"
    assert len(git(repo, "rev-list", "main").splitlines()) == 4
