"""commit_worktree: the files a job left in its workspace become one commit on its branch, built by the daemon."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pygit2
import pytest
from pygit2.enums import ConfigLevel
from structlog.testing import capture_logs

from orchestrator.core.models import Code
from orchestrator.git import inotify
from orchestrator.git.commits import ForeignWorktree, commit_worktree, publish_result
from orchestrator.git.workspace import ResultRefused, WorkspaceError
from orchestrator.logging import Event
from tests.conftest import git, workspace, write


@pytest.fixture
def job(make_repo: Callable[..., Path], tmp_path: Path) -> tuple[Path, Path, str]:
    """A repo (with `*.log` ignored) and job 1's workspace at its head."""
    repo = make_repo(
        files={"README.md": "hello\n", "src/a.py": "a = 1\n", "src/b.py": "b = 1\n", ".gitignore": "*.log\n"}
    )
    base = git(repo, "rev-parse", "HEAD")
    return repo, workspace(repo, tmp_path / "wt1", base, "orchestrator/1"), base


def files_at(repo: Path, rev: str = "orchestrator/1") -> set[str]:
    return set(git(repo, "ls-tree", "-r", "--name-only", rev).splitlines())


def commit(job: tuple[Path, Path, str], **kw: object) -> str | None:
    repo, wt, base = job
    return commit_worktree(wt, message=str(kw.pop("message", "m")), job_id=1, base=base, repo_path=repo, **kw)  # type: ignore[arg-type]


def test_commits_with_trailer(job: tuple[Path, Path, str]) -> None:
    """A change becomes a commit on base, on the repository's orchestrator/1, ending with the trailer."""
    repo, wt, base = job
    write(wt, {"src/a.py": "a = 2\n"})
    sha = commit(job, message="Fix a\n")
    assert sha == git(repo, "rev-parse", "orchestrator/1")
    assert git(repo, "log", "-1", "--format=%B", "orchestrator/1") == "Fix a\n\nOrchestrator-Job: 1"
    assert git(repo, "rev-parse", "orchestrator/1^") == base
    assert git(repo, "show", "orchestrator/1:src/a.py") == "a = 2"


def test_includes_deleted_and_untracked(job: tuple[Path, Path, str]) -> None:
    """Deleted files and new untracked files are part of the commit, like `git add -A`."""
    repo, wt, _ = job
    (wt / "src/b.py").unlink()
    write(wt, {"src/new/c.py": "c = 1\n"})
    commit(job)
    assert files_at(repo) == {".gitignore", "README.md", "src/a.py", "src/new/c.py"}


def test_excludes_ignored(job: tuple[Path, Path, str]) -> None:
    """Ignored files stay out of the commit (and stay on disk)."""
    repo, wt, _ = job
    write(wt, {"build.log": "noise\n", "src/a.py": "a = 2\n"})
    commit(job)
    assert "build.log" not in files_at(repo)
    assert (wt / "build.log").exists()


def test_no_changes_is_none(job: tuple[Path, Path, str]) -> None:
    """A workspace identical to its base gives None and makes no commit and no branch."""
    repo, wt, _ = job
    write(wt, {"build.log": "ignored\n"})
    assert commit(job) is None
    assert git(repo, "branch", "--list", "orchestrator/1") == ""


