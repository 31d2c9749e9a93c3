"""Landing onto a shared remote: a bare repository in a temp dir, two clones of it standing in for two nodes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator import testhook
from orchestrator.git import remote as rmt
from orchestrator.git.journal import Intent
from orchestrator.git.outcomes import LandOutcome
from orchestrator.jobs.landing_check import ShellCheck as Check
from tests.conftest import bare_remote, git, write


@pytest.fixture
def team(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A bare remote with one commit on main, and two clones of it (nodes A and B)."""
    bare = bare_remote(tmp_path, {"README.md": "hello\n", "src/a.py": "a = 1\n", "src/b.py": "b = 1\n"})
    clones = []
    for name in ("a", "b"):
        git(tmp_path, "clone", "-q", str(bare), name)
        clones.append(tmp_path / name)
    return bare, clones[0], clones[1]


def job_commit(clone: Path, files: dict[str, str], message: str = "job", base: str = "main") -> str:
    """A commit in `clone`'s object store on a side branch from `base` (as a job's result is), its checkout left
    on main."""
    git(clone, "checkout", "-q", "-b", f"job-{abs(hash(message))}", base)
    write(clone, files)
    git(clone, "commit", "-q", "-am", message)
    sha = git(clone, "rev-parse", "HEAD")
    git(clone, "checkout", "-q", "main")
    return sha


def pushed_from(clone: Path, files: dict[str, str], message: str) -> str:
    """Another node's own push to the remote's main."""
    git(clone, "pull", "-q", "--ff-only")
    write(clone, files)
    git(clone, "commit", "-q", "-am", message)
    git(clone, "push", "-q", "origin", "main")
    return git(clone, "rev-parse", "HEAD")


def hook(bare: Path, name: str, body: str) -> None:
    path = bare / "hooks" / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


class Recorder:
    """A journal that keeps what it was told."""

    def __init__(self) -> None:
        self.begun: list[Intent] = []
        self.ended: list[object] = []

    def begin(self, intent: Intent) -> object:
        self.begun.append(intent)
        return len(self.begun)

    def end(self, token: object) -> None:
        self.ended.append(token)


async def test_lands_on_the_remote_and_leaves_the_clone_alone(team, monkeypatch):
    """A job lands on the remote branch by a leased push; the clone's own branch and files are untouched,
    and the push runs with the scrubbed environment (no API key reaches the remote's hooks)."""
    bare, a, _ = team
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-for-hooks")
    hook(bare, "pre-receive", f'env > "{bare}/hook-env"\n')
    start = git(a, "rev-parse", "main")
    sha = job_commit(a, {"src/a.py": "a = 2\n"})
    journal = Recorder()
    remote = rmt.Remote(str(bare), "main")
    result = await rmt.land(a, remote, sha, job_id=1, message="Merge job 1", journal=journal)
    assert result.outcome is LandOutcome.LANDED, result.message
    assert git(bare, "rev-parse", "main") == result.sha == sha  # a fast-forward
    assert git(a, "rev-parse", "main") == start
    assert (a / "src/a.py").read_text() == "a = 1\n"
    assert "ANTHROPIC_API_KEY" not in (bare / "hook-env").read_text()
    assert [(i.repo, i.old, i.new) for i in journal.begun] == [(remote.key, start, sha)]
    assert journal.ended == [1]
    assert rmt.tracked(a, remote) == sha
    git(bare, "fsck", "--strict")


async def test_a_lost_race_fetches_and_lands_on_the_new_tip(team):
    """Another node's push between this node's fetch and its push fails the lease; the landing fetches, merges
    on the new tip and lands, keeping both changes."""
    bare, a, b = team
    sha = job_commit(a, {"src/a.py": "a = 2\n"})
    raced: list[str] = []

    async def race(name: str, job_id: int | None) -> None:
        if not raced:  # right before the first push: node B lands a disjoint change meanwhile
            raced.append(pushed_from(b, {"src/b.py": "b = 2\n"}, "b's change"))

    testhook.install("landing.move", race)
    try:
        result = await rmt.land(a, rmt.Remote(str(bare), "main"), sha, job_id=1, message="Merge job 1")
    finally:
        testhook.clear()
    assert result.outcome is LandOutcome.LANDED, result.message
    assert result.attempts == 2
    assert result.old_head == raced[0]
    tip = git(bare, "rev-parse", "main")
    assert git(bare, "show", f"{tip}:src/a.py") == "a = 2"
    assert git(bare, "show", f"{tip}:src/b.py") == "b = 2"
    assert git(bare, "rev-list", "--count", "main") == "4"  # initial, b's, the job's, the merge


