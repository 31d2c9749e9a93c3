"""Editing the waiting queue, as pueue's `edit` and `switch` do: a waiting job's text, paths and priority, and its
place in the queue.

Every change is a guarded write expecting the job still waiting, so an edit never races a start: whichever is
written first wins (the start's move to `running` expects `planned`; an edit that changed what the job does
moves it back to `queued`). A job whose text or paths changed is planned again, keeping its place while it is
(its decision stays, so later jobs it overlaps wait for it, `jobs.rounds.keeps_place`). Reordering writes places
(`core.queue`); two jobs switching places is one all-or-nothing write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from orchestrator import logging as olog
from orchestrator.core import lifecycle, queue
from orchestrator.core.job import Job
from orchestrator.core.lifecycle import Edit
from orchestrator.core.models import HELD, WAITING, Code, JobEvent, JobState
from orchestrator.jobs.board import Board
from orchestrator.jobs.planning import Planning
from orchestrator.plan import declared
from orchestrator.store import Write

TRIES = 8
"""Reads an edit makes at most: each finds the job further along (planning, planned, started)."""
PLACED = WAITING | HELD
"""Jobs with a place in the queue's order: waiting ones, and interrupted ones (they keep theirs)."""


class EditError(Exception):
    """An edit that cannot be done; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Change:
    """What an edit changes (None: unchanged)."""

    text: str | None = None
    paths: tuple[str, ...] | None = None
    """The job's declared paths, normalised (empty: none, it is planned from its text)."""
    priority: int | None = None

    @property
    def replan(self) -> bool:
        """Its claim no longer follows from what the job says: it is planned again."""
        return self.text is not None or self.paths is not None

    def fields(self, job: Job) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.text is not None:
            out["text"] = self.text
        if self.priority is not None:
            out["priority"] = self.priority
        if self.replan:
            paths = self.paths if self.paths is not None else job.declared
            claim = declared.claim(paths)
            out |= {"declared": tuple(sorted(claim.paths)), "claim": claim, "plan_text": "", "evidence": ()}
            said = " and ".join(k for k in ("text", "paths") if getattr(self, k) is not None)
            out |= {"code": Code.EDITED, "reason": f"edited ({said}): planned again, in its place in the queue"}
        return out


def not_waiting(job: Job, what: str) -> str:
    return (
        f"job {job.id} is {job.state}; only a waiting job (queued, planning or planned) can be {what}: "
        f"`orchestrator why {job.id}` says where it is"
    )


