"""`orchestrator revise`: a ready job goes back to its agent with review feedback, in the same worktree and on the
same branch, holding its paths throughout, and comes back ready (or lands) with both rounds' work."""

from __future__ import annotations

from pathlib import Path

from orchestrator.lab.doubles.anthropic import tool_use_message
from tests.conftest import git
from tests.doubles import anthropic_double
from tests.harness import until


def _state(d, job: int) -> str:
    return d.cli_json("show", str(job))["state"]


def test_revise_sends_a_ready_agent_job_back_with_feedback_and_it_goes_on(make_repo, daemon_factory):
    """The built-in agent resumes its conversation with the feedback as the next turn; the second round's change
    goes on top of the first on its branch; the job is ready again, keeps its paths, and lands both rounds;
    an empty feedback or a job that is not ready is refused, saying why."""
    repo = make_repo()
    script = [
        tool_use_message("edit_file", {"path": "src/a.py", "old": "a = 1", "new": "a = 2"}),
        tool_use_message("done", {"summary": "set a to 2"}),
        tool_use_message("write_file", {"path": "src/c.py", "content": "c = 3\n"}),
        tool_use_message("done", {"summary": "added c too"}),
    ]
    with anthropic_double(script) as double:
        d = daemon_factory(env={"ANTHROPIC_BASE_URL": double.url, "ANTHROPIC_API_KEY": "", "MAX_CONCURRENT_JOBS": "4"})
        d.start()
        job = d.enqueue(repo, "Set a to 2", "--runner", "claude", "--path", "src/", "--land", "review")
        until("ready", lambda: _state(d, job) == "ready")
        first = d.cli_json("show", str(job))["result"]
        refused = d.cli("revise", str(job), "")
        assert refused.returncode == 2 and "feedback is empty" in refused.stderr
        out = d.cli("revise", str(job), "Also add src/c.py with c = 3")
        assert out.returncode == 0, out.stderr
        assert "revision 1" in out.stderr
        waiter = d.enqueue(repo, "echo 9 > src/b.py", "--path", "src/b.py")
        until("ready again", lambda: _state(d, job) == "ready" and d.cli_json("show", str(job))["revisions"] == 1)
        assert _state(d, waiter) == "planned", "its paths stayed taken while it was revised"
        assert d.cli_json("why", str(waiter))["decision"]["blocking"] == [job]
    shown = d.cli_json("show", str(job))
    diff = d.cli("diff", str(job)).stdout
    assert "+a = 2" in diff and "+c = 3" in diff
    assert [e["feedback"] for e in shown["events"] if e["kind"] == "revised"] == ["Also add src/c.py with c = 3"]
    assert shown["usage"]["calls"] == 4 and shown["usage"]["runs"] == 2, "usage of both rounds"
    # The conversation went on: round two's first request holds round one and then the feedback.
    resumed = double.requests[2]["messages"]
    assert resumed[0]["content"].startswith("Task:\nSet a to 2") and len(resumed) == 5
    assert resumed[-1]["content"][-1] == {"type": "text", "text": "Also add src/c.py with c = 3"}
    assert resumed[-1]["content"][0]["type"] == "tool_result", "the `done` call it ended on is answered"
    assert d.cli("land", str(job)).returncode == 0
    assert d.cli("wait", str(job), str(waiter), "--timeout", "60").returncode == 0
    assert git(repo, "show", "main:src/a.py") == "a = 2" and git(repo, "show", "main:src/c.py") == "c = 3"
    # In the repository once it landed (not before: a result waits in its workspace until then).
    assert git(repo, "rev-parse", f"{shown['result']}^") == first, "round two goes on top of round one"
    subjects = git(repo, "log", "-2", "--format=%s", shown["result"]).splitlines()
    assert subjects == ["Also add src/c.py with c = 3", "Set a to 2"], "the revision's commit has its own subject"
    assert f"Revises job {job}: Set a to 2" in git(repo, "log", "-1", "--format=%b", shown["result"])
    assert not git(repo, "branch", "--list", f"orchestrator/{job}-kept-*"), "nothing set aside"
    out = d.cli("revise", str(job), "more please")
    assert out.returncode == 2 and f"job {job} is landed; only a ready job, or a failed or interrupted" in out.stderr


