"""Tried as a hostile user would: bad bodies, bad config, a daemon that dies or stops under a client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.client import Client, _UnixConnection
from tests.conftest import git
from tests.harness import until


def _raw_post(socket: Path, path: str, payload: bytes) -> tuple[int, dict]:
    conn = _UnixConnection(socket, 30)
    try:
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def test_huge_integers_and_deep_json_are_400(make_repo, daemon_factory):
    """Huge integers and deeply nested JSON are the client's error (400, CLI exit 2), never a 500."""
    repo = make_repo()
    d = daemon_factory().start()
    huge = b'{"repo": "%s", "text": "x", "priority": 1%s}' % (str(repo).encode(), b"0" * 5000)
    assert _raw_post(d.socket, "/jobs", huge)[0] == 400
    deep = b'{"repo": "x", "text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert _raw_post(d.socket, "/jobs", deep)[0] == 400
    big = json.dumps({"repo": str(repo), "text": "x", "priority": 10**30}).encode()
    status, body = _raw_post(d.socket, "/jobs", big)
    assert status == 400 and "out of range" in body["error"]
    assert _raw_post(d.socket, "/wait", b'{"ids": [99999999999999999999999]}')[0] == 400
    out = d.cli("enqueue", "--repo", str(repo), "--priority", str(10**30), "--", "true")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert d.cli("status").returncode == 0, "the daemon keeps serving"


def test_a_one_megabyte_job_text_runs(make_repo, daemon_factory):
    """A 1 MB job text runs (not passed through argv) and lands."""
    repo = make_repo()
    d = daemon_factory().start()
    text = ": " + "y" * 1_000_000 + "\necho big > big.txt\n"
    job = Client(d.socket).enqueue(repo=str(repo), text=text, paths=["big.txt"])["id"]
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    assert d.cli_json("show", str(job))["state"] == "landed"
    assert git(repo, "show", "main:big.txt") == "big"


def _daemon_exit(home: Path, config: bytes | None, make_dir: bool = False) -> subprocess.CompletedProcess[str]:
    cfg = home / "config" / "config.toml"
    cfg.parent.mkdir(parents=True)
    if make_dir:
        cfg.mkdir()
    elif config is not None:
        cfg.write_bytes(config)
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "daemon"], env=env, capture_output=True, text=True, timeout=60
    )


def test_unreadable_config_exits_78(tmp_path):
    """A config.toml that is not UTF-8, or is a directory, exits 78 with a message, no traceback."""
    bad = _daemon_exit(tmp_path / "a", b"[jobs]\nmax_concurrent = 2 # \xff\xfe\n")
    assert bad.returncode == 78 and "not UTF-8" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    folder = _daemon_exit(tmp_path / "b", None, make_dir=True)
    assert folder.returncode == 78 and "is a directory" in folder.stderr and "Traceback" not in folder.stderr


