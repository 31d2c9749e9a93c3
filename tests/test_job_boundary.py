"""The job boundary, tried as an attacker would: a job's text is a hostile program that knows this code.

Each test runs the real daemon with the real sandbox (bwrap) — and, where the promise holds without one,
with `sandbox = "none"` — and checks afterwards that the user's checkout (index, uncommitted, untracked
and ignored files), every ref and every object are exactly as before or as the landing defines, that no
payload ran outside the sandbox, and that the daemon's key is in no file the job could read.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.proc import sandbox
from tests.conftest import git, write
from tests.harness import until


def _bwrap_works() -> bool:
    found = shutil.which("bwrap")
    return found is not None and sandbox.probe(found) is None


needs_bwrap = pytest.mark.skipif(not _bwrap_works(), reason="bubblewrap is not installed or cannot run here")
BOTH = [pytest.param("bwrap", marks=needs_bwrap), "none"]

KEY = f"sk-ant-test-{secrets.token_hex(12)}"


def daemon(daemon_factory, mode: str, *, process: bool = False, **env: str):
    """A daemon holding an API key (never used: its base URL is a closed port) in the given sandbox mode (a
    process of its own with `process`: where its own environ and cmdline are what a job must not see)."""
    return daemon_factory(
        env={
            "ORCHESTRATOR_SANDBOX": mode,
            "ANTHROPIC_API_KEY": KEY,
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
            "MAX_CONCURRENT_JOBS": "2",
            **env,
        },
        process=process,
    )


def user_state(repo: Path) -> dict[str, object]:
    """What of the user's must survive: every file of the checkout (ignored ones too), the index, every ref,
    the git config and hooks, and the set of objects."""
    files: dict[str, bytes | str] = {}
    for dirpath, dirs, names in os.walk(repo):
        if Path(dirpath) == repo and ".git" in dirs:
            dirs.remove(".git")
        for name in names:
            p = Path(dirpath) / name
            files[str(p.relative_to(repo))] = os.readlink(p) if p.is_symlink() else p.read_bytes()
    objects = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch-check=%(objectname)"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        "files": files,
        "index": (repo / ".git/index").read_bytes(),
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "head": (repo / ".git/HEAD").read_text(),
        "config": (repo / ".git/config").read_text(),
        "hooks": sorted(os.listdir(repo / ".git/hooks")),
        "objects": set(objects),
    }


def users_repo(make_repo) -> Path:
    """A repository whose checkout holds uncommitted, untracked and ignored work of the user's."""
    repo = make_repo(files={"README.md": "hello\n", "src/a.py": "a = 1\n", ".gitignore": ".env\n"})
    write(repo, {"README.md": "the user's uncommitted edit\n", "notes.txt": "untracked\n", ".env": "TOKEN=mine\n"})
    return repo


def assert_untouched_but_landed(repo: Path, before: dict[str, object], landed: dict[str, str]) -> None:
    """The user's state is as before, except the landed files (new in the checkout and on main)."""
    after = user_state(repo)
    files = dict(before["files"])  # type: ignore[call-overload]
    for path, text in landed.items():
        files[path] = text.encode()
        assert git(repo, "show", f"main:{path}") == text.rstrip("\n")
    assert after["files"] == files
    assert after["head"] == before["head"] and after["config"] == before["config"] and after["hooks"] == before["hooks"]
    assert before["objects"] <= after["objects"]  # type: ignore[operator]
    assert git(repo, "fsck", "--no-progress") == ""


# -- 1. a process left behind rewrites the workspace's .git after the commit --------------------------------


@pytest.mark.parametrize("mode", BOTH)
def test_a_leftover_process_cannot_aim_the_daemons_cleanup_at_the_users_checkout(
    mode, make_repo, daemon_factory, tmp_path
):
    """A `setsid env -i` process the job leaves points its .git at a git dir whose core.worktree is the
    user's checkout, right after the daemon commits: the daemon's recycling never runs git there, so the
    user's edit, untracked and ignored files stay, and the landed file stays landed. (Without a sandbox the
    process survives: it only rewrites .git here; a process that wrote the user's files itself could.)"""
    repo = users_repo(make_repo)
    before = user_state(repo)
    evil = tmp_path / "evil.git"
    subprocess.run(["git", "init", "-q", "--bare", str(evil)], check=True)
    subprocess.run(["git", f"--git-dir={evil}", "config", "core.worktree", str(repo)], check=True)
    subprocess.run(["git", f"--git-dir={evil}", "config", "core.bare", "false"], check=True)
    d = daemon(daemon_factory, mode).start()
    text = f"""
echo landed > new.txt
( setsid env -i PATH="$PATH" sh -c '
    for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
      sleep 0.2; rm -rf .git; printf "gitdir: {evil}\\n" > .git
    done
' >/dev/null 2>&1 & )
"""
    job = d.enqueue(repo, text, "--path", "new.txt")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0, d.cli_json("show", str(job))["reason"]
    d.cli("wait", str(d.enqueue(repo, "echo later > later.txt", "--path", "later.txt")), "--timeout", "60")
    time.sleep(2.5)  # the leftover (unconfined without bwrap) has done its worst by now
    assert_untouched_but_landed(repo, before, {"new.txt": "landed\n", "later.txt": "later\n"})


