"""Races between the daemon and the verbs, made deterministic by pausing at the await points where they meet.

Each pins a reproduction of a job state overwritten by a writer that acted on a stale read: a cancelled job
that ran, a rejected job that landed, a round's deferral written over a supersede.
"""

from __future__ import annotations

import asyncio

import pytest

from orchestrator import testhook
from orchestrator.core.models import WAITING, Code, JobState
from orchestrator.jobs.service import JobError
from tests.conftest import git
from tests.plane import plane


class Pause:
    """A test hook that holds the first task reaching it (for one job) until `go`."""

    def __init__(self, job_id: int | None = None) -> None:
        self.job_id = job_id
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    async def __call__(self, name: str, job_id: int | None) -> None:
        if self.job_id is not None and job_id != self.job_id:
            return
        if self.reached.is_set():
            return
        self.reached.set()
        await self.go.wait()

    async def wait(self) -> None:
        await asyncio.wait_for(self.reached.wait(), 30)


async def _kinds(p, job_id: int) -> list[str]:
    return [e["kind"] for e in await p.store.events.of_job(job_id)]


async def test_a_cancel_during_admission_means_the_job_never_runs(make_repo, tmp_path):
    """A cancel that comes between admission's decision and the job's start wins: the runner never runs."""
    repo = make_repo()
    ran = tmp_path / "ran"
    async with plane(tmp_path) as p:
        pause = Pause()
        testhook.install("admit", pause)
        job = await p.enqueue(repo, f"touch {ran}; echo x > out.txt", "out.txt")
        await pause.wait()  # admitted; its move to `running` not written yet
        cancelled = await p.jobs.cancel(job)
        assert cancelled.state is JobState.CANCELLED and cancelled.code == Code.CANCELLED
        pause.go.set()
        await p.until("the job's task to end", lambda: _no_task(p, job))
        assert await p.state(job) is JobState.CANCELLED
        assert "admitted" not in await _kinds(p, job) and not ran.exists()


async def test_an_admission_that_lost_its_job_to_another_writer_backs_off(make_repo, tmp_path):
    """The move to `running` expects `planned`: a job cancelled by any other writer meanwhile stays cancelled."""
    repo = make_repo()
    ran = tmp_path / "ran"
    async with plane(tmp_path) as p:
        pause = Pause()
        testhook.install("admit", pause)
        job = await p.enqueue(repo, f"touch {ran}; echo x > out.txt", "out.txt")
        await pause.wait()
        assert await p.store.jobs.transition(job, {JobState.PLANNED}, JobState.CANCELLED, "cancelled") is not None
        pause.go.set()
        await p.until("the job's task to end", lambda: _no_task(p, job))
        assert await p.state(job) is JobState.CANCELLED
        assert await _kinds(p, job) == ["enqueued", "planning", "planned", "cancelled"] and not ran.exists()
        assert git(repo, "log", "--format=%s", "main") == "initial"


async def test_a_retry_waits_for_the_task_of_an_earlier_decision_to_end(make_repo, tmp_path):
    """A job cancelled by another writer after admission decided it (its task paused before its move to
    `running`), then retried: the new attempt is decided anew, never started by that earlier task beside the
    overlapping job admitted meanwhile."""
    repo = make_repo()
    ran, gate = tmp_path / "ran", tmp_path / "gate"
    async with plane(tmp_path) as p:
        pause = Pause()
        testhook.install("admit", pause)
        first = await p.enqueue(repo, f"touch {ran}; echo 1 > a.txt", "a.txt")
        await pause.wait()  # admitted; its task holds before its move to `running`
        pause.job_id = first  # the jobs admitted from now on go through
        assert await p.store.jobs.transition(first, {JobState.PLANNED}, JobState.CANCELLED, "cancelled") is not None
        second = await p.enqueue(repo, f"while [ ! -e {gate} ]; do sleep 0.05; done; echo 2 > a.txt", "a.txt")
        await p.reach(second, JobState.RUNNING)
        retry = asyncio.create_task(p.jobs.retry(first))
        done, _ = await asyncio.wait({retry}, timeout=0.5)
        if done:  # not waiting for the task: the new attempt is planned while the old decision's task lives
            await p.reach(first, JobState.PLANNED)
        pause.go.set()
        assert (await retry).state is JobState.QUEUED
        await p.until("the retried job deferred behind the running one", lambda: _overlap(p, first))
        assert await p.state(second) is JobState.RUNNING
        assert not ran.exists() and "admitted" not in await _kinds(p, first)
        gate.touch()
        await p.reach(second, JobState.LANDED)


