"""The `claude` runner: a built-in coding agent, a tool-use loop over the daemon's one Claude client.

The model works through `agent_tools` (read, list, search, write, edit, run, done), every path confined to
the job's worktree. It starts from the job's text and, when the pre-plan made one, its plan. Each job
has budgets (turns, tokens, wall time); running out fails the job with a reason that names the budget.
A Claude outage the shared client could not ride out (`ModelUnavailable`) fails it with that reason.
Usage and cost go on the job. The stable part of the prompt (system text and tool definitions) is
marked for prompt caching, so every turn after the first reads it from the cache. The conversation is kept in
the job's private dir, so a run that goes on from the last one (review feedback: `orchestrator revise`) carries
on with it, the feedback as the next user turn.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import logging as olog
from orchestrator.config import AgentConfig
from orchestrator.core.models import Code
from orchestrator.llm.pricing import Usage
from orchestrator.llm.shared import SharedClaude
from orchestrator.paths import open_private, private_dir
from orchestrator.proc import process
from orchestrator.proc.sandbox import Sandbox
from orchestrator.runners import confined
from orchestrator.runners.agent_tools import TOOLS, Outcome, Tools
from orchestrator.runners.base import RunContext, RunResult, note

SYSTEM = """\
You are a careful software engineer working alone in a git worktree of the user's repository, on one task.
Use the tools to read the code, make the change, and check it (run the tests that cover it). Paths are
relative to the repository root; you cannot leave it. Keep the change as small as the task allows and do
not touch unrelated files. Do not commit: when the task is done, call `done` with a one-line summary and
the orchestrator commits and lands your changes. If the task cannot be done, call `done` and say why."""

CACHED = {"type": "ephemeral"}
CONVERSATION = "agent-conversation.json"
"""The agent's conversation, in the job's private dir (out of the job's sight under the sandbox)."""


def _tools() -> list[dict[str, Any]]:
    """The tool definitions, the last one marked so system + tools form one cached prefix."""
    tools = [dict(t) for t in TOOLS]
    tools[-1] = {**tools[-1], "cache_control": CACHED}
    return tools


def first_message(text: str, plan: str) -> str:
    task = f"Task:\n{text.strip()}"
    if plan.strip():
        task += f"\n\nA pre-plan for it (a starting point, not a constraint):\n{plan.strip()}"
    return task


def resumed(saved: list[dict[str, Any]] | None, text: str, plan: str, resume: str) -> list[dict[str, Any]]:
    """The conversation to go on with: the saved one with `resume` as the next user turn (answering any tool
    calls it ended on), or, with none saved, the task with `resume` after it."""
    if not saved:
        return [{"role": "user", "content": f"{first_message(text, plan)}\n\n{resume}"}]
    messages = list(saved)
    last = messages[-1]
    said = {"type": "text", "text": resume}
    if last.get("role") == "assistant":
        calls = [b for b in last.get("content") or [] if isinstance(b, dict) and b.get("type") == "tool_use"]
        answers = [{"type": "tool_result", "tool_use_id": b["id"], "content": "noted"} for b in calls]
        messages.append({"role": "user", "content": [*answers, said]})
    else:  # tool results the model has not answered yet
        content = last.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": str(content or "")}]
        messages[-1] = {"role": "user", "content": [*blocks, said]}
    return messages


def _load(path: Path | None) -> list[dict[str, Any]] | None:
    try:
        data = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, list) and data and all(isinstance(m, dict) for m in data) else None


def _save(path: Path | None, messages: list[dict[str, Any]]) -> None:
    if path is None:
        return
    private_dir(path.parent)
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    with os.fdopen(fd, "w") as f:
        json.dump(messages, f)


@dataclass
class _Budget:
    turns: int
    tokens: int
    deadline: float

    def exceeded(self, turn: int, usage: Usage) -> str | None:
        if turn >= self.turns:
            return f"turn budget spent: {self.turns} model turns without `done` (agent.max_turns)"
        if usage.tokens >= self.tokens:
            return f"token budget spent: {usage.tokens} of {self.tokens} tokens (agent.max_tokens)"
        if time.monotonic() >= self.deadline:
            return "time budget spent (agent.max_seconds or jobs.timeout)"
        return None


