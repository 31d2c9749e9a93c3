"""The state dir is the daemon's alone: one owner, refused when unusable, private whatever the umask."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import git


def _daemon(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "daemon", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _xdg_env(tmp_path: Path, runtime: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ORCHESTRATOR_HOME", "JOURNAL_STREAM")}
    env.update(
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_RUNTIME_DIR=str(tmp_path / runtime),
    )
    (tmp_path / runtime).mkdir(mode=0o700, exist_ok=True)
    return env


def test_two_daemons_with_different_runtime_dirs_share_one_lock(short_tmp):
    """The single-daemon lock lives next to the database: a second start with another XDG_RUNTIME_DIR is refused."""
    tmp_path = short_tmp  # the socket's path is deep inside
    first = _daemon(_xdg_env(tmp_path, "run1"), tmp_path / "first.log")
    try:
        sock = tmp_path / "run1" / "orchestrator" / "orchestrator.sock"
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert first.poll() is None, (tmp_path / "first.log").read_text()
            assert time.monotonic() < deadline, "first daemon not ready"
            time.sleep(0.05)
        second = _daemon(_xdg_env(tmp_path, "run2"), tmp_path / "second.log")
        assert second.wait(30) == 1
        text = (tmp_path / "second.log").read_text()
        assert "another orchestrator daemon" in text and str(tmp_path / "state") in text
        assert first.poll() is None
    finally:
        first.terminate()
        first.wait(30)


def _refused(tmp_path: Path, prepare) -> tuple[int, str, float]:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    (home / "state").mkdir(parents=True)
    db = home / "state" / "orchestrator.db"
    prepare(db)
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home)}
    env.pop("JOURNAL_STREAM", None)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "daemon"], env=env, capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stderr, time.monotonic() - start


def test_corrupt_database_is_refused_at_once(tmp_path):
    """A database that is not SQLite (or is damaged) stops the daemon at once with exit 65, naming the file."""
    code, err, took = _refused(tmp_path, lambda db: db.write_bytes(b"this is not a database\n" * 300))
    assert code == 65, err
    assert "orchestrator.db is damaged" in err and "move it aside" in err
    assert took < 30 and "Traceback" not in err


def test_truncated_database_is_refused(tmp_path):
    """A database cut short mid-file is refused the same way, never a hang holding the lock."""

    def truncated(db: Path) -> None:
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE t (x TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 2000)
        conn.commit()
        conn.close()
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 2])

    code, err, _ = _refused(tmp_path, truncated)
    assert code == 65 and "is damaged" in err, err


def test_newer_schema_is_refused(tmp_path):
    """A database written by a newer orchestrator is refused: exit 65 and "upgrade", not "no such table"."""

    def newer(db: Path) -> None:
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA user_version=999")
        conn.close()

    code, err, _ = _refused(tmp_path, newer)
    assert code == 65 and "schema version 999" in err and "Upgrade orchestrator" in err, err


def test_private_files_whatever_the_umask(make_repo, daemon_factory):
    """Under umask 022 the state dir is 0700, the database and job logs 0600."""
    repo = make_repo()
    old = os.umask(0o022)
    try:
        d = daemon_factory(process=True).start()  # a process: the umask is its own for its whole life
    finally:
        os.umask(old)
    job = d.enqueue(repo, "echo secret-job-output; echo x > x.txt", "--path", "x.txt")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    state = d.home / "state"
    assert state.stat().st_mode & 0o777 == 0o700
    assert (state / "orchestrator.db").stat().st_mode & 0o777 == 0o600
    assert (state / "daemon.lock").stat().st_mode & 0o777 == 0o600
    log = state / "jobs" / f"{job}.log"
    assert "secret-job-output" in log.read_text() and log.stat().st_mode & 0o777 == 0o600
    assert git(repo, "show", "main:x.txt") == "x"


def test_a_home_too_long_for_a_socket_says_what_to_do(tmp_path):
    """A socket path over 107 bytes: the daemon exits 78 and the CLI 3, both naming the limit and the fix."""
    home = tmp_path / ("h" * max(1, 120 - len(str(tmp_path))))
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "NOTIFY_SOCKET")}
    env["ORCHESTRATOR_HOME"] = str(home)
    cmd = [sys.executable, "-m", "orchestrator"]
    daemon = subprocess.run([*cmd, "daemon"], env=env, capture_output=True, text=True, timeout=60)
    assert daemon.returncode == 78, daemon.stderr
    assert "longer than the 107" in daemon.stderr and "ORCHESTRATOR_HOME" in daemon.stderr
    assert "Traceback" not in daemon.stderr
    status = subprocess.run([*cmd, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 3 and "longer than the 107" in status.stderr, status.stderr
    assert "Traceback" not in status.stderr
