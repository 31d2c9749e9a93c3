"""Landing: merge in memory, compare-and-swap the branch, keep the user's checkout in step, run the check."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.git import checkouts, landing
from orchestrator.git.commits import commit_worktree
from orchestrator.git.landing import LandOutcome, advance, land
from orchestrator.jobs.landing_check import TAIL_BYTES, run_check
from orchestrator.jobs.landing_check import ShellCheck as Check
from tests.conftest import git, workspace, write


class Repo:
    """A user's repo checked out on `main`, and a way to make job commits in job worktrees."""

    def __init__(self, root: Path, tmp: Path) -> None:
        self.root = root
        self.tmp = tmp
        self.base = self.head()

    def head(self, branch: str = "main") -> str:
        return git(self.root, "rev-parse", branch)

    def job(self, n: int, files: dict[str, str | None], base: str | None = None) -> str:
        """Job `n`'s commit: `files` written (None: deleted) in its worktree on `orchestrator/n` from `base`."""
        wt = workspace(self.root, self.tmp / f"wt{n}", base or self.base, f"orchestrator/{n}")
        write(wt, {p: t for p, t in files.items() if t is not None})
        for p in (p for p, t in files.items() if t is None):
            (wt / p).unlink()
        sha = commit_worktree(wt, message=f"job {n}", job_id=n, base=base or self.base, repo_path=self.root)
        assert sha is not None
        return sha

    def user_commit(self, files: dict[str, str]) -> str:
        write(self.root, files)
        git(self.root, "commit", "-qam", "user's commit")
        return self.head()

    def status(self) -> set[str]:
        # Not via `git()`: its strip() would eat the leading space of " M path".
        out = subprocess.run(
            ["git", "status", "--porcelain"], cwd=self.root, check=True, capture_output=True, text=True
        )
        return set(out.stdout.splitlines())

    def read(self, path: str) -> str:
        return (self.root / path).read_text()


@pytest.fixture
def repo(make_repo: Callable[..., Path], tmp_path: Path) -> Repo:
    return Repo(make_repo(), tmp_path)


async def test_fast_forward(repo: Repo) -> None:
    """A job on the current head fast-forwards the branch and the user's clean checkout follows."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    result = await land(repo.root, "main", job, job_id=1, message="Merge orchestrator job 1: job 1")
    assert (result.outcome, result.sha, result.old_head) == (LandOutcome.LANDED, job, repo.base)
    assert repo.head() == job
    assert repo.read("src/a.py") == "a = 2\n"
    assert repo.status() == set()
    assert git(repo.root, "reflog", "show", "-1", "--format=%gs", "main") == "orchestrator: land job 1"


async def test_merge_commit_when_head_moved_elsewhere(repo: Repo) -> None:
    """Head moved in other files: a merge commit holds both changes and the job's commits stay reachable."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    user = repo.user_commit({"README.md": "hello, user\n"})
    result = await land(repo.root, "main", job, job_id=1, message="Merge orchestrator job 1: job 1")
    assert result.outcome is LandOutcome.LANDED and result.old_head == user
    assert repo.head() == result.sha
    assert git(repo.root, "log", "-1", "--format=%P %s") == f"{user} {job} Merge orchestrator job 1: job 1"
    git(repo.root, "merge-base", "--is-ancestor", job, "main")
    assert (repo.read("src/a.py"), repo.read("README.md")) == ("a = 2\n", "hello, user\n")
    assert repo.status() == set()


async def test_conflict_never_moves_the_ref(repo: Repo) -> None:
    """A conflicting job lists its paths and leaves the branch and the checkout alone."""
    job = repo.job(1, {"src/a.py": "a = 'job'\n"})
    user = repo.user_commit({"src/a.py": "a = 'user'\n"})
    result = await land(repo.root, "main", job, job_id=1, message="m")
    assert (result.outcome, result.conflicts) == (LandOutcome.CONFLICT, ("src/a.py",))
    assert repo.head() == user
    assert repo.read("src/a.py") == "a = 'user'\n"
    assert "src/a.py" in result.message


