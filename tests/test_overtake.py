"""A job that ran ahead of (or beside) an earlier-queued job and found nothing to change looks again once that job has
landed: the queue's order promised it would see that job's work, and its own change is never lost to it.

In-process job plane (real store, real git, real scheduler, shell jobs).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from orchestrator import testhook
from orchestrator.core import lifecycle
from orchestrator.core.job import Job
from orchestrator.core.models import JobState
from orchestrator.core.overtake import Unseen, unseen
from orchestrator.jobs.rerun import unseen_of
from tests.conftest import git
from tests.plane import Plane, plane

ENDED = (JobState.LANDED, JobState.UNCHANGED, JobState.FAILED, JobState.CONFLICTED, JobState.CANCELLED)
FILES = {"Makefile": "fail-under=99\n", "c.txt": "c\n", "tests/t.txt": "t\n"}


def _job(id: int, state: JobState, created: float = 0.0, **fields) -> Job:
    return Job(id, "r", fields.pop("branch", "main"), "t", "shell", state, created_at=created, **fields)


def test_what_a_job_has_not_seen_is_the_earlier_queued_jobs_its_base_lacks():
    """Open jobs queued before it, and landed ones whose landing came after its base; not later ones, not ones queued
    once it had started, not another branch's, not those that wait for it, not what its base has already."""
    me = _job(5, JobState.RUNNING, created=5.0, started_at=10.0)
    jobs = [
        me,
        _job(1, JobState.PLANNED, 1.0),  # queued before it, waits: unseen
        _job(2, JobState.LANDED, 2.0, landed_sha="aa"),  # landed since its base: unseen
        _job(3, JobState.LANDED, 3.0, landed_sha="bb"),  # landed in its base
        _job(4, JobState.RUNNING, 4.0, branch="dev"),  # another branch
        _job(6, JobState.PLANNED, 6.0),  # queued after it
        _job(7, JobState.PLANNED, 11.0, priority=5),  # goes first now, but was queued once it had started
        _job(8, JobState.LANDING, 4.5, land_after=(5,)),  # lands after it: it cannot wait for it
        _job(9, JobState.PLANNED, 4.6, after=(8,)),  # runs after one that waits for it
        _job(10, JobState.FAILED, 4.7),  # ended without landing: nothing of it to see
    ]
    assert unseen(me, jobs, since={"aa", "cc"}) == Unseen(waiting=(1,), landed=(2,))
    assert not unseen(_job(1, JobState.RUNNING, 1.0, started_at=1.5), jobs, since={"aa"}), "the first sees all"
    moved = _job(6, JobState.RUNNING, 6.0, started_at=10.0, priority=1)
    assert unseen(moved, jobs, since=set()) == Unseen(), "a higher priority went ahead of them by right"


def test_a_job_that_changed_nothing_runs_again_only_with_something_unseen_and_an_attempt_left():
    policy = lifecycle.LandingPolicy(max_attempts=3)
    assert lifecycle.on_unchanged(0, policy, unseen=True) is JobState.QUEUED
    assert lifecycle.on_unchanged(0, policy, unseen=False) is JobState.UNCHANGED
    assert lifecycle.on_unchanged(2, policy, unseen=True) is JobState.UNCHANGED


class _Reads:
    """A job table that notes the ids of every job it hands out."""

    def __init__(self, jobs: Any) -> None:
        self.jobs, self.read = jobs, set()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.jobs, name)
        if not callable(found):
            return found

        async def noted(*args: Any, **kwargs: Any) -> Any:
            out = await found(*args, **kwargs)
            if isinstance(out, list):
                self.read |= {j.id for j in out if isinstance(j, Job)}
            return out

        return noted


async def test_what_a_job_has_not_seen_is_read_without_every_job_that_ever_landed(make_repo, tmp_path):
    """Whether a job missed an earlier one is decided on the open jobs and those landed since its base: the jobs
    that landed before it are not read (a check on every job's end that read them all grew with the history)."""
    repo = make_repo(files=FILES)
    async with plane(tmp_path, max_concurrent=1, per_repo=1) as p:
        ids = [await p.enqueue(repo, f"echo {n} > f{n}.txt", f"f{n}.txt") for n in range(4)]
        for job_id in ids[:3]:
            assert (await p.reach(job_id, *ENDED, timeout=60)).state is JobState.LANDED
        base = git(repo, "rev-parse", "main")
        assert (await p.reach(ids[3], *ENDED, timeout=60)).state is JobState.LANDED
        me = Job(99, str(repo), "main", "t", "shell", JobState.RUNNING, created_at=time.time(), base=base)
        me = replace(me, started_at=me.created_at)
        reads = _Reads(p.store.jobs)
        board = SimpleNamespace(store=SimpleNamespace(jobs=reads))
        assert await unseen_of(board, me) == Unseen(landed=(ids[3],)), "the one landed since its base"  # type: ignore[arg-type]
    assert reads.read == {ids[3]}, "no job that landed before its base was read"


