"""The model source against a local server speaking the real Messages API: success and every fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import AnthropicConfig, Config, PlanConfig
from orchestrator.core.job import Job
from orchestrator.core.models import ClaimSource, JobState
from orchestrator.lab.doubles.anthropic import AnthropicDouble, Reply, error_reply, text_message, tool_use_message
from orchestrator.plan import composite
from orchestrator.plan.base import Kind, Note
from tests.conftest import git

pytestmark = pytest.mark.timeout(60)

FILES = {"src/api.py": "def serve():\n    pass\n", "tests/test_api.py": "import api\n", "docs/x.md": "x\n"}
GOOD = {"paths": ["src/api.py", "src/log.py"], "confidence": 0.85, "plan": "1. add a logger\n2. use it in serve"}


def job(repo: Path, text: str) -> Job:
    return Job(7, str(repo), "main", text, "shell", JobState.PLANNING)


def planner(url: str, *, timeout: float = 5.0, retries: int = 2, deadline: float = 20.0) -> composite.Composite:
    cfg = Config(
        anthropic=AnthropicConfig(base_url=url, timeout=timeout, max_retries=retries, max_retry_wait=0.2),
        plan=PlanConfig(planner="claude", deadline=deadline),
    )
    built = composite.build(cfg, None)
    assert built.model is not None and built.model.name == "claude"
    return built


async def run(make_repo, script: list[Reply], **kw: float):
    repo = make_repo("r", FILES)
    async with AnthropicDouble(script) as double:
        p = planner(double.url, **kw)
        try:
            plan = await p.plan(job(repo, "add logging to src/api.py"), git(repo, "rev-parse", "HEAD"))
        finally:
            await p.close()
    return plan, double


async def test_model_plan_with_structured_output(make_repo) -> None:
    """The model's submit_plan call becomes the claim; its plan text is kept; local evidence adds the test."""
    plan, double = await run(make_repo, [tool_use_message("submit_plan", GOOD)])
    assert plan.claim.source is ClaimSource.MODEL and plan.claim.confidence == 0.85
    assert plan.claim.paths == {"src/api.py", "src/log.py", "tests/test_api.py"}
    assert plan.text.startswith("1. add a logger")
    assert {e.kind for e in plan.evidence} >= {Kind.MODEL, Kind.TEST}
    sent = double.requests[0]
    assert sent["tool_choice"] == {"type": "tool", "name": "submit_plan"}
    assert sent["model"] == "claude-haiku-4-5"
    prompt = sent["messages"][0]["content"]
    assert "src/api.py" in prompt and "def serve()" in prompt  # file list and a snippet


async def test_prompt_carries_the_lines_around_a_named_identifier(make_repo) -> None:
    """The request holds the lines around the identifier the ticket names, found at the base deep in a
    long file, not just the file's head."""
    filler = "".join(f"HEAD_FILLER_{n} = {n}\n" for n in range(300))
    body = filler + "\n\ndef rotate_keys(keys):\n    return keys[1:] + keys[:1]\n" + filler.replace("HEAD", "TAIL")
    repo = make_repo("r", {"src/secrets.py": body, "src/other.py": "x = 1\n"})
    async with AnthropicDouble([tool_use_message("submit_plan", GOOD)]) as double:
        p = planner(double.url)
        try:
            await p.plan(job(repo, "make `rotate_keys` skip empty keys"), git(repo, "rev-parse", "HEAD"))
        finally:
            await p.close()
    prompt = double.requests[0]["messages"][0]["content"]
    assert "--- src/secrets.py" in prompt
    assert "  303  def rotate_keys(keys):" in prompt and "return keys[1:] + keys[:1]" in prompt
    assert "HEAD_FILLER_1 " not in prompt and "TAIL_FILLER_290 " not in prompt


async def test_rate_limit_honours_retry_after_then_plans(make_repo) -> None:
    """A 429 with retry-after is waited out and retried; the plan then comes from the model."""
    plan, double = await run(make_repo, [error_reply(429, retry_after=0.1), tool_use_message("submit_plan", GOOD)])
    assert plan.claim.source is ClaimSource.MODEL and len(double.requests) == 2


@pytest.mark.parametrize("status", [500, 529])
async def test_server_errors_fall_back_to_local_evidence(make_repo, status: int) -> None:
    """A model that keeps failing (500, 529 overloaded) gives way to local evidence, with the reason noted."""
    plan, double = await run(make_repo, [error_reply(status)] * 3, retries=2)
    assert len(double.requests) == 3
    assert plan.claim.source is ClaimSource.EVIDENCE and "src/api.py" in plan.claim.paths
    assert plan.notes[0][0] is Note.MODEL_UNAVAILABLE and plan.text == ""


async def test_timeout_falls_back(make_repo) -> None:
    """A model slower than the plan's deadline gives way to local evidence."""
    plan, _ = await run(make_repo, [Reply(delay=5.0, body=tool_use_message("submit_plan", GOOD).body)], deadline=0.5)
    assert plan.claim.source is ClaimSource.EVIDENCE
    assert plan.notes[0][0] is Note.DEADLINE


@pytest.mark.parametrize(
    "reply",
    [
        Reply(raw=b'{"id": "msg_1", "type": "mess'),
        text_message("I would edit src/api.py"),
        tool_use_message("submit_plan", {"paths": "src/api.py", "confidence": 0.9, "plan": ""}),
        tool_use_message("submit_plan", {"paths": ["../etc/passwd"], "confidence": 0.9, "plan": ""}),
        tool_use_message("submit_plan", {"paths": ["src/api.py"], "confidence": 7, "plan": ""}),
    ],
    ids=["truncated-json", "no-tool-call", "paths-not-a-list", "path-outside-repo", "confidence-out-of-range"],
)
async def test_malformed_output_falls_back(make_repo, reply: Reply) -> None:
    """Output the planner cannot use is never taken as a claim: local evidence stands in, with the reason."""
    plan, _ = await run(make_repo, [reply] * 3, retries=0)
    assert plan.claim.source is ClaimSource.EVIDENCE
    assert plan.notes[0][0] in (Note.MODEL_MALFORMED, Note.MODEL_UNAVAILABLE)
    assert "src/api.py" in plan.claim.paths
