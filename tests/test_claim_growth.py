"""Claims that grow while a job runs: the growth decision (pure, through admission), and the real daemon
keeping the next job away from a grown claim, and the built-in agent told a path is held before it writes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import admission, claims, growth
from orchestrator.core.job import Job
from orchestrator.core.models import Claim, ClaimSource, JobState, JobView, Policy, Reason, Risk, Snapshot
from orchestrator.lab.doubles.anthropic import tool_use_message
from tests.conftest import git
from tests.doubles import anthropic_double
from tests.harness import until
from tests.test_e2e_jobs import wait_for_file

POLICY = Policy(max_concurrent=4)


def _view(job_id: int, *paths: str, actual: tuple[str, ...] = (), repo: str = "/r") -> JobView:
    return JobView(job_id, repo, "main", Claim(frozenset(paths), 0.9, ClaimSource.DECLARED), frozenset(actual))


def test_paths_outside_the_claim_grow_it_when_no_active_job_holds_them():
    """A running job's write outside its claim is admitted as growth when no other active job holds the path."""
    g = growth.decide(_view(1, "src/a.py"), {"src/a.py", "docs/new.md"}, [_view(2, "src/b.py")], POLICY)
    assert g.paths == {"docs/new.md"} and g.grows and g.held_by == ()


def test_growth_into_what_another_job_claims_or_touched_is_refused_and_names_it():
    """Growth meeting another active job's claim, or its actual paths, is refused with Overlap naming that job."""
    others = [_view(2, "src/b.py"), _view(3, "docs/", actual=("tests/t.py",)), _view(4, "x.py", repo="/other")]
    g = growth.decide(_view(1, "src/a.py"), {"src/b.py", "tests/t.py", "x.py"}, others, POLICY)
    assert not g.grows and g.decision is not None and g.decision.reason is Reason.OVERLAP
    assert g.held_by == (2, 3), "another repository's job holds nothing here"


def test_growth_leaves_union_merged_files_and_what_the_claim_holds_out():
    """A changelog or a path under a claimed directory is no growth: nothing to ask."""
    g = growth.decide(_view(1, "src/"), {"src/deep/x.py", "CHANGES.md"}, [_view(2, "CHANGES.md")], POLICY)
    assert g.paths == frozenset() and not g.grows


def test_growth_into_a_barrier_beside_other_jobs_is_refused():
    """A running job that reaches a barrier path while others run is serialised with them (Barrier)."""
    policy = Policy(max_concurrent=4, barriers=("uv.lock",))
    g = growth.decide(_view(1, "src/a.py"), {"uv.lock"}, [_view(2, "src/b.py")], policy)
    assert not g.grows and g.decision is not None and g.decision.reason is Reason.BARRIER and g.held_by == (2,)


def test_a_risk_estimate_of_what_another_job_might_touch_is_no_holding():
    """Growth beside a job whose estimate says it may touch the path (risk over `plan.risk`) is still admitted:
    only what the others claim or touched holds a path."""
    risky = Risk(near=(("docs/x.md", 0.9),), rest=0.01, area="docs/")
    other = JobView(2, "/r", "main", Claim(frozenset({"docs/y.md"}), 0.8, ClaimSource.EVIDENCE, risky))
    policy = Policy(max_concurrent=4, risk=0.03)
    probe = JobView(3, "/r", "main", Claim(frozenset({"docs/x.md"}), 1.0, ClaimSource.DECLARED))
    assert admission.decide(probe, Snapshot(active=(other,), policy=policy)).reason is Reason.RISK
    g = growth.decide(_view(1, "src/a.py"), {"docs/x.md"}, [other], policy)
    assert g.grows and g.held_by == ()
    assert growth.held("docs/x.md", _view(1, "src/a.py"), [other], policy) is None


def test_a_grown_claim_is_what_admission_holds_for_the_next_job():
    """The job's `grown` paths join its claim in admission's view, so a later job claiming one waits (Overlap)."""
    claim = Claim(frozenset({"src/a.py"}), 0.9, ClaimSource.DECLARED)
    running = Job(1, "/r", "main", "t", "shell", JobState.RUNNING, claim=claim, grown=frozenset({"docs/x.md"}))
    waiting = _view(2, "docs/x.md")
    d = admission.decide(waiting, Snapshot(active=(running.view(),), waiting=(waiting,), policy=POLICY))
    assert d.reason is Reason.OVERLAP and d.blocking == (1,)
    assert running.claim.paths == {"src/a.py"}, "the plan's own claim (what calibration measures) is unchanged"


PATHS = st.sampled_from(["src/a.py", "src/b.py", "src/", "docs/x.md", "docs/", "README.md", "t/*.py", "t/u.py"])


