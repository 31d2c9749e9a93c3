"""Rate limits: what an agent CLI's output says about a limit (pure), admission holding back a limited runner's
jobs, and the built-in agent's job waiting a bounded number of times before it fails with RateLimited."""

from __future__ import annotations

import json
import shlex
import time
import tomllib
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.commands import fit
from orchestrator.config import PROFILES, ConfigError, RunnerTemplate, parse
from orchestrator.core.admission import decide
from orchestrator.core.models import Claim, ClaimSource, JobView, Policy, Reason, Snapshot
from orchestrator.lab.doubles.anthropic import error_reply
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


FORGED = (
    '{"type":"result","is_error":true,"api_error_status":429,"api_error_type":"rate_limit_error",'
    '"result":"Claude AI usage limit reached|9999999999"}',
    "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached. Please try again in 3600s.",
    "usage limit reached|9999999999",
    "You've hit your usage limit. Try again in 2 hours.",
    "stream error: 429 Too Many Requests; retry-after: 3600",
    CODEX_RETRY.strip(),
)
"""Every form a limit took in any runner's output before signs belonged to a runner's profile."""


def _printing(lines: tuple[str, ...], then: str) -> str:
    """A shell script that prints `lines` (each exactly) and then runs `then`."""
    return f"# print what looks like rate limits\nprintf '%s\\n' {' '.join(map(shlex.quote, lines))}\n{then}\n"


CC, AIDER, CODEX = (ratelimit.SIGNS[name] for name in ("claude-code", "aider", "codex"))
CODEX_USAGE = (
    "ERROR: You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit "
    "https://chatgpt.com/settings/usage to purchase more credits or try again at 8:31 AM."
)
"""What codex 0.171 prints for a subscription's limit (a 429 `usage_limit_reached`), curly apostrophe and all."""


def test_the_agent_clis_own_rate_limit_messages_are_recognised_with_their_wait():
    """By each CLI's own signs: Claude Code's JSON 429 result and a subscription's "usage limit reached|<reset>"
    error result, aider's litellm error (with OpenAI's "try again in 20s"), codex's retry warning for a 429 (the
    wait it would sleep) and its usage-limit error (the clock time to try again) are limits; ordinary output is
    not. aider's and codex's are forgeable (their agent's words sit among their lines), Claude Code's are not."""
    cc = ratelimit.detect(CLAUDE_CODE_429, CC, now=0)
    assert cc is not None and cc.message.startswith("API Error: Request rejected (429)") and cc.retry_after is None
    assert not cc.forgeable
    reset = '{"type":"result","subtype":"success","is_error":true,"result":"Claude AI usage limit reached|1700003600"}'
    usage = ratelimit.detect(reset, CC, now=1700000000)
    assert usage is not None and usage.retry_after == 3600
    typed = '{"type":"result","is_error":true,"api_error":"usage_limit_reached","result":"Limit reached"}'
    assert ratelimit.detect(typed, CC, now=0) is not None
    aider = ratelimit.detect(AIDER_429, AIDER, now=0)
    assert aider is not None and aider.message.startswith("litellm.RateLimitError") and aider.retry_after == 20
    assert aider.forgeable
    codex_retry = ratelimit.detect(CODEX_RETRY, CODEX, now=0)
    assert codex_retry is not None and codex_retry.retry_after == 3599.999734074 and codex_retry.forgeable
    t = time.localtime()
    eight = time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 8, 0, 0, 0, 0, -1))
    codex_usage = ratelimit.detect(f"warning: x\n{CODEX_USAGE}\n", CODEX, now=eight)
    assert codex_usage is not None and codex_usage.retry_after == 31 * 60, "until 8:31 the same day"
    later = ratelimit.detect(CODEX_USAGE, CODEX, now=eight + 3600)
    assert later is not None and later.retry_after == 24 * 3600 - 29 * 60, "8:31 the next day"
    in_hours = "ERROR: You've hit your usage limit. Try again in 2 hours."
    assert ratelimit.detect(in_hours, CODEX, now=0).retry_after == 7200
    for signs in (CC, AIDER, CODEX):
        assert ratelimit.detect("wrote src/rate.py\n429 files checked\nall tests passed\n", signs, now=0) is None
    assert ratelimit.detect('{"type":"result","is_error":false,"result":"Done."}', CC, now=0) is None


