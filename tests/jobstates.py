"""Put a stored job in a state for a test, the only way the daemon can: one allowed move after another."""

from __future__ import annotations

from typing import Any

from orchestrator.core.models import JobState
from orchestrator.jobs.board import Board
from orchestrator.store import Store

PATH = {
    JobState.QUEUED: (),
    JobState.PLANNING: (JobState.PLANNING,),
    JobState.PLANNED: (JobState.PLANNING, JobState.PLANNED),
    JobState.RUNNING: (JobState.PLANNING, JobState.PLANNED, JobState.RUNNING),
    JobState.LANDING: (JobState.PLANNING, JobState.PLANNED, JobState.RUNNING, JobState.LANDING),
    JobState.READY: (JobState.PLANNING, JobState.PLANNED, JobState.RUNNING, JobState.READY),
    JobState.LANDED: (JobState.PLANNING, JobState.PLANNED, JobState.RUNNING, JobState.LANDING, JobState.LANDED),
    JobState.UNCHANGED: (JobState.PLANNING, JobState.PLANNED, JobState.RUNNING, JobState.UNCHANGED),
    JobState.FAILED: (JobState.PLANNING, JobState.FAILED),
    JobState.CANCELLED: (JobState.CANCELLED,),
    JobState.CONFLICTED: (JobState.PLANNING, JobState.PLANNED, JobState.RUNNING, JobState.LANDING, JobState.CONFLICTED),
    JobState.INTERRUPTED: (JobState.PLANNING, JobState.PLANNED, JobState.RUNNING, JobState.INTERRUPTED),
}


async def put(store: Store | Board, job_id: int, state: JobState, event: str = "moved", **fields: Any):
    """Move a queued job along the usual path to `state` (through the board: announced); `fields` (and
    `event`) go with the last move."""
    writer: Any = store if isinstance(store, Board) else store.jobs  # the board's moves (announced), or the table's
    job = await (store.store if isinstance(store, Board) else store).jobs.get(job_id)
    assert job is not None and job.state is JobState.QUEUED, "put starts from a queued job"
    steps = PATH[state]
    if not steps:
        return await writer.update(job_id, {JobState.QUEUED}, event=event, **fields) if fields else job
    current = JobState.QUEUED
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        kind = event if last else str(step)
        job = await writer.transition(job_id, {current}, step, kind, **(fields if last else {}))
        assert job is not None
        current = step
    return job
