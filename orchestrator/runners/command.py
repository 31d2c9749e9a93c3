"""`command` runners: an agent CLI (Claude Code, aider, codex, ...) from a config template `[runners.NAME]`.

The template's argv is run as it is (exec, never through a shell). In each argument `{prompt}` (the job's
text), `{plan}` (the pre-plan, if any), `{worktree}` and `{job_id}` are replaced, so the prompt reaches the
CLI as exactly one argument whatever quotes, newlines or `$(...)` it holds. The environment is the basic
allow-list plus the template's `pass_env` names: every other secret of the daemon stays out. With
`scratch_home = true` each job gets a HOME of its own holding copies of `home_files`, for CLIs whose
shared config does not survive several instances at once.
"""

from __future__ import annotations

import asyncio

from orchestrator.config import RunnerTemplate
from orchestrator.core.models import Code
from orchestrator.runners import process
from orchestrator.runners.base import RunContext, RunResult
from orchestrator.runners.sandbox import Sandbox, private_home


def expand(argv: tuple[str, ...], values: dict[str, str]) -> list[str]:
    """Replace the known `{name}` placeholders in each argument; anything else in braces stays as written."""
    out = []
    for arg in argv:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


class CommandRunner:
    def __init__(self, name: str, template: RunnerTemplate, sandbox: Sandbox) -> None:
        self.name = name
        self.template = template
        self.sandbox = sandbox

    async def run(self, ctx: RunContext) -> RunResult:
        if why := self.sandbox.check():
            return RunResult(False, None, why, code=Code.SANDBOX_UNAVAILABLE)
        t = self.template
        argv = expand(
            t.argv,
            {
                "prompt": ctx.job.text,
                "plan": str(getattr(ctx.job, "plan_text", "") or ""),
                "worktree": str(ctx.worktree),
                "job_id": str(ctx.job.id),
            },
        )
        extra = {**ctx.env, "ORCHESTRATOR_JOB_ID": str(ctx.job.id), "ORCHESTRATOR_WORKTREE": str(ctx.worktree)}
        home = None
        if t.scratch_home:
            home = await asyncio.to_thread(private_home, ctx, t.home_files)
            extra.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
        env = self.sandbox.env(ctx, process.environment(t.pass_env, extra))
        timeout = t.timeout or ctx.timeout
        result = await process.run(
            argv,
            prefix=self.sandbox.prefix(ctx, home=home),
            env=env,
            timeout=timeout,
            what=f"job {ctx.job.id} runner {self.name}",
            **ctx.process_options(),
        )
        if result.timed_out:
            return RunResult(False, None, f"{self.name} timed out after {timeout:g}s")
        if result.ok:
            return RunResult(True, 0, f"{self.name} exited 0")
        return RunResult(False, result.returncode, f"{self.name} {result.status}")
