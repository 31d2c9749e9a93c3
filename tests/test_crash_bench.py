"""The crash test's short form: a few kill -9s of a real daemon, every invariant checked after each restart."""

from __future__ import annotations

import io

import pytest

from orchestrator.lab.bench import crash


@pytest.mark.timeout(240)
def test_a_few_kills_break_no_invariant():
    """Two kill -9s during landings (of its whole process group, then of the daemon alone): nothing lost, doubled
    or left behind. (`bench crash --kills 50` is the measurement; this is its machinery, on two rounds.)"""
    out = io.StringIO()
    rounds = crash.run(kills=2, seed=7, out=out, max_jobs=3)  # short temp dirs: a socket path is limited
    assert [r.violations for r in rounds] == [[], []], out.getvalue()
    assert [(r.group_kill, r.killed_at.startswith("landing")) for r in rounds] == [(True, True), (False, True)]
    assert sum(len(r.jobs) for r in rounds) == 6
