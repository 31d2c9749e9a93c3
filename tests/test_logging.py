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
