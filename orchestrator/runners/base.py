"""The one small interface every runner implements: run a job in its worktree, report how it went."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.core import claims
from orchestrator.core.job import Job
from orchestrator.paths import open_private
from orchestrator.proc.process import KILL_GRACE, LOG_CAP, Owner
from orchestrator.runners.mcp import Door

Held = Callable[[str], Awaitable[str | None]]
"""(repo-relative path) → why the job should not write it now, or None."""


@dataclass(frozen=True, slots=True)
class RunContext:
    job: Job
    worktree: Path
    log_path: Path
    timeout: float
    env: dict[str, str] = field(default_factory=dict)
    owner: Owner = field(default_factory=Owner)
    """Records each process group the runner starts (the store, in the daemon): pass it to `process.run`."""
    private_dir: Path | None = None
    """A 0700 dir of the job's own, outside the worktree, for scripts and prompts the runner writes."""
    terminal: Path | None = None
    """Where a runner that runs its command in a terminal of the job's own keeps it (`proc.terminal`): a dir no
    sandboxed command sees. None: no such terminal."""
    log_cap: int = LOG_CAP
    grace: float = KILL_GRACE
    """Seconds between SIGTERM and SIGKILL when the job times out or the daemon stops."""
    held: Held | None = None
    """Asks whether a path outside the job's claim is held by another active job (the refusal, or None)."""
    resume: str = ""
    """Not "": the runner goes on from where its last run stopped, in the same worktree, told this (a person's
    review feedback, or that a rate limit is over)."""
    door: Door | None = None
    """The job's door to the daemon (its socket and token), for a runner that tells its CLI of the job's MCP server
    (`runners.mcp`): open while the runner runs; None when it has none."""
    session: bool = True
    """With `resume`: a CLI with a `resume_argv` resumes its own session (review feedback); False after a rate
    limit (its session may hold nothing), when it runs its `argv` again told the task and `resume`."""

    @property
    def claim_lines(self) -> str:
        """The job's claim as its command's `ORCHESTRATOR_CLAIM` holds it: a path a line, an addition as the new file
        it is (`a new file in changelog.d/`, not `changelog.d/+`)."""
        return "\n".join(claims.describe(p) for p in sorted(self.job.claim.paths))

    @property
    def plan(self) -> str:
        """The model's pre-plan for the job ("" when none planned it): start from it, do not plan again."""
        return self.job.plan_text

    def process_options(self) -> dict[str, Any]:
        """What every `process.run` of this job shares: its worktree, log, cap, grace, owner, private dir."""
        return {
            "cwd": self.worktree,
            "log_path": self.log_path,
            "log_cap": self.log_cap,
            "grace": self.grace,
            "owner": self.owner,
            "script_dir": self.private_dir,
        }


@dataclass(frozen=True, slots=True)
class RunResult:
    ok: bool
    exit_code: int | None
    summary: str
    """One line for the job's reason: what the runner did or why it failed."""
    usage: dict[str, Any] | None = None
    """Model usage and cost of the run (`llm.pricing.Usage.to_json()`), for runners that call a model."""
    code: str | None = None
    """The failure's closed code (a `models.Code`) when it is more specific than RunnerFailed / TimedOut."""
    retry_after: float | None = None
    """With code RateLimited: seconds until the model API's limit lifts, when it said (None: unknown)."""
    limit_forgeable: bool = False
    """With code RateLimited: read from output the job could have printed itself (`ratelimit.Signs.forgeable`)."""


def note(path: Path, line: str) -> None:
    """Append one line of a runner's own to the job's log (private: 0600 whatever the umask)."""
    fd = open_private(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode(errors="backslashreplace"))  # a file name need not be UTF-8
    finally:
        os.close(fd)


class Runner(Protocol):
    """A runner may also set `rerun_safe = True`: running a job again from scratch is harmless, so
    `jobs.requeue_interrupted` re-queues its interrupted jobs when the daemon starts. And it may define
    `task(text) -> str`: the words of a job's text that say what the task is, without what the runner
    reads as its own instructions (planners read these: `runners.task`)."""

    name: str

    async def run(self, ctx: RunContext) -> RunResult: ...


class UnknownRunner(ValueError):
    """The job names a runner this daemon does not have."""
