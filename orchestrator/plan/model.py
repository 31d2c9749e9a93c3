"""The model source: Claude plans the job through the daemon's one Claude client (`llm.anthropic`).

Structured output through a tool schema: the model must call `submit_plan` with the paths it will touch,
its confidence and a short plan. The prompt holds the ticket, the repository's file list at the base
(ranked: what local evidence found first, then files that change often, then the rest; cut to the token
budget) and snippets of the files local evidence found. Anything else the model sends back is a
`ModelUnusable` the composite turns into a logged fallback to local evidence.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.config import Config
from orchestrator.core import claims
from orchestrator.core.job import Job
from orchestrator.core.models import Claim, ClaimSource
from orchestrator.git import repos
from orchestrator.llm.anthropic import Claude, ModelUnavailable
from orchestrator.llm.shared import SharedClaude
from orchestrator.plan.base import Evidence, Kind, Note, Plan
from orchestrator.plan.composite import MODELS, ModelUnusable
from orchestrator.plan.evidence import tree_files
from orchestrator.store import Store

MAX_CONFIDENCE = 0.9
"""A model's own confidence is capped: only a person's declaration is certain."""
CHARS_PER_TOKEN = 4
SNIPPET_LINES = 60

TOOL: dict[str, Any] = {
    "name": "submit_plan",
    "description": "Submit the files this job will create, modify or delete, and a short plan.",
    "input_schema": {
        "type": "object",
        "properties": {
            "paths": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Repo-relative paths the job will touch (files; a directory ends with '/'). "
                "Include the tests to change or add.",
            },
            "confidence": {
                "type": "number",
                "minimum": 0,
                "maximum": 1,
                "description": "Probability that the job touches no file outside `paths`.",
            },
            "plan": {"type": "string", "description": "The plan in a few numbered steps."},
        },
        "required": ["paths", "confidence", "plan"],
    },
}

SYSTEM = (
    "You plan coding jobs for a scheduler that runs jobs side by side when the files they touch are disjoint. "
    "Read the ticket and the repository's file list, then call submit_plan once: every file the job will "
    "create, modify or delete (tests included), an honest confidence, and a short plan a coding agent can "
    "follow. Prefer naming files to directories; name a directory only when the job really spans it."
)


def _ranked(files: list[str], first: list[str], count: dict[str, int], budget_chars: int) -> tuple[list[str], int]:
    """The file list ranked (local evidence, then often-changed files, then the rest) and cut to the budget."""
    order = list(dict.fromkeys([*first, *sorted(files, key=lambda f: (-count.get(f, 0), f))]))
    out, used = [], 0
    for f in order:
        if used + len(f) + 1 > budget_chars:
            break
        out.append(f)
        used += len(f) + 1
    return out, len(order) - len(out)


def _snippet(repo: str, base: str, path: str) -> str:
    out = subprocess.run(
        ["git", "-C", repo, "show", f"{base}:{path}"],
        capture_output=True,
        env=repos.git_env(Path(repo)),
        stdin=subprocess.DEVNULL,
        timeout=30,
        check=False,
    )
    if out.returncode != 0 or b"\0" in out.stdout[:8000]:
        return ""
    return "\n".join(out.stdout.decode("utf-8", "replace").splitlines()[:SNIPPET_LINES])


def prompt(job: Job, base: str, local: Plan | None, budget_tokens: int, count: dict[str, int]) -> str:
    """The user message: ticket, ranked file list, snippets of what local evidence found (blocking)."""
    files = sorted(tree_files(job.repo, base).paths)
    found = [e.path for e in (local.evidence if local else ()) if e.path in set(files)]
    budget = budget_tokens * CHARS_PER_TOKEN
    snippets = []
    used = 0
    for path in dict.fromkeys(found):
        text = _snippet(job.repo, base, path)
        if text and used + len(text) < budget // 3:
            snippets.append(f"--- {path}\n{text}")
            used += len(text)
    listed, left = _ranked(files, found, count, budget - used - len(job.text))
    parts = [f"Ticket:\n{job.text}\n", f"Files in the repository ({len(files)}):", *listed]
    if left:
        parts.append(f"... and {left} more files not listed")
    if found:
        parts.append("\nLocal evidence (text mentions, definitions, tests, co-change): " + ", ".join(found))
    if snippets:
        parts += ["\nSnippets:", *snippets]
    return "\n".join(parts)


def parse(message: Any) -> tuple[frozenset[str], float, str]:
    """The claim paths, confidence and plan text from a `submit_plan` call, or `ModelUnusable`."""
    calls = [b for b in getattr(message, "content", []) if getattr(b, "type", "") == "tool_use"]
    call = next((b for b in calls if getattr(b, "name", "") == TOOL["name"]), None)
    if call is None:
        raise ModelUnusable(Note.MODEL_MALFORMED, "the model did not call submit_plan")
    return parse_input(call.input if isinstance(call.input, dict) else {})


def parse_input(data: dict[str, Any]) -> tuple[frozenset[str], float, str]:
    """The claim paths, confidence and plan text of a plan object (`TOOL`'s input schema), or `ModelUnusable`."""
    if not isinstance(data, dict):
        raise ModelUnusable(Note.MODEL_MALFORMED, "the plan is not a JSON object")
    raw, confidence, text = data.get("paths"), data.get("confidence"), data.get("plan", "")
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        raise ModelUnusable(Note.MODEL_MALFORMED, "submit_plan without a list of paths")
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        raise ModelUnusable(Note.MODEL_MALFORMED, f"submit_plan with confidence {confidence!r} (not in 0..1)")
    paths = set()
    for p in raw:
        try:
            paths.add(claims.normalize(p.strip()))
        except claims.ClaimError as e:
            raise ModelUnusable(Note.MODEL_MALFORMED, f"submit_plan named an unusable path: {e}") from None
    return frozenset(paths), min(float(confidence), MAX_CONFIDENCE), text if isinstance(text, str) else ""


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
        count = self.counts(job.repo) if self.counts else {}
        content = await asyncio.to_thread(prompt, job, base, local, self.budget_tokens, count)
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
        paths, confidence, text = parse(message)
        why = f"{self.model}'s pre-plan names it"
        evidence = tuple(Evidence(p, Kind.MODEL, why) for p in sorted(paths))
        return Plan(Claim(paths, confidence, ClaimSource.MODEL), evidence, text, str(Kind.MODEL))


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

__all__ = ["TOOL", "ClaudePlanner", "parse", "parse_input", "prompt"]
