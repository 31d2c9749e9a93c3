"""The Ollama source through the daemon's gate, against a local server speaking Ollama's `/api/chat`."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import Config, OllamaConfig, PlanConfig
from orchestrator.core.job import Job
from orchestrator.core.models import ClaimSource, JobState
from orchestrator.lab.doubles.ollama import Profile, start
from orchestrator.llm.gate import Gate
from orchestrator.plan import composite
from orchestrator.plan.base import Note
from tests.conftest import git

pytestmark = pytest.mark.timeout(60)

FILES = {"src/api.py": "def serve():\n    pass\n", "tests/test_api.py": "import api\n"}


async def plan_with(repo: Path, url: str, model: str = "hermes3", gates: dict[str, Gate] | None = None):
    cfg = Config(ollama=OllamaConfig(host=url, model=model), plan=PlanConfig(planner="ollama", deadline=20))
    planner = composite.build(cfg, None, gates)
    assert planner.model is not None and planner.model.name == "ollama"
    try:
        job = Job(3, str(repo), "main", "add logging to src/api.py", "shell", JobState.PLANNING)
        return await planner.plan(job, git(repo, "rev-parse", "HEAD"))
    finally:
        await planner.close()


async def test_structured_request_through_the_shared_gate(make_repo) -> None:
    """The planner sends one `/api/chat` call with the plan's JSON schema as `format`, through the gate the
    daemon shares with chat; an answer without a claim falls back to local evidence, with the reason."""
    repo = make_repo("r", FILES)
    runner, url, server = await start(Profile())
    gates: dict[str, Gate] = {}
    try:
        plan = await plan_with(repo, url, gates=gates)
    finally:
        await runner.cleanup()
    seen = server.engine.seen
    assert [s["path"] for s in seen] == ["/api/chat"]
    assert seen[0]["format"]["required"] == ["paths", "confidence", "plan"]
    assert "src/api.py" in seen[0]["messages"][-1]["content"]
    assert list(gates) == [url]  # the one gate for this host, shared (the chat plane takes it from here)
    # The double answers a chat-memory object, not a plan: never taken as a claim.
    assert plan.claim.source is ClaimSource.EVIDENCE and "src/api.py" in plan.claim.paths
    assert plan.notes[0][0] is Note.MODEL_MALFORMED


async def test_missing_model_falls_back(make_repo) -> None:
    """A model the server does not have is a logged fallback to local evidence, not a stuck job."""
    repo = make_repo("r", FILES)
    runner, url, _ = await start(Profile())
    try:
        plan = await plan_with(repo, url, model="nope")
    finally:
        await runner.cleanup()
    assert plan.claim.source is ClaimSource.EVIDENCE
    assert plan.notes[0][0] is Note.MODEL_UNAVAILABLE and "nope" in plan.notes[0][1]