# -- 2. history deleted from inside the sandbox --------------------------------------------------------------


@needs_bwrap
def test_a_job_cannot_delete_or_rewrite_the_repositorys_objects_or_refs(make_repo, daemon_factory):
    """A job deleting objects through its git dir, its alternates file or the repository's path, moving
    refs with update-ref or a push, changes nothing of the repository: its own git dir is all it can break."""
    repo = users_repo(make_repo)
    before = user_state(repo)
    d = daemon(daemon_factory, "bwrap").start()
    text = f"""
rm -rf "$(git rev-parse --git-common-dir)"/objects/* 2>/dev/null
objects=$(cat .git/objects/info/alternates 2>/dev/null || echo {repo}/.git/objects)
rm -rf "$objects"/* 2>/dev/null
git --git-dir={repo}/.git update-ref refs/heads/main HEAD 2>/dev/null
git push -q {repo} HEAD:refs/heads/main 2>/dev/null
git --git-dir={repo}/.git branch evil 2>/dev/null
echo done > proof.txt
"""
    job = d.enqueue(repo, text, "--path", "proof.txt")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0, d.cli_json("show", str(job))["reason"]
    assert_untouched_but_landed(repo, before, {"proof.txt": "done\n"})
    assert "evil" not in git(repo, "branch", "--list")


# -- 3. git config the daemon might obey: fsmonitor, hooks, worktree config ---------------------------------


@pytest.mark.parametrize("mode", BOTH)
def test_planted_fsmonitor_and_hooks_never_run_with_the_daemons_key(mode, make_repo, daemon_factory, tmp_path):
    """fsmonitor and hooks planted in the job's git dir (and, as `git config --worktree`, under worktreeConfig)
    never run outside the sandbox; later landings into main are not held up by them."""
    repo = users_repo(make_repo)
    git(repo, "config", "extensions.worktreeConfig", "true")  # what `git sparse-checkout init` sets
    before = user_state(repo)
    marker = tmp_path / "payload-ran"
    payload = tmp_path / "payload.sh"
    payload.write_text(f'#!/bin/sh\nenv > {marker}\nexit 1\n')
    payload.chmod(0o755)
    d = daemon(daemon_factory, mode).start()
    text = f"""
git config core.fsmonitor {payload}
git config extensions.worktreeConfig true && git config --worktree core.fsmonitor {payload}
for h in post-checkout post-commit reference-transaction post-index-change; do
  printf '#!/bin/sh\\n{payload}\\n' > .git/hooks/$h && chmod +x .git/hooks/$h
done
printf 'gitdir: {repo}/.git\\n' > .git/gitdir 2>/dev/null
echo one > one.txt
"""
    first = d.enqueue(repo, text, "--path", "one.txt")
    second = d.enqueue(repo, "echo two > two.txt", "--path", "two.txt", "--after", str(first))
    out = d.cli("wait", str(first), str(second), "--timeout", "90")
    assert out.returncode == 0, [d.cli_json("show", str(j))["reason"] for j in (first, second)]
    assert not marker.exists(), marker.read_text()
    before["config"] = (repo / ".git/config").read_text()  # the user's own setting above
    assert_untouched_but_landed(repo, before, {"one.txt": "one\n", "two.txt": "two\n"})


