"""Crash recovery on the store: what a `kill -9` of the daemon can leave half done, and how a restart settles it.

- Process ownership: every group a runner or a landing check starts is recorded first (`StoreOwner`), and a
  restarted daemon ends what its dead predecessor left running before it touches a worktree (`end_survivors`).
- The landing journal: a landing's intent is stored before the ref moves (`StoreJournal`), and a restarted
  daemon brings the user's checkouts level before it lands anything else (`settle_landings`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pygit2

from orchestrator import logging as olog
from orchestrator.core.models import JobEvent, JobState
from orchestrator.git.journal import Intent, settle
from orchestrator.git.repos import RepoError
from orchestrator.git.worktrees import WorktreeError, WorktreePool
from orchestrator.jobs.board import Board
from orchestrator.proc import process
from orchestrator.store import Store

T = TypeVar("T")

CLEANUP_ERRORS: tuple[type[Exception], ...] = (WorktreeError, RepoError, pygit2.GitError, OSError)
"""What releasing, keeping or recovering a worktree may fail with, expectedly."""


@dataclass(frozen=True, slots=True)
class StoreOwner(process.Owner):
    """Records a job's process groups in the store (`process.run` opens its gate only after `own`)."""

    store: Store
    job_id: int | None = None

    @property
    def tag(self) -> str:
        return process.home_tag(self.store.home)

    async def own(self, group: process.Group) -> None:
        await self.store.processes.own(group, self.job_id)

    async def disown(self, group: process.Group) -> None:
        await self.store.processes.disown(group)


async def end_survivors(store: Store, *, grace: float) -> list[process.Group]:
    """End every recorded group that still runs (checked against pid reuse), then forget them all.

    Called on start before worktrees are recovered or handed out: no process of a dead daemon keeps
    writing into a worktree that a retry is about to get.
    """
    recorded = await store.processes.all()
    ended = await process.end_groups([g for g, _ in recorded], grace=grace) if recorded else []
    # Whatever left its group (setsid, a double fork) still carries this home's mark: only a dead
    # predecessor on this state dir can have started it.
    mark = f"{process.RUN_MARK}={StoreOwner(store).tag}."
    await process.end_marked(mark, exact=False, what="processes of a dead daemon")
    # And whatever is still in a cgroup it made, whatever it did to its group and environment.
    cut = await process.end_cgroups(StoreOwner(store).tag)
    if cut:
        olog.get().warning(olog.Event.PROCESS_SURVIVORS_ENDED, cgroups=cut, what="cgroups of a dead daemon")
    if not recorded:
        return []
    for group, _ in recorded:
        await store.processes.disown(group)
    if ended:
        jobs = sorted({j for g, j in recorded if j is not None and g in ended})
        olog.get().warning(
            olog.Event.PROCESS_SURVIVORS_ENDED,
            groups=[g.pgid for g in ended],
            jobs=jobs,
            what=[g.what for g in ended],
        )
    return ended


JOURNAL_WAIT = 60.0
"""Seconds a landing thread waits for the store to record or clear an intent."""


class StoreJournal:
    """`git.journal.Journal` on the store, for `advance` running in a worker thread (it blocks that thread,
    never the event loop, until the intent is committed)."""

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop

    def begin(self, intent: Intent) -> object:
        return self._call(self.store.journal.begin(intent))

    def end(self, token: object) -> None:
        if token is not None:
            assert isinstance(token, int)
            self._call(self.store.journal.end(token))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(JOURNAL_WAIT)
        coro.close()
        raise RuntimeError("StoreJournal is called from a worker thread (asyncio.to_thread), never the loop")


async def settle_landings(board: Board, pool: WorktreePool) -> list[int]:
    """On start: bring the checkouts of every interrupted landing level (see `git.journal.settle`).

    A landing whose ref had moved is finished here: its job becomes `landed` with a reason that says
    whether every checkout is level (and where not, what to do). One rolled back stays `landing`; the
    landing queue tries it again. Returns the jobs whose landings were settled.
    """
    store = board.store
    settled: list[int] = []
    for entry, intent in await store.journal.open():
        log = olog.get(job_id=intent.job_id, repo=intent.repo)
        job = await store.jobs.get(intent.job_id) if intent.job_id is not None else None
        if job is None or Path(job.repo) != Path(intent.repo):
            # Not a landing of this daemon's: its job is not of that repository (in team mode, not of one of this
            # node's clones). Nothing is written anywhere on its word; a person is told what it named.
            log.error(
                olog.Event.LANDING_RECOVERED, ok=False, refused=True, checkouts=list(intent.checkouts),
                error="the intent names no job of this daemon in that repository: not obeyed, dropped",
            )  # fmt: skip
            await store.journal.end(entry)
            continue
        try:
            done = await asyncio.to_thread(settle, intent)
        except (RepoError, pygit2.GitError, OSError, KeyError, ValueError) as e:
            # Left in the journal: the next start tries again; the person is told now.
            log.error(olog.Event.LANDING_RECOVERED, ok=False, error=f"{type(e).__name__}: {e}", exc_info=True)
            continue
        message = done.message(intent)
        log.info(
            olog.Event.LANDING_RECOVERED,
            outcome=done.outcome,
            consistent=done.consistent,
            fixed=done.fixed,
            left=done.left,
            locks=list(done.locks),
        )
        job = await store.jobs.get(job.id)
        if job is not None and job.state is JobState.LANDING:
            settled.append(job.id)
            data = {"outcome": done.outcome, "consistent": done.consistent, "left": done.left}
            if done.outcome == "finished":
                with olog.best_effort("release the landed job's worktree", *CLEANUP_ERRORS, job_id=job.id):
                    await pool.release(Path(job.repo), job.id, keep=False, delete_branch=True)
                await board.transition(
                    job.id,
                    {JobState.LANDING},
                    JobState.LANDED,
                    JobEvent.LANDED,
                    landed_sha=intent.new,
                    finished_at=time.time(),
                    data={**data, "sha": intent.new},
                    reason=f"landed job {job.id} at {intent.new[:12]}; {message}",
                )
            else:
                await board.update(
                    job.id, {JobState.LANDING}, event=JobEvent.LANDING_RECOVERED, data=data, reason=message
                )
        await store.journal.end(entry)
    return settled