async def _overlap(p, job_id: int) -> bool:
    job = await p.store.jobs.get(job_id)
    return job is not None and job.state is JobState.PLANNED and job.code == "Overlap"


async def _no_task(p, job_id: int) -> bool:
    return job_id not in p.parts.scheduler.running


async def _ready(p, repo, name: str) -> int:
    job = await p.enqueue(repo, f"echo {name} > {name}.txt", f"{name}.txt", land="review")
    await p.reach(job, JobState.READY)
    return job


@pytest.mark.parametrize("first", ["reject", "land"])
async def test_land_and_reject_at_once_do_exactly_one(make_repo, tmp_path, first):
    """`land` and `reject` of one ready job at the same time: exactly one wins, and the job's state says which
    (a rejected job never lands; a landed one was not rejected)."""
    repo = make_repo()
    async with plane(tmp_path) as p:
        job = await _ready(p, repo, "r")
        pause = Pause(job)
        testhook.install(f"review.{first}", pause)
        verbs = {"land": p.jobs.land, "reject": p.jobs.reject}
        winner = asyncio.create_task(verbs[first](job))
        await pause.wait()  # the first verb read `ready` and decided; its write not done yet
        other = asyncio.create_task(verbs["land" if first == "reject" else "reject"](job))
        await asyncio.sleep(0.05)
        pause.go.set()
        assert (await winner).id == job
        with pytest.raises(JobError):
            await other
        if first == "reject":
            done = await p.reach(job, JobState.CANCELLED)
            assert done.code == Code.REJECTED
            await asyncio.sleep(0.2)  # a landing, had one been started, would have moved the branch by now
            assert await p.state(job) is JobState.CANCELLED
            assert "landed" not in await _kinds(p, job)
            assert "r.txt" not in git(repo, "ls-tree", "--name-only", "main")
        else:
            await p.reach(job, JobState.LANDED)
            assert "rejected" not in await _kinds(p, job)
            assert git(repo, "show", "main:r.txt") == "r"


async def test_a_rounds_deferral_never_overwrites_a_newer_cancel(make_repo, tmp_path):
    """A round's deferral write expects `planned`: a supersede (cancel with its reason) meanwhile keeps its
    reason and code."""
    repo = make_repo()
    gate = tmp_path / "gate"
    async with plane(tmp_path, max_concurrent=1) as p:
        blocker = await p.enqueue(repo, f"while [ ! -e {gate} ]; do sleep 0.05; done; echo a > a.txt", "a.txt")
        await p.reach(blocker, JobState.RUNNING)
        pause = Pause()
        testhook.install("round.deferrals", pause)
        job = await p.enqueue(repo, "echo b > b.txt", "b.txt")
        await pause.wait()  # the round decided: job waits (Concurrency); its write is next
        await p.jobs.cancel(job, reason="superseded by job 99", event="superseded", only=WAITING)
        pause.go.set()
        await asyncio.sleep(0.2)
        done = await p.store.jobs.get(job)
        assert done is not None and done.state is JobState.CANCELLED
        assert done.reason == "superseded by job 99" and done.code == Code.CANCELLED
        assert "deferred" not in await _kinds(p, job)
        gate.touch()
        await p.reach(blocker, JobState.LANDED)
