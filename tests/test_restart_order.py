"""Order survives a restart: an interrupted job keeps its place and its claim until it is retried or ended."""

from __future__ import annotations

import signal

import pytest

from tests.conftest import git
from tests.harness import Daemon, until
from tests.test_e2e_jobs import wait_for_file


def _restart(d: Daemon, daemon_factory, sig: int, config: str) -> Daemon:
    d.kill(sig)
    (d.home / "config").mkdir(parents=True, exist_ok=True)
    (d.home / "config" / "config.toml").write_text(config)
    again = daemon_factory(env={"MAX_CONCURRENT_JOBS": "3"}, process=isinstance(d, Daemon))  # the same home
    again.log_path = d.home / "after.log"
    return again.start()


@pytest.mark.parametrize("requeue", [False, True], ids=["retry-by-hand", "requeue-on-start"])
def test_a_later_overlapping_job_never_lands_before_an_interrupted_one(make_repo, daemon_factory, tmp_path, requeue):
    """Two running and three waiting, then a restart: the waiting job that overlaps an interrupted one waits for
    it (its change lands on top, not under it), and a job `--after` it waits for its retry instead of failing."""
    repo = make_repo()
    gate = tmp_path / "gate"
    # A kill -9 needs a daemon process; a graceful stop (SIGTERM's handler) is the same in this process.
    # Two slots: the disjoint job waits for one until the restart (which gives three), never ending before it.
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "2"}, process=not requeue).start()
    first = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo one > f.txt", "--path", "f.txt")
    beside = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo two > g.txt", "--path", "g.txt")
    until("both to run", lambda: all(d.cli_json("show", str(i))["state"] == "running" for i in (first, beside)))
    later = d.enqueue(repo, "echo three > f.txt", "--path", "f.txt")
    after = d.enqueue(repo, "echo four > h.txt", "--path", "h.txt", "--after", str(first))
    free = d.enqueue(repo, "echo five > i.txt", "--path", "i.txt")
    until("the later job to wait for the first", lambda: d.cli_json("show", str(later))["code"] == "Overlap")
    until("the disjoint job to wait for a slot", lambda: d.cli_json("show", str(free))["code"] == "Concurrency")
    config = f"[jobs]\nkill_grace = 1\nrequeue_interrupted = {'true' if requeue else 'false'}\n"
    d2 = _restart(d, daemon_factory, signal.SIGTERM if requeue else signal.SIGKILL, config)
    assert d2.cli("wait", str(free), "--timeout", "60").returncode == 0, "a disjoint job is not held back"
    if not requeue:
        waiting = d2.cli_json("why", str(later))
        assert d2.cli_json("show", str(first))["state"] == "interrupted"
        assert waiting["state"] == "planned" and waiting["code"] == "Priority", waiting
        assert f"orchestrator retry {first}" in waiting["next"]
        assert d2.cli_json("show", str(after))["code"] == "Dependency"
        assert d2.cli("retry", str(first), str(beside)).returncode == 0
    gate.touch()
    assert d2.cli("wait", str(first), str(beside), str(later), str(after), "--timeout", "90").returncode == 0
    assert git(repo, "show", "main:f.txt") == "three", "the later job's change lands on top of the first's"
    landed = {i: d2.cli_json("show", str(i))["landed_sha"] for i in (first, later)}
    ancestor = ["merge-base", "--is-ancestor", landed[first], landed[later]]
    assert git(repo, *ancestor) == "", "the first job landed before the later one"
    assert git(repo, "show", "main:h.txt") == "four"


async def test_a_burst_daemon_is_idle_when_only_kept_places_hold_jobs_back(make_repo, tmp_path):
    """Jobs that wait only for an interrupted job (it waits for a person) leave nothing to do: a burst daemon
    exits rather than waiting for ever; once the interrupted job is retried, both land in order."""
    from orchestrator.core.models import Claim, ClaimSource, JobState
    from tests.jobstates import put
    from tests.plane import plane

    repo = make_repo()
    async with plane(tmp_path) as p:
        claim = Claim(frozenset({"f.txt"}), 1.0, ClaimSource.DECLARED)
        first = await p.store.jobs.add(
            repo=str(repo), branch="main", text="echo one > f.txt", runner="shell", declared=["f.txt"], claim=claim
        )
        await put(p.store, first.id, JobState.INTERRUPTED)
        later = await p.enqueue(repo, "echo three > f.txt", "f.txt")

        async def decided() -> bool:
            j = await p.store.jobs.get(later)
            return j is not None and j.code == "Priority"

        await p.until("the later job to wait for the interrupted one", decided)
        assert await p.parts.scheduler._idle()
        await p.jobs.retry(first.id)
        assert not await p.parts.scheduler._idle()
        await p.reach(later, JobState.LANDED, timeout=60)
        assert await p.state(first.id) is JobState.LANDED
    assert git(repo, "show", "main:f.txt") == "three"