async def test_noop_when_already_landed(repo: Repo) -> None:
    """Landing a commit the branch already contains moves nothing."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    await land(repo.root, "main", job, job_id=1, message="m")
    again = await land(repo.root, "main", job, job_id=1, message="m")
    assert (again.outcome, again.sha) == (LandOutcome.NOOP, job)


def test_cas_refuses_stale_expected_head(repo: Repo) -> None:
    """advance with a stale expected head says HEAD_MOVED and leaves the branch where it is."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    user = repo.user_commit({"README.md": "moved\n"})
    result = advance(repo.root, "main", repo.base, job, job_id=1)
    assert (result.outcome, result.sha, result.old_head) == (LandOutcome.HEAD_MOVED, user, repo.base)
    assert repo.head() == user


def test_cas_is_atomic_with_the_ref_write(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    """A branch moved after advance read it (before its write) is not overwritten: the write itself compares."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    other = repo.job(2, {"docs/x.md": "other\n"})
    real = checkouts.on_branch

    def moved_meanwhile(*args: Any) -> list[Path]:
        git(repo.root, "update-ref", "refs/heads/main", other)  # e.g. the user's `git commit` or `git pull`
        return real(*args)

    monkeypatch.setattr(checkouts, "on_branch", moved_meanwhile)
    result = advance(repo.root, "main", repo.base, job, job_id=1)
    assert (result.outcome, result.sha) == (LandOutcome.HEAD_MOVED, other)
    assert repo.head() == other


async def test_land_retries_after_head_moved(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the user commits while a landing merges, land merges again on the new head and lands."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    real_merge = landing.merge_for_landing
    calls: list[str] = []

    def merge_then_user_commits(*args: Any, **kwargs: Any) -> Any:
        result = real_merge(*args, **kwargs)
        calls.append(result.kind)
        if len(calls) == 1:
            repo.user_commit({"README.md": "committed meanwhile\n"})
        return result

    monkeypatch.setattr(landing, "merge_for_landing", merge_then_user_commits)
    result = await land(repo.root, "main", job, job_id=1, message="m")
    assert calls == ["fast-forward", "merge"]
    assert result.outcome is LandOutcome.LANDED
    assert (repo.read("src/a.py"), repo.read("README.md")) == ("a = 2\n", "committed meanwhile\n")


async def test_user_work_elsewhere_survives(repo: Repo) -> None:
    """Unstaged edits, staged changes and untracked files outside the landed paths survive; landed files are updated."""
    job = repo.job(1, {"src/a.py": "a = 2\n", "src/new.py": "new = 1\n"})
    write(repo.root, {"README.md": "user is typing\n", "docs/x.md": "staged\n", "notes.txt": "mine\n"})
    git(repo.root, "add", "docs/x.md")

    result = await land(repo.root, "main", job, job_id=1, message="m")

    assert result.outcome is LandOutcome.LANDED
    assert repo.status() == {" M README.md", "M  docs/x.md", "?? notes.txt"}
    assert git(repo.root, "diff", "--cached", "--name-only") == "docs/x.md"
    assert (repo.read("README.md"), repo.read("docs/x.md"), repo.read("notes.txt")) == (
        "user is typing\n",
        "staged\n",
        "mine\n",
    )
    assert (repo.read("src/a.py"), repo.read("src/new.py")) == ("a = 2\n", "new = 1\n")


@pytest.mark.parametrize("staged", [False, True])
async def test_user_edit_to_landed_file_blocks(repo: Repo, staged: bool) -> None:
    """The user's uncommitted edit (staged or not) to a file the landing changes → USER_DIRTY, nothing moved."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    write(repo.root, {"src/a.py": "a = 'mine'\n"})
    if staged:
        git(repo.root, "add", "src/a.py")
    result = await land(repo.root, "main", job, job_id=1, message="m")
    assert (result.outcome, result.user_paths) == (LandOutcome.USER_DIRTY, ("src/a.py",))
    assert repo.head() == repo.base
    assert repo.read("src/a.py") == "a = 'mine'\n"
    assert "src/a.py" in result.message


@pytest.mark.parametrize("ignored", [False, True])
async def test_untracked_file_in_the_way_blocks(repo: Repo, ignored: bool) -> None:
    """An untracked (even ignored) user file where the landing adds one → USER_DIRTY, the file intact."""
    job = repo.job(1, {"src/new.py": "from job\n"})
    write(repo.root, {"src/new.py": "user's own\n"})
    if ignored:
        write(repo.root, {".git/info/exclude": "src/new.py\n"})
    result = await land(repo.root, "main", job, job_id=1, message="m")
    assert (result.outcome, result.user_paths) == (LandOutcome.USER_DIRTY, ("src/new.py",))
    assert repo.head() == repo.base
    assert repo.read("src/new.py") == "user's own\n"


async def test_failed_checkout_update_swaps_back(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    """If git refuses to update the checkout after the ref moved, the ref is swapped back and the edit survives."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    write(repo.root, {"src/a.py": "a = 'mine'\n"})
    # Make the pre-checks miss the edit, as if it were made in the instant after them.
    monkeypatch.setattr(checkouts, "in_the_way", lambda *a: None)
    monkeypatch.setattr(checkouts, "dry_run", lambda *a: None)
    result = await land(repo.root, "main", job, job_id=1, message="m")
    assert (result.outcome, result.user_paths) == (LandOutcome.USER_DIRTY, ("src/a.py",))
    assert repo.head() == repo.base
    assert repo.read("src/a.py") == "a = 'mine'\n"
    assert repo.status() == {" M src/a.py"}


async def test_checkout_on_another_branch_untouched(repo: Repo) -> None:
    """With the user on another branch, the target branch moves and the work tree is left alone."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    git(repo.root, "checkout", "-q", "-b", "feature")
    write(repo.root, {"src/a.py": "a = 'feature work'\n"})
    result = await land(repo.root, "main", job, job_id=1, message="m")
    assert result.outcome is LandOutcome.LANDED and repo.head() == job
    assert repo.read("src/a.py") == "a = 'feature work'\n"
    assert git(repo.root, "rev-parse", "--abbrev-ref", "HEAD") == "feature"


async def test_linked_worktree_on_branch_follows(repo: Repo) -> None:
    """A linked worktree that has the target branch checked out is kept in step like the main one."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    git(repo.root, "checkout", "-q", "-b", "feature")
    linked = repo.tmp / "user-main"
    git(repo.root, "worktree", "add", "-q", str(linked), "main")
    result = await land(repo.root, "main", job, job_id=1, message="m")
    assert result.outcome is LandOutcome.LANDED
    assert (linked / "src/a.py").read_text() == "a = 2\n"
    assert git(linked, "status", "--porcelain") == ""


async def test_bare_repository(repo: Repo) -> None:
    """In a bare repository the branch simply moves."""
    bare = repo.tmp / "bare.git"
    git(repo.tmp, "clone", "-q", "--bare", str(repo.root), str(bare))
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    git(repo.root, "push", "-q", str(bare), "orchestrator/1")
    result = await land(bare, "main", job, job_id=1, message="m")
    assert result.outcome is LandOutcome.LANDED
    assert git(bare, "rev-parse", "main") == job


# ---- the landing check ---------------------------------------------------------------------------------


def worktrees(repo: Repo) -> str:
    return git(repo.root, "worktree", "list", "--porcelain")


async def test_check_ok_runs_at_sha(repo: Repo) -> None:
    """The check runs in a scratch worktree at the given sha, and the worktree is gone afterwards."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    before = worktrees(repo)
    scratch_root = repo.tmp / "scratch"
    scratch_root.mkdir()
    result = await run_check(
        repo.root, job, "git rev-parse HEAD; cat src/a.py", timeout=30, log_path=None, scratch_root=scratch_root
    )
    assert (result.ok, result.returncode, result.timed_out) == (True, 0, False)
    assert result.output_tail == f"{job}\na = 2\n"
    assert worktrees(repo) == before
    assert list(scratch_root.iterdir()) == []


async def test_check_failure_logged(repo: Repo) -> None:
    """A failing check is not ok, keeps the exit status and the output tail; the full output goes to the log."""
    log = repo.tmp / "check.log"
    big = "x" * 10_000
    result = await run_check(repo.root, repo.base, f"echo {big}; echo boom >&2; exit 3", timeout=30, log_path=log)
    assert (result.ok, result.returncode) == (False, 3)
    assert result.output_tail.endswith("boom\n") and len(result.output_tail) <= TAIL_BYTES
    assert big in log.read_text() and "[exit 3]" in log.read_text()
    assert worktrees(repo).count("worktree ") == 1


async def test_check_timeout_kills_group(repo: Repo) -> None:
    """A check past its timeout is killed with its children, reported as timed out, and its worktree removed."""
    start = time.monotonic()
    result = await run_check(repo.root, repo.base, "sleep 30 & echo started; sleep 30", timeout=0.5, log_path=None)
    assert time.monotonic() - start < 10
    assert (result.ok, result.timed_out) == (False, True)
    assert result.output_tail == "started\n"
    assert worktrees(repo).count("worktree ") == 1


async def test_land_checked(repo: Repo) -> None:
    """With a check, a failing command leaves the branch alone; a passing one lands."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    failed = await land(repo.root, "main", job, job_id=1, message="m", check=Check("grep -q 3 src/a.py", 30))
    assert failed.outcome is LandOutcome.CHECK_FAILED and repo.head() == repo.base
    landed = await land(repo.root, "main", job, job_id=1, message="m", check=Check("grep -q 2 src/a.py", 30))
    assert landed.outcome is LandOutcome.LANDED and repo.head() == job


async def test_check_cancelled_cleans_up(repo: Repo) -> None:
    """Cancelling a running check kills its command and still removes the scratch worktree."""
    scratch_root = repo.tmp / "scratch"
    scratch_root.mkdir()
    pid_file = repo.tmp / "pid"
    task = asyncio.create_task(
        run_check(repo.root, repo.base, f"echo $$ > {pid_file}; sleep 30", timeout=60, scratch_root=scratch_root)
    )
    async with asyncio.timeout(10):
        while not pid_file.exists() or not pid_file.read_text().strip():  # noqa: ASYNC110 -- another process writes it
            await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert worktrees(repo).count("worktree ") == 1
    assert list(scratch_root.iterdir()) == []
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


# ---- all or nothing on every fault ---------------------------------------------------------------------


async def test_a_rewritten_branch_is_never_merged(repo: Repo) -> None:
    """A head that no longer contains the job's base (reset, force-pushed) is not merged: nothing moves."""
    dropped = repo.user_commit({"README.md": "dropped later\n"})
    job = repo.job(1, {"src/a.py": "a = 2\n"}, base=dropped)
    git(repo.root, "reset", "-q", "--hard", repo.base)
    rewritten = repo.user_commit({"docs/x.md": "rewritten history\n"})
    result = await land(repo.root, "main", job, job_id=1, message="m", base=dropped)
    assert result.outcome is LandOutcome.REWRITTEN and "planned again" in result.message
    assert repo.head() == rewritten
    with pytest.raises(subprocess.CalledProcessError):
        git(repo.root, "merge-base", "--is-ancestor", dropped, "main")


async def test_an_unwritable_ref_fails_and_moves_nothing(repo: Repo) -> None:
    """A ref that cannot be written (a stale refs/heads/main.lock) is a fault, not a moving branch: nothing moved;
    once it can be written, the same landing goes through."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    lock = repo.root / ".git" / "refs" / "heads" / "main.lock"
    lock.write_text("stale\n")
    result = await land(repo.root, "main", job, job_id=1, message="m", retries=0)
    assert result.outcome is LandOutcome.FAULT and "not moved" in result.message
    assert repo.head() == repo.base and repo.read("src/a.py") == "a = 1\n" and repo.status() == set()
    lock.unlink()
    assert (await land(repo.root, "main", job, job_id=1, message="m")).outcome is LandOutcome.LANDED


async def test_a_stale_index_lock_is_named_for_what_it_is(repo: Repo) -> None:
    """A stale index.lock in the checkout makes the landing wait with a message naming the lock and what to do,
    never "your uncommitted changes"."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    lock = repo.root / ".git" / "index.lock"
    lock.write_text("")
    result = await land(repo.root, "main", job, job_id=1, message="m")
    assert result.outcome is LandOutcome.USER_DIRTY and result.user_paths == ()
    assert f"rm {lock}" in result.message and "uncommitted" not in result.message
    assert repo.head() == repo.base


def test_a_commit_the_person_is_making_goes_through_a_landing(repo: Repo) -> None:
    """A `git commit` under way in the checkout (its pre-commit hook running) when a landing moves the branch: the
    landing waits for it, so the person's commit goes through (git would refuse it, `cannot lock ref 'HEAD'`, had
    the branch moved under it) and the job lands on top of it when tried again."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    started, release = repo.tmp / "started", repo.tmp / "release"
    hook = repo.root / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\necho > {started}\nread line < {release}\n")  # blocks until the test opens it
    hook.chmod(0o755)
    os.mkfifo(started)
    os.mkfifo(release)
    write(repo.root, {"docs/x.md": "the person's line\n"})
    git(repo.root, "add", "docs/x.md")
    prepared = landing.prepare(repo.root, "main", repo.base, job, job_id=1)
    assert isinstance(prepared, landing.Prepared)
    commit = subprocess.Popen(["git", "commit", "-qm", "mine"], cwd=repo.root, stderr=subprocess.PIPE, text=True)
    started.read_text()  # the hook runs: git has read HEAD and will move it when the hook ends
    moved: list[landing.LandResult] = []
    mover = threading.Thread(target=lambda: moved.append(landing.move(prepared)))
    mover.start()
    mover.join(0.3)  # the landing waits for the commit (before, it moved the branch at once)
    head_meanwhile = repo.head()
    release.write_text("go\n")
    _, err = commit.communicate(timeout=30)
    mover.join(30)
    assert head_meanwhile == repo.base
    assert commit.returncode == 0, err
    assert moved[0].outcome is LandOutcome.HEAD_MOVED and git(repo.root, "log", "-1", "--format=%s") == "mine"
    hook.unlink()
    again = asyncio.run(land(repo.root, "main", job, job_id=1, message="m"))
    assert again.outcome is LandOutcome.LANDED
    assert repo.read("src/a.py") == "a = 2\n" and repo.read("docs/x.md") == "the person's line\n"
    assert repo.status() == set()


def test_a_landings_checks_leave_the_index_to_the_person(repo: Repo) -> None:
    """The checks before a landing (git's dry run) work on a copy of the index: a git command of the person's that
    holds the index meanwhile neither stops them nor is stopped by them; only the move itself takes the lock."""
    job = repo.job(1, {"src/a.py": "a = 2\n"})
    lock = repo.root / ".git" / "index.lock"
    lock.write_text("")  # the person's `git add` under way
    prepared = landing.prepare(repo.root, "main", repo.base, job, job_id=1)
    assert isinstance(prepared, landing.Prepared), prepared
    assert lock.read_text() == "", "the person's lock was left alone"
    lock.unlink()  # their command ends
    assert landing.move(prepared).outcome is LandOutcome.LANDED
    assert repo.read("src/a.py") == "a = 2\n" and repo.status() == set()


def test_only_the_persons_git_holds_a_landing_back(repo: Repo, tmp_path: Path) -> None:
    """A process named git running `commit` in the checkout is a command under way; the same in a job's sandbox (a
    PID namespace of its own, the checkout visible read-only) is not: a job cannot hold other jobs' landings."""
    fake = tmp_path / "bin" / "git"  # comm "git", argv `git -c 'sleep 30' commit`: a commit that waits
    fake.parent.mkdir()
    shutil.copy("/bin/sh", fake)
    mine = subprocess.Popen([str(fake), "-c", "sleep 30", "commit"], cwd=repo.root, start_new_session=True)
    try:
        _wait_until_named_git(mine.pid)  # Popen may return while the child is still inside its exec
        assert checkouts.git_under_way([repo.root]) == (mine.pid, "commit", repo.root.resolve())
    finally:
        os.killpg(mine.pid, signal.SIGKILL)  # its sleep too
        mine.wait()
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bubblewrap is not installed: the sandboxed half cannot run")
    box = [bwrap, "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    boxed = subprocess.Popen([*box, "--chdir", str(repo.root), str(fake), "-c", "sleep 30", "commit"])
    try:
        deadline = time.monotonic() + 10
        while not _named_git_in(repo.root) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _named_git_in(repo.root), "the sandboxed process started"
        assert checkouts.git_under_way([repo.root]) is None
    finally:
        boxed.kill()
        boxed.wait()


def _wait_until_named_git(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/comm").read_text() != "git\n":
        assert time.monotonic() < deadline, "the fake git never became a process named git"
        time.sleep(0.01)


def _named_git_in(where: Path) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text() == "git\n" and os.readlink(f"/proc/{pid}/cwd") == str(where):
                return True
        except OSError:
            continue
    return False


def test_git_command_reads_the_subcommand_after_globals() -> None:
    """A process's argv reads as the git subcommand it runs and where: global options skipped, `-C` followed."""
    assert checkouts.git_command(["git", "-C", "sub", "-c", "a=b", "commit", "-m", "x"], Path("/r")) == (
        "commit",
        Path("/r/sub"),
    )
    assert checkouts.git_command(["/usr/bin/git", "--no-pager", "log"], Path("/r")) == ("log", Path("/r"))
    assert checkouts.git_command(["python3", "commit"], Path("/r")) is None
    assert checkouts.git_command(["git", "--version"], Path("/r")) is None


def _repo_on(fs: Path, tmp: Path) -> Repo:
    root = fs / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    write(root, {"src/a.py": "a = 1\n", "docs/x.md": "x\n", "notes/mine.txt": "committed\n"})
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    write(root, {"notes/mine.txt": "the user's own edit\n"})
    return Repo(root, tmp)


BIG = "0" * (1536 * 1024)  # compresses to almost nothing in git, takes 1.5 MB in a checkout


async def test_too_little_space_in_the_checkout_waits_and_moves_nothing(small_fs, tmp_path: Path) -> None:
    """A landing that would not fit in the checkout's file system moves nothing and says how much it needs."""
    repo = _repo_on(small_fs("2m"), tmp_path)
    job = repo.job(1, {"src/a.py": BIG, "big.txt": BIG})
    result = await land(repo.root, "main", job, job_id=1, message="m")
    assert result.outcome is LandOutcome.NO_SPACE and "free some space" in result.message
    assert repo.head() == repo.base and repo.status() == {" M notes/mine.txt"}
    assert repo.read("src/a.py") == "a = 1\n" and not (repo.root / "big.txt").exists()


async def test_a_disk_full_during_the_checkout_update_puts_everything_back(
    small_fs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkout's disk fills between the checks and the update: the branch, the index and every file are put
    back as they were (no half-landing), and the same landing goes through once there is room."""
    from orchestrator import testhook

    fs = small_fs("6m")
    repo = _repo_on(fs, tmp_path)
    job = repo.job(1, {"src/a.py": BIG, "big.txt": BIG, "docs/x.md": None})
    filler = fs / "filler"

    async def fill(name: str, job_id: int | None) -> None:
        free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
        with filler.open("wb") as f:
            f.write(b"\0" * max(free - 256 * 1024, 0))  # room for the ref, not for the files

    testhook.install("landing.move", fill)
    try:
        result = await land(repo.root, "main", job, job_id=1, message="m", retries=0)
    finally:
        testhook.clear()
    assert result.outcome is LandOutcome.FAULT and "not moved" in result.message, result.message
    assert repo.head() == repo.base
    assert repo.status() == {" M notes/mine.txt"}, "no staged deletes, no half-written files"
    assert repo.read("src/a.py") == "a = 1\n" and repo.read("docs/x.md") == "x\n"
    assert repo.read("notes/mine.txt") == "the user's own edit\n"
    filler.unlink()
    assert (await land(repo.root, "main", job, job_id=1, message="m")).outcome is LandOutcome.LANDED
    assert repo.read("src/a.py") == BIG and not (repo.root / "docs/x.md").exists()
    assert repo.status() == {" M notes/mine.txt"}
