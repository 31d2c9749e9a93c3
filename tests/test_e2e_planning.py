"""Planning off the scheduler loop, end to end: a real daemon, a slow model on a local Messages API server."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from orchestrator.client import Client
from orchestrator.lab.doubles.anthropic import AnthropicDouble, Reply, tool_use_message
from tests.conftest import git

pytestmark = pytest.mark.timeout(120)

MODEL_SECONDS = 5.0


@pytest.fixture
def slow_model() -> Iterator[AnthropicDouble]:
    """A Messages API double, in a thread of its own, that takes 5 s for every plan."""

    def script(body: dict[str, Any]) -> Reply:
        ticket = body["messages"][0]["content"].split("Files in the repository")[0]
        found = re.search(r"src/m\d\.py", ticket)
        path = found.group(0) if found else "src/a.py"
        answer = tool_use_message("submit_plan", {"paths": [path], "confidence": 0.8, "plan": f"1. edit {path}"})
        return Reply(delay=MODEL_SECONDS, body=answer.body)

    loop = asyncio.new_event_loop()
    double = AnthropicDouble(script)
    ready = threading.Event()
    stop = asyncio.Event()

    async def serve() -> None:
        async with double:
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield double
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
    loop.close()


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def test_declared_jobs_are_admitted_without_waiting_for_model_plans(
    make_repo, daemon_factory, slow_model: AnthropicDouble
) -> None:
    """20 jobs in 3 repos, a model taking 5 s per plan: every job with declared paths is admitted before any
    model plan is done, and every job leaves `planning` (the logs show it)."""
    files = {f"src/{c}.py": f"{c} = 1\n" for c in ["a", "b", "c", "m0", "m1", "m2", "m3"]}
    repos = [make_repo(f"r{i}", files) for i in range(3)]
    for repo in repos:  # jobs land on `main`, away from the checkout: the test is about planning, not about
        git(repo, "checkout", "-q", "-b", "work")  # telling landings from edits in a checkout being updated
    d = daemon_factory(env={"ANTHROPIC_BASE_URL": slow_model.url, "MAX_CONCURRENT_JOBS": "20"})
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text(
        "[plan]\nconcurrency = 12\ndeadline = 30\n[anthropic]\nconcurrency = 12\n[jobs]\nper_repo = 8\n"
    )
    d.start()
    api = Client(d.socket)  # through the API: 20 CLI start-ups could outlast a model plan on a loaded machine

    def enqueue(repo: Path, text: str, paths: list[str]) -> int:
        return int(api.enqueue(repo=str(repo), text=text, paths=paths, branch="main")["id"])

    model_jobs, declared_jobs = [], []
    for n in range(12):  # 4 per repo, each on a file of its own: planned by the model, then all run at once
        path = f"src/m{n // 3}.py"
        model_jobs.append(enqueue(repos[n % 3], f"echo {n} >> {path}  # edit {path}", []))
    for n in range(8):  # 3, 3 and 2 per repo, each declaring a file of its own
        path = f"src/{'abc'[n // 3]}.py"
        declared_jobs.append(enqueue(repos[n % 3], f"echo {n} >> {path} # declared", [path]))
    out = d.cli("wait", *map(str, declared_jobs), "--timeout", "60")
    assert out.returncode == 0, out.stderr
    out = d.cli("wait", *map(str, model_jobs), "--timeout", "90")
    assert out.returncode == 0, out.stderr
    events = d.events()
    planned_by_model = [_at(e) for e in events if e.get("event") == "job.planned" and e.get("source") == "model"]
    assert planned_by_model, "no plan came from the model"
    enqueued = {e["job_id"]: _at(e) for e in events if e.get("event") == "job.enqueued"}
    planned = {e["job_id"]: _at(e) for e in events if e.get("event") == "job.planned"}
    admitted = {e["job_id"]: _at(e) for e in events if e.get("event") == "admission.admitted"}
    assert set(declared_jobs) <= set(admitted)
    for j in declared_jobs:
        # Admitted sooner than any model plan can take, while model jobs queued before it were still planning.
        assert admitted[j] - enqueued[j] < MODEL_SECONDS, (j, admitted[j] - enqueued[j])
        assert any(planned[m] > admitted[j] for m in model_jobs if m in planned), j
    assert all(planned[m] - enqueued[m] >= MODEL_SECONDS * 0.9 for m in model_jobs)
    first_model_plan = min(planned_by_model)
    states = {j["id"]: j["state"] for j in d.cli_json("status")}
    assert not [i for i, s in states.items() if s in ("planning", "queued")], states
    # Declared jobs never asked the model; model jobs did.
    assert len(slow_model.requests) >= len(model_jobs)
    assert all("# declared" not in r["messages"][0]["content"] for r in slow_model.requests)
    assert time.time() > first_model_plan  # sanity: timestamps are wall-clock seconds


def test_plan_command_shows_evidence_and_stats_predict_reports(make_repo, daemon_factory) -> None:
    """`plan` shows each path's evidence; a text naming nothing is an ambiguous claim and the log says so;
    an undeclared job is planned from local evidence, and `stats predict` compares claim and actual."""
    repo = make_repo("r", {"src/api.py": "def serve():\n    pass\n", "tests/test_api.py": "x\n", "README.md": "r\n"})
    d = daemon_factory().start()
    shown = d.cli_json("plan", "--repo", str(repo), "refactor src/api.py")
    assert {e["path"]: e["kind"] for e in shown["evidence"]}["src/api.py"] == "named"
    ranked = {r["path"]: r for r in shown["ranking"]}
    assert ranked["src/api.py"]["claimed"]
    assert any("naming convention" in w for w in ranked["tests/test_api.py"]["why"])
    assert shown["claim"]["source"] == "evidence"
    vague = d.cli_json("plan", "--repo", str(repo), "make it faster")
    assert vague["claim"]["paths"] == [] and vague["notes"][0]["code"] == "NamesNothing"
    named = d.enqueue(repo, "echo more >> src/api.py  # edit src/api.py")
    nothing = d.enqueue(repo, "true  # tidy up")
    out = d.cli("wait", str(named), str(nothing), "--timeout", "60")
    assert out.returncode == 5, out.stderr  # the tidy-up changed nothing: not reported as a success
    assert d.cli_json("show", str(nothing))["state"] == "unchanged"
    events = d.events()
    notes = [e for e in events if e.get("event") == "plan.note" and e.get("code") == "NamesNothing"]
    assert [e["job_id"] for e in notes] == [nothing]
    stats = d.cli_json("stats", "predict", "--repo", str(repo))
    row = stats["repos"][str(repo.resolve())]["all"]
    # Three commits are no record: the claim's risk is unknown, so it ran alone and counts as not confident.
    assert row["jobs"] == 1 and row["confident"] == 0


def test_plan_without_a_daemon_plans_in_process(make_repo, daemon_factory) -> None:
    """With no daemon running, `plan` plans in this process with the configured planner: the same claim and
    evidence as the daemon's, a note on stderr, stdout still the JSON; a bad repository is a clear refusal."""
    repo = make_repo("r", {"src/api.py": "def serve():\n    pass\n", "tests/test_api.py": "x\n", "README.md": "r\n"})
    d = daemon_factory()  # never started
    out = d.cli("plan", "--repo", str(repo), "refactor src/api.py", "--json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert {e["path"]: e["kind"] for e in shown["evidence"]}["src/api.py"] == "named"
    assert shown["base"] == git(repo, "rev-parse", "HEAD") and "no daemon running" in out.stderr
    missing = d.cli("plan", "--repo", str(repo / "nowhere"), "x")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert not d.socket.exists(), "nothing started a daemon"


def test_plan_says_a_short_report_naming_no_file_runs_apart(make_repo, daemon_factory) -> None:
    """An issue's title that names no file (`serve fails when ...`) is planned apart: `plan` shows its claim as the
    whole repository and the note that says why and what to name instead."""
    repo = make_repo("r", {"src/api.py": "def serve():\n    pass\n", "tests/test_api.py": "x\n", "README.md": "r\n"})
    out = daemon_factory().cli("plan", "--repo", str(repo), "serve fails when the port is already taken")
    assert out.returncode == 0, out.stderr
    said = out.stdout + out.stderr
    assert "claim       / (the whole repository)" in said
    assert "note: Apart: the text reports what is wrong, not what to change" in said and "Paths:" in said
