"""Process ownership in the store: every group a runner or a landing check starts is recorded first, and a
restarted daemon ends what its dead predecessor left running before it touches a worktree.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator import logging as olog
from orchestrator.runners import process
from orchestrator.store import Store


@dataclass(frozen=True, slots=True)
class StoreOwner(process.Owner):
    """Records a job's process groups in the store (`process.run` opens its gate only after `own`)."""

    store: Store
    job_id: int | None = None

    async def own(self, group: process.Group) -> None:
        await self.store.own_process(group, self.job_id)

    async def disown(self, group: process.Group) -> None:
        await self.store.disown_process(group)


async def end_survivors(store: Store, *, grace: float) -> list[process.Group]:
    """End every recorded group that still runs (checked against pid reuse), then forget them all.

    Called on start before worktrees are recovered or handed out: no process of a dead daemon keeps
    writing into a worktree that a retry is about to get.
    """
    recorded = await store.processes()
    if not recorded:
        return []
    ended = await process.end_groups([g for g, _ in recorded], grace=grace)
    for group, _ in recorded:
        await store.disown_process(group)
    if ended:
        jobs = sorted({j for g, j in recorded if j is not None and g in ended})
        olog.get().warning(
            olog.Event.PROCESS_SURVIVORS_ENDED,
            groups=[g.pgid for g in ended],
            jobs=jobs,
            what=[g.what for g in ended],
        )
    return ended
