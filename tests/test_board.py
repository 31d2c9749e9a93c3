"""The board is the one door for job writes: every change of a job is stored, then announced on the event stream
(what `orchestrator watch` reads) and to the scheduler, whoever made it."""

from __future__ import annotations

import asyncio

from orchestrator.core.models import JobState
from orchestrator.jobs.board import Subscription
from tests.plane import plane


def _seen(sub: Subscription) -> list[dict]:
    """The job announcements a subscriber got so far."""
    out = []
    while not sub.queue.empty():
        item = sub.queue.get_nowait()
        if item["type"] == "job":
            out.append(item["job"])
    return out


async def test_planning_and_the_watch_announce_their_writes(make_repo, tmp_path):
    """The start of a job's plan and the paths it touches while it runs reach the event stream as they are stored."""
    repo = make_repo()
    async with plane(tmp_path) as p:
        sub = p.parts.board.subscribe()
        gate = tmp_path / "go"
        job = await p.enqueue(repo, f"echo new > src/a.py; while [ ! -e {gate} ]; do sleep 0.05; done", "src/a.py")
        await p.until("the job to touch src/a.py", lambda: _touched(p, job))
        await asyncio.sleep(0)  # the write's announcement is made before its caller goes on
        seen = [j for j in _seen(sub) if j["id"] == job]
        assert any(j["state"] == JobState.PLANNING for j in seen), [j["state"] for j in seen]
        assert any(j["state"] == JobState.RUNNING and "src/a.py" in j["actual"] for j in seen)
        gate.touch()
        await p.reach(job, JobState.LANDED)


async def _touched(p, job_id: int) -> bool:
    job = await p.store.jobs.get(job_id)
    return job is not None and "src/a.py" in job.actual
