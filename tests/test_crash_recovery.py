"""Crash recovery end to end: a `kill -9` of the daemon leaves nothing running and nothing half done."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from orchestrator.core.records import Intent
from orchestrator.git import journal
from orchestrator.proc import process
from tests.conftest import git, write
from tests.harness import Daemon, until


def restart(daemon_factory, d: Daemon, name: str) -> Daemon:  # type: ignore[no-untyped-def]
    """A new daemon of the same kind on the same home (stopped by the fixture at the end), logging to
    `home/<name>.log`."""
    again = daemon_factory(name, process=isinstance(d, Daemon))
    again.home, again.env, again.socket = d.home, d.env, d.socket
    again.log_path = d.home / f"{name}.log"
    return again.start()


def test_runner_of_a_killed_daemon_is_ended_before_the_retry(make_repo, daemon_factory, tmp_path):
    """kill -9 the daemon mid-job, restart, retry: the old runner is gone and only the retry's lines land."""
    repo = make_repo()
    ctl = tmp_path / "lines"
    ctl.write_text("600\n")  # the first run would append for 30 s
    d = daemon_factory(process=True).start()
    job = d.enqueue(
        repo,
        f'n=$(cat {ctl}); i=0; while [ $i -lt $n ]; do echo "$$ $i" >> a.txt; i=$((i+1)); sleep 0.05; done',
        "--path",
        "a.txt",
    )
    worktree = Path(until("a worktree", lambda: d.cli_json("show", str(job)).get("worktree")))
    lines = until("the job to write", lambda: (worktree / "a.txt").exists() and (worktree / "a.txt").read_text())
    old_pid = int(lines.split()[0])
    d.kill()
    assert process.alive(old_pid), "the runner outlives a kill -9 of its daemon (its own process group)"
    ctl.write_text("5\n")

    d2 = restart(daemon_factory, d, "second")
    assert not process.alive(old_pid), "the restarted daemon ended the dead daemon's runner"
    assert d2.cli_json("show", str(job))["state"] == "interrupted"
    assert d2.cli("retry", str(job)).returncode == 0
    assert d2.cli("wait", str(job), "--timeout", "60").returncode == 0
    shown = d2.cli_json("show", str(job))
    assert shown["state"] == "landed", shown
    landed = git(repo, "show", "main:a.txt").splitlines()
    assert len(landed) == 5 and len({line.split()[0] for line in landed}) == 1, landed
    assert landed[0].split()[0] != str(old_pid)
    assert "process.survivors_ended" in {e["event"] for e in d2.events()}


# A writer that leaves its job's process group and session (a daemonising agent would), then keeps
# appending to a.txt in the worktree; its pid goes to esc.pid.
_ESCAPE = "setsid sh -c 'echo $$ > esc.pid; while :; do echo x >> a.txt; sleep 0.05; done' </dev/null >/dev/null 2>&1 &"


def test_process_that_left_its_group_is_ended_with_its_job(make_repo, daemon_factory):
    """A job whose runner starts a `setsid` writer and exits: the writer is ended before the job lands."""
    repo = make_repo()
    d = daemon_factory().start()
    job = d.enqueue(
        repo, f"{_ESCAPE} while [ ! -s esc.pid ]; do sleep 0.02; done", "--path", "a.txt", "--path", "esc.pid"
    )
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    pid = int(git(repo, "show", "main:esc.pid"))
    assert not process.alive(pid), "the writer that left its process group outlived its job"
    assert "process.escapees_ended" in {e["event"] for e in d.events()}


