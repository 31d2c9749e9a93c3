"""`orchestrator watch` the way a person uses it: in a real terminal (tmux), with a daemon running jobs."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import git
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

    sock = f"orch-watch-{tmp_path.name}-{os.getpid()}"  # apart from other workers' and runs' servers
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
        assert "no running, waiting or ready jobs" in screen()

        subprocess.run([*tmux, "send-keys", "-t", "w", "q"], check=True, timeout=20)
        deadline = time.monotonic() + 15
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(), "q quits the watch"
        errors = [e for e in d.events() if e["event"] == "api.error"]
        assert not errors, f"quitting logs no error: {errors}"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=20)


class Tmux:
    """One tmux server of the test's own: a command in a 120×30 terminal, keys typed, the screen read."""

    def __init__(self, name: str, command: str) -> None:
        self.base = ["tmux", "-L", f"{name}-{os.getpid()}"]  # apart from other workers' and runs' servers
        subprocess.run([*self.base, "new-session", "-d", "-x", "120", "-y", "30", "-s", "w", command], check=True,
                       timeout=20)  # fmt: skip

    def screen(self) -> str:
        out = subprocess.run([*self.base, "capture-pane", "-p", "-t", "w"], capture_output=True, text=True, timeout=20)
        return out.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "w", *keys], check=True, timeout=20)

    def shows(self, text: str, what: str, timeout: float = 30) -> str:
        """Wait until the screen shows `text`; the screen then (or fail with the screen as it is)."""
        try:
            until(lambda: text in self.screen(), timeout=timeout, what=what)
        except AssertionError:
            raise AssertionError(f"the screen never showed {what} ({text!r}):\n{self.screen()}") from None
        return self.screen()

    def alive(self) -> bool:
        return subprocess.run([*self.base, "has-session", "-t", "w"], capture_output=True, timeout=20).returncode == 0

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=20)


def test_watch_shows_ready_jobs_and_its_keys_diff_land_and_reject_them(make_repo, daemon_factory, tmp_path):
    """Jobs waiting for review are listed first with the keys to use; `d` pages the selected one's diff, `l`
    lands it, `↓` `r` `y` rejects the next; `status` and `why` say what to do about a ready job."""
    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "4"}).start()
    first = d.enqueue(repo, "echo reviewed > src/a.py", "--path", "src/a.py", "--land", "review")
    second = d.enqueue(repo, "echo dropped > docs/x.md", "--path", "docs/x.md", "--land", "review")
    until(lambda: all(d.cli_json("show", str(j))["state"] == "ready" for j in (first, second)), what="both ready")
    status = d.cli("status")
    assert "2 ready" in status.stderr and f"`orchestrator diff {first}`" in status.stderr, status.stderr
    why = d.cli("why", str(first)).stdout
    assert f"next: waits for your review: `orchestrator diff {first}`" in why and "retry" not in why, why

    command = shlex.join(["env", "-u", "COLUMNS", "-u", "LINES", f"ORCHESTRATOR_HOME={d.home}", "LESS=R", "PAGER=less",
                          sys.executable, "-m", "orchestrator", "watch"])  # fmt: skip
    t = Tmux(f"orch-review-{tmp_path.name}", command)
    try:
        shot = t.shows("d diff · l land · r reject", "the review keys")
        rows = [ln.split() for ln in shot.splitlines()]
        assert ["›", str(first), "ready"] in [r[:3] for r in rows], "the first ready job, selected"
        assert [str(second), "ready"] in [r[:2] for r in rows]
        assert "2 ready" in shot
        t.keys("d")
        pager = t.shows("+reviewed", "the first job's diff in the pager")
        assert "src/a.py" in pager and "dropped" not in pager
        t.keys("q")  # quits the pager, not the view
        t.shows(f"job {first}: its diff was shown", "the view back after the pager")
        t.keys("l")
        until(lambda: d.cli_json("show", str(first))["state"] == "landed", what="the first job landed", timeout=60)
        t.shows(f"› {second:>4} ready", "the selection on the job still ready")
        t.keys("r")
        t.shows(f"reject job {second}? y rejects it", "the question")
        t.keys("y")
        until(lambda: d.cli_json("show", str(second))["state"] == "cancelled", what="the second job rejected")
        t.shows("no running, waiting or ready jobs", "nothing left to review")
        t.keys("q")
        until(lambda: not t.alive(), timeout=15, what="q quits the watch")
    finally:
        t.close()
    assert git(repo, "show", "main:src/a.py") == "reviewed" and git(repo, "show", "main:docs/x.md") == "x"
    assert d.cli_json("show", str(second))["code"] == "Rejected"
    assert not [e for e in d.events() if e["event"] == "api.error"], "quitting logs no error"
