"""What a job that went ahead of earlier-queued jobs has not seen of them. Pure, no I/O.

The queue's order is a promise: a job sees the work of every job queued before it. Admission lets a later job
start ahead of an earlier one (or beside a running one) when their claims are disjoint, betting that neither needs
the other's change. A job that lands a change loses nothing on that bet: a landing that no longer applies conflicts
and runs again on the new head. A job that ends with nothing to change (or whose recorded change does not apply)
can lose it silently: it looked at a base without the earlier job's change (`fail-under=99` already there), ended,
and the earlier job then landed what it would have changed (`fail-under=100`). Such a job runs again behind what it
has not seen (`Unseen`): on a base that has it, it sees what the order promised.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass

from orchestrator.core.job import Job
from orchestrator.core.models import OPEN, JobState
from orchestrator.core.queue import order


@dataclass(frozen=True, slots=True)
class Unseen:
    """The earlier-queued jobs of a job's branch whose change its base lacks."""

    waiting: tuple[int, ...] = ()
    """Not ended yet (waiting, running or landing): it runs again once they have ended, on a base with what they
    landed."""
    landed: tuple[int, ...] = ()
    """Landed after its base was taken: the branch head has their change, its base does not."""

    def __bool__(self) -> bool:
        return bool(self.waiting or self.landed)

    def said(self) -> str:
        """`job 26 (queued before it, not landed yet)` and the like, for a reason."""
        parts = []
        if self.waiting:
            parts.append(f"{_jobs(self.waiting)} queued before it, not landed yet")
        if self.landed:
            parts.append(f"{_jobs(self.landed)} queued before it, landed since its base")
        return "; ".join(parts)


def unseen(job: Job, jobs: Iterable[Job], since: Container[str]) -> Unseen:
    """The jobs of `jobs` queued before `job` (in the queue's order, and already queued when it started) on its
    repository and branch whose change its base lacks: open ones, and landed ones whose landing commit is in
    `since` (the commits on the branch since its base). A job that runs after `job` (`after`, or `land_after`, at
    any remove) is left out: it waits for `job`, so `job` cannot wait for it."""
    mine = [j for j in jobs if (j.repo, j.branch) == (job.repo, job.branch) and j.id != job.id]
    later = _behind(job.id, mine)
    key = order(job)
    earlier = [
        j for j in mine
        if order(j) < key and j.id not in later and (job.started_at is None or j.created_at <= job.started_at)
    ]  # fmt: skip
    waiting = tuple(sorted(j.id for j in earlier if j.state in OPEN))
    landed = tuple(
        sorted(j.id for j in earlier if j.state is JobState.LANDED and j.landed_sha and j.landed_sha in since)
    )
    return Unseen(waiting, landed)


def _behind(job_id: int, jobs: list[Job]) -> set[int]:
    """The jobs that wait for `job_id`, directly or through others (`after`, `land_after`)."""
    waits_for = {j.id: set(j.after) | set(j.land_after) for j in jobs}
    found: set[int] = set()
    grew = True
    while grew:
        grew = False
        for i, deps in waits_for.items():
            if i not in found and (job_id in deps or deps & found):
                found.add(i)
                grew = True
    return found


def _jobs(ids: tuple[int, ...]) -> str:
    return ("job " if len(ids) == 1 else "jobs ") + ", ".join(map(str, ids))
