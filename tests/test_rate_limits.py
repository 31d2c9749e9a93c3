"""Rate limits: what an agent CLI's output says about a limit (pure), admission holding back a limited runner's
jobs, and the built-in agent's job waiting a bounded number of times before it fails with RateLimited."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.commands import fit
from orchestrator.core.admission import decide
from orchestrator.core.models import Claim, ClaimSource, JobView, Policy, Reason, Snapshot
from orchestrator.doubles.anthropic import error_reply
from orchestrator.runners import ratelimit
from tests.doubles import anthropic_double

CLAUDE_CODE_429 = (
    '{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"api_error_type":"rate_limit_error",'
    '"result":"API Error: Request rejected (429) · Number of request tokens has exceeded your per-minute rate limit",'
    '"session_id":"c6d3c798"}'
)
AIDER_429 = """litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached for
gpt-double in organization org-x on tokens per min (TPM): Limit 10000, Used 10000, Requested 500. Please
try again in 20s.
The API provider has rate limited you. Try again later or check your quotas.
Retrying in 0.2 seconds...
"""


CODEX_RETRY = (
    "2026-12-02T03:13:53.616584Z  WARN codex_core::responses_retry: stream disconnected - retrying sampling request "
    "(1/5 in 3599.999734074s)... turn_id=01a234be retries=1 max_retries=5 sampling_error=exceeded retry limit, last "
    "status: 429 Too Many Requests\n"
)
"""What codex 0.171 prints (with the profile's RUST_LOG) on a 429 with `retry-after: 3600`, before it would sleep."""


def test_the_agent_clis_own_rate_limit_messages_are_recognised_with_their_wait():
    """Claude Code's JSON 429 result, aider's litellm error (with OpenAI's "try again in 20s"), a subscription's
    "usage limit reached|<reset>", codex's 429 (and the wait in its retry warning) and a retry-after are limits;
    ordinary output is not."""
    cc = ratelimit.detect(CLAUDE_CODE_429, now=0)
    assert cc is not None and cc.message.startswith("API Error: Request rejected (429)") and cc.retry_after is None
    aider = ratelimit.detect(AIDER_429, now=0)
    assert aider is not None and aider.message.startswith("litellm.RateLimitError") and aider.retry_after == 20
    usage = ratelimit.detect("Claude AI usage limit reached|1700003600", now=1700000000)
    assert usage is not None and usage.retry_after == 3600
    codex = ratelimit.detect("stream error: 429 Too Many Requests; retry-after: 30", now=0)
    assert codex is not None and codex.retry_after == 30
    assert ratelimit.detect("you've hit your usage limit. try again in 2 hours", now=0).retry_after == 7200
    codex_retry = ratelimit.detect(CODEX_RETRY, now=0)
    assert codex_retry is not None and codex_retry.retry_after == 3599.999734074
    assert ratelimit.detect("wrote src/rate.py\n429 files checked\nall tests passed\n", now=0) is None
    assert ratelimit.detect('{"type":"result","is_error":false,"result":"Done."}', now=0) is None


def test_waits_follow_the_api_else_double_and_stay_bounded():
    """The wait is what the API named, else the first wait doubled per earlier wait; capped, at least 1 s."""
    assert ratelimit.wait(20, 0, first=60, cap=3600) == 20
    assert [ratelimit.wait(None, n, first=60, cap=300) for n in range(4)] == [60, 120, 240, 300]
    assert ratelimit.wait(7200, 0, first=60, cap=3600) == 3600 and ratelimit.wait(0.01, 0, 60, 3600) == 1


def test_the_output_watch_reads_whole_lines_across_chunks():
    """A limit message cut between two output chunks is seen once its line is complete."""
    watch = ratelimit.Watch()
    assert not watch(b"working...\nlitellm.RateLimi")
    assert watch(b"tError: slow down\n") and "RateLimitError" in watch.seen


def _view(job_id: int, path: str, runner: str) -> JobView:
    claim = Claim(frozenset({path}), 0.9, ClaimSource.DECLARED)
    return JobView(job_id, "/r", "main", claim, runner=runner)


def test_a_limited_runners_jobs_wait_with_the_time_they_start_and_others_do_not():
    """While claude-code's API is limited its new jobs wait (RateLimited, with the time); a shell job starts."""
    cc, sh = _view(1, "a.py", "claude-code"), _view(2, "b.py", "shell")
    snap = Snapshot(waiting=(cc, sh), limited={"claude-code": 1_700_000_000.0}, policy=Policy(max_concurrent=4))
    held = decide(cc, snap)
    assert held.reason is Reason.RATE_LIMITED and "rate-limited until" in held.message
    assert held.next.startswith("starts by itself after")
    assert decide(sh, snap).admitted


def test_a_job_resting_on_a_rate_limit_holds_its_paths_but_no_slot():
    """An active job waiting for its limit to end takes no slot (global or per repo): a job beside it starts in a
    full daemon; its paths stay held, so a job overlapping them still waits (Overlap, not Concurrency)."""
    resting = replace(_view(1, "a.py", "claude-code"), resting=True)
    other, overlapping = _view(2, "b.py", "shell"), _view(3, "a.py", "shell")
    full = Policy(max_concurrent=1, per_repo=1)
    snap = Snapshot(active=(resting,), waiting=(other, overlapping), policy=full)
    assert decide(other, snap).admitted
    held = decide(overlapping, snap)
    assert held.reason is Reason.OVERLAP and held.blocking == (1,)
    busy = Snapshot(active=(replace(resting, resting=False),), waiting=(other,), policy=full)
    assert decide(other, busy).reason is Reason.CONCURRENCY


@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), st.floats(0, 100)), st.sampled_from(["a", "b", "c"]),
       st.floats(0, 100), st.floats(0, 100))  # fmt: skip
