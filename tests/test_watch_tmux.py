"""`orchestrator watch` the way a person uses it: in a real terminal (tmux), with a daemon running jobs."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time

import pytest

from tests.test_e2e_jobs import until, wait_for_file

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")


def test_watch_shows_running_and_waiting_jobs_with_reasons_and_q_quits(make_repo, daemon_factory, tmp_path):
    """The live view lists running and waiting jobs per repo with each waiting job's reason, follows the
    daemon's events as jobs move on, and `q` quits it."""
    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "4"}).start()
    gate = tmp_path / "gate"
    holder = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo a > src/a.py", "--path", "src/a.py")
    docs = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo d > docs/x.md", "--path", "docs/")
    until(lambda: d.cli_json("show", str(docs))["state"] == "running", what="both running")
    waiter = d.enqueue(repo, "echo w >> src/a.py", "--path", "src/")
    until(lambda: d.cli_json("show", str(waiter))["code"] == "Overlap", what="waiter held back")

    sock = f"orch-watch-{tmp_path.name}"
    tmux = ["tmux", "-L", sock]
    # The terminal's own size, not a COLUMNS/LINES left in the environment, sets the view's width.
    command = shlex.join(
        ["env", "-u", "COLUMNS", "-u", "LINES", f"ORCHESTRATOR_HOME={d.home}", sys.executable, "-m", "orchestrator"]
    )
    command += " watch"
    subprocess.run([*tmux, "new-session", "-d", "-x", "120", "-y", "30", "-s", "w", command], check=True, timeout=20)

    def screen() -> str:
        out = subprocess.run([*tmux, "capture-pane", "-p", "-t", "w"], capture_output=True, text=True, timeout=20)
        return out.stdout

    def alive() -> bool:
        return subprocess.run([*tmux, "has-session", "-t", "w"], capture_output=True, timeout=20).returncode == 0

    try:
        try:
            until(lambda: f"waits for job {holder} to land" in screen(), timeout=30, what="the watch screen")
        except AssertionError:
            raise AssertionError("the watch screen never showed the wait:\n" + screen()) from None
        shot = screen()
        (tmp_path / "watch-screen.txt").write_text(shot)
        print(shot)
        lines = shot.splitlines()
        assert any(line.lstrip().startswith(f"{holder} running") for line in lines), shot
        assert any(line.lstrip().startswith(f"{docs} running") for line in lines), shot
        row = next(line for line in lines if line.lstrip().startswith(f"{waiter} planned"))
        assert "Overlap" in row and f"waits for job {holder} to land" in row, "its reason and what it waits for"
        assert "2 running, 1 waiting: 1 Overlap" in shot and repo.name in shot
        assert all(len(line) <= 120 for line in lines)

        gate.touch()  # the view follows the daemon's events: the waiter runs and everything lands
        jobs = (holder, docs, waiter)
        try:
            until(lambda: all(d.cli_json("show", str(j))["state"] == "landed" for j in jobs), timeout=180,
                  what="every job landed")  # fmt: skip
        except AssertionError:
            states = {j: d.cli_json("show", str(j)) for j in jobs}
            raise AssertionError(f"the jobs did not all land: {states}\n{screen()}") from None
        try:
            until(lambda: "3 landed" in screen(), timeout=30, what="the view to show every job landed")
        except AssertionError:
            raise AssertionError("the view never showed the jobs landed:\n" + screen()) from None
        assert "no running or waiting jobs" in screen()

        subprocess.run([*tmux, "send-keys", "-t", "w", "q"], check=True, timeout=20)
        deadline = time.monotonic() + 15
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(), "q quits the watch"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=20)
