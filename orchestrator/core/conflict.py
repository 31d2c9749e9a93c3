"""Which of two jobs whose changes really conflict lands second: the one stopped and run again. Pure, no I/O."""

from __future__ import annotations

from orchestrator.core.job import Job
from orchestrator.core.models import JobState


def second(a: Job, b: Job) -> Job | None:
    """The one of `a` and `b` that lands second, if it is still running (None: neither runs, nothing to stop).

    An order already set stands (a job that lands after the other, `land_after`); a job that has finished its
    run lands before one still running; else the one that started later (its id breaking a tie) lands second."""
    running = [j for j in (a, b) if j.state is JobState.RUNNING]
    if not running:
        return None
    if len(running) == 1:
        return running[0]
    if a.id in b.land_after:
        return b
    if b.id in a.land_after:
        return a
    return max((a, b), key=lambda j: (j.started_at or 0.0, j.id))