def test_wait_and_follow_exit_3_when_the_daemon_dies(make_repo, daemon_factory):
    """`wait` and `logs -f` on a daemon that is killed exit 3 with a message, not a traceback."""
    repo = make_repo()
    d = daemon_factory(process=True).start()
    job = d.enqueue(repo, "echo started; sleep 60", "--path", "x.txt")
    until("the job to run", lambda: d.cli_json("show", str(job))["state"] == "running")
    cmd = [sys.executable, "-m", "orchestrator"]
    waiting = subprocess.Popen([*cmd, "wait", str(job)], env=d.env, stderr=subprocess.PIPE, text=True)
    following = subprocess.Popen(
        [*cmd, "logs", "-f", str(job)], env=d.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    time.sleep(2.0)  # both are connected and waiting
    d.kill()
    for proc in (waiting, following):
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 3 and "went away" in stderr and "Traceback" not in stderr, stderr


def test_no_runtime_dir_puts_the_socket_in_the_private_state_dir(make_repo, short_tmp):
    """Without XDG_RUNTIME_DIR the socket lives under the state dir (0700), never in a shared /tmp dir."""
    tmp_path = short_tmp  # the socket's path is deep inside
    env = {k: v for k, v in os.environ.items() if k not in ("ORCHESTRATOR_HOME", "XDG_RUNTIME_DIR", "JOURNAL_STREAM")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    cmd = [sys.executable, "-m", "orchestrator"]
    daemon = subprocess.Popen([*cmd, "daemon"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        sock = tmp_path / "state" / "orchestrator" / "run" / "orchestrator.sock"
        until("the socket", sock.exists)
        assert subprocess.run([*cmd, "status"], env=env, capture_output=True, timeout=60).returncode == 0
        assert sock.parent.stat().st_mode & 0o777 == 0o700
    finally:
        daemon.terminate()
        daemon.wait(30)


def test_graceful_stop_gives_jobs_sigterm_and_a_grace(make_repo, daemon_factory, tmp_path):
    """SIGTERM to the daemon: a running job gets SIGTERM first and may finish its cleanup in the grace period."""
    repo = make_repo()
    out = tmp_path / "out"
    d = daemon_factory(process=True).start()
    cleanup = f"trap 'sleep 0.3; echo cleaned >> {out}; exit 0' TERM"
    job = d.enqueue(repo, f"{cleanup}; echo started >> {out}; while :; do sleep 0.1; done")
    until("the job to start", out.exists)
    d.kill(signal.SIGTERM)
    assert out.read_text().splitlines() == ["started", "cleaned"]
    assert d.proc is not None and d.proc.returncode == 0
    assert job


def test_requeue_interrupted_on_start(make_repo, daemon_factory, tmp_path):
    """With jobs.requeue_interrupted, a job a stopped daemon interrupted is queued again on start and lands."""
    repo = make_repo()
    ctl = tmp_path / "go"
    d = daemon_factory()
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text("[jobs]\nrequeue_interrupted = true\nkill_grace = 1\n")
    d.start()
    job = d.enqueue(repo, f"while [ ! -e {ctl} ]; do sleep 0.05; done; echo done > r.txt", "--path", "r.txt")
    until("the job to run", lambda: d.cli_json("show", str(job))["state"] == "running")
    d.kill(signal.SIGTERM)
    ctl.touch()
    d2 = daemon_factory("second")
    d2.home, d2.env, d2.socket = d.home, d.env, d.socket
    d2.log_path = d.home / "second.log"
    d2.start()
    assert d2.cli("wait", str(job), "--timeout", "60").returncode == 0
    shown = d2.cli_json("show", str(job))
    assert shown["state"] == "landed" and shown["attempts"] == 1, shown
    assert git(repo, "show", "main:r.txt") == "done"


def test_retry_keeps_a_failed_attempts_files_whatever_its_git_dir_holds(make_repo, daemon_factory):
    """A failed attempt's files are kept on an attempt branch on retry, even when the job broke its own git dir
    (a stale index.lock, a garbage index): the daemon reads the files, not the job's git state."""
    repo = make_repo()
    d = daemon_factory().start()
    job = d.enqueue(repo, "echo precious > work.txt; : > .git/index.lock; echo junk > .git/index; exit 1")
    d.cli("wait", str(job), "--timeout", "60")
    assert d.cli_json("show", str(job))["state"] == "failed"
    out = d.cli("retry", str(job))
    assert out.returncode == 0 and "orchestrator/1-attempt-1" in out.stderr, out.stderr
    assert git(repo, "show", "orchestrator/1-attempt-1:work.txt") == "precious"


def test_retry_never_wipes_work_it_cannot_commit(make_repo, daemon_factory):
    """If a failed attempt's files cannot be committed (a file over the size a job may commit), retry refuses
    and keeps them as they are, saying what to do."""
    repo = make_repo()
    d = daemon_factory().start()
    job = d.enqueue(repo, "echo precious > work.txt; truncate -s 101M huge.bin; exit 1", "--path", "work.txt")
    d.cli("wait", str(job), "--timeout", "60")
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "failed"
    worktree = Path(shown["worktree"])
    out = d.cli("retry", str(job))
    assert out.returncode != 0 and "could not be committed" in out.stderr and "kept" in out.stderr, out.stderr
    assert "huge.bin" in out.stderr
    assert (worktree / "work.txt").read_text() == "precious\n"
    assert d.cli_json("show", str(job))["state"] == "failed"