def test_a_known_limit_stands_until_a_longer_one_and_ends_at_its_time(known, runner, until, now):
    """A new limit counts only when it ends later than the one known; those in force at a time are exactly those
    ending after it."""
    assert ratelimit.extends(known, runner, until) == (until > known.get(runner, 0.0))
    standing = ratelimit.standing(known, now)
    assert standing == {r: t for r, t in known.items() if t > now}


def test_the_status_summary_counts_running_jobs_that_wait_for_a_rate_limit():
    """`status` and `watch` say how many running jobs are waiting for their model API's limit to end."""
    jobs = [{"state": "running", "code": "RateLimited"}, {"state": "running", "code": "Admitted"},
            {"state": "planned", "code": "RateLimited"}]  # fmt: skip
    assert fit.summary(jobs) == "2 running (1 RateLimited), 1 waiting: 1 RateLimited"


def test_the_built_in_agent_waits_for_a_long_rate_limit_then_fails_when_it_lasts(make_repo, daemon_factory):
    """A 429 with an hour's retry-after: the job waits (capped, still running, event rate_limited), runs again,
    and once its waits are spent it fails with code RateLimited, not ModelUnavailable."""
    repo = make_repo()
    with anthropic_double(lambda _: error_reply(429, "rate limit exceeded", retry_after=3600)) as double:
        d = daemon_factory(env={"ANTHROPIC_BASE_URL": double.url, "ANTHROPIC_API_KEY": ""})
        (d.home / "config").mkdir(parents=True)
        (d.home / "config" / "config.toml").write_text("[jobs]\nrate_limit_waits = 1\nrate_limit_max_wait = 1\n")
        d.start()
        job = d.enqueue(repo, "Set a to 2", "--runner", "claude", "--path", "src/a.py")
        assert d.cli("wait", str(job), "--timeout", "60").returncode == 1
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "failed" and shown["code"] == "RateLimited", shown["reason"]
    assert "still limited after 1 waits" in shown["reason"]
    waited = [e for e in shown["events"] if e["kind"] == "rate_limited"]
    assert [(e["seconds"], e["wait"]) for e in waited] == [(1, 1)], "the hour asked for was capped"
    assert len(double.requests) == 2, "one call per run: the client did not retry against the limit"


def test_a_rate_limited_job_frees_its_slot_and_its_limit_outlives_a_restart(make_repo, daemon_factory):
    """With one slot, a job resting on an hour's rate limit lets a shell job run and land meanwhile; after a kill -9
    the limit is read back from the store, so a new job of that runner waits (RateLimited) until the same time."""
    import time

    from tests.harness import until
    from tests.test_crash_recovery import restart

    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "1"})
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text(
        '[plan]\nplanner = "local"\n[runners.limited]\n'
        "argv = [\"sh\", \"-c\", \"echo 'stream error: 429 Too Many Requests; retry-after: 3600'; exit 1\"]\n"
    )
    d.start()
    limited = d.enqueue(repo, "Set a to 2", "--runner", "limited", "--path", "src/a.py")
    until("it rests", lambda: d.cli_json("show", str(limited))["code"] == "RateLimited")
    other = d.enqueue(repo, "echo 'b = 2' > src/b.py", "--path", "src/b.py")
    assert d.cli("wait", str(other), "--timeout", "30").returncode == 0, d.cli_json("why", str(other))
    shown = d.cli_json("show", str(limited))
    assert shown["state"] == "running" and shown["code"] == "RateLimited", "it still rests, holding src/a.py"
    [rested] = [e for e in shown["events"] if e["kind"] == "rate_limited"]
    assert rested["seconds"] == 3600
    d.kill()
    d2 = restart(daemon_factory, d, "second")
    assert d2.cli_json("show", str(limited))["state"] == "interrupted"
    again = d2.enqueue(repo, "Set x", "--runner", "limited", "--path", "docs/x.md")
    why = until("it waits for the limit", lambda: (w := d2.cli_json("why", str(again)))["decision"] and w)
    at = time.strftime("%H:%M:%S", time.localtime(rested["until"]))
    assert why["decision"]["reason"] == "RateLimited" and f"rate-limited until {at}" in why["decision"]["message"]
