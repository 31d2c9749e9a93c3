"""The `shell` runner: the job's text is a shell script run by `/bin/sh` (or its argv a command), in its worktree.

It runs through `process.run`: its process group is owned (recorded in the store), its output goes to the
per-job log file (capped), never to the daemon's log, and on timeout or stop the whole group gets
SIGTERM then SIGKILL, so no process outlives its job. A long text goes through a private file, not argv.
"""

from __future__ import annotations

from orchestrator.core.models import Code
from orchestrator.proc import process
from orchestrator.proc.sandbox import Sandbox
from orchestrator.runners import confined
from orchestrator.runners.base import RunContext, RunResult


def job_env(ctx: RunContext, pass_env: tuple[str, ...] = ()) -> dict[str, str]:
    """The allow-listed environment (`process.environment`) plus the job's own variables."""
    return process.environment(
        pass_env,
        {
            **ctx.env,
            "ORCHESTRATOR_JOB_ID": str(ctx.job.id),
            "ORCHESTRATOR_WORKTREE": str(ctx.worktree),
            "ORCHESTRATOR_CLAIM": ctx.claim_lines,
            "PWD": str(ctx.worktree),
        },
    )


class ShellRunner:
    name = "shell"
    rerun_safe = True
    """Each attempt runs in a fresh worktree (the last one kept on its branch): safe to re-queue on start."""

    def __init__(self, sandbox: Sandbox | None = None) -> None:
        self.sandbox = sandbox or Sandbox()

    async def run(self, ctx: RunContext) -> RunResult:
        if why := self.sandbox.check():
            return RunResult(False, None, why, code=Code.SANDBOX_UNAVAILABLE)
        # An argv job runs exactly as given (exec, no shell, no re-splitting); a text job through sh.
        result = await process.run(
            list(ctx.job.argv) if ctx.job.argv else ctx.job.text,
            prefix=confined.prefix(self.sandbox, ctx),
            env=confined.env(self.sandbox, ctx, job_env(ctx)),
            timeout=ctx.timeout,
            what=f"job {ctx.job.id} runner shell",
            **ctx.process_options(),
        )
        if result.timed_out:
            return RunResult(False, None, f"timed out after {ctx.timeout:g}s")
        if result.ok:
            return RunResult(True, 0, "command exited 0")
        return RunResult(False, result.returncode, f"command {result.status}")