def test_a_failed_job_is_revised_through_admission_and_survives_kill_9_in_its_kept_worktree(
    make_repo, daemon_factory, tmp_path
):
    """A failed job sent back with feedback asks admission again (it waits while another job holds its paths), keeps
    its base and worktree, and lands both rounds without undoing what its branch got meanwhile; a kill -9 while it
    waits leaves it waiting with its feedback, one while it runs leaves it interrupted and revisable again; a job
    that failed with no worktree is told to retry."""
    from tests.test_crash_recovery import restart

    repo = make_repo(files={"a.txt": "base\n", "b.txt": "b\n"})
    hold, go = tmp_path / "hold", tmp_path / "go"
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "4"}, process=True).start()
    # Round one writes half its work and fails; a revision appends the feedback, waiting for `go` first.
    script = (
        'if [ -z "$ORCHESTRATOR_FEEDBACK" ]; then echo half >> a.txt; exit 3; fi\n'
        f'echo "$ORCHESTRATOR_FEEDBACK" >> a.txt; while [ ! -e {go} ]; do sleep 0.05; done'
    )
    job = d.enqueue(repo, script, "--path", "a.txt")
    assert d.cli("wait", str(job), "--timeout", "60").returncode != 0
    failed = d.cli_json("show", str(job))
    assert failed["state"] == "failed" and failed["worktree"], failed["reason"]
    assert "orchestrator revise" in d.cli_json("why", str(job))["next"]
    orphan = d.enqueue(repo, "true", "--path", "b.txt", "--after", str(job))
    until("the dependent failed", lambda: d.cli_json("show", str(orphan))["state"] == "failed")
    out = d.cli("revise", str(orphan), "try again")
    assert out.returncode == 2 and "no worktree kept" in out.stderr and f"orchestrator retry {orphan}" in out.stderr
    # The branch moves meanwhile (outside the job's claim), and another job now holds a.txt.
    (repo / "b.txt").write_text("the user's b\n")
    git(repo, "commit", "-qam", "the user's change")
    holder = d.enqueue(repo, f"while [ ! -e {hold} ]; do sleep 0.05; done", "--path", "a.txt")
    until("the holder runs", lambda: d.cli_json("show", str(holder))["state"] == "running")

    out = d.cli("revise", str(job), "first feedback")
    assert out.returncode == 0 and "waits for admission" in out.stderr, out.stderr
    until("it waits on the holder", lambda: (d.cli_json("why", str(job))["decision"] or {}).get("blocking"))
    why = d.cli_json("why", str(job))
    assert why["state"] == "planned" and why["decision"]["reason"] == "Overlap" and why["decision"]["blocking"] == [
        holder
    ]
    d.kill()  # while it waits for admission
    d2 = restart(daemon_factory, d, "second")
    until("the revision runs after the restart", lambda: d2.cli_json("show", str(job))["state"] == "running")
    until("round two wrote", lambda: "first feedback" in (Path(failed["worktree"]) / "a.txt").read_text())
    d2.kill()  # while its revision runs
    d3 = restart(daemon_factory, d2, "third")
    cut = d3.cli_json("show", str(job))
    assert cut["state"] == "interrupted" and cut["feedback"] == "first feedback" and cut["worktree"]
    assert d3.cli("revise", str(job), "second feedback").returncode == 0
    go.touch()
    assert d3.cli("wait", str(job), "--timeout", "60").returncode == 0
    shown = d3.cli_json("show", str(job))
    assert shown["state"] == "landed" and shown["base"] == failed["base"] and shown["worktree"] == failed["worktree"]
    assert shown["revisions"] == 2 and shown["feedback"] == ""
    assert git(repo, "show", "main:a.txt").splitlines() == ["base", "half", "first feedback", "second feedback"]
    assert git(repo, "show", "main:b.txt") == "the user's b", "landed by a merge from its own base: nothing undone"
    kinds = [(e["kind"], e.get("from")) for e in shown["events"] if e["kind"] in ("revised", "interrupted")]
    assert kinds == [("revised", "failed"), ("interrupted", None), ("revised", "interrupted")]
    hold.touch()
