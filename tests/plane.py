"""The real job plane in the test's own event loop: a real SQLite file, real git repositories, the shell runner
(unconfined), the scheduler running; no socket. For races made deterministic with `orchestrator.testhook`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator import testhook
from orchestrator.config import PROFILES, Config, JobsConfig, PlanConfig, RunnerTemplate
from orchestrator.core.job import Job
from orchestrator.core.models import JobState
from orchestrator.daemon import JobPlane
from orchestrator.git.worktrees import WorktreePool
from orchestrator.jobs.board import Board
from orchestrator.paths import resolve
from orchestrator.proc.sandbox import Sandbox
from orchestrator.requests import Enqueue
from orchestrator.runners import registry
from orchestrator.store import Store
from orchestrator.store.sqlite import SqliteStore


@dataclass
class Plane:
    parts: JobPlane
    store: Store
    home: Path

    @property
    def jobs(self) -> Any:
        return self.parts.jobs

    async def enqueue(self, repo: Path, text: str, *paths: str, **extra: Any) -> int:
        job = await self.jobs.submit(Enqueue(repo=str(repo), text=text, paths=paths, **extra))
        return int(job.id)

    async def until(self, what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Await `check()` (a coroutine function) until truthy; fail saying what never came."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}")

    async def state(self, job_id: int) -> JobState:
        job = await self.store.jobs.get(job_id)
        assert job is not None
        return job.state

    async def reach(self, job_id: int, *states: JobState, timeout: float = 30.0) -> Job:
        async def check() -> Job | None:
            job = await self.store.jobs.get(job_id)
            return job if job is not None and job.state in states else None

        return await self.until(f"job {job_id} to be {'/'.join(map(str, states))}", check, timeout)


@contextlib.asynccontextmanager
async def plane(
    tmp_path: Path, plan: PlanConfig | None = None, runners: Mapping[str, RunnerTemplate] | None = None, **jobs: Any
) -> AsyncIterator[Plane]:
    """A running job plane on a fresh home under `tmp_path`; `jobs` override `JobsConfig` fields, `plan` is the
    planning config (default: the defaults), `runners` command runners beside the shipped profiles."""
    paths = resolve({"ORCHESTRATOR_HOME": str(tmp_path / "home")})
    paths.ensure()
    cfg = Config(
        jobs=replace(JobsConfig(), sandbox="none", kill_grace=1.0, **jobs),
        plan=plan or PlanConfig(),
        runners={**PROFILES, **(runners or {})},
    )
    store = await SqliteStore.open(paths.db)
    board = Board(store)
    pool = WorktreePool(paths.worktrees, warm=0)
    parts = JobPlane.load(cfg, paths, board, pool, registry(cfg, None, Sandbox()))
    await parts.scheduler.load()
    loop = asyncio.create_task(parts.scheduler.run())
    try:
        yield Plane(parts, store, tmp_path / "home")
    finally:
        testhook.clear()
        parts.scheduler.halt()
        await asyncio.wait_for(loop, 30)
        await parts.scheduler.stop()
        await parts.watch.stop()
        await parts.planning.stop()
        await parts.lander.drain(5.0)
        await store.close()
