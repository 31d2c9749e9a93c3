"""The model source: Claude plans the job through the daemon's one Claude client (`llm.anthropic`).

Structured output through a tool schema: the model must call `submit_plan` with the paths it will touch,
its confidence and a short plan. The prompt (`plan.prompt`, shared with the Ollama planner) holds the
ticket, the relevant snippets and the ranked file list at the base, cut to the token budget. Anything
else the model sends back is a `ModelUnusable` the composite turns into a logged fallback to local evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.config import Config
from orchestrator.core.job import Job
from orchestrator.llm.anthropic import Claude, ModelUnavailable
from orchestrator.llm.shared import SharedClaude
from orchestrator.plan.base import Note, Plan
from orchestrator.plan.composite import MODELS, ModelUnusable
from orchestrator.plan.prompt import SYSTEM, TOOL, model_plan, parse_input, user_message
from orchestrator.store import Store


def parse(message: Any) -> tuple[frozenset[str], float, str]:
    """The claim paths, confidence and plan text from a `submit_plan` call, or `ModelUnusable`."""
    calls = [b for b in getattr(message, "content", []) if getattr(b, "type", "") == "tool_use"]
    call = next((b for b in calls if getattr(b, "name", "") == TOOL["name"]), None)
    if call is None:
        raise ModelUnusable(Note.MODEL_MALFORMED, "the model did not call submit_plan")
    return parse_input(call.input if isinstance(call.input, dict) else {})


class ClaudePlanner:
    """Claude's pre-plan, through the shared client (its bound and retries)."""

    name = "claude"

    def __init__(
        self, claude: Claude, model: str, budget_tokens: int, counts: Callable[[str], dict[str, int]] | None = None
    ) -> None:
        self.counts = counts
        """How often each file of a repo changed (from the local planner's history), to rank the file list."""
        self.claude = claude
        self.model = model
        self.budget_tokens = budget_tokens

    async def close(self) -> None:
        await self.claude.close()

    async def plan(self, job: Job, base: str, local: Plan | None = None) -> Plan:
        content = await user_message(job, base, local, self.budget_tokens, self.counts)
        try:
            message = await self.claude.create(
                model=self.model,
                max_tokens=1024,
                system=SYSTEM,
                tools=[TOOL],
                tool_choice={"type": "tool", "name": TOOL["name"]},
                messages=[{"role": "user", "content": content}],
            )
        except ModelUnavailable as e:
            raise ModelUnusable(Note.MODEL_UNAVAILABLE, str(e)) from e
        return model_plan(parse(message), self.model)


def _factory(
    cfg: Config,
    store: Store | None,
    counts: Callable[[str], dict[str, int]],
    gates: dict[str, Any],
    shared: SharedClaude | None = None,
) -> ClaudePlanner | None:
    # The daemon's one client: planning and agents share one bound and one retry policy.
    claude = shared.get() if shared is not None else Claude(cfg.anthropic)
    if not claude.available:
        return None
    return ClaudePlanner(claude, cfg.anthropic.plan_model, cfg.plan.prompt_tokens, counts)


MODELS["claude"] = _factory

__all__ = ["ClaudePlanner", "parse"]
