"""A node's hold on its jobs: leases renewed off the event loop, an outage of the database that takes no job away,
a job a node lost stopped there at once and started afresh wherever it runs next, landed exactly once. Real
daemons, a real PostgreSQL (stopped and started), a bare remote."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from orchestrator.lab.localpg import LocalPostgres
from tests.conftest import bare_remote, git
from tests.harness import until
from tests.teamkit import alive, landed_once, make_node, states

pytestmark = pytest.mark.timeout(240)

LEASE = 3


def _waiting_job(tmp_path: Path, name: str) -> tuple[str, Path, Path]:
    """A job's text that, on its first attempt only, writes a first draft and its pid and waits for `gate`; then
    writes its file."""
    gate, pid = tmp_path / f"{name}.gate", tmp_path / f"{name}.pid"
    first = tmp_path / f"{name}.first"
    script = (
        f"if [ ! -e {first} ]; then touch {first}; echo draft > {name}.txt; echo $$ > {pid}; "
        f"while [ ! -e {gate} ]; do sleep 0.1; done; fi; echo {name} > {name}.txt"
    )
    return script, gate, pid


def _kinds(d, job: int) -> list[str]:  # type: ignore[no-untyped-def]
    return [e["kind"] for e in d.cli_json("show", str(job))["events"]]


def test_a_database_outage_longer_than_the_lease_takes_no_job_away(tmp_path, postgres: LocalPostgres, pg_url):
    """PostgreSQL stopped for three leases while node a runs a job and node b could take it: when the database is
    back, a still holds and runs it (b took nothing over), its runner never stopped; released, it lands exactly
    once, and a job queued before the outage lands too: nothing lost, nothing run twice."""
    bare = bare_remote(tmp_path, {"README.md": "hi\n"})
    a, clone_a = make_node(tmp_path, bare, pg_url, "a", lease=LEASE, labels=["ay"])
    b, _ = make_node(tmp_path, bare, pg_url, "b", lease=LEASE)
    a.start()
    b.start()
    try:
        script, gate, pidfile = _waiting_job(tmp_path, "long")
        long = a.enqueue(clone_a, script, "--path", "long.txt", "--label", "ay")
        runner = int(until("the job runs on a", lambda: pidfile.exists() and pidfile.read_text().strip()))
        other = a.enqueue(clone_a, "echo other > other.txt", "--path", "other.txt", "--after", str(long))
        postgres.stop()
        try:
            time.sleep(LEASE * 3)
            assert alive(runner), "the runner was stopped while the database was away"
        finally:
            postgres.start()
        time.sleep(LEASE * 2)  # b's beats, with the database back: nothing of a's is lapsed
        job = states(b)[long]
        assert (job["state"], job["node"]) == ("running", "a") and alive(runner)
        gate.touch()
        until("both landed", lambda: all(states(a)[i]["state"] == "landed" for i in (long, other)), 90)
        assert landed_once(bare) == sorted([long, other])
        kinds = _kinds(a, long)
        assert kinds.count("landed") == 1 and "requeued" not in kinds and "interrupted" not in kinds, kinds
    finally:
        a.stop()
        b.stop()


def test_a_node_that_lost_its_job_stops_its_runner_at_once_and_starts_it_afresh(tmp_path, pg_url):
    """Node a is cut off (SIGSTOP to its daemon and its lease keeper, as a machine paused or a network gone would
    leave it) past its lease while it runs a job; node b takes the job over (back to the queue; only a has the
    label to claim it again). a resumes: it stops the lost attempt's runner at once and writes nothing of it;
    claiming the job again it gets a fresh workspace (the lost attempt's work kept on its branch, no "already has a
    workspace") and lands it exactly once."""
    bare = bare_remote(tmp_path, {"README.md": "hi\n"})
    a, clone_a = make_node(tmp_path, bare, pg_url, "a", lease=LEASE, labels=["ay"])
    b, _ = make_node(tmp_path, bare, pg_url, "b", lease=LEASE)
    a.start()
    b.start()
    assert a.proc is not None
    try:
        script, gate, pidfile = _waiting_job(tmp_path, "job")
        job = a.enqueue(clone_a, script, "--path", "job.txt", "--label", "ay")
        runner = int(until("the first attempt runs", lambda: pidfile.exists() and pidfile.read_text().strip()))
        os.killpg(a.proc.pid, signal.SIGSTOP)  # the daemon and its keeper (the runner has a session of its own)
        try:
            until("b took the job over", lambda: states(b)[job]["state"] == "queued", timeout=LEASE * 6)
        finally:
            os.killpg(a.proc.pid, signal.SIGCONT)
        resumed = time.monotonic()
        until("the lost attempt's runner stopped", lambda: not alive(runner), timeout=LEASE * 3)
        assert time.monotonic() - resumed < LEASE, "not at once"
        until("landed", lambda: states(a)[job]["state"] == "landed", 90)
        assert landed_once(bare) == [job]
        shown = a.cli_json("show", str(job))
        assert "already has a workspace" not in shown["reason"] and shown["node"] == "a"
        kinds = [e["kind"] for e in shown["events"]]
        assert kinds.count("claimed") == 2 and kinds.count("landed") == 1, kinds
        assert git(clone_a, "branch", "--list", f"orchestrator/{job}-attempt-*") != ""
    finally:
        gate.touch()
        a.stop()
        b.stop()


def test_a_stalled_daemon_loses_no_job(tmp_path, pg_url):
    """Node a's daemon stalls for three leases (SIGSTOP to it alone: what a loop or an interpreter held by a C library
    for that long amounts to) while it runs a job: its lease keeper renews on, so node b takes nothing over; a goes
    on and lands the job once."""
    bare = bare_remote(tmp_path, {"README.md": "hi\n"})
    a, clone_a = make_node(tmp_path, bare, pg_url, "a", lease=LEASE, labels=["ay"])
    b, _ = make_node(tmp_path, bare, pg_url, "b", lease=LEASE)
    a.start()
    b.start()
    assert a.proc is not None
    try:
        script, gate, pidfile = _waiting_job(tmp_path, "job")
        job = a.enqueue(clone_a, script, "--path", "job.txt", "--label", "ay")
        until("the job runs", lambda: pidfile.exists() and pidfile.read_text().strip())
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(LEASE * 3)
            seen = states(b)[job]
            assert (seen["state"], seen["node"]) == ("running", "a"), seen
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        gate.touch()
        until("landed", lambda: states(a)[job]["state"] == "landed", 90)
        assert landed_once(bare) == [job] and "requeued" not in _kinds(a, job)
    finally:
        gate.touch()
        a.stop()
        b.stop()
