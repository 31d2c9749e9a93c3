"""commit_worktree: what an agent left in its worktree becomes one commit on the job's branch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pygit2
import pytest
from pygit2.enums import ConfigLevel

from orchestrator.git.commits import commit_worktree
from tests.conftest import git, write


@pytest.fixture
def job(make_repo: Callable[..., Path], tmp_path: Path) -> tuple[Path, Path, str]:
    """A repo (with `*.log` ignored) and job 1's worktree on `orchestrator/1` at its head."""
    repo = make_repo(
        files={"README.md": "hello\n", "src/a.py": "a = 1\n", "src/b.py": "b = 1\n", ".gitignore": "*.log\n"}
    )
    base = git(repo, "rev-parse", "HEAD")
    wt = tmp_path / "wt1"
    git(repo, "worktree", "add", "-q", "-b", "orchestrator/1", str(wt), base)
    return repo, wt, base


def files_at(wt: Path, rev: str = "HEAD") -> set[str]:
    return set(git(wt, "ls-tree", "-r", "--name-only", rev).splitlines())


def test_commits_with_trailer(job: tuple[Path, Path, str]) -> None:
    """A change becomes a commit on the job branch whose message ends with the Orchestrator-Job trailer."""
    _, wt, base = job
    write(wt, {"src/a.py": "a = 2\n"})
    sha = commit_worktree(wt, message="Fix a\n", job_id=1, base=base)
    assert sha == git(wt, "rev-parse", "orchestrator/1")
    assert git(wt, "log", "-1", "--format=%B") == "Fix a\n\nOrchestrator-Job: 1"
    assert git(wt, "rev-parse", "HEAD^") == base
    assert git(wt, "status", "--porcelain") == ""


def test_includes_deleted_and_untracked(job: tuple[Path, Path, str]) -> None:
    """Deleted files and new untracked files are part of the commit, like `git add -A`."""
    _, wt, base = job
    (wt / "src/b.py").unlink()
    write(wt, {"src/new/c.py": "c = 1\n"})
    commit_worktree(wt, message="m", job_id=1, base=base)
    assert files_at(wt) == {".gitignore", "README.md", "src/a.py", "src/new/c.py"}


def test_excludes_ignored(job: tuple[Path, Path, str]) -> None:
    """Ignored files stay out of the commit (and stay on disk)."""
    _, wt, base = job
    write(wt, {"build.log": "noise\n", "src/a.py": "a = 2\n"})
    commit_worktree(wt, message="m", job_id=1, base=base)
    assert "build.log" not in files_at(wt)
    assert (wt / "build.log").exists()


def test_no_changes_is_none(job: tuple[Path, Path, str]) -> None:
    """A worktree identical to its base gives None and makes no commit."""
    _, wt, base = job
    write(wt, {"build.log": "ignored\n"})
    assert commit_worktree(wt, message="m", job_id=1, base=base) is None
    assert git(wt, "rev-parse", "HEAD") == base


def test_agent_committed_everything(job: tuple[Path, Path, str]) -> None:
    """If the agent committed its work itself and left nothing else, its HEAD is returned, no new commit."""
    _, wt, base = job
    write(wt, {"src/a.py": "a = 2\n"})
    git(wt, "commit", "-qam", "agent's own commit")
    head = git(wt, "rev-parse", "HEAD")
    assert commit_worktree(wt, message="m", job_id=1, base=base) == head
    assert git(wt, "rev-parse", "HEAD") == head


def test_agent_commit_plus_leftovers(job: tuple[Path, Path, str]) -> None:
    """Uncommitted leftovers after the agent's own commit are committed on top of it."""
    _, wt, base = job
    write(wt, {"src/a.py": "a = 2\n"})
    git(wt, "commit", "-qam", "agent's own commit")
    agent = git(wt, "rev-parse", "HEAD")
    write(wt, {"src/b.py": "b = 2\n"})
    sha = commit_worktree(wt, message="m", job_id=1, base=base)
    assert sha is not None and sha != agent
    assert git(wt, "rev-parse", "HEAD^") == agent


def test_changes_that_cancel_out_are_none(job: tuple[Path, Path, str]) -> None:
    """An agent commit undone in the work tree leaves no change against the base: None."""
    _, wt, base = job
    write(wt, {"src/a.py": "a = 2\n"})
    git(wt, "commit", "-qam", "agent's own commit")
    write(wt, {"src/a.py": "a = 1\n"})
    assert commit_worktree(wt, message="m", job_id=1, base=base) is None


def test_identity_follows_git_precedence(job: tuple[Path, Path, str]) -> None:
    """GIT_AUTHOR_*/GIT_COMMITTER_* win over the repo's user.name/email, as for `git commit`."""
    _, wt, base = job
    write(wt, {"src/a.py": "a = 2\n"})
    commit_worktree(wt, message="m", job_id=1, base=base)
    assert git(wt, "log", "-1", "--format=%an <%ae>|%cn <%ce>") == (
        "Test Author <author@example.com>|Test Committer <committer@example.com>"
    )


@pytest.fixture
def no_identity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No GIT_* identity in the environment, an empty HOME, no global config for libgit2 either."""
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    # libgit2 fixed its global/XDG search paths at import time; point them at the empty HOME too.
    paths = pygit2.settings.search_path
    saved = {level: paths[level] for level in (ConfigLevel.GLOBAL, ConfigLevel.XDG)}
    for level in saved:
        paths[level] = str(home)
    yield
    for level, value in saved.items():
        paths[level] = value


def test_fallback_identity(job: tuple[Path, Path, str], no_identity: None) -> None:
    """With no identity configured anywhere the commit is still made, as `orchestrator <orchestrator@localhost>`."""
    repo, wt, base = job
    git(repo, "config", "--unset", "user.name")
    git(repo, "config", "--unset", "user.email")
    write(wt, {"src/a.py": "a = 2\n"})
    assert commit_worktree(wt, message="m", job_id=1, base=base) is not None
    commit = pygit2.Repository(str(wt)).head.peel(pygit2.Commit)
    assert (commit.author.name, commit.author.email) == ("orchestrator", "orchestrator@localhost")
    assert (commit.committer.name, commit.committer.email) == ("orchestrator", "orchestrator@localhost")


def test_a_scripts_subject_is_its_leading_comment_or_what_it_runs() -> None:
    """A shell job's commit subject is its `# comment` line, else `Run `cmd``; a ticket keeps its first line."""
    from orchestrator.core.job import Job
    from orchestrator.core.models import JobState

    def subject(text: str, runner: str = "shell", argv: tuple[str, ...] | None = None) -> str:
        return Job(id=3, repo="/r", branch="main", text=text, runner=runner, argv=argv, state=JobState.QUEUED).subject

    assert subject("echo a > x.txt\necho b >> x.txt") == "Run `echo a > x.txt`"
    assert subject("#!/bin/sh\n# Regenerate the docs\nmake docs") == "Regenerate the docs"
    assert subject("x" * 100).endswith("...`") and len(subject("x" * 100)) <= 72
    assert subject("printf '%s' 'a b'", "fake", ("printf", "%s", "a b")) == "Run `printf '%s' 'a b'`"
    assert subject("Fix the login form\n\nIt forgets the user.", "claude") == "Fix the login form"
