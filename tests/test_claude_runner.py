"""The built-in `claude` runner end to end: the real daemon, the production Claude client, and a local
server speaking the real Messages API (scripted tool-use replies)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orchestrator.client import Client
from orchestrator.lab.doubles.anthropic import Reply, error_reply, text_message, tool_use_message
from tests.conftest import git
from tests.doubles import anthropic_double

TEST = "import sys; sys.path.insert(0, 'src'); import a, c; assert (a.a, c.c) == (2, 3); print('tests ok')"


def _config(home: Path, text: str) -> None:
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "config.toml").write_text(text)


def _daemon(daemon_factory, tmp_path: Path, url: str, config: str = "", env: dict[str, str] | None = None):
    d = daemon_factory(env={"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "", **(env or {})})
    _config(d.home, config)
    return d.start()


def _results(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool results a request sends back (its last user message)."""
    last = request["messages"][-1]
    return [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]


def test_claude_runner_does_a_small_task_and_it_lands(make_repo, daemon_factory, tmp_path):
    """Create a file, edit another, run a test: the change lands; escapes are refused and logged."""
    repo = make_repo()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("untouched\n")
    os.symlink(outside, repo / "link")
    with open(os.fsencode(repo / "src") + b"/caf\xe9.txt", "wb") as f:  # a name that is not UTF-8
        f.write(b"x\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a link out, a name in Latin-1")
    script = [
        tool_use_message("list_dir", {"path": "src"}, text="Looking around."),
        tool_use_message("write_file", {"path": "src/c.py", "content": "c = 3\n"}),
        tool_use_message("edit_file", {"path": "src/a.py", "old": "a = 1", "new": "a = 2"}),
        tool_use_message(
            "read_file",
            {"path": "../outside/keep.txt"},
            more=[("read_file", {"path": "/etc/passwd"}), ("write_file", {"path": "link/evil.txt", "content": "x"})],
        ),
        tool_use_message("run", {"command": f'python3 -c "{TEST}"'}),
        tool_use_message("done", {"summary": "added c, set a to 2"}),
    ]
    with anthropic_double(script) as double:
        d = _daemon(daemon_factory, tmp_path, double.url)
        job = d.enqueue(repo, "Add src/c.py and set a to 2\n\nThen run the test.", "--runner", "claude",
                        "--path", "src/")  # fmt: skip
        assert d.cli("wait", str(job), "--timeout", "90").returncode == 0, d.cli_json("show", str(job))["reason"]
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "landed"
    assert git(repo, "show", "main:src/c.py") == "c = 3" and git(repo, "show", "main:src/a.py") == "a = 2"
    assert git(repo, "log", "-1", "--format=%s", "main") == "Add src/c.py and set a to 2" or (
        "Add src/c.py and set a to 2" in git(repo, "log", "--format=%s", "main").splitlines()
    )
    # The escapes: tool errors the model reads, logged, and nothing outside changed.
    refusals = _results(double.requests[4])
    assert [r["is_error"] for r in refusals] == [True, True, True]
    assert "'..' is refused" in refusals[0]["content"] and "absolute" in refusals[1]["content"]
    assert "outside the repository" in refusals[2]["content"]
    logged = [e for e in d.events() if e["event"] == "agent.path_refused"]
    assert [e["path"] for e in logged] == ["../outside/keep.txt", "/etc/passwd", "link/evil.txt"]
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "untouched\n"
    # The name that is not UTF-8 reached the model escaped (the API takes UTF-8 only), not as a crash.
    assert "caf\\xe9.txt" in _results(double.requests[1])[0]["content"]
    # The test command ran in the worktree and its output came back.
    ran = _results(double.requests[5])[0]
    assert not ran["is_error"] and ran["content"].startswith("exit 0") and "tests ok" in ran["content"]
    # The prompt: the task first, the stable part marked for caching.
    first = double.requests[0]
    assert first["messages"][0]["content"].startswith("Task:\nAdd src/c.py and set a to 2")
    assert first["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert first["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert {t["name"] for t in first["tools"]} == {
        "read_file", "list_dir", "search", "write_file", "edit_file", "run", "done"
    }  # fmt: skip
    # Usage and cost on the job, in `show` and `status --json`.
    usage = shown["usage"]
    assert usage["calls"] == 6 and usage["input_tokens"] == 600 and usage["output_tokens"] == 120
    assert usage["cost_usd"] == round((600 * 3 + 120 * 15) / 1e6, 6)
    listed = {j["id"]: j for j in d.cli_json("status")}
    assert listed[job]["usage"]["calls"] == 6
    assert "usage" in d.cli("show", str(job)).stdout


def test_budgets_fail_the_job_with_a_reason(make_repo, daemon_factory, tmp_path):
    """A model that never calls `done` spends the turn budget; the job fails saying which budget."""
    repo = make_repo()
    with anthropic_double(lambda _: tool_use_message("list_dir", {})) as double:
        d = _daemon(daemon_factory, tmp_path, double.url, "[agent]\nmax_turns = 3\n")
        job = d.enqueue(repo, "loop forever", "--runner", "claude", "--path", "src/")
        d.cli("wait", str(job), "--timeout", "60")
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "failed" and shown["code"] == "BudgetSpent"
    assert "turn budget spent: 3" in shown["reason"]
    assert len(double.requests) == 3 and shown["usage"]["calls"] == 3


FAULTS = "[anthropic]\ntimeout = 1\nmax_retries = 6\nmax_retry_wait = 0.2\n"


def test_transient_faults_are_ridden_out(make_repo, daemon_factory, tmp_path):
    """429 with retry-after, 529, 500, a reset connection and a timeout: retried; the job still lands."""
    repo = make_repo()
    script = [
        error_reply(429, retry_after=0.1),
        error_reply(529),
        error_reply(500),
        Reply(reset=True),
        Reply(delay=3.0, body=text_message("too late").body),
        tool_use_message("write_file", {"path": "src/d.py", "content": "d = 4\n"}),
        error_reply(429, retry_after=0.1),
        tool_use_message("done", {"summary": "added d"}),
    ]
    with anthropic_double(script) as double:
        d = _daemon(daemon_factory, tmp_path, double.url, FAULTS)
        job = d.enqueue(repo, "add d", "--runner", "claude", "--path", "src/")
        assert d.cli("wait", str(job), "--timeout", "90").returncode == 0, d.cli_json("show", str(job))["reason"]
    assert git(repo, "show", "main:src/d.py") == "d = 4"
    assert len(double.requests) == 8
    retries = [e["reason"] for e in d.events() if e["event"] == "claude.retry"]
    assert any("429" in r for r in retries) and any("529" in r for r in retries)
    assert any("timed out" in r for r in retries) and any("unreachable" in r for r in retries)


def test_a_lasting_outage_fails_the_job_with_the_reason(make_repo, daemon_factory, tmp_path):
    """When the retries are spent the job fails (never hangs) with code ModelUnavailable and what happened."""
    repo = make_repo()
    with anthropic_double(lambda _: error_reply(529)) as double:
        d = _daemon(daemon_factory, tmp_path, double.url, "[anthropic]\nmax_retries = 2\nmax_retry_wait = 0.1\n")
        job = d.enqueue(repo, "anything", "--runner", "claude", "--path", "src/")
        d.cli("wait", str(job), "--timeout", "60")
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "failed" and shown["code"] == "ModelUnavailable"
    assert "overloaded (529)" in shown["reason"] and "after 3 attempts" in shown["reason"]


def test_the_concurrency_limit_holds_under_20_jobs(make_repo, daemon_factory, tmp_path):
    """20 claude jobs at once: never more than `anthropic.concurrency` requests in flight; all of them end."""
    repo = make_repo()

    def slow_done(_: dict[str, Any]) -> Reply:
        return Reply(body=tool_use_message("done", {"summary": "nothing to do"}).body, delay=0.3)

    with anthropic_double(slow_done) as double:
        d = _daemon(daemon_factory, tmp_path, double.url, "[anthropic]\nconcurrency = 3\n[jobs]\nper_repo = 20\n",
                    env={"MAX_CONCURRENT_JOBS": "20"})  # fmt: skip
        c = Client(d.socket)
        ids = [
            c.enqueue(repo=str(repo), text=f"job {i}", runner="claude", paths=[f"f{i}.txt"])["id"] for i in range(20)
        ]
        assert d.cli("wait", *map(str, ids), "--timeout", "120").returncode == 5  # each changed nothing
    states = {j["state"] for j in (d.cli_json("show", str(i)) for i in ids)}
    assert states == {"unchanged"}
    assert len(double.requests) == 20
    assert double.peak_in_flight == 3, double.peak_in_flight
    started = [e for e in d.events() if e["event"] == "job.started"]
    assert len(started) == 20


async def test_no_key_fails_clearly(tmp_path):
    """Without a key or base URL, a claude job fails at once saying to set ANTHROPIC_API_KEY."""
    from orchestrator.config import AgentConfig, AnthropicConfig
    from orchestrator.core.job import Job
    from orchestrator.core.models import JobState
    from orchestrator.llm.shared import SharedClaude
    from orchestrator.proc.sandbox import Sandbox
    from orchestrator.runners.base import RunContext
    from orchestrator.runners.claude import ClaudeRunner

    runner = ClaudeRunner(SharedClaude(AnthropicConfig()), AgentConfig(), "claude-sonnet-4-5", Sandbox())
    job = Job(id=1, repo=str(tmp_path), branch="main", text="anything", runner="claude", state=JobState.RUNNING)
    result = await runner.run(RunContext(job=job, worktree=tmp_path, log_path=tmp_path / "1.log", timeout=60))
    assert not result.ok and result.code == "ModelUnavailable" and "ANTHROPIC_API_KEY" in result.summary


def test_the_agent_starts_from_the_pre_plan_when_there_is_one():
    """The first message carries the task, then the pre-plan's text when the planner made one."""
    from orchestrator.runners.claude import first_message

    assert first_message("Fix a", "") == "Task:\nFix a"
    with_plan = first_message("Fix a", "Edit src/a.py: change a to 2.")
    assert with_plan.startswith("Task:\nFix a") and "pre-plan" in with_plan and "Edit src/a.py" in with_plan
