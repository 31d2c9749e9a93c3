"""Real conflicts between running jobs, found while they run and acted on at once.

Two running jobs of one branch whose touched paths meet may still merge (disjoint hunks of one file, a
changelog); an in-memory three-way merge of their current files says whether they do (`git.merging`). It runs
when their touched paths first meet, again each time either one's touched paths change, and every `RECHECK`
seconds while both run (a second edit of a file already touched changes no path). A running job is also merged
with its branch's head when that moved since its base in a path it touched: at each change of its touched paths,
and when a job that changed one of them lands.

On a real conflict the job that would land second (`core.conflict.second`; against the head, the running
job) is stopped at once: its runner's
processes end, its workspace stays, and it runs again behind the other (`jobs.rerun`, through the executor's
`interrupt`), so a wrong guess at admission costs the minutes it ran, not a whole run and a re-run. The job
that lands first runs on untouched. One structured event, `job.stopped`, names the stopped job, what it met,
the blocking job and what happens next.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from orchestrator import logging as olog
from orchestrator.config import Config
from orchestrator.core import claims
from orchestrator.core.admission_index import plist
from orchestrator.core.conflict import second
from orchestrator.core.job import Job
from orchestrator.core.models import ACTIVE, ANY, Code, JobEvent, JobState
from orchestrator.git import merging
from orchestrator.jobs.board import Board
from orchestrator.jobs.facts import GitFacts
from orchestrator.jobs.rerun import Rerun

RECHECK = 2.0
"""Seconds between merges of two running jobs whose touched paths meet, while nothing else asks for one."""

HEAD_RECHECK = 30.0
"""Seconds between looks at a running job's branch head while nothing (a touch, a landing) asks for one."""

Interrupt = Callable[[int, Rerun], bool]
"""Stops a running job's runner to run it again (`Executor.interrupt`); False when its run had ended."""


