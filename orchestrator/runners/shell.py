"""The `shell` runner: the job's text is a shell command (or its argv a command) run in its worktree.

Its output goes to the per-job log file, never to the daemon's log. On timeout or cancellation the whole
process group is killed, so no agent process outlives its job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from orchestrator.runners.base import RunContext, RunResult

# Variables a job's command never sees: the daemon's own secrets.
_SECRET_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY")


def job_env(ctx: RunContext) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}
    env.update(ctx.env)
    env["ORCHESTRATOR_JOB_ID"] = str(ctx.job.id)
    env["ORCHESTRATOR_WORKTREE"] = str(ctx.worktree)
    env["ORCHESTRATOR_CLAIM"] = "\n".join(sorted(ctx.job.claim.paths))
    env["PWD"] = str(ctx.worktree)
    return env


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class ShellRunner:
    name = "shell"

    async def run(self, ctx: RunContext) -> RunResult:
        ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
        with ctx.log_path.open("ab") as log:
            log.write(f"$ {ctx.job.text}\n".encode())
            log.flush()
            # An argv job runs exactly as given (exec, no shell, no re-splitting); a text job through sh.
            argv = ctx.job.argv or ("/bin/sh", "-c", ctx.job.text)
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=ctx.worktree,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=job_env(ctx),
                start_new_session=True,
            )
            try:
                code = await asyncio.wait_for(proc.wait(), timeout=ctx.timeout)
            except TimeoutError:
                _kill_group(proc)
                await proc.wait()
                log.write(f"\n[orchestrator] killed after {ctx.timeout:g}s timeout\n".encode())
                return RunResult(False, None, f"timed out after {ctx.timeout:g}s")
            except asyncio.CancelledError:
                _kill_group(proc)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 5)
                raise
            # The command may have left children in its group; none outlive the job.
            _kill_group(proc)
        if code == 0:
            return RunResult(True, 0, "command exited 0")
        return RunResult(False, code, f"command exited {code}")