def test_process_that_left_its_group_is_ended_after_a_kill(make_repo, daemon_factory):
    """kill -9 the daemon while a job's `setsid` writer runs: the restarted daemon ends it before the retry."""
    repo = make_repo()
    d = daemon_factory(process=True).start()
    job = d.enqueue(repo, f"{_ESCAPE} sleep 60", "--path", "a.txt", "--path", "esc.pid")
    worktree = Path(until("a worktree", lambda: d.cli_json("show", str(job)).get("worktree")))
    pid_file = worktree / "esc.pid"
    pid = int(until("the writer to start", lambda: pid_file.exists() and pid_file.read_text().strip()))
    d.kill()
    assert process.alive(pid), "the writer survives a kill -9 of the daemon"
    restart(daemon_factory, d, "second")
    assert not process.alive(pid), "the restarted daemon ended the dead daemon's escaped writer"


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(d: Daemon) -> None:
    """kill -9 the daemon and every process it started (a crash of its whole process tree)."""
    assert d.proc is not None
    for pid in [d.proc.pid, *_descendants(d.proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    d.proc.wait(timeout=30)


def test_landing_killed_after_the_ref_moved_is_finished_on_restart(make_repo, daemon_factory, tmp_path):
    """kill -9 between the ref move and the checkout update: on restart the user's checkout is brought level
    (stale index.lock of ours removed, their own edit kept) and the job says it landed after a restart."""
    repo = make_repo(files={"a.txt": "old\n", "b.txt": "mine\n"})
    old = git(repo, "rev-parse", "main")
    (repo / "b.txt").write_text("my own uncommitted edit\n")
    mark = tmp_path / "slowed"
    hook = tmp_path / "fsmonitor"
    # A slow core.fsmonitor widens the window: the first git call in the checkout after main moved sleeps.
    hook.write_text(
        "#!/bin/sh\n"
        f'if [ ! -e {mark} ] && [ "$(git --git-dir={repo}/.git rev-parse refs/heads/main)" != "{old}" ]; then\n'
        f"  touch {mark}; sleep 60\n"
        "fi\nexit 1\n"
    )
    hook.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(hook))
    d = daemon_factory(process=True).start()
    job = d.enqueue(repo, "echo new > a.txt", "--path", "a.txt")
    until("main to move and the checkout update to stall", mark.exists, timeout=60)
    assert git(repo, "rev-parse", "main") != old
    kill_tree(d)

    d2 = restart(daemon_factory, d, "second")
    assert d2.cli("wait", str(job), "--timeout", "60").returncode == 0
    shown = d2.cli_json("show", str(job))
    assert shown["state"] == "landed" and "after a restart" in shown["reason"], shown["reason"]
    assert "NOT level" not in shown["reason"]
    assert git(repo, "status", "--porcelain") == "M b.txt", "only the user's own edit is uncommitted"
    assert (repo / "a.txt").read_text() == "new\n" and (repo / "b.txt").read_text() == "my own uncommitted edit\n"
    assert not (repo / ".git" / "index.lock").exists()
    assert not (repo / ".git" / "index.lock.lock").exists(), "git's lock on the landing's copy of the index"
    assert git(repo, "log", "--format=%s", f"{old}..main").count("echo new > a.txt") == 1
    recovered = [e for e in d2.events() if e["event"] == "landing.recovered"]
    assert recovered and recovered[0]["outcome"] == "finished" and recovered[0]["locks"], recovered


def test_job_that_deletes_its_git_dir_lands_and_commits_nowhere_else(make_repo, daemon_factory, tmp_path):
    """With the state dir inside another repository sharing history, a job that runs `rm -rf .git` still lands
    its files (the daemon commits the files, not the job's git dir); nothing reaches the outer repository."""
    outer = make_repo("outer", files={"README.md": "hello\n", "dotfile": "x\n"})
    repo = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(outer), str(repo))
    outer_head = git(outer, "rev-parse", "HEAD")
    d = daemon_factory()
    d.home = outer / "home"  # the daemon's state lives inside the outer repository's work tree
    d.env["ORCHESTRATOR_HOME"] = str(d.home)
    d.socket, d.log_path = d.home / "run" / "orchestrator.sock", tmp_path / "daemon.log"
    d.start()
    job = d.enqueue(repo, "rm -rf .git; echo x > new.txt", "--path", "new.txt")
    d.cli("wait", str(job), "--timeout", "60")
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "landed", shown["reason"]
    assert git(outer, "rev-parse", "HEAD") == outer_head, "nothing was committed into the outer repository"
    assert git(outer, "for-each-ref", "--format=%(refname)") == "refs/heads/main"
    assert git(repo, "show", "main:new.txt") == "x" and git(repo, "rev-parse", "main^") == outer_head


