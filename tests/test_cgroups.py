"""A cgroup per command where the daemon may make them: nothing a job starts outlives it, sandbox or not."""

from __future__ import annotations

import random
import signal
import subprocess
import time

import pytest

from orchestrator.proc import cgroups, process
from tests.harness import until

AVAILABLE, WHY = cgroups.find()
needs_cgroups = pytest.mark.skipif(AVAILABLE is None, reason=f"no cgroup for the tests to make: {WHY}")


def running(tag: str) -> bool:
    """A process whose whole command line is `sleep <tag>`: the escapee itself, not the job's shell, whose
    `sh -c '... sleep <tag> ...'` would match a substring before it has started the escapee."""
    return subprocess.run(["pgrep", "-f", "-x", f"sleep {tag}"], capture_output=True).returncode == 0


def a_tag() -> str:
    """A sleep duration no other process has: the escapee's name in the process list."""
    return f"{random.randint(100, 999)}.{random.randint(10**5, 10**6)}"


@needs_cgroups
async def test_a_process_that_leaves_its_group_and_clears_its_environment_is_ended(tmp_path, monkeypatch):
    """`setsid env -i` escapes the process group and the run mark; the command's cgroup still holds it, and
    it is killed (and the cgroup removed) before `run` returns."""
    monkeypatch.setattr(process, "CGROUPS", AVAILABLE)
    tag = a_tag()
    result = await process.run(
        f"setsid env -i sleep {tag} >/dev/null 2>&1 & sleep 0.3",
        cwd=tmp_path,
        env=process.environment(),
        timeout=30,
    )
    assert result.ok
    assert not running(tag)
    assert not [p for p in AVAILABLE.base.iterdir() if p.name.startswith(cgroups.PREFIX + "unowned.")]


@needs_cgroups
def test_a_dead_daemons_escapees_are_ended_on_start(make_repo, daemon_factory):
    """kill -9 of the daemon while a job's `setsid env -i` process runs: the next daemon on that state dir
    kills it through the cgroup its predecessor made, before it recovers anything."""
    repo = make_repo()
    d = daemon_factory(env={"ORCHESTRATOR_SANDBOX": "none"}, process=True).start()
    tag = a_tag()
    job = d.enqueue(repo, f"setsid env -i sleep {tag} & sleep 120", "--path", "x/")
    until("the escapee runs", lambda: running(tag), 60)
    d.kill(signal.SIGKILL)
    d.wait_exit()
    assert running(tag), "it outlived the daemon (not its group, no mark)"
    d.start()
    until("the escapee is gone", lambda: not running(tag), 30)
    assert d.cli_json("show", str(job))["state"] == "interrupted"
    assert any(e["event"] == "process.survivors_ended" and e.get("cgroups") for e in d.events())


@needs_cgroups
def test_without_a_sandbox_a_leftover_never_writes_after_the_job(make_repo, daemon_factory, tmp_path):
    """With sandbox none, a process a job leaves with `setsid env -i` is killed when the job ends: it never
    writes after the daemon read the job's result."""
    repo = make_repo()
    late = tmp_path / "late"
    d = daemon_factory(env={"ORCHESTRATOR_SANDBOX": "none"}).start()
    job = d.enqueue(repo, f"(setsid env -i sh -c 'sleep 1; echo x > {late}' &); echo y > y.txt", "--path", "y.txt")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    time.sleep(1.5)
    assert not late.exists()