def _wait(path: Path, limit: int = 600) -> str:
    return f"n=0; while [ ! -e {path} ] && [ $n -lt {limit} ]; do sleep 0.05; n=$((n+1)); done"


async def _overtaken(p: Plane, repo: Path, go: Path) -> tuple[int, int, int]:
    """Job c runs (holding c.txt) until `go`; job a, queued next, also claims c.txt and waits; job b, queued last,
    claims only the Makefile and starts beside c, ahead of a. a sets the Makefile's line to 100 (beyond its claim);
    b keeps it at 99, which on its base (without a) it already is: b changes nothing there."""
    c = await p.enqueue(repo, f"echo c2 > c.txt; {_wait(go)}", "c.txt")
    await p.reach(c, JobState.RUNNING)
    a_script = "echo t2 > tests/t.txt; echo c3 >> c.txt; echo fail-under=100 > Makefile"
    a = await p.enqueue(repo, a_script, "c.txt", "tests/")
    b = await p.enqueue(repo, "sed -i 's/fail-under=100/fail-under=99/' Makefile", "Makefile")
    return c, a, b


async def _ran(p: Plane, job_id: int, *kinds: str) -> Job:
    """The job once its first run ended (an event says how: finished, or sent back to run again)."""

    async def ended() -> bool:
        ends = kinds or ("finished", "recheck")
        return any(e["kind"] in ends for e in await p.store.events.of_job(job_id))

    await p.until(f"job {job_id}'s run to end", ended)
    job = await p.store.jobs.get(job_id)
    assert job is not None
    return job


async def test_a_job_that_overtook_one_and_changed_nothing_runs_again_once_that_one_landed(make_repo, tmp_path):
    """b overtook a, found nothing to change on its base, and a then landed its line: b is not left `unchanged` (its
    change lost); it goes back to the queue behind a (an event says why), runs on a head with a's change, and lands."""
    repo = make_repo(files=FILES)
    go = tmp_path / "go"
    async with plane(tmp_path, max_concurrent=3, per_repo=3) as p:
        c, a, b = await _overtaken(p, repo, go)
        waiting = await _ran(p, b)
        assert waiting.state is not JobState.UNCHANGED, waiting.reason
        assert set(waiting.land_after) >= {a}, waiting
        assert await p.state(a) in (JobState.PLANNING, JobState.PLANNED, JobState.QUEUED), "b went ahead of a"
        go.touch()
        for job in (c, a, b):
            done = await p.reach(job, *ENDED, timeout=60)
            assert done.state is JobState.LANDED, done.reason
        events = [e for e in await p.store.events.of_job(b) if e["kind"] == "recheck"]
        assert events and a in events[0]["behind"], events
    assert git(repo, "show", "main:Makefile") == "fail-under=99", "b's change is on main, after a's"
    assert git(repo, "show", "main:tests/t.txt") == "t2"


async def test_the_run_again_is_stored_and_survives_a_stop_after_the_earlier_job_landed(make_repo, tmp_path):
    """The daemon stops after a landed and before b ran again: b's look again is a stored state, so a new daemon on
    the same home runs it and lands its change."""
    repo = make_repo(files=FILES)
    go = tmp_path / "go"
    async with plane(tmp_path, max_concurrent=3, per_repo=3) as p:
        c, a, b = await _overtaken(p, repo, go)
        waiting = await _ran(p, b)
        assert waiting.state is not JobState.UNCHANGED, waiting.reason

        admitted = asyncio.Event()

        async def held(name: str, job_id: int | None) -> None:
            if job_id == b:
                admitted.set()
                await asyncio.Event().wait()  # b never starts in this daemon: it stops first

        testhook.install("admit", held)
        go.touch()
        for job in (c, a):
            assert (await p.reach(job, *ENDED, timeout=60)).state is JobState.LANDED
        await asyncio.wait_for(admitted.wait(), 30)
        assert (await p.store.jobs.get(b)).state is JobState.PLANNED
    assert git(repo, "show", "main:Makefile") == "fail-under=100"
    async with plane(tmp_path, max_concurrent=3, per_repo=3) as p:
        done = await p.reach(b, *ENDED, timeout=60)
        assert done.state is JobState.LANDED, done.reason
    assert git(repo, "show", "main:Makefile") == "fail-under=99"


