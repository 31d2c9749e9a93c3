"""Where a job goes when a person reorders the waiting queue (`switch`, `move --before`, `enqueue --before`). Pure.

The queue's order is `JobView.order_key`: the higher priority first, then the lower place (a job's id until a
person moves it), then the id. Moving a job before another gives it that job's priority and a place between that
job's and the one just before it, so no other job's order changes; switching two jobs swaps their priorities and
places. Admission reads the new order as it reads any: a job never overtakes an earlier waiting job it conflicts
with, whichever way it became earlier.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.core.job import Job


@dataclass(frozen=True, slots=True)
class Place:
    """A job's priority and its place among the jobs of that priority."""

    priority: int
    place: float

    def fields(self) -> dict[str, object]:
        return {"priority": self.priority, "place": self.place}


def place_of(job: Job) -> Place:
    """Where `job` stands now (its id when no one moved it)."""
    return Place(job.priority, float(job.id) if job.place is None else job.place)


def order(job: Job) -> tuple[int, float, int]:
    return (-job.priority, place_of(job).place, job.id)


def before(target: Job, waiting: Iterable[Job], moving: int) -> Place | None:
    """The place that puts job `moving` just before `target` among the `waiting` jobs: `target`'s priority, halfway
    between `target` and the job now just before it (one place earlier when none is). None when no number lies
    between the two (places moved into one gap fifty times over): `renumbered` makes room."""
    mine = place_of(target)
    same = sorted((j for j in waiting if j.priority == target.priority and j.id not in (moving, target.id)), key=order)
    earlier = [place_of(j).place for j in same if order(j) < order(target)]
    low = earlier[-1] if earlier else mine.place - 1.0
    half = (low + mine.place) / 2
    return Place(mine.priority, half) if low < half < mine.place else None


def renumbered(waiting: Iterable[Job], priority: int) -> Mapping[int, float]:
    """New places, one apart and in the same order, for the waiting jobs of `priority`: room between every two."""
    same = sorted((j for j in waiting if j.priority == priority), key=order)
    start = place_of(same[0]).place if same else 0.0
    return {j.id: start + n for n, j in enumerate(same)}


def switched(a: Job, b: Job) -> tuple[Place, Place]:
    """The places of `a` and `b` after they switch: each where the other was."""
    return place_of(b), place_of(a)