async def test_a_remote_that_keeps_moving_ends_as_a_branch_that_does(team):
    """Every push losing its race (another node lands before each) ends HEAD_MOVED after `retries` more attempts,
    in the words a local branch that keeps moving gets; nothing of the job is pushed."""
    bare, a, b = team
    sha = job_commit(a, {"src/a.py": "a = 2\n"})
    raced: list[str] = []

    async def race(name: str, job_id: int | None) -> None:
        raced.append(pushed_from(b, {"src/b.py": f"b = {len(raced) + 2}\n"}, f"b's change {len(raced)}"))

    testhook.install("landing.move", race)
    try:
        result = await rmt.land(a, rmt.Remote(str(bare), "main"), sha, job_id=1, message="m", retries=1)
    finally:
        testhook.clear()
    assert result.outcome is LandOutcome.HEAD_MOVED and result.attempts == 2 == len(raced)
    assert "kept moving: 2 attempts to land job 1" in result.message, result.message
    assert git(bare, "rev-parse", "main") == raced[-1]


async def test_a_conflict_with_the_remote_is_never_pushed(team):
    """A job that conflicts with what another node landed meanwhile is not pushed; the remote stays at the
    other node's commit and the conflicting paths are named."""
    bare, a, b = team
    sha = job_commit(a, {"src/a.py": "a = 2\n"})
    theirs = pushed_from(b, {"src/a.py": "a = 3\n"}, "b's change")
    result = await rmt.land(a, rmt.Remote(str(bare), "main"), sha, job_id=1, message="Merge job 1")
    assert result.outcome is LandOutcome.CONFLICT
    assert result.conflicts == ("src/a.py",)
    assert git(bare, "rev-parse", "main") == theirs


async def test_a_failed_landing_check_is_never_pushed(team):
    """The landing check runs on the merged result in a scratch workspace, as on a local landing: a failure is
    CHECK_FAILED in the same words (the command, how it ended), its output kept, and nothing is pushed."""
    bare, a, _ = team
    before = git(bare, "rev-parse", "main")
    sha = job_commit(a, {"src/a.py": "a = 2\n"})
    check = Check("echo checked; grep -q 3 src/a.py", 30)
    remote = rmt.Remote(str(bare), "main")
    result = await rmt.land(a, remote, sha, job_id=1, message="m", check=check)
    assert result.outcome is LandOutcome.CHECK_FAILED
    assert f"landing check `{check.command}` exited 1" in result.message and "checked" in result.check_output
    assert git(bare, "rev-parse", "main") == before
    passed = await rmt.land(a, remote, sha, job_id=1, message="m", check=Check("grep -q 2 src/a.py", 30))
    assert passed.outcome is LandOutcome.LANDED, passed.message
    assert git(bare, "rev-parse", "main") == sha


async def test_a_refusing_hook_is_a_failure_with_the_remotes_words(team):
    """Branch protection (a pre-receive hook refusing the update) fails the landing with the remote's own message;
    nothing moves and the journal's intent is closed."""
    bare, a, _ = team
    hook(bare, "pre-receive", 'echo "GL-HOOK-ERR: main is protected: open a merge request" >&2\nexit 1\n')
    before = git(bare, "rev-parse", "main")
    sha = job_commit(a, {"src/a.py": "a = 2\n"})
    journal = Recorder()
    result = await rmt.land(a, rmt.Remote(str(bare), "main"), sha, job_id=1, message="m", journal=journal)
    assert result.outcome is LandOutcome.REFUSED
    assert "main is protected: open a merge request" in result.message
    assert git(bare, "rev-parse", "main") == before
    assert journal.ended == [1]