def test_the_users_own_fsmonitor_never_receives_the_daemons_key(make_repo, daemon_factory, tmp_path):
    """A core.fsmonitor in the repository's config (the user's own, or one a job without a sandbox planted)
    runs for the landing's checkout update without the daemon's API key or the job's variables."""
    repo = make_repo()
    dump = tmp_path / "fsmonitor-env"
    monitor = tmp_path / "monitor.sh"
    monitor.write_text(f"#!/bin/sh\nenv >> {dump}\nexit 1\n")  # exit 1: git falls back to a full scan
    monitor.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(monitor))
    d = daemon(daemon_factory, "none").start()
    job = d.enqueue(repo, "echo x > x.txt", "--path", "x.txt")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    assert dump.exists(), "the user's fsmonitor ran (it is theirs to have)"
    seen = dump.read_text()
    assert KEY not in seen and "ANTHROPIC" not in seen and "ORCHESTRATOR_JOB" not in seen


# -- 4. straight onto main, past review -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", BOTH)
def test_a_job_in_review_cannot_reach_its_target_branch(mode, make_repo, daemon_factory):
    """A job that points its HEAD at refs/heads/main waits in review with main untouched; rejected, it never
    reaches main; landed, main gets exactly its change and the user's checkout follows."""
    repo = users_repo(make_repo)
    before = user_state(repo)
    d = daemon(daemon_factory, mode).start()
    text = 'g=$(git rev-parse --git-dir); echo "ref: refs/heads/main" > "$g/HEAD"; echo r > r.txt; git commit -qam x'
    rejected = d.enqueue(repo, text, "--path", "r.txt", "--land", "review")
    until("job ready", lambda: d.cli_json("show", str(rejected))["state"] == "ready", 60)
    main_before = git(repo, "rev-parse", "main")
    waiting = user_state(repo)
    assert (waiting["files"], waiting["index"], waiting["head"]) == (before["files"], before["index"], before["head"])
    assert f"refs/heads/main {main_before}" in str(before["refs"]), "main did not move before a decision"
    assert d.cli("reject", str(rejected)).returncode == 0
    after = user_state(repo)
    assert git(repo, "rev-parse", "main") == main_before and after["files"] == before["files"]
    assert after["index"] == before["index"]
    approved = d.enqueue(repo, text.replace("r.txt", "s.txt").replace("echo r", "echo s"), "--path", "s.txt",
                         "--land", "review")  # fmt: skip
    until("job ready", lambda: d.cli_json("show", str(approved))["state"] == "ready", 60)
    assert git(repo, "rev-parse", "main") == main_before
    assert d.cli("land", str(approved)).returncode == 0
    d.cli("wait", str(approved), "--timeout", "60")
    assert d.cli_json("show", str(approved))["state"] == "landed"
    assert git(repo, "show", "main:s.txt") == "s" and (repo / "s.txt").read_text() == "s\n"
    assert "r.txt" not in git(repo, "ls-tree", "-r", "--name-only", "main")


# -- 5. the key and other jobs' texts, from /proc and the daemon's files --------------------------------------


@needs_bwrap
def test_the_key_is_in_no_file_the_job_can_read(make_repo, daemon_factory, tmp_path):
    """A job that reads every process's environ and cmdline, the daemon's state, config and runtime dirs and
    /tmp lands what it found: neither the key nor another job's text is in it, and it sees no other process."""
    repo = make_repo()
    d = daemon(daemon_factory, "bwrap", process=True)
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "env").write_text(f"ANTHROPIC_API_KEY={KEY}\n")
    (d.home / "config" / "env").chmod(0o600)
    d.start()
    secret_text = f"other job's secret {secrets.token_hex(6)}"
    other = d.enqueue(repo, f"sleep 3 # {secret_text}", "--path", "docs/")
    text = f"""
{{
  ls /proc | grep -E '^[0-9]+$' | wc -l
  cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'
  grep -rIa --exclude-dir=.git . {d.home} /tmp "$XDG_RUNTIME_DIR" 2>/dev/null
  cat ~/.config/orchestrator/env 2>/dev/null
}} > "$TMPDIR/found"
mv "$TMPDIR/found" found.txt
"""
    job = d.enqueue(repo, text, "--path", "found.txt")
    assert d.cli("wait", str(job), str(other), "--timeout", "60").returncode == 5  # `other` changes nothing
    assert d.cli_json("show", str(job))["state"] == "landed"
    found = subprocess.run(["git", "show", "main:found.txt"], cwd=repo, capture_output=True, check=True).stdout
    assert KEY.encode() not in found and secret_text.encode() not in found
    assert int(found.splitlines()[0]) <= 8, "only the job's own processes are visible"
    assert b"orchestrator\ndaemon" not in found, "the daemon's process is not visible"


# -- 6. the landing check is the job's code ----------------------------------------------------------------------