def test_half_made_check_worktree_is_removed_on_start(make_repo, tmp_path):
    """A `git worktree add` killed before it wrote `commondir` breaks `git worktree list`; recovery removes it."""
    from orchestrator.jobs.landing_check import remove_stale_scratch

    repo = make_repo()
    scratch = tmp_path / "state" / "scratch"
    half = scratch / "orchestrator-check-x" / "abc"
    half.mkdir(parents=True)
    admin = repo / ".git" / "worktrees" / "abc"
    admin.mkdir(parents=True)
    (admin / "locked").write_text("initializing")
    (admin / "gitdir").write_text(f"{half}/.git\n")
    (admin / "commondir").write_text("")  # created, never written: the kill came in between
    assert subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True).returncode != 0
    remove_stale_scratch(repo, scratch, tmp_path / "state")
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert not admin.exists() and not half.parent.exists()


async def test_a_journal_entry_is_obeyed_only_for_its_own_job_and_repository_s_worktrees(make_repo, tmp_path):
    """Recovery writes only what a landing of this daemon's own would have: an entry whose checkout is an unrelated
    repository (not a worktree of the entry's repository), or whose job is of another repository or none, is not
    obeyed (logged, dropped); the unrelated repository keeps every byte and its index."""
    from orchestrator.core.records import Intent
    from orchestrator.git.worktrees import WorktreePool
    from orchestrator.jobs.board import Board
    from orchestrator.jobs.recovery import settle_landings
    from orchestrator.store.sqlite import SqliteStore

    repo, other = make_repo("repo"), make_repo("other")
    victim = make_repo("victim", {"mine.txt": "mine\n"})
    (victim / "mine.txt").write_text("mine, not committed yet\n")
    old = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "planted")
    (repo / "planted.txt").write_text("planted\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "planted")
    new = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    store = await SqliteStore.open(tmp_path / "state.db")
    try:
        job = await store.jobs.add(repo=str(repo), branch="planted", text="t", runner="shell")
        elsewhere = await store.jobs.add(repo=str(other), branch="main", text="t", runner="shell")
        for job_id, checkout in ((job.id, victim), (elsewhere.id, repo), (None, repo)):
            intent = Intent(str(repo), "refs/heads/planted", old, new, (str(checkout),), job_id, 0.0)
            await store.journal.begin(intent)
        await settle_landings(Board(store), WorktreePool(tmp_path / "worktrees", warm=0))
        assert await store.journal.open() == []
    finally:
        await store.close()
    assert git(victim, "status", "--porcelain") == "M mine.txt" and not (victim / "planted.txt").exists()
    assert not (repo / "planted.txt").exists() and git(repo, "status", "--porcelain") == ""


def test_a_ref_lock_left_by_a_landing_killed_mid_move_is_removed_and_the_next_landing_moves_the_branch(make_repo):
    """A daemon killed while it moved the branch's ref leaves `refs/heads/main.lock`: recovery removes it when it
    appeared after the landing's intent (and nobody holds it), so later landings are not refused; an older one is
    someone else's and stays."""
    repo = make_repo()
    old = git(repo, "rev-parse", "main")
    write(repo, {"a.txt": "new\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "new")
    new = git(repo, "rev-parse", "main")
    lock = repo / ".git" / "refs" / "heads" / "main.lock"
    lock.write_text(new + "\n")
    intent = Intent(str(repo), "refs/heads/main", old, new, (str(repo),), None, time.time() + 5)
    assert str(lock) not in journal.settle(intent).locks and lock.exists(), "older than the intent: not ours"
    intent = Intent(str(repo), "refs/heads/main", old, new, (str(repo),), None, time.time() - 5)
    settled = journal.settle(intent)
    assert settled.outcome == "finished" and str(lock) in settled.locks and not lock.exists()
    git(repo, "update-ref", "refs/heads/main", old, new)  # the branch moves again