async def test_a_replay_that_does_not_apply_ahead_of_an_earlier_job_runs_again_behind_it(make_repo, tmp_path):
    """A recorded change made on top of an earlier-queued job's change, replayed ahead of that job (which waits), does
    not apply on its base: a conflict, and it runs again once that earlier job has ended (not only the job running
    beside it), so its second attempt lands on a base with the change it was made on."""
    repo = make_repo(files={"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n"})
    git(repo, "checkout", "-qb", "side")
    (repo / "a.txt").write_text("A\n")
    git(repo, "commit", "-qam", "first")
    first = git(repo, "rev-parse", "HEAD")
    (repo / "a.txt").write_text("A, then B\n")
    git(repo, "commit", "-qam", "second, on top of the first")
    second = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    go = tmp_path / "go"
    async with plane(tmp_path, max_concurrent=3, per_repo=3) as p:
        c = await p.enqueue(repo, f"echo c2 > c.txt; {_wait(go)}", "c.txt")
        await p.reach(c, JobState.RUNNING)
        a = await p.enqueue(repo, f"First\ncommit: {first}", "a.txt", "c.txt", runner="replay")
        b = await p.enqueue(repo, f"Second\ncommit: {second}", "b.txt", runner="replay")
        stopped = await _ran(p, b, "requeued")
        assert stopped.state is not JobState.CONFLICTED, stopped.reason
        (event,) = [e for e in await p.store.events.of_job(b) if e["kind"] == "requeued"]
        assert event["behind"] == [c, a], event
        go.touch()
        done = await p.reach(b, *ENDED, timeout=60)
        assert done.state is JobState.LANDED and done.attempts == 1, done.reason
    assert git(repo, "show", "main:a.txt") == "A, then B"


async def test_it_is_not_run_again_when_what_it_waited_for_landed_nothing(make_repo, tmp_path):
    """The earlier jobs b went ahead of (and ran beside) end without landing anything: b's look stands (it would see
    the same files), so it ends `unchanged` once they ended, its runner not started again."""
    repo = make_repo(files=FILES)
    go, runs = tmp_path / "go", tmp_path / "runs"
    async with plane(tmp_path, max_concurrent=3, per_repo=3) as p:
        c = await p.enqueue(repo, _wait(go), "c.txt")
        await p.reach(c, JobState.RUNNING)
        a = await p.enqueue(repo, "true", "c.txt", "tests/")
        b = await p.enqueue(repo, f"echo run >> {runs}; sed -i 's/fail-under=100/fail-under=99/' Makefile", "Makefile")
        assert (await _ran(p, b)).state is not JobState.UNCHANGED
        go.touch()
        assert (await p.reach(a, *ENDED, timeout=60)).state is JobState.UNCHANGED
        done = await p.reach(b, *ENDED, timeout=60)
        assert done.state is JobState.UNCHANGED and done.attempts == 1, done.reason
        assert "not run again" in done.reason
    assert runs.read_text() == "run\n", "its runner ran once"


def test_a_kill_9_after_it_was_sent_back_loses_neither_its_run_again_nor_its_change(
    make_repo, daemon_factory, tmp_path
):
    """End to end through the real daemon and CLI: b was sent back to look again (stored), then the daemon is killed
    -9 before the earlier job landed; the restarted daemon, once that job is retried and lands, runs b again and b's
    change is on main, after the earlier job's."""
    from tests.harness import until
    from tests.test_crash_recovery import restart

    repo = make_repo(files=FILES)
    go = tmp_path / "go"
    d = daemon_factory(process=True, env={"MAX_CONCURRENT_JOBS": "4"}).start()
    c = d.enqueue(repo, f"echo c2 > c.txt; {_wait(go)}", "--path", "c.txt")
    until("c to run", lambda: d.cli_json("show", str(c))["state"] == "running")
    a = d.enqueue(repo, "echo c3 >> c.txt; echo fail-under=100 > Makefile", "--path", "c.txt", "--path", "tests/")
    b = d.enqueue(repo, "sed -i 's/fail-under=100/fail-under=99/' Makefile", "--path", "Makefile")
    sent = until("b sent back", lambda: (s := d.cli_json("show", str(b)))["attempts"] == 1 and s, timeout=60)
    assert sent["state"] in ("queued", "planning", "planned") and a in sent["land_after"], sent
    d.kill()

    d2 = restart(daemon_factory, d, "second")
    go.touch()
    assert d2.cli_json("show", str(c))["state"] == "interrupted"
    assert d2.cli("retry", str(c)).returncode == 0
    assert d2.cli("wait", str(c), str(a), str(b), "--timeout", "90").returncode == 0
    assert [d2.cli_json("show", str(j))["state"] for j in (c, a, b)] == ["landed"] * 3
    assert git(repo, "show", "main:Makefile") == "fail-under=99"
