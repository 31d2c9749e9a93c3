"""The crash test's short form: a few kill -9s of a real daemon, every invariant checked after each restart."""

from __future__ import annotations

import io

import pytest

from orchestrator.lab.bench import crash


@pytest.mark.timeout(240)
def test_a_few_kills_break_no_invariant():
    """Three kill -9s at random moments (weighted towards landings): nothing lost, doubled or left behind."""
    out = io.StringIO()
    rounds = crash.run(kills=3, seed=7, out=out, max_jobs=3)  # short temp dirs: a socket path is limited
    assert [r.violations for r in rounds] == [[], [], []], out.getvalue()
    assert sum(len(r.jobs) for r in rounds) == 9
