"""Confinement of shell jobs: bubblewrap where it works, and detection after the fact where it does not."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from orchestrator.proc import sandbox
from tests.conftest import git, outside_tmp


def _bwrap_works() -> bool:
    found = shutil.which("bwrap")
    return found is not None and sandbox.probe(found) is None


needs_bwrap = pytest.mark.skipif(not _bwrap_works(), reason="bubblewrap is not installed or cannot run here")


def test_auto_without_bwrap_says_why_once(monkeypatch):
    """`auto` on a machine without bwrap runs unconfined and gives the reason; `bwrap` makes jobs refuse."""
    monkeypatch.setattr(shutil, "which", lambda _: None)
    auto = sandbox.resolve("auto")
    assert not auto.active and "not installed" in auto.reason and auto.check() is None
    required = sandbox.resolve("bwrap")
    assert "install bubblewrap" in (required.check() or "")
    assert not sandbox.resolve("none").active


@needs_bwrap
def test_with_bwrap_a_job_cannot_write_the_users_checkout_or_home(make_repo, daemon_factory, tmp_path):
    """Writes to the user's checkout and $HOME fail and change nothing; the workspace, a commit of the job's own
    and TMPDIR work."""
    repo = make_repo()
    home = tmp_path / "userhome"
    home.mkdir()
    d = daemon_factory(env={"ORCHESTRATOR_SANDBOX": "bwrap", "HOME": str(home), "MAX_CONCURRENT_JOBS": "3"}).start()
    checkout = d.enqueue(repo, f"echo hacked > {repo}/README.md", "--path", "README.md")
    into_home = d.enqueue(repo, f"touch {home}/evil", "--path", "docs/")
    fine = d.enqueue(
        repo,
        'echo ok > src/a.py && echo t > "$TMPDIR/t" && git add -A && git commit -qm "own commit"',
        "--path",
        "src/a.py",
    )
    d.cli("wait", str(checkout), str(into_home), str(fine), "--timeout", "60")
    jc, jh, jf = (d.cli_json("show", str(i)) for i in (checkout, into_home, fine))
    assert jc["state"] == "failed" and jh["state"] == "failed", (jc["reason"], jh["reason"])
    assert (repo / "README.md").read_text() == "hello\n" and git(repo, "status", "--porcelain") == ""
    assert list(home.iterdir()) == []
    assert "Read-only file system" in d.cli("logs", str(checkout)).stdout
    assert jf["state"] == "landed", jf["reason"]
    assert git(repo, "show", "main:src/a.py") == "ok"
    # The job's own commit stayed in its own git dir: the daemon committed the files itself.
    assert "own commit" not in git(repo, "log", "--format=%s", "main")
    assert any(e["event"] == "sandbox.ready" for e in d.events())


@needs_bwrap
def test_hidden_dirs_read_empty_and_hidden_files_read_empty():
    """What the sandbox is told to hide is out of a confined command's sight: a dir (a socket dir) is empty, a file
    (a password file) reads as nothing, also where it lies inside a dir shown again; the rest reads as on the host."""
    tmp_path = outside_tmp()  # not under /tmp, which every confined command sees empty anyway
    try:
        _hidden_dirs_and_files(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _hidden_dirs_and_files(tmp_path: Path) -> None:
    import subprocess

    sockets, secret, state = tmp_path / "sockets", tmp_path / "secret", tmp_path / "state"
    shown = state / "repo"  # a dir inside a hidden one, shown again read-only (as a repository in a hidden home)
    for d in (sockets, shown):
        d.mkdir(parents=True)
    (sockets / ".s.PGSQL.5432").write_text("socket")
    (state / "orchestrator.db").write_text("db")
    secret.write_text("password")
    (shown / ".pgpass").write_text("password")
    (shown / "visible").write_text("visible")
    ws = tmp_path / "ws"
    ws.mkdir()
    found = shutil.which("bwrap")
    assert found is not None
    hidden = (str(sockets), str(state), str(secret), str(shown / ".pgpass"), "/no/such")
    argv = sandbox.Sandbox(bwrap=found, hidden=hidden).confine(ws, tmp=ws, readonly=[shown])
    script = f"ls -A {sockets}; ls {state}; cat {secret} {shown}/.pgpass {shown}/visible"
    out = subprocess.run([*argv, "sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout) == (0, "repo\nvisible"), out.stderr
    assert secret.read_text() == "password"


def test_without_a_sandbox_a_write_to_the_checkout_fails_the_job(make_repo, daemon_factory):
    """With sandbox none, a job that writes into the user's checkout fails with the paths it wrote."""
    repo = make_repo()
    d = daemon_factory(env={"ORCHESTRATOR_SANDBOX": "none"}).start()
    job = d.enqueue(repo, f"echo x > {repo}/stray.txt && echo y > src/a.py", "--path", "src/a.py")
    d.cli("wait", str(job), "--timeout", "60")
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "failed" and shown["code"] == "WroteOutside"
    assert "stray.txt" in shown["reason"]
    assert git(repo, "show", "main:src/a.py") == "a = 1", "not landed"
    assert (repo / "stray.txt").read_text() == "x\n", "what the person finds is left as it is"


def test_cancel_stops_a_stubborn_runner_and_keeps_the_worktree(make_repo, daemon_factory, tmp_path):
    """A runner ignoring SIGTERM is killed after the grace period; the job is cancelled, its worktree kept."""
    repo = make_repo()
    d = daemon_factory()
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text("[jobs]\nkill_grace = 1\n")
    d.start()
    marker = tmp_path / "started"
    job = d.enqueue(repo, f"trap '' TERM; echo partial > src/a.py; touch {marker}; sleep 37.25", "--path", "src/")
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.1)
    assert d.cli("cancel", str(job)).returncode == 0
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "cancelled"
    assert (Path(shown["worktree"]) / "src" / "a.py").read_text() == "partial\n"
    alive = [p for p in Path("/proc").glob("[0-9]*") if b"37.25" in _cmdline(p)]
    assert not alive, "the runner's process group is gone"


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""


@needs_bwrap
def test_a_sandboxed_job_gets_sigterm_and_its_grace_on_cancel(make_repo, daemon_factory):
    """Cancelling a job under bwrap sends SIGTERM to the job itself (not only to the sandbox, whose death
    would kill it at once): its trap runs and what it writes then is kept in the workspace."""
    repo = make_repo()
    d = daemon_factory(env={"ORCHESTRATOR_SANDBOX": "bwrap"})
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text("[jobs]\nkill_grace = 5\n")
    d.start()
    job = d.enqueue(repo, "trap 'echo saved > src/a.py; exit 0' TERM; touch started; while :; do sleep 0.1; done",
                    "--path", "src/")  # fmt: skip
    deadline = time.monotonic() + 60
    while d.cli_json("show", str(job)).get("worktree") is None or not (
        Path(d.cli_json("show", str(job))["worktree"]) / "started"
    ).exists():
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.1)
    assert d.cli("cancel", str(job)).returncode == 0
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "cancelled"
    assert (Path(shown["worktree"]) / "src" / "a.py").read_text() == "saved\n"