def test_the_jobs_own_git_state_is_not_obeyed(job: tuple[Path, Path, str]) -> None:
    """The job's own commits, index, HEAD and config count for nothing: the files do, on the real base."""
    repo, wt, base = job
    write(wt, {"src/a.py": "a = 2\n"})
    git(wt, "commit", "-qam", "agent's own commit")
    git(wt, "config", "user.name", "Mallory")
    (wt / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # as if the job's branch were main
    write(wt, {"src/b.py": "b = 2\n"})
    git(wt, "add", "src/b.py")
    write(wt, {"src/b.py": "b = 3\n"})  # unstaged on top of staged: the file on disk is what counts
    sha = commit(job)
    assert sha is not None
    assert git(repo, "rev-parse", "orchestrator/1^") == base, "parent is the base, not the job's HEAD"
    assert git(repo, "show", "orchestrator/1:src/b.py") == "b = 3"
    assert git(repo, "log", "-1", "--format=%an", "orchestrator/1") == "Test Author"
    assert git(repo, "rev-parse", "main") == base, "main is untouched"


def test_changes_that_cancel_out_are_none(job: tuple[Path, Path, str]) -> None:
    """A job commit undone in the files leaves no change against the base: None."""
    _, wt, _ = job
    write(wt, {"src/a.py": "a = 2\n"})
    git(wt, "commit", "-qam", "agent's own commit")
    write(wt, {"src/a.py": "a = 1\n"})
    assert commit(job) is None


def test_links_modes_and_special_files_are_taken_as_git_records_them(job: tuple[Path, Path, str]) -> None:
    """A symlink is a link (never followed), an exec bit a mode; FIFOs and nested repositories are left out."""
    repo, wt, _ = job
    secret = wt.parent / "outside-secret"
    secret.write_text("secret\n")
    os.symlink(secret, wt / "leak")
    os.symlink("/", wt / "root")
    write(wt, {"run.sh": "#!/bin/sh\n"})
    os.chmod(wt / "run.sh", 0o755)
    os.mkfifo(wt / "pipe")
    nested = wt / "vendor" / "lib"
    nested.mkdir(parents=True)
    git(nested, "init", "-q")
    write(nested, {"x.py": "x = 1\n"})
    commit(job)
    tree = pygit2.Repository(str(repo)).revparse_single("orchestrator/1").peel(pygit2.Tree)
    assert tree["leak"].filemode == pygit2.enums.FileMode.LINK
    assert pygit2.Repository(str(repo))[tree["leak"].id].data == str(secret).encode()
    assert tree["root"].filemode == pygit2.enums.FileMode.LINK
    assert tree["run.sh"].filemode == pygit2.enums.FileMode.BLOB_EXECUTABLE
    assert "pipe" not in tree and "vendor" not in tree


def test_a_file_over_the_cap_fails_the_commit(job: tuple[Path, Path, str]) -> None:
    """A file larger than a job may commit is a clear error; nothing is committed."""
    repo, wt, _ = job
    with open(wt / "huge.bin", "wb") as f:
        f.truncate(2 * 1024 * 1024)  # sparse: costs no disk
    with pytest.raises(WorkspaceError, match=r"'huge\.bin' is 2 MiB, over the 1 MiB"):
        commit(job, max_file=1024 * 1024)
    assert git(repo, "branch", "--list", "orchestrator/1") == ""


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        (b"git~1", "'git~1' (a name git refuses)"),
        (b".GIT/config", "'.GIT/' (a name git refuses)"),
        (b"sub/.Git/x", "'sub/.Git/' (a name git refuses)"),
        (b".git.", "'.git.' (a name git refuses)"),
        (b"p\xff", "'p\\xff' (not UTF-8)"),
        (b"GIT~1/hooks/post-checkout", "'GIT~1/hooks/post-checkout' (a name git refuses)"),
    ],
)
def test_a_name_git_cannot_store_is_refused_by_name(job: tuple[Path, Path, str], name: bytes, shown: str) -> None:
    """A file whose name git refuses (or that is not UTF-8) fails the commit with a message that names it and says
    what to do; no blob, commit or branch is written, whatever else the job left."""
    repo, wt, _ = job
    write(wt, {"fine.txt": "ok\n"})
    path = os.path.join(os.fsencode(wt), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"unique content of a refused file\n")
    with pytest.raises(ResultRefused) as refused:
        commit(job)
    assert refused.value.code is Code.BAD_NAMES
    assert shown in str(refused.value) and "rename or delete them" in str(refused.value)
    assert git(repo, "branch", "--list", "orchestrator/1") == ""
    blob = str(pygit2.hash(b"unique content of a refused file\n"))
    assert subprocess.run(["git", "cat-file", "-e", blob], cwd=repo).returncode != 0, "no blob was written"


def test_an_existing_branch_of_that_name_is_kept_not_overwritten(job: tuple[Path, Path, str]) -> None:
    """A branch orchestrator/1 from an older state dir keeps its commit under a name of its own."""
    repo, wt, base = job
    git(repo, "branch", "orchestrator/1", base)
    write(repo, {"old.txt": "old work\n"})
    git(repo, "add", "old.txt")
    git(repo, "commit", "-qm", "old job 1", "--no-verify")
    old = git(repo, "rev-parse", "HEAD")
    git(repo, "reset", "-q", "--hard", base)
    git(repo, "branch", "-f", "orchestrator/1", old)
    write(wt, {"src/a.py": "a = 2\n"})
    sha = commit(job)
    assert git(repo, "rev-parse", "orchestrator/1") == sha
    assert git(repo, "rev-parse", f"orchestrator/1-kept-{old[:12]}") == old


def test_a_workspace_of_another_repository_is_refused(job: tuple[Path, Path, str], make_repo, tmp_path) -> None:
    """Committing from a workspace made from another repository raises ForeignWorktree and commits nothing."""
    repo, _, _ = job
    other = make_repo("other")
    ws = workspace(other, tmp_path / "wt-other", git(other, "rev-parse", "HEAD"))
    write(ws, {"src/a.py": "a = 9\n"})
    with pytest.raises(ForeignWorktree, match="another repository"):
        commit_worktree(ws, message="m", job_id=1, base=git(repo, "rev-parse", "HEAD"), repo_path=repo)
    with pytest.raises(ForeignWorktree, match="not an orchestrator workspace"):
        commit_worktree(repo, message="m", job_id=1, base=git(repo, "rev-parse", "HEAD"), repo_path=repo)


