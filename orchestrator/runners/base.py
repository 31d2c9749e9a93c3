"""The one small interface every runner implements: run a job in its worktree, report how it went."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from orchestrator.core.job import Job


@dataclass(frozen=True, slots=True)
class RunContext:
    job: Job
    worktree: Path
    log_path: Path
    timeout: float
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunResult:
    ok: bool
    exit_code: int | None
    summary: str
    """One line for the job's reason: what the runner did or why it failed."""


class Runner(Protocol):
    name: str

    async def run(self, ctx: RunContext) -> RunResult: ...


class UnknownRunner(ValueError):
    """The job names a runner this daemon does not have."""
