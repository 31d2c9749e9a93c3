"""Queue verbs like pueue's: several ids and filters per verb, pause/resume, limit at run time, clean."""

from __future__ import annotations

import json

import pytest

from tests.conftest import git
from tests.test_e2e_jobs import wait_for_file

ENV = {"MAX_CONCURRENT_JOBS": "4"}


@pytest.fixture
def started(make_repo, daemon_factory):
    repo = make_repo()
    d = daemon_factory(env=ENV).start()
    return repo, d


def states(d, *ids: int) -> list[str]:
    return [d.cli_json("show", str(i))["state"] for i in ids]


def test_cancel_and_retry_take_several_ids_and_filters(started, make_repo, tmp_path):
    """`cancel 1 2` cancels both; `retry --failed --repo R` re-queues only that repo's ended jobs."""
    repo, d = started
    other = make_repo("other")
    gate = tmp_path / "gate"
    a = d.enqueue(repo, f"{wait_for_file(gate)}; echo a > src/a.py", "--path", "src/a.py")
    b = d.enqueue(repo, f"{wait_for_file(gate)}; echo b > src/b.py", "--path", "src/b.py")
    c = d.enqueue(other, "exit 3", "--path", "x.txt")
    assert d.cli("wait", str(c), "--timeout", "60").returncode == 1
    out = d.cli("cancel", str(a), str(b))
    assert out.returncode == 0, out.stderr
    assert states(d, a, b) == ["cancelled", "cancelled"]
    assert f"job {a}: cancelled" in out.stderr and f"job {b}: cancelled" in out.stderr

    refused = d.cli("cancel", str(a), "999")
    assert refused.returncode == 2 and "already ended" in refused.stderr and "no job 999" in refused.stderr

    gate.touch()
    retried = json.loads(d.cli("retry", "--failed", "--repo", str(repo), "--json").stdout)
    assert sorted(r["id"] for r in retried) == [a, b], "the other repo's failed job stays failed"
    assert states(d, c) == ["failed"]
    assert d.cli("wait", str(a), str(b), "--timeout", "60").returncode == 0
    assert git(repo, "show", "main:src/a.py") == "a" and git(repo, "show", "main:src/b.py") == "b"
    assert d.cli("retry").returncode == 2, "naming nothing is a usage error"


def test_clean_removes_ended_jobs_records_and_logs(started):
    """`clean --all` drops ended jobs from the list with their logs; landed commits stay in git."""
    repo, d = started
    landed = d.enqueue(repo, "echo landed > src/a.py", "--path", "src/a.py")
    failed = d.enqueue(repo, "echo oops; exit 1", "--path", "src/b.py")
    d.cli("wait", str(landed), str(failed), "--timeout", "60")
    sha = d.cli_json("show", str(landed))["landed_sha"]
    log = d.home / "state" / "jobs" / f"{failed}.log"
    assert log.exists()
    out = d.cli("clean", "--all")
    assert out.returncode == 0, out.stderr
    assert d.cli_json("status") == []
    assert not log.exists()
    assert d.cli("show", str(landed)).returncode == 2
    assert git(repo, "cat-file", "-t", sha) == "commit" and git(repo, "show", "main:src/a.py") == "landed"
