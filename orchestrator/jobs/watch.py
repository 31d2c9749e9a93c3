"""The overlap watch: a running job's actual paths as they change, and what to do when they meet another's.

The executor's change watcher reports each running job's actual paths here. They are stored (guarded: only
while the job runs) and kept in memory for the next round's snapshot. Paths outside the job's claim ask
admission whether they may join it (`core.growth`): they join its claim either way (`grown`, an event
`claim_grown`), and when another active job of the repository claims or touched them, their landings are
ordered at once (the later started lands after the earlier, `land_after`). Every change of a running job's
paths goes on to the conflict watch (`jobs.conflicts`), which merges jobs that touched a common path in memory
and stops the one that would land second on a real conflict.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from orchestrator import logging as olog
from orchestrator.config import Config
from orchestrator.core import claims, growth
from orchestrator.core.admission_index import plist
from orchestrator.core.job import Job
from orchestrator.core.models import ACTIVE, ANY, JobEvent, JobState, JobView
from orchestrator.jobs.board import Board
from orchestrator.jobs.conflicts import ConflictWatch
from orchestrator.jobs.facts import GitFacts


class OverlapWatch:
    def __init__(self, board: Board, cfg: Config, facts: GitFacts) -> None:
        self.board = board
        self.cfg = cfg
        self.facts = facts
        self.actual: dict[int, frozenset[str]] = {}
        """Running jobs' latest actual paths (fresher than the store's between rounds)."""
        self._overlaps: set[tuple[int, int]] = set()
        self._growing = asyncio.Lock()
        self.conflicts = ConflictWatch(board, cfg, facts)

    def forget(self, job_id: int) -> None:
        self.actual.pop(job_id, None)
        self.conflicts.forget(job_id)

    async def stop(self) -> None:
        await self.conflicts.stop()

    async def changed(self, job_id: int, actual: frozenset[str]) -> None:
        """A running job's actual paths changed: store them; paths outside its claim ask admission to join it."""
        job = await self.board.update(job_id, {JobState.RUNNING}, actual=actual)
        if job is None:
            return  # it stopped running meanwhile: its end state has its paths
        self.actual[job_id] = actual
        olog.get(job_id=job_id, repo=job.repo).debug(olog.Event.JOB_CHANGED, actual=sorted(actual)[:50], n=len(actual))
        async with self._growing:  # one growth decision at a time: two jobs growing into one path see each other
            await self._grow(job, actual)
        self.conflicts.touched(job, actual)

    async def views(self, job: Job, touched: frozenset[str]) -> tuple[JobView, list[tuple[Job, JobView]]] | None:
        """`job` and the other active jobs of its repository as admission sees them (live actual paths); None
        when `touched` holds nothing outside its claim (then the others are not read)."""
        mergeable = await self.facts.mergeable(job.repo, job.base)

        def view(j: Job) -> JobView:
            return replace(j.view(mergeable), actual=self.actual.get(j.id, j.actual))

        mine = view(job)
        if not growth.outside(mine, touched, self.cfg.policy()):
            return None
        active = await self.board.store.jobs.all(ACTIVE)
        others = [(o, view(o)) for o in active if o.repo == job.repo and o.id != job.id]
        return mine, others

    async def holding(self, job_id: int) -> tuple[frozenset[str], list[tuple[Job, frozenset[str]]]] | None:
        """A running job's claim (its growth with it), and what each other active job of its repository holds: its
        claim, growth and touched paths (a job's door answers with these). None when it is not running."""
        job = await self.board.store.jobs.get(job_id)
        if job is None or job.state is not JobState.RUNNING:
            return None
        others = [
            (o, o.claim.paths | o.grown | self.actual.get(o.id, o.actual))
            for o in await self.board.store.jobs.all(ACTIVE)
            if o.repo == job.repo and o.id != job.id
        ]
        return job.claim.paths | job.grown, others

    async def reserve(self, job_id: int, paths: frozenset[str]) -> growth.Growth | None:
        """May `paths` join running job `job_id`'s claim before it writes them (its agent asks)? The decision of
        claim growth, asked ahead: granted, they join it (event `claim_grown`, `asked`); held by another active
        job, they do not (the agent is told by whom). None when the job is not running."""
        async with self._growing:
            job = await self.board.store.jobs.get(job_id)
            if job is None or job.state is not JobState.RUNNING:
                return None
            seen = await self.views(job, paths)
            if seen is None:
                return growth.Growth(frozenset())  # all in its claim already
            mine, others = seen
            g = growth.decide(mine, paths, [v for _, v in others], self.cfg.policy())
            if not g.grows:
                return g
            grown = sorted(g.paths)
            written = await self.board.update(
                job.id,
                {JobState.RUNNING},
                grown=job.grown | g.paths,
                event=JobEvent.CLAIM_GROWN,
                data={"paths": grown[:50], "held_by": [], "asked": True},
            )
            if written is None:
                return None
            olog.get(job_id=job.id, repo=job.repo).info(
                olog.Event.JOB_CLAIM_GROWN, paths=grown[:50], asked=True, message=f"its agent claimed {plist(grown)}"
            )
            return g

    async def held(self, job_id: int, path: str) -> str | None:
        """Why running job `job_id` should not write `path` now (another active job holds it), or None: what
        the built-in agent asks before it writes outside its claim, so it can wait or work elsewhere."""
        try:
            wanted = frozenset({claims.normalize(path)})
        except claims.ClaimError:
            return None  # no claim can name it (a literal `[`, a backslash): its write shows in the watch
        job = await self.board.store.jobs.get(job_id)
        seen = None if job is None else await self.views(job, wanted)
        if seen is None:
            return None
        mine, others = seen
        refused = growth.held(path, mine, [v for _, v in others], self.cfg.policy())
        if refused is None:
            return None
        return (
            f"{path} is outside your claim and {refused.message}. Do not write it now: work on your own files "
            "first; it is free once that job has landed"
        )

    async def _grow(self, job: Job, actual: frozenset[str]) -> None:
        seen = await self.views(job, actual)
        if seen is None:
            return
        mine, others = seen
        try:
            g = growth.decide(mine, actual, [v for _, v in others], self.cfg.policy())
        except claims.ClaimError as e:  # a file name no claim can hold (a literal `[`): landing order decides
            olog.get(job_id=job.id, repo=job.repo).warning(olog.Event.JOB_CLAIM_GROWN, error=str(e))
            return
        if not g.paths:
            return
        grown = sorted(g.paths)
        held_by = list(g.held_by)
        written = await self.board.update(
            job.id,
            {JobState.RUNNING},
            grown=job.grown | g.paths,
            event=JobEvent.CLAIM_GROWN,
            data={"paths": grown[:50], "held_by": held_by},
        )
        if written is None:
            return
        log = olog.get(job_id=job.id, repo=job.repo)
        if not held_by:
            log.info(olog.Event.JOB_CLAIM_GROWN, paths=grown[:50], message=f"its claim grew by {plist(grown)}")
            return
        assert g.decision is not None
        log.warning(
            olog.Event.JOB_CLAIM_GROWN,
            paths=grown[:50],
            held_by=held_by,
            reason=str(g.decision.reason),
            message=f"it touched {plist(grown)} outside its claim: {g.decision.message}; their landings are ordered",
        )
        for other, view in others:
            if other.id not in held_by:
                continue
            meet = claims.overlapping(g.paths, view.claim.paths | view.actual) or g.paths
            pair = (min(job.id, other.id), max(job.id, other.id))
            if pair in self._overlaps:
                continue
            self._overlaps.add(pair)
            await self._record(written, other, meet)

    async def _record(self, job: Job, other: Job, meet: frozenset[str]) -> None:
        later, earlier = (
            (job, other) if (job.started_at or 0, job.id) >= (other.started_at or 0, other.id) else (other, job)
        )
        log = olog.get(job_id=job.id, repo=job.repo)
        log.warning(
            olog.Event.JOB_OVERLAP,
            other=other.id,
            paths=sorted(meet),
            lands_after=earlier.id,
            later=later.id,
            message=f"job {job.id} touched {', '.join(sorted(meet))} outside its claim, "
            f"which job {other.id} holds; job {later.id} lands after job {earlier.id}",
        )
        current = await self.board.store.jobs.get(later.id)  # its current land_after, not the one when the watch began
        # A job re-run after a conflict may meet a job that already lands after it: the order stands.
        if (
            current is not None
            and earlier.id not in current.land_after
            and not await self._lands_after(earlier.id, later.id)
        ):
            await self.board.update(
                later.id,
                ACTIVE,
                land_after=(*current.land_after, earlier.id),
                event=JobEvent.OVERLAP,
                data={"other": earlier.id, "paths": sorted(meet)},
            )
        if job.id != later.id:
            await self.board.update(
                job.id, ANY, event=JobEvent.OVERLAP, data={"other": other.id, "paths": sorted(meet)}
            )

    async def _lands_after(self, job_id: int, other: int) -> bool:
        """True if `job_id` already lands after `other`, directly or through open jobs between (a cycle else)."""
        seen: set[int] = set()
        todo = [job_id]
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            job = await self.board.store.jobs.get(i)
            if job is None or job.state.terminal:
                continue
            if other in job.land_after:
                return True
            todo.extend(job.land_after)
        return False
