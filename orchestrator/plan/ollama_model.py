"""The model source on a local model: Ollama through the daemon's one gate for that host (`llm.gate`,
`llm.ollama`), at background priority, so a chat turn always goes first.

Same prompt as the Claude planner (`plan.prompt`); structured output through Ollama's `format` (a JSON schema). The
reply must be `{"paths": [...], "confidence": x, "plan": "..."}`; anything else, a busy or absent server,
or a gate that will not take the call falls back to local evidence with the reason logged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from orchestrator.config import Config
from orchestrator.core.job import Job
from orchestrator.llm import gate as llm_gate
from orchestrator.llm import ollama as llm_ollama
from orchestrator.plan.base import Note, Plan
from orchestrator.plan.composite import MODELS, ModelUnusable
from orchestrator.plan.prompt import SYSTEM, TOOL, model_plan, parse_input, user_message
from orchestrator.store import Store

SCHEMA: dict[str, Any] = TOOL["input_schema"]


class OllamaPlanner:
    """A local model's pre-plan, one background call through the host's gate."""

    name = "ollama"

    def __init__(self, backend: Any, budget_tokens: int, counts: Callable[[str], dict[str, int]] | None = None):
        self.backend = backend
        self.budget_tokens = budget_tokens
        self.counts = counts

    async def close(self) -> None:
        await self.backend.close()

    async def plan(self, job: Job, base: str, local: Plan | None = None) -> Plan:
        content = await user_message(job, base, local, self.budget_tokens, self.counts)
        instruction = (
            'Answer with JSON only: {"paths": [...], "confidence": 0..1, "plan": "..."} '
            "listing every file the job will touch."
        )
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{content}\n\n{instruction}"}]
        try:
            result = await self.backend.chat(messages, priority=llm_gate.Priority.BACKGROUND, format=SCHEMA)
        except (llm_ollama.OllamaError, llm_gate.GateError) as e:
            raise ModelUnusable(Note.MODEL_UNAVAILABLE, f"Ollama: {e}") from e
        try:
            data = json.loads(result.text)
        except json.JSONDecodeError:
            raise ModelUnusable(Note.MODEL_MALFORMED, "Ollama answered with text that is not JSON") from None
        return model_plan(parse_input(data), self.backend.model)


def _factory(
    cfg: Config,
    store: Store | None,
    counts: Callable[[str], dict[str, int]],
    gates: dict[str, Any],
    claude: object = None,
) -> OllamaPlanner | None:
    # `gates` is the daemon's one gate per host: the planner queues behind chat turns, never beside them.
    return OllamaPlanner(llm_ollama.from_config(cfg.ollama, gates), cfg.plan.prompt_tokens, counts)


MODELS["ollama"] = _factory