async def test_a_rewritten_remote_branch_is_not_merged_back(team):
    """A remote branch force-pushed to history without the job's base is refused (REWRITTEN): the dropped history
    is never pushed back."""
    bare, a, b = team
    base = git(a, "rev-parse", "main")
    sha = job_commit(a, {"src/a.py": "a = 2\n"})
    git(b, "checkout", "-q", "--orphan", "fresh")
    write(b, {"README.md": "new start\n"})
    git(b, "commit", "-q", "-am", "rewritten")
    git(b, "push", "-q", "--force", "origin", "fresh:main")
    rewritten = git(bare, "rev-parse", "main")
    result = await rmt.land(a, rmt.Remote(str(bare), "main"), sha, job_id=1, message="m", base=base)
    assert result.outcome is LandOutcome.REWRITTEN
    assert git(bare, "rev-parse", "main") == rewritten


async def test_follow_fast_forwards_the_clone_only_when_asked_and_clean(team):
    """With `follow` the clone's checked-out branch is brought to the landed commit (files too); a clone whose branch
    has commits of its own is left as it is and told so."""
    bare, a, b = team
    sha = job_commit(a, {"src/a.py": "a = 2\n"})
    result = await rmt.land(a, rmt.Remote(str(bare), "main"), sha, job_id=1, message="m", follow=True)
    assert result.outcome is LandOutcome.LANDED
    assert git(a, "rev-parse", "main") == sha
    assert (a / "src/a.py").read_text() == "a = 2\n"
    assert "followed" in result.message
    write(b, {"README.md": "mine\n"})
    git(b, "commit", "-q", "-am", "b's own local commit")
    own = git(b, "rev-parse", "main")
    job_b = job_commit(b, {"src/b.py": "b = 2\n"}, "job b", base="origin/main")
    result = await rmt.land(b, rmt.Remote(str(bare), "main"), job_b, job_id=2, message="m", follow=True)
    assert result.outcome is LandOutcome.LANDED, result.message
    assert git(b, "rev-parse", "main") == own
    assert "left as it is" in result.message


async def test_an_unreachable_remote_never_shows_its_password(team):
    """A remote that cannot be reached is UNREACHABLE (for the caller to retry later), and the URL's password
    appears in no message."""
    _, a, _ = team
    sha = job_commit(a, {"src/a.py": "a = 2\n"})
    url = "http://robot:s3cret-token@127.0.0.1:9/team/repo.git"
    result = await rmt.land(a, rmt.Remote(url, "main"), sha, job_id=1, message="m", timeout=20)
    assert result.outcome is LandOutcome.UNREACHABLE
    assert "s3cret-token" not in result.message
    assert "robot:***@127.0.0.1:9" in result.message


async def test_a_fence_that_says_no_stops_the_push(team):
    """When the caller's fence says the node no longer holds the job, nothing is pushed."""
    bare, a, _ = team
    before = git(bare, "rev-parse", "main")
    sha = job_commit(a, {"src/a.py": "a = 2\n"})

    async def fence() -> bool:
        return False

    result = await rmt.land(a, rmt.Remote(str(bare), "main"), sha, job_id=1, message="m", fence=fence)
    assert result.outcome is LandOutcome.FENCED
    assert git(bare, "rev-parse", "main") == before


async def test_a_landing_after_a_crash_finds_its_push(team):
    """`landed` tells whether a push went through (a node killed between push and record); landing the same job
    again is a no-op, not a second copy."""
    bare, a, _ = team
    sha = job_commit(a, {"src/a.py": "a = 2\n"}, "job one")
    remote = rmt.Remote(str(bare), "main")
    assert not rmt.landed(a, remote, sha)
    pushed_sha = git(a, "rev-parse", "main")
    git(a, "merge", "-q", "--no-ff", "-m", "merge", sha.strip())
    merged = git(a, "rev-parse", "HEAD")
    assert rmt.push(a, remote, pushed_sha, merged).outcome is rmt.PushOutcome.PUSHED
    assert rmt.landed(a, remote, merged)
    again = await rmt.land(a, remote, sha, job_id=1, message="m")
    assert again.outcome is LandOutcome.NOOP
    assert git(bare, "rev-parse", "main") == merged