class ClaudeRunner:
    name = "claude"

    def __init__(self, claude: SharedClaude, cfg: AgentConfig, model: str, sandbox: Sandbox) -> None:
        self.claude = claude
        self.cfg = cfg
        self.model = model
        self.sandbox = sandbox

    async def unready(self) -> str | None:
        """Why the built-in agent cannot run a job here: no key for the Messages API (nor a server of its own)."""
        if self.claude.cfg.api_key or self.claude.cfg.base_url:
            return None
        return "ANTHROPIC_API_KEY is not set in the daemon's environment (for the service: its env file)"

    async def run(self, ctx: RunContext) -> RunResult:
        log = olog.get()
        usage = Usage(model=self.model)
        journal = _Journal(ctx)

        def refused(tool: str, path: str, reason: str) -> None:
            journal.line(f"[refused] {tool} {path!r}: {reason}")
            log.warning(olog.Event.AGENT_PATH_REFUSED, tool=tool, path=path, reason=reason)

        async def run_command(command: str, timeout: float) -> tuple[int | None, str]:
            journal.line(f"[run] {command}")
            result = await process.run(
                command,
                prefix=confined.prefix(self.sandbox, ctx),
                env=confined.env(self.sandbox, ctx, process.environment((), _job_vars(ctx))),
                timeout=timeout,
                what=f"job {ctx.job.id} runner claude: run",
                **ctx.process_options(),
            )
            return (None if result.timed_out else result.returncode), result.output_tail

        async def held(path: str) -> str | None:
            why = await ctx.held(path) if ctx.held is not None else None
            if why is not None:
                journal.line(f"[held] {path}: {why}")
                log.info(olog.Event.AGENT_HELD, path=path, reason=why)
            return why

        tools = Tools(
            ctx.worktree,
            run_command=run_command,
            on_refused=refused,
            held=held,
            output_cap=self.cfg.output_cap,
            run_timeout=self.cfg.run_timeout,
        )
        seconds = min(self.cfg.max_seconds, ctx.timeout)
        budget = _Budget(self.cfg.max_turns, self.cfg.max_tokens, time.monotonic() + seconds)
        kept = ctx.private_dir / CONVERSATION if ctx.private_dir is not None else None
        plan = str(getattr(ctx.job, "plan_text", "") or "")
        if ctx.resume:
            messages = resumed(await asyncio.to_thread(_load, kept), ctx.job.text, plan, ctx.resume)
        else:
            messages = [{"role": "user", "content": first_message(ctx.job.text, plan)}]
        try:
            # The wall-time budget is hard: a slow model call or tool command is cut (its process group too).
            return await asyncio.wait_for(self._loop(ctx, tools, budget, usage, journal, messages), seconds)
        except TimeoutError:
            return self._spent(f"time budget spent: {seconds:g}s (agent.max_seconds or jobs.timeout)", usage, journal)
        finally:
            with olog.best_effort("keep the agent's conversation", OSError):
                await asyncio.shield(asyncio.to_thread(_save, kept, messages))

    def _spent(self, why: str, usage: Usage, journal: _Journal) -> RunResult:
        journal.line(f"[claude] {why}")
        olog.get().warning(olog.Event.AGENT_BUDGET, reason=why, usage_total=usage.tokens)
        return RunResult(False, None, why, usage=usage.to_json(), code=Code.BUDGET_SPENT)

    async def _loop(
        self,
        ctx: RunContext,
        tools: Tools,
        budget: _Budget,
        usage: Usage,
        journal: _Journal,
        messages: list[dict[str, Any]],
    ) -> RunResult:
        from orchestrator.llm.anthropic import ModelUnavailable  # the SDK loads with the first agent job

        log = olog.get()
        plan = str(getattr(ctx.job, "plan_text", "") or "")
        start = "goes on from its last run" if ctx.resume else "starts from the pre-plan" if plan else "no pre-plan"
        journal.line(f"[claude] {self.model}; {start}")
        turn = 0
        while True:
            if why := budget.exceeded(turn, usage):
                return self._spent(why, usage, journal)
            turn += 1
            try:
                message = await self.claude.get().create(
                    model=self.model,
                    max_tokens=self.cfg.response_tokens,
                    system=[{"type": "text", "text": SYSTEM, "cache_control": CACHED}],
                    tools=_tools(),
                    messages=messages,
                )
            except ModelUnavailable as e:
                journal.line(f"[claude] {e}")
                if e.rate_limited:
                    after = e.retry_after or None
                    why = str(e)
                    return RunResult(False, None, why, usage.to_json(), Code.RATE_LIMITED, retry_after=after)
                return RunResult(
                    False, None, f"Claude unavailable: {e}", usage=usage.to_json(), code=Code.MODEL_UNAVAILABLE
                )
            usage.add(message.usage)
            content = [block.model_dump(exclude_none=True) for block in message.content]
            messages.append({"role": "assistant", "content": content})
            for block in message.content:
                if block.type == "text" and block.text.strip():
                    journal.line(f"[claude] {block.text.strip()}")
            calls = [b for b in message.content if b.type == "tool_use"]
            if not calls:
                # An answer without a tool call: the model considers the task finished.
                summary = " ".join(b.text for b in message.content if b.type == "text").strip()
                return RunResult(True, 0, _one_line(summary) or "agent finished", usage=usage.to_json())
            results: list[dict[str, Any]] = []
            finished: Outcome | None = None
            for call in calls:
                args = call.input if isinstance(call.input, dict) else {}
                outcome = await tools.call(call.name, args)
                journal.line(
                    f"[tool] {call.name} {_brief(args)} -> {'error: ' if outcome.error else ''}"
                    f"{_one_line(outcome.text)[:200]}"
                )
                log.debug(olog.Event.AGENT_TOOL, tool=call.name, error=outcome.error, turn=turn)
                results.append(
                    {"type": "tool_result", "tool_use_id": call.id, "content": outcome.text, "is_error": outcome.error}
                )
                if outcome.done:
                    finished = outcome
            if finished is not None:
                log.info(olog.Event.AGENT_DONE, turns=turn, usage_total=usage.tokens, cost_usd=usage.cost_usd)
                return RunResult(True, 0, _one_line(finished.text) or "agent done", usage=usage.to_json())
            messages.append({"role": "user", "content": results})


def _job_vars(ctx: RunContext) -> dict[str, str]:
    return {**ctx.env, "ORCHESTRATOR_JOB_ID": str(ctx.job.id), "ORCHESTRATOR_WORKTREE": str(ctx.worktree)}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _brief(args: dict[str, Any]) -> str:
    shown = {k: (v if not isinstance(v, str) or len(v) <= 80 else v[:77] + "...") for k, v in args.items()}
    return _one_line(str(shown))


class _Journal:
    """The agent's side of the job log: one line per turn's text, tool call and refusal."""

    def __init__(self, ctx: RunContext) -> None:
        self.path = ctx.log_path

    def line(self, text: str) -> None:
        note(self.path, text)