class ConflictWatch:
    def __init__(self, board: Board, cfg: Config, facts: GitFacts) -> None:
        self.board = board
        self.cfg = cfg
        self.facts = facts
        self.interrupt: Interrupt | None = None
        """Handed in by the job plane once the executor exists."""
        self._live: dict[int, tuple[tuple[str, str], frozenset[str]]] = {}
        """Running jobs: (repo, branch) and the paths they touched so far."""
        self._pairs: dict[tuple[int, int], asyncio.Event] = {}
        """Pairs of running jobs whose touched paths meet, each with the event that asks for a merge now."""
        self._heads: dict[int, asyncio.Event] = {}
        """Running jobs whose files are merged with their branch's head when it moves, each with its event."""
        self._landed_by: dict[int, int] = {}
        """The job whose landing asked for a running job's merge with the head."""
        self._tasks: set[asyncio.Task[None]] = set()
        board.on_end(self._ended)

    def touched(self, job: Job, actual: frozenset[str]) -> None:
        """A running job's touched paths changed: merge it with every running job of its branch that touched a
        path it did (now, and while both run)."""
        where = (job.repo, job.branch)
        self._live[job.id] = (where, actual)
        for other, (at, theirs) in list(self._live.items()):
            if other == job.id or at != where or not _meet(actual, theirs):
                continue
            pair = (min(job.id, other), max(job.id, other))
            poke = self._pairs.get(pair)
            if poke is None:
                self._pairs[pair] = poke = asyncio.Event()
                self._spawn(self._watch_pair(pair, poke), f"conflicts-{pair[0]}-{pair[1]}")
            poke.set()
        self._head_check(job.id)

    def forget(self, job_id: int) -> None:
        self._live.pop(job_id, None)
        if (poke := self._heads.get(job_id)) is not None:
            poke.set()  # its head watch sees it gone and ends

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- two running jobs ----------------------------------------------------------------------------

    async def _watch_pair(self, pair: tuple[int, int], poke: asyncio.Event) -> None:
        said: bool | None = None
        try:
            while True:
                poke.clear()
                a, b = await self.board.store.jobs.get(pair[0]), await self.board.store.jobs.get(pair[1])
                if a is None or b is None or not _runs(a) or not _runs(b):
                    return
                both = _meet(self._touched(a), self._touched(b))
                try:
                    found = await asyncio.to_thread(
                        merging.workspaces_conflict,
                        Path(a.repo),
                        (str(a.base), Path(str(a.worktree))),
                        (str(b.base), Path(str(b.worktree))),
                        self._mergeable(a.repo),
                    )
                except Exception as e:  # noqa: BLE001 - advisory: the landing makes the real check
                    olog.get(job_id=a.id, repo=a.repo).info(olog.Event.JOB_OVERLAP_CHECKED, other=b.id, error=str(e))
                    found = ()
                # Only where both touched: a conflict with what landed under one of them is that one's own.
                conflicts = tuple(p for p in found if _meet(frozenset({p}), both))
                if said is not bool(conflicts):
                    said = bool(conflicts)
                    await self._checked(a, b, both, conflicts)
                if conflicts:
                    await self._stop_second(a, b, conflicts)
                    return
                with contextlib.suppress(TimeoutError):  # no news: merge again after RECHECK
                    await asyncio.wait_for(poke.wait(), RECHECK)
        finally:
            self._pairs.pop(pair, None)

    async def _checked(self, a: Job, b: Job, both: frozenset[str], conflicts: tuple[str, ...]) -> None:
        message = "real conflict in " + ", ".join(conflicts) if conflicts else "same files, disjoint hunks so far"
        olog.get(job_id=a.id, repo=a.repo).info(
            olog.Event.JOB_OVERLAP_CHECKED,
            other=b.id,
            paths=sorted(both)[:50],
            conflict=bool(conflicts),
            conflicts=list(conflicts[:50]),
            message=message,
        )
        await self.board.update(
            a.id, ANY, event=JobEvent.OVERLAP_CHECKED, data={"other": b.id, "conflicts": list(conflicts[:50])}
        )

    async def _stop_second(self, a: Job, b: Job, conflicts: tuple[str, ...]) -> None:
        later = second(a, b)
        if later is None:
            return
        earlier = b if later is a else a
        reason = f"a real conflict with job {earlier.id} in {plist(conflicts)}"
        stopped = self.interrupt is not None and self.interrupt(later.id, Rerun(reason, (earlier.id,), conflicts))
        if stopped:
            then = f"runs again once job {earlier.id} has ended, on a base that has its change"
        else:  # its run had just ended: its landing comes after the other's, and conflicts there
            then = f"its run had ended: it lands after job {earlier.id}, whose landing settles it"
            await self._land_after(later, earlier)
        olog.get(job_id=later.id, repo=later.repo).warning(
            olog.Event.JOB_STOPPED,
            code=Code.CONFLICT,
            blocking=[earlier.id],
            conflicts=list(conflicts[:50]),
            stopped=stopped,
            message=f"{reason}: job {later.id} would land second",
            next=then,
        )

    async def _land_after(self, later: Job, earlier: Job) -> None:
        current = await self.board.store.jobs.get(later.id)
        if current is None or earlier.id in current.land_after or later.id in earlier.land_after:
            return
        await self.board.update(later.id, ACTIVE, land_after=(*current.land_after, earlier.id))

    # -- a running job and its branch's head -----------------------------------------------------------

    def _head_check(self, job_id: int) -> None:
        poke = self._heads.get(job_id)
        if poke is None:
            self._heads[job_id] = poke = asyncio.Event()
            self._spawn(self._watch_head(job_id, poke), f"conflicts-{job_id}-head")
        poke.set()

    def _ended(self, job: Job) -> None:
        """A job ended: a landing asks each running job of its branch that touched a path it changed to merge
        with the new head."""
        self.forget(job.id)
        if job.state is not JobState.LANDED:
            return
        where = (job.repo, job.branch)
        for other, (at, theirs) in list(self._live.items()):
            if at == where and _meet(job.actual, theirs):
                self._landed_by[other] = job.id
                self._head_check(other)

    async def _watch_head(self, job_id: int, poke: asyncio.Event) -> None:
        """While the job runs: at each change of its touched paths, and each landing on its branch that touched a
        path it did, merge its files with the branch head if that moved since its base in a path it touched."""
        try:
            while True:
                poke.clear()
                job = await self.board.store.jobs.get(job_id)
                if job is None or not _runs(job) or job_id not in self._live:
                    return
                conflicts = await self._vs_head(job)
                if conflicts:
                    await self._stop_behind_head(job, conflicts)
                    return
                with contextlib.suppress(TimeoutError):  # a landing or a touch pokes it; this only looks again
                    await asyncio.wait_for(poke.wait(), HEAD_RECHECK)
        finally:
            self._heads.pop(job_id, None)
            self._landed_by.pop(job_id, None)

    async def _vs_head(self, job: Job) -> tuple[str, ...]:
        key = (job.repo, job.branch)
        head = (await self.facts.heads([key]))[key]
        if head is None or head == job.base:
            return ()
        touched = self._touched(job)
        moved = await self.facts.moved(job.repo, str(job.base), head)
        both = touched if moved is None else _meet(touched, moved)
        if not both:
            return ()
        try:
            found = await asyncio.to_thread(
                merging.workspace_conflicts_with,
                Path(job.repo),
                (str(job.base), Path(str(job.worktree))),
                head,
                self._mergeable(job.repo),
            )
        except Exception as e:  # noqa: BLE001 - advisory: the landing makes the real check
            olog.get(job_id=job.id, repo=job.repo).info(olog.Event.JOB_OVERLAP_CHECKED, head=head, error=str(e))
            return ()
        return tuple(p for p in found if _meet(frozenset({p}), both))

    async def _stop_behind_head(self, job: Job, conflicts: tuple[str, ...]) -> None:
        landed = self._landed_by.get(job.id)
        what = f"job {landed}, which landed" if landed is not None else f"{job.branch}, which moved since it started"
        reason = f"a real conflict with {what}, in {plist(conflicts)}"
        stopped = self.interrupt is not None and self.interrupt(job.id, Rerun(reason, (), conflicts))
        olog.get(job_id=job.id, repo=job.repo).warning(
            olog.Event.JOB_STOPPED,
            code=Code.CONFLICT,
            blocking=[landed] if landed is not None else [],
            conflicts=list(conflicts[:50]),
            stopped=stopped,
            message=reason,
            next="runs again on the new head" if stopped else "its run had ended: its landing conflicts and re-runs it",
        )

    # -- facts -----------------------------------------------------------------------------------------

    def _touched(self, job: Job) -> frozenset[str]:
        live = self._live.get(job.id)
        return live[1] if live is not None else job.actual

    def _mergeable(self, repo: str) -> merging.Mergeable:
        patterns = self.cfg.mergeable(repo)
        return lambda path: claims.matches(path, patterns)


def _runs(job: Job) -> bool:
    return job.state is JobState.RUNNING and bool(job.worktree and job.base)


def _meet(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    """The paths of `a` that meet a path of `b` (a directory meets what is under it; the root meets all)."""
    try:
        return claims.overlapping(a, b)
    except claims.ClaimError:  # a name no claim can hold (a literal `[`): as it is
        return a & b