def test_identity_follows_git_precedence(job: tuple[Path, Path, str]) -> None:
    """GIT_AUTHOR_*/GIT_COMMITTER_* win over the repo's user.name/email, as for `git commit`."""
    repo, wt, _ = job
    write(wt, {"src/a.py": "a = 2\n"})
    commit(job)
    assert git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>", "orchestrator/1") == (
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
    repo, wt, _ = job
    git(repo, "config", "--unset", "user.name")
    git(repo, "config", "--unset", "user.email")
    write(wt, {"src/a.py": "a = 2\n"})
    assert commit(job) is not None
    c = pygit2.Repository(str(repo)).revparse_single("orchestrator/1").peel(pygit2.Commit)
    assert (c.author.name, c.author.email) == ("orchestrator", "orchestrator@localhost")
    assert (c.committer.name, c.committer.email) == ("orchestrator", "orchestrator@localhost")


@pytest.mark.parametrize("openat2", [True, False])
def test_a_link_swapped_in_while_the_files_are_read_is_never_followed(
    job: tuple[Path, Path, str], monkeypatch: pytest.MonkeyPatch, openat2: bool
) -> None:
    """A process of the job that swaps a directory for a link to outside while the daemon reads the files
    (deterministically: at the reader's first step) never gets an outside file into a blob."""
    from orchestrator import beneath

    repo, wt, _ = job
    outside = wt.parent / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "a.py").write_text("the user's secret\n")
    write(wt, {"src/deep/a.py": "a = 2\n"})
    swapped: list[bool] = []

    def swap() -> None:
        if not swapped:
            swapped.append(True)
            os.rename(wt / "src", wt / "src.moved")
            os.symlink(outside, wt / "src")

    if openat2 and not beneath.have_openat2():
        pytest.skip("this kernel has no openat2 (Linux 5.6+)")
    monkeypatch.setattr(beneath, "pause", swap)
    monkeypatch.setattr(beneath, "_openat2_state", openat2)
    commit(job)
    assert swapped
    blobs = git(repo, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)")
    secret = pygit2.hash(b"the user's secret\n")
    assert str(secret) not in blobs


def test_a_landing_killed_while_it_copies_the_result_is_completed_by_the_next(job: tuple[Path, Path, str]) -> None:
    """A job's result reaches the repository one object at a time, each after the objects it names (blobs, the
    trees holding them, the commit last): wherever a kill -9 cuts the copy short, the landing after the restart
    copies the rest, and the result is whole (never a commit whose files the repository lacks)."""
    repo, wt, _ = job
    write(wt, {"src/a.py": "a = 2\n", "src/new/c.py": "c = 1\n", "docs/d.md": "d\n"})
    sha = commit(job, publish=False)
    assert sha is not None
    objects = Path(pygit2.Repository(str(repo)).path) / "objects"
    for i in range(256):
        (objects / f"{i:02x}").mkdir(exist_ok=True)  # watched before the copy writes into them
    with inotify.Tree(objects) as watch:
        publish_result(wt, repo, sha, "orchestrator/1")
        seen = []
        while batch := watch.read(0.2):
            seen += [p.decode() for p in batch if b"/" in p]  # a loose object's final name, in the order written
    written = list(dict.fromkeys(seen))
    assert len(written) == 8, written  # the commit, 4 trees (root, src, src/new, docs), 3 blobs
    kept = {name: (objects / name).read_bytes() for name in written}
    for k in range(len(written)):  # killed after k objects were written
        for name in written:
            (objects / name).unlink()
        for name in written[:k]:
            (objects / name).write_bytes(kept[name])
        publish_result(wt, repo, sha, "orchestrator/1")
        lacks = [n for n in written if not pygit2.Repository(str(repo)).odb.exists(n.replace("/", ""))]
        assert lacks == [], f"killed after {k} of {written}"
    assert git(repo, "show", "orchestrator/1:src/new/c.py") == "c = 1"


def test_a_branch_lock_left_by_a_killed_daemon_does_not_keep_the_job_from_landing(job: tuple[Path, Path, str]) -> None:
    """A daemon killed while it moved a job's branch leaves git's `<branch>.lock` behind; the daemon after it moves
    the branch anyway (the lock is older than it, and only the daemon writes its jobs' branches). A lock made since
    it started is someone's at work: left alone, and git's refusal stands."""
    repo, wt, _ = job
    write(wt, {"src/a.py": "a = 2\n"})
    sha = commit(job, publish=False)
    assert sha is not None
    lock = Path(pygit2.Repository(str(repo)).path) / "refs" / "heads" / "orchestrator" / "1.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("")
    try:
        with pytest.raises((OSError, pygit2.GitError)):  # made now: another writer's, at work
            publish_result(wt, repo, sha, "orchestrator/1")
        assert lock.exists()
        os.utime(lock, (0, 0))  # as a daemon killed before this one started left it
        with capture_logs() as logs:
            publish_result(wt, repo, sha, "orchestrator/1")
    finally:
        lock.unlink(missing_ok=True)
    assert git(repo, "rev-parse", "orchestrator/1") == sha
    assert [e["branch"] for e in logs if e["event"] == Event.BRANCH_LOCK_REMOVED] == ["orchestrator/1"]


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
