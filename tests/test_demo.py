"""`orchestrator demo`, the README's first command: every job lands, and the daemon log it names is there after."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(180)
def test_the_demo_lands_every_job_and_keeps_the_log_it_names() -> None:
    """The demo exits 0 (all landed) and the log path it prints still holds the daemon's JSON lines (0600)."""
    out = subprocess.run([sys.executable, "-m", "orchestrator", "demo"], capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    named = re.findall(r"daemon log: (\S+)", out.stderr)
    assert named, out.stderr
    log = Path(named[0])
    try:
        assert log.exists(), "the demo removed the log it named"
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        events = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
        assert any(e.get("event") == "landing.landed" for e in events)
        assert f"the daemon's log: {log}" in out.stderr
    finally:
        log.unlink(missing_ok=True)
