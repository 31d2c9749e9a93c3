"""End to end: the real daemon in burst mode, the real CLI, a real repository."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import time
from pathlib import Path

from tests.conftest import git

ADMISSION = {"admission.admitted", "admission.deferred", "admission.replan", "admission.failed"}


def test_three_shell_jobs_land_and_status_tells_the_truth(make_repo, daemon_factory):
    """Three shell jobs enqueued through the CLI all land with their changes; status and the log agree."""
    repo = make_repo()
    d = daemon_factory(process=True).start("--burst", "--grace", "3")
    ids = [
        d.enqueue(repo, "echo one > one.txt", "--path", "one.txt"),
        d.enqueue(repo, "echo two > src/two.py", "--path", "src/two.py"),
        d.enqueue(repo, "echo three >> README.md", "--path", "README.md"),
    ]
    assert d.cli("wait", *map(str, ids), "--timeout", "60").returncode == 0
    jobs = {j["id"]: j for j in d.cli_json("status")}
    assert d.wait_exit(60) == 0, "burst mode exits 0 once nothing is open"

    assert [jobs[i]["state"] for i in ids] == ["landed"] * 3
    head = git(repo, "rev-parse", "main")
    for i in ids:
        job = jobs[i]
        assert set(job) >= {
            "id",
            "repo",
            "branch",
            "text",
            "runner",
            "state",
            "claim",
            "actual",
            "base",
            "created_at",
            "started_at",
            "finished_at",
            "landed_sha",
            "reason",
        }
        assert job["repo"] == str(repo.resolve()) and job["branch"] == "main" and job["runner"] == "shell"
        assert job["claim"]["source"] == "declared" and job["claim"]["confidence"] == 1.0
        assert job["actual"] == job["claim"]["paths"], "what the job touched is what it said"
        assert git(repo, "merge-base", "--is-ancestor", job["landed_sha"], head) == ""
    assert git(repo, "show", "main:one.txt") == "one"
    assert git(repo, "show", "main:src/two.py") == "two"
    assert git(repo, "show", "main:README.md").splitlines() == ["hello", "three"]
    trailers = git(repo, "log", "--format=%(trailers:key=Orchestrator-Job,valueonly)", "main")
    assert {int(t) for t in trailers.split()} == set(ids)

    events = d.events()
    admissions = [e for e in events if e["event"] in ADMISSION]
    admitted = [e for e in admissions if e["event"] == "admission.admitted"]
    assert sorted(e["job_id"] for e in admitted) == sorted(ids), "one admitted event per job"
    for e in admissions:
        assert e["reason"] and e["message"], e
    # Each decision is logged once per change of reason: no two identical consecutive events for a job.
    for i in ids:
        seq = [(e["event"], e["reason"], tuple(e["blocking"])) for e in admissions if e["job_id"] == i]
        assert all(a != b for a, b in itertools.pairwise(seq)), seq
    assert all(e["event"] in _closed_set() for e in events)


def _closed_set() -> set[str]:
    from orchestrator.logging import EVENTS

    return set(EVENTS)


def test_killed_daemon_restarts_where_it_was(make_repo, daemon_factory, tmp_path):
    """SIGKILL while a job runs: on restart that job is interrupted, the others intact, and retry completes it."""
    repo = make_repo()
    gate = tmp_path / "gate"
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "1"}, process=True).start()
    slow = d.enqueue(repo, f"while [ ! -e {gate} ]; do sleep 0.05; done; echo slow > slow.txt", "--path", "slow.txt")
    queued = d.enqueue(repo, "echo later > later.txt", "--path", "later.txt")
    deadline = time.monotonic() + 20
    while d.cli_json("show", str(slow))["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    d.kill(signal.SIGKILL)

    d2 = daemon_factory(env={"MAX_CONCURRENT_JOBS": "1"}, process=True)
    d2.home, d2.log_path, d2.socket = d.home, d.home / "daemon2.log", d.socket
    d2.env = d.env
    d2.start()
    assert d2.cli("wait", str(queued), "--timeout", "60").returncode == 0
    s = d2.cli_json("show", str(slow))
    assert s["state"] == "interrupted" and "retry" in s["reason"]
    assert d2.cli_json("show", str(queued))["state"] == "landed"
    recovered = [e for e in d2.events() if e["event"] == "daemon.recovered"]
    assert recovered and recovered[0]["interrupted"] == [slow]

    gate.touch()
    assert d2.cli("retry", str(slow)).returncode == 0
    assert d2.cli("wait", str(slow), "--timeout", "60").returncode == 0
    assert d2.cli_json("show", str(slow))["state"] == "landed"
    assert git(repo, "show", "main:slow.txt") == "slow"
    assert git(repo, "show", "main:later.txt") == "later"


def test_enqueue_rejects_a_path_that_is_not_a_repo(daemon_factory, tmp_path):
    """A non-repo path is rejected at once (exit 2) with a message that says what to do."""
    d = daemon_factory().start()
    plain = tmp_path / "plain"
    plain.mkdir()
    out = d.cli("enqueue", "--repo", str(plain), "true")
    assert out.returncode == 2
    assert "not inside a git repository" in out.stderr and "git init" in out.stderr
    assert d.cli_json("status") == []


def test_enqueue_rejects_a_missing_branch(make_repo, daemon_factory):
    """A branch that does not exist is rejected and the message names the ones that do."""
    repo = make_repo()
    d = daemon_factory().start()
    out = d.cli("enqueue", "--repo", str(repo), "--branch", "nope", "true")
    assert out.returncode == 2
    assert "nope" in out.stderr and "main" in out.stderr


def test_enqueue_rejects_a_bare_repository(daemon_factory, tmp_path, make_repo):
    """A bare repository has no work tree to land into: rejected with what to pass instead."""
    src = make_repo()
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(src), str(bare))
    d = daemon_factory().start()
    out = d.cli("enqueue", "--repo", str(bare), "true")
    assert out.returncode == 2 and "bare" in out.stderr


def test_enqueue_rejects_bad_paths(make_repo, daemon_factory):
    """Absolute and escaping paths are rejected with a clear error, and nothing is queued."""
    repo = make_repo()
    d = daemon_factory().start()
    for bad in ("/etc/passwd", "../outside.txt", "src/../../x"):
        out = d.cli("enqueue", "--repo", str(repo), "--path", bad, "true")
        assert out.returncode == 2, (bad, out.stderr)
        assert out.stderr.strip()
    assert d.cli_json("status") == []


def _raw(sock_path: Path, request: bytes) -> tuple[int, dict]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(sock_path))
    s.sendall(request)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(body)


def test_malformed_requests_get_400_and_the_daemon_keeps_serving(daemon_factory, make_repo):
    """Malformed JSON, wrong types and unknown ids get clear errors; the daemon keeps running."""
    repo = make_repo()
    d = daemon_factory().start()
    body = b"{not json"
    status, data = _raw(
        d.socket,
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    )
    assert status == 400 and "not valid JSON" in data["error"]
    body = json.dumps({"repo": str(repo), "text": "true", "priority": "high"}).encode()
    status, data = _raw(
        d.socket,
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    )
    assert status == 400 and "priority" in data["error"]
    body = b"[1, 2]"
    status, data = _raw(
        d.socket,
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    )
    assert status == 400 and "object" in data["error"]
    out = d.cli("show", "999")
    assert out.returncode == 2 and "no job 999" in out.stderr
    out = d.cli("cancel", "999")
    assert out.returncode == 2
    assert d.cli("status").returncode == 0, "still serving"


def test_socket_is_private(daemon_factory):
    """The API socket is mode 0600 in a 0700 directory, and no TCP port is opened."""
    d = daemon_factory().start()
    assert d.socket.stat().st_mode & 0o777 == 0o600
    assert d.socket.parent.stat().st_mode & 0o777 == 0o700


def test_second_daemon_on_the_same_home_is_refused(daemon_factory):
    """A second daemon on one home exits 1 with a clear message; the first keeps running."""
    d = daemon_factory().start()
    second = daemon_factory(process=True)
    second.home, second.env, second.log_path = d.home, d.env, d.home / "second.log"
    second.start(wait=False)
    assert second.wait_exit(30) == 1
    assert "another orchestrator daemon" in second.log_path.read_text()
    assert d.cli("status").returncode == 0


def test_cli_without_daemon_exits_3(tmp_path):
    """With no daemon, the CLI exits 3 and says how to start one."""
    from tests.harness import Daemon

    d = Daemon(tmp_path / "nohome")
    out = d.cli("status")
    assert out.returncode == 3 and "orchestrator daemon" in out.stderr


def test_sigterm_stops_gracefully_and_interrupts_running_jobs(make_repo, daemon_factory, tmp_path):
    """SIGTERM: the daemon exits 0 promptly, the running job is interrupted and its process is gone."""
    repo = make_repo()
    pidfile = tmp_path / "runner.pid"
    d = daemon_factory(process=True).start()
    job = d.enqueue(repo, f"echo $$ > {pidfile}; exec sleep 60", "--path", "slow.txt")
    deadline = time.monotonic() + 20
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    started = time.monotonic()
    d.kill(signal.SIGTERM)
    assert d.proc is not None and d.proc.returncode == 0
    assert time.monotonic() - started < 15
    events = [e["event"] for e in d.events()]
    assert "daemon.stopping" in events and events[-1] == "daemon.stopped"
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, "no runner process outlives the daemon's shutdown"

    d2 = daemon_factory(process=True)
    d2.home, d2.env, d2.log_path, d2.socket = d.home, d.env, d.home / "after.log", d.socket
    d2.start()
    shown = d2.cli_json("show", str(job))
    assert shown["state"] == "interrupted"