class Editing:
    def __init__(self, board: Board, planning: Planning, wake: Callable[[], None]) -> None:
        self.board = board
        self.store = board.store
        self.planning = planning
        self.wake = wake

    async def _get(self, job_id: int) -> Job:
        job = await self.store.jobs.get(job_id)
        if job is None:
            raise EditError(f"no job {job_id}: `orchestrator status` lists the jobs")
        if job.node and not self.store.team.mine(job) and job.state in (JobState.PLANNING, JobState.PLANNED):
            raise EditError(f"job {job_id} is held by node {job.node!r} of the team: edit or move it there")
        return job

    async def edit(self, job_id: int, change: Change) -> Job:
        """Change a waiting job's text, paths or priority; planned again when its text or paths changed."""
        for _ in range(TRIES):
            job = await self._get(job_id)
            if change.text is not None and job.argv is not None:
                raise EditError(
                    f"job {job_id} runs an exact argv ({job.text}); cancel it and enqueue the new one "
                    f"(`orchestrator cancel {job_id}`)"
                )
            how = lifecycle.on_edit(job.state, replan=change.replan)
            if how is Edit.NOT_NOW:
                raise EditError(not_waiting(job, "edited"))
            fields = change.fields(job)
            data = {"changed": sorted(k for k in ("text", "paths", "priority") if getattr(change, k) is not None)}
            if how is Edit.STOP_PLAN:
                await self.planning.cancel(job_id)  # its plan read the old text: it must not be stored
            expect, event = {job.state}, JobEvent.EDITED
            if how is Edit.IN_PLACE:
                done = await self.board.update(job_id, expect, event=event, data=data, **fields)
            else:
                done = await self.board.transition(job_id, expect, JobState.QUEUED, event, data=data, **fields)
            if done is None:
                continue  # it moved on meanwhile (planned, started): decide again on where it is now
            olog.get(job_id=job_id, repo=job.repo).info(olog.Event.JOB_EDITED, changed=data["changed"], replan=how)
            self.wake()
            return done
        raise EditError(f"job {job_id} kept moving while it was being edited; try again")

    async def move(self, job_id: int, before: int) -> Job:
        """Put a waiting job just before another waiting job in the queue (with that job's priority)."""
        if job_id == before:
            raise EditError(f"job {job_id} cannot move before itself")
        for _ in range(TRIES):
            job, target = await self._get(job_id), await self._get(before)
            for j in (job, target):
                if j.state not in WAITING:
                    raise EditError(not_waiting(j, "moved" if j is job else "moved before"))
            waiting = await self.store.team.everyone(PLACED)
            spot, room = place_before(target, waiting, job.id)
            data = {"before": before, "priority": spot.priority, "place": spot.place}
            moved = Write(job_id, spot.fields(), JobEvent.MOVED, data, WAITING)
            kept = Write(before, {}, None, None, WAITING)  # still waiting, or the move means nothing
            done = await self.board.update_all([*room, moved, kept])
            if done is None:
                continue
            olog.get(job_id=job_id, repo=job.repo).info(olog.Event.JOB_MOVED, before=before, place=spot.place)
            self.wake()
            return done[len(room)]
        raise EditError(f"job {job_id} or job {before} kept moving while it was being moved; try again")

    async def switch(self, a: int, b: int) -> list[Job]:
        """Two waiting jobs take each other's place (and priority) in the queue, in one write."""
        if a == b:
            raise EditError(f"job {a} cannot switch with itself")
        for _ in range(TRIES):
            ja, jb = await self._get(a), await self._get(b)
            for j in (ja, jb):
                if j.state not in WAITING:
                    raise EditError(not_waiting(j, "switched"))
            pa, pb = queue.switched(ja, jb)
            done = await self.board.update_all([
                Write(a, pa.fields(), JobEvent.MOVED, {"switched": b, **pa.fields()}, WAITING),
                Write(b, pb.fields(), JobEvent.MOVED, {"switched": a, **pb.fields()}, WAITING),
            ])  # fmt: skip
            if done is None:
                continue
            olog.get(job_id=a, repo=ja.repo).info(olog.Event.JOB_MOVED, switched=b)
            self.wake()
            return done
        raise EditError(f"job {a} or job {b} kept moving while they were being switched; try again")

    async def place_for_new(self, before: int) -> tuple[queue.Place, list[Write]]:
        """Where a job about to be queued `--before` job `before` goes, and the writes that make room for it."""
        target = await self._get(before)
        if target.state not in WAITING:
            raise EditError(not_waiting(target, "queued before"))
        return place_before(target, await self.store.team.everyone(PLACED), 0)

    async def make_room(self, room: list[Write]) -> None:
        """Write the new places `place_before` asked for (nothing when it needed none)."""
        if room and await self.board.update_all(room) is None:
            raise EditError("the queue changed while making room in it; try again")


def place_before(target: Job, waiting: Iterable[Job], moving: int) -> tuple[queue.Place, list[Write]]:
    """The place just before `target`, and the writes that renumber its priority's jobs first when there is no
    room between it and the job before it (`core.queue.renumbered`)."""
    waiting = [j for j in waiting if j.id != moving]
    spot = queue.before(target, waiting, moving)
    if spot is not None:
        return spot, []
    places = queue.renumbered(waiting, target.priority)
    again = [replace(j, place=places.get(j.id, j.place)) for j in waiting]
    spot = queue.before(replace(target, place=places.get(target.id, target.place)), again, moving)
    assert spot is not None, "renumbered places are one apart"
    return spot, [Write(i, {"place": p}, None, None, PLACED) for i, p in places.items()]
