"""A cgroup per command where the daemon may make them: nothing a job starts outlives it, sandbox or not."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.proc import cgroups, process
from tests.harness import until

AVAILABLE, WHY = cgroups.find()
needs_cgroups = pytest.mark.skipif(AVAILABLE is None, reason=f"no cgroup for the tests to make: {WHY}")


def running(tag: str) -> bool:
    """A process whose whole command line is `sleep <tag>`: the escapee itself, not the job's shell, whose
    `sh -c '... sleep <tag> ...'` would match a substring before it has started the escapee."""
    return subprocess.run(["pgrep", "-f", "-x", f"sleep {tag}"], capture_output=True).returncode == 0


def made_cgroups(monkeypatch) -> list[Path]:
    """The cgroups this test's commands make (other workers' commands make theirs at the same time, under the same
    base: only this test's own are checked)."""
    made: list[Path] = []
    real = cgroups.Cgroups.make

    def make(self, mark: str) -> Path:
        path = real(self, mark)
        made.append(path)
        return path

    monkeypatch.setattr(cgroups.Cgroups, "make", make)
    return made


def a_tag() -> str:
    """A sleep duration no other process has: the escapee's name in the process list."""
    return f"{random.randint(100, 999)}.{random.randint(10**5, 10**6)}"


@needs_cgroups
async def test_a_process_that_leaves_its_group_and_clears_its_environment_is_ended(tmp_path, monkeypatch):
    """`setsid env -i` escapes the process group and the run mark; the command's cgroup still holds it, and
    it is killed (and the cgroup removed) before `run` returns."""
    monkeypatch.setattr(process, "CGROUPS", AVAILABLE)
    made = made_cgroups(monkeypatch)
    tag = a_tag()
    result = await process.run(
        f"setsid env -i sleep {tag} >/dev/null 2>&1 & sleep 0.3",
        cwd=tmp_path,
        env=process.environment(),
        timeout=30,
    )
    assert result.ok
    assert not running(tag)
    assert made and not [p for p in made if p.exists()]


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


FORKS = (
    "import os, sys, time\n"
    "n = 0\n"
    "try:\n"
    "    for _ in range(int(sys.argv[1])):\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(30)\n"
    "            os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print('fork refused:', e.strerror)\n"
    "print('children', n, flush=True)\n"
)
"""A bounded fork bomb: as many sleeping children as it may make (up to argv[1]); it says how many it made."""


def limited(pids: int = 0, memory: int = 0) -> cgroups.Cgroups:
    """The daemon's cgroups with these limits, or the test is skipped saying which controller is missing."""
    found, why = cgroups.find(cgroups.Limits(pids=pids, memory=memory))
    if found is None:
        pytest.skip(f"no cgroup for the tests to make: {why}")
    wanted = {"pids"} if pids else set()
    wanted |= {"memory"} if memory else set()
    held = {b.controller for b in found.bounds}
    if not wanted <= held:
        pytest.skip(f"no {', '.join(sorted(wanted - held))} controller here: {why}")
    return found


def children(output: str) -> int:
    return int(output.rsplit("children", 1)[1].split()[0])


async def test_a_fork_bomb_is_held_to_pids_max(tmp_path, monkeypatch):
    """A command that forks as much as it can is held to `pids.max` (processes and threads of its cgroup
    together), told so by the kernel (EAGAIN), and everything it made is gone when it ends."""
    monkeypatch.setattr(process, "CGROUPS", limited(pids=32))
    made = made_cgroups(monkeypatch)
    (tmp_path / "forks.py").write_text(FORKS)
    result = await process.run(["python3", str(tmp_path / "forks.py"), "500"], cwd=tmp_path,
                               env=process.environment(), timeout=60)  # fmt: skip
    assert result.ok, result.output_tail
    assert "fork refused" in result.output_tail and children(result.output_tail) < 32
    assert made and not [p for p in made if p.exists()]


async def test_memory_past_memory_max_ends_the_command_not_the_daemon(tmp_path, monkeypatch):
    """A command that takes more memory than `memory.max` is killed by the kernel inside its own cgroup (the job
    fails, SIGKILL); the daemon goes on."""
    monkeypatch.setattr(process, "CGROUPS", limited(memory=64 * 2**20))
    result = await process.run(["python3", "-c", "b = b'x' * (400 * 2**20); print('kept', len(b))"], cwd=tmp_path,
                               env=process.environment(), timeout=60)  # fmt: skip
    assert result.returncode == -signal.SIGKILL and "kept" not in result.output_tail


def test_a_fork_bomb_job_is_held_and_the_daemon_answers(make_repo, daemon_factory, tmp_path):
    """Through the real daemon, `jobs.pids_max = 64`: a job forking as much as it can makes fewer than 64
    processes, the daemon answers its API all the while, and says at start which limits hold."""
    limited(pids=64)
    repo = make_repo()
    (tmp_path / "forks.py").write_text(FORKS)
    d = daemon_factory()
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text("[jobs]\npids_max = 64\n")
    d.start()
    started = [e for e in d.events() if e["event"] == "process.cgroups"]
    assert started and "pids.max=64" in started[0]["limits"], started
    job = d.enqueue(repo, f"python3 {tmp_path / 'forks.py'} 2000; echo x > x.txt", "--path", "x.txt")
    until("the job to run", lambda: d.cli_json("show", str(job))["state"] != "queued")
    for _ in range(10):
        assert d.cli("status", timeout=10).returncode == 0
    assert d.cli("wait", str(job), "--timeout", "120").returncode == 0
    log = d.cli("logs", str(job), "--raw").stdout
    assert "fork refused" in log and children(log) < 64, log[-500:]
