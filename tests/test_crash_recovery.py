"""Crash recovery end to end: a `kill -9` of the daemon leaves nothing running and nothing half done."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.conftest import git
from tests.harness import Daemon


def _until(what: str, check, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def restart(daemon_factory, d: Daemon, name: str) -> Daemon:  # type: ignore[no-untyped-def]
    """A new daemon on the same home (stopped by the fixture at the end), logging to `home/<name>.log`."""
    again = daemon_factory(name)
    again.home, again.env, again.socket = d.home, d.env, d.socket
    again.log_path = d.home / f"{name}.log"
    return again.start()


def test_runner_of_a_killed_daemon_is_ended_before_the_retry(make_repo, daemon_factory, tmp_path):
    """kill -9 the daemon mid-job, restart, retry: the old runner is gone and only the retry's lines land."""
    repo = make_repo()
    ctl = tmp_path / "lines"
    ctl.write_text("600\n")  # the first run would append for 30 s
    d = daemon_factory().start()
    job = d.enqueue(
        repo,
        f'n=$(cat {ctl}); i=0; while [ $i -lt $n ]; do echo "$$ $i" >> a.txt; i=$((i+1)); sleep 0.05; done',
        "--path",
        "a.txt",
    )
    worktree = Path(_until("a worktree", lambda: d.cli_json("show", str(job)).get("worktree")))
    lines = _until("the job to write", lambda: (worktree / "a.txt").exists() and (worktree / "a.txt").read_text())
    old_pid = int(lines.split()[0])
    d.kill()
    assert _alive(old_pid), "the runner outlives a kill -9 of its daemon (its own process group)"
    ctl.write_text("5\n")

    d2 = restart(daemon_factory, d, "second")
    assert not _alive(old_pid), "the restarted daemon ended the dead daemon's runner"
    assert d2.cli_json("show", str(job))["state"] == "interrupted"
    assert d2.cli("retry", str(job)).returncode == 0
    assert d2.cli("wait", str(job), "--timeout", "60").returncode == 0
    shown = d2.cli_json("show", str(job))
    assert shown["state"] == "landed", shown
    landed = git(repo, "show", "main:a.txt").splitlines()
    assert len(landed) == 5 and len({line.split()[0] for line in landed}) == 1, landed
    assert landed[0].split()[0] != str(old_pid)
    assert "process.survivors_ended" in {e["event"] for e in d2.events()}