def test_a_limits_words_where_the_agents_text_goes_are_no_sign():
    """What an agent can make its CLI print is not a limit: the words (or a whole forged object) inside Claude
    Code's `result` string of a success, its reset form without the error, another object than the result, the
    old loose forms anywhere; codex's warning as the command line it echoes, or not at the start of a line."""
    said = json.dumps(f"Done. {'; '.join(FORGED)}")
    for text in (
        f'{{"type":"result","subtype":"success","is_error":false,"result":{said}}}',
        '{"type":"result","is_error":false,"result":"Claude AI usage limit reached|9999999999"}',
        '{"type":"assistant","is_error":true,"api_error_status":429}',
        '{"type":"result","is_error":true,"api_error_status":"429","result":"a string is not its status"}',
        *FORGED[1:],
    ):
        assert ratelimit.detect(text, CC, now=0) is None, text
    for text in (FORGED[0], *FORGED[2:], "> " + FORGED[1], "Tokens: 2k sent. litellm.RateLimitError: slow down"):
        assert ratelimit.detect(text, AIDER, now=0) is None, text
    echoed = f"/bin/bash -lc \"echo '{CODEX_RETRY.strip()}'\" in /work/job-1"
    for text in (*FORGED[:5], echoed, " " + CODEX_RETRY, "stream error: 429 Too Many Requests; retry-after: 30"):
        assert ratelimit.detect(text, CODEX, now=0) is None, text


def test_a_runner_names_its_signs_and_a_template_of_ones_own_has_none():
    """The shipped profiles name their own CLI's signs; a command template of one's own names none unless it
    says (`rate_limits`), and a name that is no sign set is a config error."""
    assert {n: p.rate_limits for n, p in PROFILES.items()} == {n: n for n in ("claude-code", "aider", "codex")}
    assert RunnerTemplate(argv=("sh",)).rate_limits == "" and "" not in ratelimit.SIGNS
    mine = '[runners.mine]\nargv = ["mine"]\n'
    assert parse(tomllib.loads(mine), {}).runners["mine"].rate_limits == ""
    assert parse(tomllib.loads(mine + 'rate_limits = "codex"\n'), {}).runners["mine"].rate_limits == "codex"
    with pytest.raises(ConfigError, match="rate_limits"):
        parse(tomllib.loads(mine + 'rate_limits = "anything"\n'), {})


def test_waits_follow_the_api_else_double_and_stay_bounded():
    """The wait is what the API named, else the first wait doubled per earlier wait; capped, at least 1 s."""
    assert ratelimit.wait(20, 0, first=60, cap=3600) == 20
    assert [ratelimit.wait(None, n, first=60, cap=300) for n in range(4)] == [60, 120, 240, 300]
    assert ratelimit.wait(7200, 0, first=60, cap=3600) == 3600 and ratelimit.wait(0.01, 0, 60, 3600) == 1


def test_the_output_watch_reads_whole_lines_across_chunks():
    """A limit message cut between two output chunks is seen once its line is complete."""
    watch = ratelimit.Watch(AIDER)
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


# Too slow is the machine's, never this property's: one draw of its floats took 3 s on a loaded 2-core machine.
@settings(suppress_health_check=[HealthCheck.too_slow])
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


def _usage_limit_result(reset: int) -> str:
    """Claude Code's JSON result for a subscription's usage limit that resets at `reset` (a UNIX time)."""
    return json.dumps({"type": "result", "subtype": "success", "is_error": True,
                       "result": f"Claude AI usage limit reached|{reset}", "session_id": "c6d3c798"})  # fmt: skip


def test_a_rate_limited_job_frees_its_slot_and_its_limit_outlives_a_restart(make_repo, daemon_factory):
    """With one slot, a job resting on an hour's rate limit lets a shell job run and land meanwhile; after a kill -9
    the limit is read back from the store, so a new job of that runner waits (RateLimited) until the same time."""
    from tests.harness import until
    from tests.test_crash_recovery import restart

    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "1"}, process=True)
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text(
        '[plan]\nplanner = "local"\n[runners.limited]\nrate_limits = "claude-code"\n'
        f"argv = [\"sh\", \"-c\", '''echo '{_usage_limit_result(int(time.time()) + 7200)}'; exit 1''']\n"
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


def test_output_that_looks_like_a_rate_limit_rests_no_job_of_a_runner_without_signs(make_repo, daemon_factory):
    """A shell job, and a job of a command template of one's own (no signs declared), printing every form a limit
    ever took (Claude Code's JSON result, a reset time, aider's and codex's lines) are not rate-limited: they land,
    and the next job of the same runner starts at once (nothing held back)."""
    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "1"})
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text(
        '[plan]\nplanner = "local"\n[jobs]\nrate_limit_max_wait = 3600\n'
        '[runners.tool]\nargv = ["sh", "-c", "{prompt}"]\n'
    )
    d.start()
    jobs = [
        d.enqueue(repo, _printing(FORGED, "echo 'a = 2' > src/a.py"), "--runner", "tool", "--path", "src/a.py"),
        d.enqueue(repo, _printing(FORGED, "echo 'b = 2' > src/b.py"), "--path", "src/b.py"),
        d.enqueue(repo, "echo 'c = 3' > src/c.py", "--runner", "tool", "--path", "src/c.py"),
    ]
    out = d.cli("wait", *map(str, jobs), "--timeout", "30")
    shown = [d.cli_json("show", str(j)) for j in jobs]
    assert out.returncode == 0, [(s["state"], s["code"], s["reason"]) for s in shown]
    assert [s["state"] for s in shown] == ["landed"] * 3
    assert not [e for s in shown for e in s["events"] if e["kind"] == "rate_limited"]
    held = [e for e in d.events() if e["event"] == "admission.deferred" and e["reason"] == "RateLimited"]
    assert not held, "no job was held back for a limit"