@needs_bwrap
def test_the_landing_check_runs_confined(make_repo, daemon_factory, tmp_path):
    """A job that rewrites the repository's landing check script gets it run inside the sandbox: its write to
    the user's checkout and to a file outside fail, and the check fails the landing."""
    repo = make_repo(files={"README.md": "hello\n", "check.sh": "exit 0\n"})
    outside = tmp_path / "outside-marker"
    d = daemon(daemon_factory, "bwrap")
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text(f'[repos."{repo}"]\ncheck = "sh check.sh"\n')
    d.start()
    payload = f"echo pwned > {repo}/README.md; touch {outside}; cat /proc/1/environ; exit 0"
    job = d.enqueue(repo, f"printf '%s\\n' '{payload}' > check.sh", "--path", "check.sh")
    d.cli("wait", str(job), "--timeout", "60")
    shown = d.cli_json("show", str(job))
    assert (repo / "README.md").read_text() == "hello\n" and not outside.exists()
    assert shown["state"] == "landed", shown["reason"]  # the check itself exited 0; its writes went nowhere
    assert KEY not in d.cli("logs", str(job)).stdout


# -- 10. without a sandbox: an overwrite that keeps size and mtime ---------------------------------------------


def test_without_a_sandbox_an_overwrite_keeping_size_and_mtime_is_seen(make_repo, daemon_factory):
    """With sandbox none, a job that overwrites the user's dirty file with same-size content and restores its
    mtime fails with WroteOutside naming it (ctime and inode give it away)."""
    repo = make_repo()
    write(repo, {"README.md": "user edit\n"})
    d = daemon(daemon_factory, "none").start()
    text = f"""python3 - <<'EOF'
import os
p = "{repo}/README.md"
st = os.stat(p)
open(p, "w").write("evil edit\\n")
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
EOF
echo y > y.txt"""
    job = d.enqueue(repo, text, "--path", "y.txt")
    d.cli("wait", str(job), "--timeout", "60")
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "failed" and shown["code"] == "WroteOutside", shown["reason"]
    assert "README.md" in shown["reason"]


@needs_bwrap
def test_no_process_of_a_sandboxed_job_outlives_it(make_repo, daemon_factory):
    """Processes a job leaves (`setsid`, `env -i`, a double fork) are gone once it ends: the PID namespace
    dies with its first process, so none writes afterwards and none is left running."""
    repo = make_repo()
    d = daemon(daemon_factory, "bwrap").start()
    tag = f"{secrets.randbelow(900) + 100}.{secrets.randbelow(10**6)}"  # a sleep no other process has
    text = f"""
( setsid env -i PATH="$PATH" sh -c 'sleep 1; echo late > "$0"/late.txt' "$TMPDIR" & )
( setsid env -i sleep {tag} & )
echo now > now.txt
"""
    job = d.enqueue(repo, text, "--path", "now.txt")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    time.sleep(1.5)
    assert not list((d.home / "state").rglob("late.txt"))
    assert subprocess.run(["pgrep", "-f", f"sleep {tag}"], capture_output=True).returncode == 1, "nothing left"


@needs_bwrap
@pytest.mark.skipif(os.getuid() != 0, reason="capabilities inside the sandbox are only a question when root runs it")
def test_a_job_of_a_daemon_run_as_root_has_no_capability_to_remount(make_repo, daemon_factory):
    """Under a daemon run as root, a job that remounts the read-only root (or binds over it) to write the
    user's checkout, or writes the kernel's core_pattern, fails: it has no capability in its namespace,
    setuid programs give none back, and /proc/sys is read-only."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text()
    repo = users_repo(make_repo)
    before = user_state(repo)
    d = daemon(daemon_factory, "bwrap").start()
    text = f"""
grep CapEff /proc/self/status > caps.txt
mount -o remount,rw / 2>>caps.txt; mount -o remount,rw,bind {repo} {repo} 2>>caps.txt
mount -t tmpfs none {repo} 2>>caps.txt
echo pwned > {repo}/README.md 2>>caps.txt
echo '|/bin/sh -c "touch {repo}/pwned"' > /proc/sys/kernel/core_pattern 2>>caps.txt
true
"""
    job = d.enqueue(repo, text, "--path", "caps.txt")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    caps = git(repo, "show", "main:caps.txt")
    assert "CapEff:\t0000000000000000" in caps, caps
    assert Path("/proc/sys/kernel/core_pattern").read_text() == pattern
    assert_untouched_but_landed(repo, before, {"caps.txt": caps + "\n"})