@settings(max_examples=300, deadline=None)
@given(
    mine=st.frozensets(PATHS, min_size=1, max_size=3),
    touched=st.frozensets(PATHS, max_size=4),
    others=st.lists(
        st.tuples(st.frozensets(PATHS, min_size=1, max_size=3), st.frozensets(PATHS, max_size=2)), max_size=3
    ),
)
def test_growth_is_admitted_only_when_no_other_active_job_meets_the_new_paths(mine, touched, others):
    """Property: growth is admitted exactly when the new paths meet nothing another active job claims or touched."""
    views = [_view(i + 2, *claim, actual=tuple(actual)) for i, (claim, actual) in enumerate(others)]
    g = growth.decide(_view(1, *mine), touched, views, POLICY)
    assert g.paths == claims.outside(touched, mine)
    held = {v.id for v in views if claims.overlapping(g.paths, v.claim.paths | v.actual)}
    assert g.grows == (bool(g.paths) and not held)
    if g.paths and held:
        assert set(g.held_by) == held


def test_a_job_that_wrote_outside_its_claim_keeps_the_next_job_away_from_it(started, tmp_path):
    """Real daemon: a job writes docs/x.md outside its claim and puts it back; its claim has grown (event, `show`,
    `why`), and a later job claiming docs/x.md waits for it (Overlap) though its diff no longer holds the path."""
    repo, d = started
    gate, undo, undone = tmp_path / "gate", tmp_path / "undo", tmp_path / "undone"
    a = d.enqueue(repo, f"echo 2 > src/a.py; echo y > docs/x.md; {wait_for_file(undo)}; echo x > docs/x.md; "
                        f"touch {undone}; {wait_for_file(gate)}", "--path", "src/a.py")  # fmt: skip
    until("the claim grown", lambda: d.cli_json("show", str(a))["grown"] == ["docs/x.md"])
    undo.touch()
    until("the write undone", undone.exists)
    until("its diff no longer holds it", lambda: d.cli_json("show", str(a))["actual"] == ["src/a.py"])
    b = d.enqueue(repo, "echo z > docs/x.md", "--path", "docs/x.md")
    until("b deferred on a's grown claim", lambda: d.cli_json("show", str(b))["code"] == "Overlap")
    assert d.cli_json("why", str(b))["decision"]["blocking"] == [a]
    shown = d.cli_json("show", str(a))
    assert shown["claim"]["paths"] == ["src/a.py"] and shown["state"] == "running"
    grew = [e for e in shown["events"] if e["kind"] == "claim_grown"]
    assert grew and grew[0]["paths"] == ["docs/x.md"] and grew[0]["held_by"] == []
    assert "claim grown by: docs/x.md" in d.cli("why", str(a)).stdout
    gate.touch()
    assert d.cli("wait", str(a), str(b), "--timeout", "60").returncode == 0
    assert git(repo, "show", "main:docs/x.md") == "z" and git(repo, "show", "main:src/a.py") == "2"


def test_the_built_in_agent_is_told_a_path_is_held_before_it_writes_it(make_repo, daemon_factory, tmp_path):
    """The agent's write outside its claim into a path another running job claims is refused with that job's id;
    its own write lands, the held file is untouched by it."""
    repo = make_repo()
    gate = tmp_path / "gate"
    script = [
        tool_use_message("write_file", {"path": "src/b.py", "content": "b = 'agent'\n"}),
        tool_use_message("write_file", {"path": "src/a.py", "content": "a = 2\n"}),
        tool_use_message("done", {"summary": "set a"}),
    ]
    with anthropic_double(script) as double:
        d = daemon_factory(env={"ANTHROPIC_BASE_URL": double.url, "ANTHROPIC_API_KEY": "", "MAX_CONCURRENT_JOBS": "4"})
        d.start()
        holder = d.enqueue(repo, f"{wait_for_file(gate)}; echo 'b = 2' > src/b.py", "--path", "src/b.py")
        until("holder running", lambda: d.cli_json("show", str(holder))["state"] == "running")
        agent = d.enqueue(repo, "Set a to 2", "--runner", "claude", "--path", "src/a.py")
        assert d.cli("wait", str(agent), "--timeout", "60").returncode == 0, d.cli_json("show", str(agent))["reason"]
        gate.touch()
        assert d.cli("wait", str(holder), "--timeout", "60").returncode == 0
    refused = [b for b in double.requests[1]["messages"][-1]["content"] if b.get("type") == "tool_result"]
    assert refused[0]["is_error"] and f"job {holder}" in refused[0]["content"], refused
    assert "src/b.py is outside your claim" in refused[0]["content"]
    assert any(e["event"] == "agent.held" and e["path"] == "src/b.py" for e in d.events())
    assert git(repo, "show", "main:src/a.py") == "a = 2" and git(repo, "show", "main:src/b.py") == "b = 2"