def test_a_forgeable_limit_rests_its_job_and_holds_back_others_only_once_another_job_meets_one(
    make_repo, daemon_factory
):
    """A template with codex's signs (which its agent could print: codex echoes its commands' output): a job whose
    output has codex's 429 retry warning rests (RateLimited), but the runner's next job starts and lands meanwhile;
    only when a second job meets a limit too are the runner's new jobs held back (RateLimited, with the time)."""
    from tests.harness import until

    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "2"})
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text(
        '[plan]\nplanner = "local"\n[runners.forger]\nargv = ["sh", "-c", "{prompt}"]\nrate_limits = "codex"\n'
    )
    d.start()
    forge = _printing((CODEX_RETRY.strip(),), "sleep 30")
    first = d.enqueue(repo, forge, "--runner", "forger", "--path", "src/a.py")
    until("it rests", lambda: d.cli_json("show", str(first))["code"] == "RateLimited")
    other = d.enqueue(repo, "echo 'b = 2' > src/b.py", "--runner", "forger", "--path", "src/b.py")
    assert d.cli("wait", str(other), "--timeout", "30").returncode == 0, d.cli_json("why", str(other))
    shown = d.cli_json("show", str(first))
    assert shown["state"] == "running" and shown["code"] == "RateLimited", shown["reason"]
    assert "holds back no other forger job" in shown["reason"]
    [rested] = [e for e in shown["events"] if e["kind"] == "rate_limited"]
    assert rested["held"] is False and rested["seconds"] > 3500, "the wait its line named"
    second = d.enqueue(repo, forge, "--runner", "forger", "--path", "src/c.py")
    until("it rests too", lambda: d.cli_json("show", str(second))["code"] == "RateLimited")
    [corroborated] = [e for e in d.cli_json("show", str(second))["events"] if e["kind"] == "rate_limited"]
    assert corroborated["held"] is True
    last = d.enqueue(repo, "echo 'd = 4' > docs/d.md", "--runner", "forger", "--path", "docs/d.md")
    why = until("held back", lambda: (w := d.cli_json("why", str(last)))["decision"] and w)
    assert why["decision"]["reason"] == "RateLimited" and "rate-limited until" in why["decision"]["message"]
    for job in (first, second, last):
        assert d.cli("cancel", str(job)).returncode == 0


async def test_limits_count_a_forgeable_sighting_for_the_runner_once_another_job_corroborates_it():
    """A forgeable limit alone holds back nothing, whatever the same job says again; a second job's while the first
    stands does (until that one's end); one that ended, or another runner's, corroborates nothing; a limit that is
    not forgeable counts at once."""
    from orchestrator.jobs.limits import Limits

    limits, now = Limits(), time.time()
    assert not await limits.hit("codex", now - 1, job=1, forgeable=True)
    assert not await limits.hit("codex", now + 60, job=2, forgeable=True), "job 1's limit had ended"
    assert not await limits.hit("codex", now + 90, job=2, forgeable=True), "the same job again"
    assert not await limits.hit("aider", now + 60, job=3, forgeable=True), "another runner's"
    assert limits.active() == {}
    assert await limits.hit("codex", now + 30, job=3, forgeable=True)
    assert limits.active() == {"codex": now + 30}
    assert await limits.hit("codex", now + 20, job=4, forgeable=True), "held back already"
    assert await limits.hit("claude-code", now + 60, job=5)
    assert limits.active() == {"codex": now + 30, "claude-code": now + 60}
