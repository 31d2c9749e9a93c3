"""What a job's text names that its base does not have (`core.chains.coined`), read off the base's tree index.

A term is new to the base when few of its files use it (`TreeIndex.df`), no file or folder is named by it, and hardly
a subject of its mined history (`History.index`, the local planner's) names it. Run
in a thread: the first look at a repository builds its index (the local planner's, shared and kept).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from orchestrator import logging as olog
from orchestrator.core import chains
from orchestrator.core.job import Job
from orchestrator.plan import index
from orchestrator.plan.base import Plan
from orchestrator.plan.history import History


def coined(repo: str, base: str, text: str, history: History | None = None) -> frozenset[str]:
    """The terms of `text` new to `repo` at `base` (and to its mined `history`'s subjects, when there is one)."""
    said = (lambda t: len(history.index.get(t, ()))) if history is not None else (lambda t: 0)
    tree = index.for_repo(Path(repo))
    with tree.lock:
        tree.move(base)
        return chains.coined(
            text, lambda t: tree.df.get(t, 0) + len(tree.by_stem.get(t, ())) + tree.dir_files.get(t, 0), said
        )


async def plan_with(job: Job, base: str, plan: Plan, history: History | None = None) -> Plan:
    """`plan` with what the job's text names that its base does not have (`Claim.coined`): an earlier job making one
    of those goes first (`core.chains`). Planned again (its branch moved), it keeps what was new to the base it was
    queued on: the first jobs of a series landing make its words known to the new head, while a later one it was
    made on (a move of what the first ones made) is still to come. Unknown (the index cannot be read) is nothing
    new: claims decide alone."""
    with olog.best_effort("find what the job's text names that its base lacks", job_id=job.id, repo=job.repo):
        new = await asyncio.to_thread(coined, job.repo, base, job.text, history)
        return dataclasses.replace(plan, claim=dataclasses.replace(plan.claim, coined=job.claim.coined | new))
    return plan