def test_identity_is_one_name_however_a_node_spells_the_url(tmp_path):
    """scp-like, ssh and https spellings of one repository (users, passwords, ports, `.git`, case) share an
    identity; a local path is its resolved absolute path."""
    spellings = [
        "git@GitHub.com:team/app.git",
        "ssh://git@github.com:22/team/app",
        "https://robot:token@github.com/team/app.git/",
        "https://github.com/team/app",
    ]
    assert {rmt.identity(u) for u in spellings} == {"github.com/team/app"}
    os.chdir(tmp_path)
    (tmp_path / "r.git").mkdir()
    assert rmt.identity("r.git") == rmt.identity(f"file://{tmp_path}/r.git") == str(tmp_path / "r.git")
    assert rmt.Remote("git@github.com:team/app.git", "main").key == "github.com/team/app#main"
    assert rmt.shown("https://robot:token@github.com/team/app") == "https://robot:***@github.com/team/app"


def test_a_race_lost_inside_the_remote_is_a_lost_race_not_a_refusal():
    """Another push landing between the remote's check of our lease and its ref update ("cannot lock ref … is at X
    but expected Y", as git's receive-pack says it) is a lost race to fetch and retry, not a refusal that fails
    the job; a hook's refusal stays a refusal."""
    remote = rmt.Remote("/srv/remote.git", "main")
    out = "To /srv/remote.git\n!\tabc:refs/heads/main\t[remote rejected] (failed to update ref)\nDone\n"
    race = (
        "remote: error: cannot lock ref 'refs/heads/main': is at c8e3fd9f2ccc6e0cae3df51f7b6fee6eb53bf27c but "
        "expected 7fb888023d329964fa01abfba275e0afed176d69\n"
    )
    lost = rmt.push_outcome(remote, "a" * 40, 1, out, race)
    assert lost is not None and lost.outcome is rmt.PushOutcome.STALE
    hook = out.replace("(failed to update ref)", "(pre-receive hook declined)")
    refused = rmt.push_outcome(remote, "a" * 40, 1, hook, "remote: main is protected\n")
    assert refused is not None and refused.outcome is rmt.PushOutcome.REFUSED and "main is protected" in refused.message


async def test_a_job_whose_earlier_attempt_landed_on_another_node_lands_nothing_again(team):
    """Job 7 taken over from node A (its push had not shown yet) ran again on node B; A's push lands after all.
    B's landing of its own attempt finds job 7's commit on the remote since the base: nothing is pushed again, and
    the job is landed at A's commit. A commit whose body merely quotes the trailer is no such commit."""
    from orchestrator.git.commits import job_message

    bare, a, b = team
    base = git(a, "rev-parse", "main")
    first = job_commit(a, {"src/a.py": "a = 2\n"}, job_message("first attempt", 7))
    assert (await rmt.land(a, rmt.Remote(str(bare), "main"), first, job_id=7, message="m", base=base)).outcome is (
        LandOutcome.LANDED
    )
    pushed = git(bare, "rev-parse", "main")
    quoted = pushed_from(b, {"src/b.py": "b = 2\n"}, "note\n\nOrchestrator-Job: 8 is quoted here\n\nSee-also: x")
    again = job_commit(b, {"src/a.py": "a = 2\n", "README.md": "run twice\n"}, job_message("second attempt", 7), base)
    result = await rmt.land(b, rmt.Remote(str(bare), "main"), again, job_id=7, message="m", base=base)
    assert result.outcome is LandOutcome.NOOP and result.sha == first, result.message
    assert git(bare, "rev-parse", "main") == quoted != pushed
    git(b, "checkout", "-q", "-b", "job-eight", base)
    write(b, {"src/eight.py": "eight = 8\n"})
    git(b, "add", "-A")
    git(b, "commit", "-qm", job_message("job eight", 8))
    other = git(b, "rev-parse", "HEAD")
    git(b, "checkout", "-q", "main")
    landed8 = await rmt.land(b, rmt.Remote(str(bare), "main"), other, job_id=8, message="m", base=base)
    assert landed8.outcome is LandOutcome.LANDED, landed8.message
