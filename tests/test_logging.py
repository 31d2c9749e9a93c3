"""Logs: JSON lines, a closed set of event names, journald priority, secrets masked."""

from __future__ import annotations

import io
import json
import os

from orchestrator import logging as olog


def _capture() -> io.StringIO:
    buf = io.StringIO()
    olog.configure(buf, force_json=True)
    return buf


def test_json_lines_with_bound_context():
    """Each event is one JSON object per line, with contextvars-bound job id and repo."""
    import structlog

    buf = _capture()
    structlog.contextvars.bind_contextvars(job_id=7, repo="/r")
    try:
        olog.get().info(olog.Event.JOB_STARTED, worktree="/w")
    finally:
        structlog.contextvars.clear_contextvars()
    line = json.loads(buf.getvalue().splitlines()[0])
    assert line["event"] == "job.started" and line["job_id"] == 7 and line["repo"] == "/r"
    assert line["level"] == "info" and "timestamp" in line


def test_unregistered_event_is_flagged():
    """An event outside the closed set is marked so tests catch it."""
    buf = _capture()
    olog.get().info("made.up")
    assert json.loads(buf.getvalue())["unregistered_event"] is True


def test_secrets_never_reach_the_log():
    """Keys naming a secret and values shaped like an API key are masked."""
    buf = _capture()
    olog.get().info(olog.Event.DAEMON_STARTED, api_key="abc", note="key sk-ant-api03-abcdefghijkl here")
    out = buf.getvalue()
    assert 'abc"' not in out and "sk-ant-api03" not in out and "****" in out


def test_journal_stream_detection(tmp_path):
    """JOURNAL_STREAM is honoured only when it names this very stream."""
    f = (tmp_path / "out").open("w")
    st = os.fstat(f.fileno())
    assert olog.stdout_is_journal(f, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert not olog.stdout_is_journal(f, {"JOURNAL_STREAM": "1:2"})
    assert not olog.stdout_is_journal(f, {})
    f.close()


def _line(**fields: object) -> str:
    buf = _capture()
    olog.get().info(olog.Event.DAEMON_STARTED, **fields)
    return buf.getvalue()


def test_a_known_secret_is_masked_whatever_its_shape_and_wherever_it_is():
    """The value of a secret-named environment variable is masked in any field, nested or in free text."""
    olog.register_environment({"ACME_API_TOKEN": "zq-unknown-shape-4711", "PATH": "/usr/bin", "MAX_TOKENS": "8"})
    out = _line(note="calling with zq-unknown-shape-4711 now", nested={"a": ["x", "zq-unknown-shape-4711"]})
    assert "zq-unknown-shape-4711" not in out and out.count("****") == 2


def test_an_environment_dump_has_its_secret_values_masked():
    """An env dump, as a dict or as NAME=value text, keeps names and ordinary values but masks secrets."""
    env = {"ANTHROPIC_API_KEY": "plain-but-secret", "GITHUB_TOKEN": "also-secret-1", "PATH": "/bin", "HOME": "/h"}
    out = _line(env=env, text="ANTHROPIC_API_KEY=plain-but-secret GIT_PASSWORD: hunter22 PATH=/bin")
    for secret in ("plain-but-secret", "also-secret-1", "hunter22"):
        assert secret not in out, secret
    line = json.loads(out)
    assert line["env"]["PATH"] == "/bin" and line["env"]["ANTHROPIC_API_KEY"] == "****"
    assert "PATH=/bin" in line["text"] and "ANTHROPIC_API_KEY=****" in line["text"]


def test_the_argv_of_a_command_runner_has_its_secret_options_masked():
    """An argv with --api-key VALUE, --token=VALUE or a key-shaped word is logged without them."""
    key = "sk-proj-" + "A" * 24
    argv = ["agent", "--api-key", "v4lue-xyz-123", "--token=abc123xyz", "-p", key, "--max-tokens", "8"]
    out = _line(argv=argv, command="agent --api-key v4lue-xyz-123 --token=abc123xyz")
    for secret in ("v4lue-xyz-123", "abc123xyz", "sk-proj-"):
        assert secret not in out, secret
    line = json.loads(out)
    assert line["argv"][:2] == ["agent", "--api-key"] and line["argv"][-2:] == ["--max-tokens", "8"]


def test_an_exception_carrying_request_headers_is_masked_in_the_traceback():
    """The SDK's HTTP layer shows `x-api-key` in a headers repr (it hides only authorization): an exception
    carrying one is logged, traceback and all, with the key masked."""
    import httpx

    key = "sk-ant-api03-" + "k" * 40
    headers = httpx.Headers({"x-api-key": key, "authorization": "Bearer tok-abcdefgh123", "anthropic-version": "1"})
    assert key in repr(headers)  # the leak this guards against
    buf = _capture()
    try:
        raise RuntimeError(f"request failed: {headers!r}")
    except RuntimeError:
        olog.get().error(olog.Event.SCHEDULER_ERROR, exc_info=True)
    out = buf.getvalue()
    assert key not in out and "sk-ant-api03" not in out and "tok-abcdefgh123" not in out
    assert "RuntimeError: request failed" in out and "anthropic-version" in out


def test_counts_and_ordinary_text_are_left_alone():
    """Numbers under token-named fields and text that only mentions a secret-like word are not masked."""
    line = json.loads(_line(max_tokens=8192, usage={"input_tokens": 10}, reason="src/tokenizer.py: leads outside"))
    assert line["max_tokens"] == 8192 and line["usage"] == {"input_tokens": 10}
    assert line["reason"] == "src/tokenizer.py: leads outside"
